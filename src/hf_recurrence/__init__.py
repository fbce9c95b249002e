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
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderForTokenClassification,
    RecurrentDecoderModel,
    RecurrentDecoderPreTrainedModel,
    RecurrentDecoderState,
    RecurrentGPT2Config,
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentGPT2PreTrainedModel,
    RecurrentGPT2State,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaForSequenceClassification,
    RecurrentLlamaForTokenClassification,
    RecurrentLlamaModel,
    RecurrentLlamaPreTrainedModel,
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
    "RecurrentDecoderForSequenceClassification",
    "RecurrentDecoderForTokenClassification",
    "RecurrentDecoderModel",
    "RecurrentDecoderPreTrainedModel",
    "RecurrentDecoderState",
    "RecurrentGPT2Config",
    "RecurrentGPT2ForSequenceClassification",
    "RecurrentGPT2ForTokenClassification",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2PreTrainedModel",
    "RecurrentGPT2State",
    "RecurrentLlamaConfig",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaForSequenceClassification",
    "RecurrentLlamaForTokenClassification",
    "RecurrentLlamaModel",
    "RecurrentLlamaPreTrainedModel",
    "RecurrentLlamaState",
    "TransformerXLConfig",
    "TransformerXLLMHeadModel",
    "TransformerXLModel",
    "TransformerXLPreTrainedModel",
    "TransformerXLState",
    "__version__",
]
