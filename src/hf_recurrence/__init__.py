"""hf_recurrence: recurrence across windows of text for Hugging Face transformers models.

Importing the package registers its model families with the transformers Auto classes, and, where PEFT is installed,
their default PEFT target modules (`integrations.peft_defaults`).
"""

__version__ = "0.1.0"

from .integrations.peft_defaults import register_peft_defaults
from .models import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    IBertPreTrainedModel,
    InductiveBertConfig,
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentDecoderState,
    RecurrentGPT2Config,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2State,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaState,
    TransformerXLConfig,
    TransformerXLLMHeadModel,
    TransformerXLModel,
    TransformerXLPreTrainedModel,
    TransformerXLState,
)


register_peft_defaults()

__all__ = [
    "IBertForMaskedLM",
    "IBertForSequenceClassification",
    "IBertForTokenClassification",
    "IBertModel",
    "IBertPreTrainedModel",
    "InductiveBertConfig",
    "RecurrentDecoderConfig",
    "RecurrentDecoderForCausalLM",
    "RecurrentDecoderState",
    "RecurrentGPT2Config",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2State",
    "RecurrentLlamaConfig",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaState",
    "TransformerXLConfig",
    "TransformerXLLMHeadModel",
    "TransformerXLModel",
    "TransformerXLPreTrainedModel",
    "TransformerXLState",
    "__version__",
]
# TEMPORARY-UNTIL-HEADS
RecurrentGPT2Model = RecurrentLlamaModel = RecurrentGPT2ForSequenceClassification = RecurrentGPT2ForTokenClassification = None
RecurrentLlamaForSequenceClassification = RecurrentLlamaForTokenClassification = None
