from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

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

__all__ = [
    "TransformerXLConfig",
    "TransformerXLLMHeadModel",
    "TransformerXLModel",
    "TransformerXLPreTrainedModel",
    "TransformerXLState",
]
