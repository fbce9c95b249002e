from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_recurrent_llama import RecurrentLlamaConfig
from .modeling_recurrent_llama import (
    RecurrentLlamaForCausalLM,
    RecurrentLlamaModel,
    RecurrentLlamaPreTrainedModel,
    RecurrentLlamaState,
)


AutoConfig.register(RecurrentLlamaConfig.model_type, RecurrentLlamaConfig, exist_ok=True)
AutoModel.register(RecurrentLlamaConfig, RecurrentLlamaModel, exist_ok=True)
AutoModelForCausalLM.register(RecurrentLlamaConfig, RecurrentLlamaForCausalLM, exist_ok=True)

RecurrentLlamaConfig.register_for_auto_class()
RecurrentLlamaModel.register_for_auto_class("AutoModel")
RecurrentLlamaForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "RecurrentLlamaConfig",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaModel",
    "RecurrentLlamaPreTrainedModel",
    "RecurrentLlamaState",
]
