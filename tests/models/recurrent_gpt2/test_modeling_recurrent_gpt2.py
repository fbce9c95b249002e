"""Recurrent GPT-2, the recurrence core under GPT-2's names: its flat config and GPT-2's attribute names, stock GPT-2
checkpoints loading into it, and configs saved without a window. What the core does over every backbone, GPT-2
included, is tested in tests/models/recurrent_decoder."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel

from ...common import ACROSS_KERNELS, TINY_GPT2, load_over_a_stock_checkpoint, tiny_recurrent_config


def make_model(**overrides) -> RecurrentGPT2LMHeadModel:
    return RecurrentGPT2LMHeadModel(tiny_recurrent_config(**overrides)).eval()


def test_no_max_position_embeddings():
    # The model has no maximum length; generate() must not cap or warn at n_positions.
    assert getattr(tiny_recurrent_config(), "max_position_embeddings", None) is None


class TestGPT2Compatibility:
    def test_first_window_equals_stock_gpt2_and_weights_load_unchanged(self, tmp_path):
        gpt2 = GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()
        model = load_over_a_stock_checkpoint(gpt2, RecurrentGPT2LMHeadModel, "recurrent_gpt2", tmp_path)
        ids = torch.randint(0, 99, (2, 8))
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, gpt2(ids).logits, **ACROSS_KERNELS)
            # Later windows differ only through h_prev and restarted positions.
            long_ids = torch.randint(0, 99, (2, 30))
            torch.testing.assert_close(model(long_ids).logits[:, :8], gpt2(long_ids[:, :8]).logits)

    def test_invalid_window_for_the_checkpoint_is_refused(self, tmp_path):
        GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).save_pretrained(tmp_path)
        with pytest.raises(ValueError, match="window_size=32 exceeds .*=16"):
            RecurrentGPT2LMHeadModel.from_pretrained(tmp_path, window_size=32)

    def test_gpt2_config_converted_without_a_window_gets_the_whole_position_table(self, tmp_path):
        # PEFT and AutoConfig reload a converted model's base config this way, with no recurrence settings.
        GPT2Config(**TINY_GPT2).save_pretrained(tmp_path)
        config = RecurrentGPT2Config.from_pretrained(tmp_path, insertion_layer=1)
        assert config.window_size == TINY_GPT2["n_positions"] == 16
        large = GPT2Config(**{**TINY_GPT2, "n_positions": 1024}).to_dict()
        assert RecurrentGPT2Config.from_dict(large, insertion_layer=1).window_size == 300


def test_stock_gpt2_of_the_same_size_cannot_run_past_its_position_table():
    gpt2 = GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()
    with pytest.raises((IndexError, RuntimeError)):
        gpt2(torch.randint(1, 99, (1, 5 + 5 * TINY_GPT2["n_positions"])))
    # ... which the recurrent GPT-2 of the same size reads.
    assert make_model()(torch.randint(1, 99, (1, 5 + 5 * TINY_GPT2["n_positions"]))).logits.shape[1] == 85
