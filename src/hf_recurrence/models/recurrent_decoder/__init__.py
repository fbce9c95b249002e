from transformers import AutoConfig, AutoModelForCausalLM

from .configuration_recurrent_decoder import RecurrentDecoderConfig, RecurrentGPT2Config, RecurrentLlamaConfig
from .modeling_recurrent_decoder import (
    RecurrentDecoderForCausalLM,
    RecurrentDecoderState,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2State,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaState,
)


for config_class, causal_lm_class in (
    (RecurrentDecoderConfig, RecurrentDecoderForCausalLM),
    (RecurrentGPT2Config, RecurrentGPT2LMHeadModel),
    (RecurrentLlamaConfig, RecurrentLlamaForCausalLM),
):
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModelForCausalLM.register(config_class, causal_lm_class, exist_ok=True)
    config_class.register_for_auto_class()
    causal_lm_class.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "RecurrentDecoderConfig",
    "RecurrentDecoderForCausalLM",
    "RecurrentDecoderState",
    "RecurrentGPT2Config",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2State",
    "RecurrentLlamaConfig",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaState",
]
