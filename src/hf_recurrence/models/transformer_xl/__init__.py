from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from . import configuration_transformer_xl, modeling_transformer_xl
from .configuration_transformer_xl import LegacyTransfoXLConfig, TransformerXLConfig
from .modeling_transformer_xl import (
    TransformerXLLMHeadModel,
    TransformerXLModel,
    TransformerXLPreTrainedModel,
    TransformerXLState,
)


AutoConfig.register(TransformerXLConfig.model_type, TransformerXLConfig, exist_ok=True)
AutoConfig.register(LegacyTransfoXLConfig.model_type, LegacyTransfoXLConfig, exist_ok=True)
AutoModel.register(TransformerXLConfig, TransformerXLModel, exist_ok=True)
AutoModelForCausalLM.register(TransformerXLConfig, TransformerXLLMHeadModel, exist_ok=True)

TransformerXLConfig.register_for_auto_class()
TransformerXLModel.register_for_auto_class("AutoModel")
TransformerXLLMHeadModel.register_for_auto_class("AutoModelForCausalLM")

__all__ = [*configuration_transformer_xl.__all__, *modeling_transformer_xl.__all__]
