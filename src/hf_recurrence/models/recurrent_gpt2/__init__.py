from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_recurrent_gpt2 import RecurrentGPT2Config
from .modeling_recurrent_gpt2 import (
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentGPT2PreTrainedModel,
    RecurrentGPT2State,
)


AutoConfig.register(RecurrentGPT2Config.model_type, RecurrentGPT2Config, exist_ok=True)
AutoModel.register(RecurrentGPT2Config, RecurrentGPT2Model, exist_ok=True)
AutoModelForCausalLM.register(RecurrentGPT2Config, RecurrentGPT2LMHeadModel, exist_ok=True)
AutoModelForSequenceClassification.register(RecurrentGPT2Config, RecurrentGPT2ForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(RecurrentGPT2Config, RecurrentGPT2ForTokenClassification, exist_ok=True)

RecurrentGPT2Config.register_for_auto_class()
RecurrentGPT2Model.register_for_auto_class("AutoModel")
RecurrentGPT2LMHeadModel.register_for_auto_class("AutoModelForCausalLM")
RecurrentGPT2ForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
RecurrentGPT2ForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")

__all__ = [
    "RecurrentGPT2Config",
    "RecurrentGPT2ForSequenceClassification",
    "RecurrentGPT2ForTokenClassification",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2PreTrainedModel",
    "RecurrentGPT2State",
]
