from transformers import AutoConfig, AutoModelForCausalLM

from .configuration_recurrent_decoder import RecurrentDecoderConfig
from .modeling_recurrent_decoder import RecurrentDecoderForCausalLM, RecurrentDecoderState


AutoConfig.register(RecurrentDecoderConfig.model_type, RecurrentDecoderConfig, exist_ok=True)
AutoModelForCausalLM.register(RecurrentDecoderConfig, RecurrentDecoderForCausalLM, exist_ok=True)

RecurrentDecoderConfig.register_for_auto_class()
RecurrentDecoderForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["RecurrentDecoderConfig", "RecurrentDecoderForCausalLM", "RecurrentDecoderState"]
