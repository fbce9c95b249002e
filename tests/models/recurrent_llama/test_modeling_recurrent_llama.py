"""Recurrent Llama, the recurrence core under Llama's names: its flat config (a `LlamaConfig`), stock Llama
checkpoints loading into it (tied and untied), and configs converted without a window. What the core does over every
backbone, Llama included (pooling, the control, the RoPE policy of h_prev), is tested in tests/models/recurrent_decoder."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM

from ...common import ACROSS_KERNELS, TINY_LLAMA, load_over_a_stock_checkpoint


def test_the_config_is_a_llama_config_whose_h_prev_key_is_not_rotated_by_default():
    config = RecurrentLlamaConfig()
    assert config.h_prev_rope_position is None
    assert isinstance(config, LlamaConfig)


def test_llama_config_converted_without_a_window_gets_at_most_300(tmp_path):
    LlamaConfig(**TINY_LLAMA).save_pretrained(tmp_path)
    config = RecurrentLlamaConfig.from_pretrained(tmp_path, insertion_layer=1)
    assert config.model_type == "recurrent_llama" and config.window_size == 16
    large = LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": 8192}).to_dict()
    assert RecurrentLlamaConfig.from_dict(large, insertion_layer=1).window_size == 300


@pytest.mark.parametrize("tied", [True, False])
def test_first_window_equals_stock_llama_and_weights_load_unchanged(tmp_path, tied):
    llama = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, tie_word_embeddings=tied)).eval()
    model = load_over_a_stock_checkpoint(llama, RecurrentLlamaForCausalLM, "recurrent_llama", tmp_path)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
    ids = torch.randint(0, 99, (2, 8))
    long_ids = torch.randint(0, 99, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, **ACROSS_KERNELS)
        torch.testing.assert_close(model(long_ids).logits[:, :8], llama(long_ids[:, :8]).logits, **ACROSS_KERNELS)


def test_invalid_window_for_the_checkpoint_is_refused(tmp_path):
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="window_size=32 exceeds .*max_position_embeddings=16"):
        RecurrentLlamaForCausalLM.from_pretrained(tmp_path, window_size=32)
