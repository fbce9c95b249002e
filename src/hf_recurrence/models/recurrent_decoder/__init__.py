from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from . import configuration_recurrent_decoder, modeling_recurrent_decoder
from .configuration_recurrent_decoder import RecurrentDecoderConfig, RecurrentGPT2Config, RecurrentLlamaConfig
from .modeling_recurrent_decoder import (
    RecurrentDecoderForCausalLM,
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderForTokenClassification,
    RecurrentDecoderModel,
    RecurrentDecoderPreTrainedModel,
    RecurrentDecoderState,
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentGPT2State,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaForSequenceClassification,
    RecurrentLlamaForTokenClassification,
    RecurrentLlamaModel,
    RecurrentLlamaState,
)


# The config classes of the core and of its named families, each with the four models the Auto classes (in this
# order) load for it. (The package's table of families and what it knows of them is `hf_recurrence.families`.)
REGISTERED_MODELS = {
    RecurrentDecoderConfig: (
        RecurrentDecoderModel,
        RecurrentDecoderForCausalLM,
        RecurrentDecoderForSequenceClassification,
        RecurrentDecoderForTokenClassification,
    ),
    RecurrentGPT2Config: (
        RecurrentGPT2Model,
        RecurrentGPT2LMHeadModel,
        RecurrentGPT2ForSequenceClassification,
        RecurrentGPT2ForTokenClassification,
    ),
    RecurrentLlamaConfig: (
        RecurrentLlamaModel,
        RecurrentLlamaForCausalLM,
        RecurrentLlamaForSequenceClassification,
        RecurrentLlamaForTokenClassification,
    ),
}
AUTO_CLASSES = (AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification)

for config_class, model_classes in REGISTERED_MODELS.items():
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()
    for auto_class, model_class in zip(AUTO_CLASSES, model_classes, strict=True):
        auto_class.register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_class.__name__)

RecurrentGPT2PreTrainedModel = RecurrentLlamaPreTrainedModel = RecurrentDecoderPreTrainedModel

__all__ = [
    *configuration_recurrent_decoder.__all__,
    *modeling_recurrent_decoder.__all__,
    "RecurrentGPT2PreTrainedModel",
    "RecurrentLlamaPreTrainedModel",
]
