from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_recurrent_gpt2 import RecurrentGPT2Config
from .modeling_recurrent_gpt2 import (
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentGPT2PreTrainedModel,
    RecurrentGPT2State,
)


AutoConfig.register(RecurrentGPT2Config.model_type, RecurrentGPT2Config, exist_ok=True)
AutoModel.register(RecurrentGPT2Config, RecurrentGPT2Model, exist_ok=True)
AutoModelForCausalLM.register(RecurrentGPT2Config, RecurrentGPT2LMHeadModel, exist_ok=True)

RecurrentGPT2Config.register_for_auto_class()
RecurrentGPT2Model.register_for_auto_class("AutoModel")
RecurrentGPT2LMHeadModel.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "RecurrentGPT2Config",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2PreTrainedModel",
    "RecurrentGPT2State",
]
