"""Model families. Importing this package registers every family with the transformers Auto classes."""

from .inductive_bert import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    IBertPreTrainedModel,
    InductiveBertConfig,
)
from .recurrent_decoder import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentDecoderState,
    RecurrentGPT2Config,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2State,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaState,
)
from .transformer_xl import (
    TransformerXLConfig,
    TransformerXLLMHeadModel,
    TransformerXLModel,
    TransformerXLPreTrainedModel,
    TransformerXLState,
)
