from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_recurrent_decoder import RecurrentDecoderConfig
from .modeling_recurrent_decoder import (
    RecurrentDecoderForCausalLM,
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderForTokenClassification,
    RecurrentDecoderModel,
    RecurrentDecoderPreTrainedModel,
    RecurrentDecoderState,
)


AutoConfig.register(RecurrentDecoderConfig.model_type, RecurrentDecoderConfig, exist_ok=True)
AutoModel.register(RecurrentDecoderConfig, RecurrentDecoderModel, exist_ok=True)
AutoModelForCausalLM.register(RecurrentDecoderConfig, RecurrentDecoderForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(
    RecurrentDecoderConfig, RecurrentDecoderForSequenceClassification, exist_ok=True
)
AutoModelForTokenClassification.register(RecurrentDecoderConfig, RecurrentDecoderForTokenClassification, exist_ok=True)

RecurrentDecoderConfig.register_for_auto_class()
RecurrentDecoderModel.register_for_auto_class("AutoModel")
RecurrentDecoderForCausalLM.register_for_auto_class("AutoModelForCausalLM")
RecurrentDecoderForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
RecurrentDecoderForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")

__all__ = [
    "RecurrentDecoderConfig",
    "RecurrentDecoderForCausalLM",
    "RecurrentDecoderForSequenceClassification",
    "RecurrentDecoderForTokenClassification",
    "RecurrentDecoderModel",
    "RecurrentDecoderPreTrainedModel",
    "RecurrentDecoderState",
]
