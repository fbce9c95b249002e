from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_recurrent_llama import RecurrentLlamaConfig
from .modeling_recurrent_llama import (
    RecurrentLlamaForCausalLM,
    RecurrentLlamaForSequenceClassification,
    RecurrentLlamaForTokenClassification,
    RecurrentLlamaModel,
    RecurrentLlamaPreTrainedModel,
    RecurrentLlamaState,
)


AutoConfig.register(RecurrentLlamaConfig.model_type, RecurrentLlamaConfig, exist_ok=True)
AutoModel.register(RecurrentLlamaConfig, RecurrentLlamaModel, exist_ok=True)
AutoModelForCausalLM.register(RecurrentLlamaConfig, RecurrentLlamaForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(
    RecurrentLlamaConfig, RecurrentLlamaForSequenceClassification, exist_ok=True
)
AutoModelForTokenClassification.register(RecurrentLlamaConfig, RecurrentLlamaForTokenClassification, exist_ok=True)

RecurrentLlamaConfig.register_for_auto_class()
RecurrentLlamaModel.register_for_auto_class("AutoModel")
RecurrentLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")
RecurrentLlamaForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
RecurrentLlamaForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")

__all__ = [
    "RecurrentLlamaConfig",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaForSequenceClassification",
    "RecurrentLlamaForTokenClassification",
    "RecurrentLlamaModel",
    "RecurrentLlamaPreTrainedModel",
    "RecurrentLlamaState",
]
