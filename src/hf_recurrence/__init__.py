"""hf_recurrence: recurrence across windows of text for Hugging Face transformers models.

Importing the package registers its model families with the transformers Auto classes.
"""

__version__ = "0.1.0"

from .models import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    IBertPreTrainedModel,
    InductiveBertConfig,
    RecurrentGPT2Config,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentGPT2PreTrainedModel,
    RecurrentGPT2State,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaModel,
    RecurrentLlamaPreTrainedModel,
    RecurrentLlamaState,
    TransformerXLConfig,
    TransformerXLLMHeadModel,
    TransformerXLModel,
    TransformerXLPreTrainedModel,
    TransformerXLState,
)


__all__ = [
    "IBertForMaskedLM",
    "IBertForSequenceClassification",
    "IBertForTokenClassification",
    "IBertModel",
    "IBertPreTrainedModel",
    "InductiveBertConfig",
    "RecurrentGPT2Config",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2PreTrainedModel",
    "RecurrentGPT2State",
    "RecurrentLlamaConfig",
    "RecurrentLlamaForCausalLM",
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
