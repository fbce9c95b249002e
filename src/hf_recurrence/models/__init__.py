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
)
from .transformer_xl import (
    TransformerXLConfig,
    TransformerXLLMHeadModel,
    TransformerXLModel,
    TransformerXLPreTrainedModel,
    TransformerXLState,
)
