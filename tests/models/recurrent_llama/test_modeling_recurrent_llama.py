"""Recurrent Llama: what is particular to the Llama backbone and the switches first measured on it (pooling, control, the
RoPE policy of h_prev), Llama compatibility. The rest of the behaviour it shares with every backbone of the recurrence
core is tested on the recurrent GPT-2 (tests/models/recurrent_gpt2) and on every backbone row (tests/test_backbones.py)."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM

from ...common import (
    ACROSS_KERNELS,
    TINY_LLAMA,
    chunked_logits,
    load_over_a_stock_checkpoint,
    tiny_recurrent_llama_config,
)


def make_model(**overrides) -> RecurrentLlamaForCausalLM:
    return RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(**overrides)).eval()


class TestConfig:
    @pytest.mark.parametrize(
        ("overrides", "field", "value"),
        [
            # The settings it shares with the recurrent GPT-2: tests/test_families.py.
            ({"h_prev_rope_position": -9}, "h_prev_rope_position", "-9"),
            ({"h_prev_rope_position": 1}, "h_prev_rope_position", "1"),
            ({"recurrence_input": "noise"}, "recurrence_input", "'noise'"),
        ],
    )
    def test_invalid_values_name_field_and_value(self, overrides, field, value):
        with pytest.raises(ValueError, match=f"{field}={value}".replace("[", r"\[").replace("]", r"\]")):
            tiny_recurrent_llama_config(**overrides)

    def test_the_pooling_switch_takes_only_a_bool(self):
        # transformers' strict config dataclass checks the declared type, as for every bool field of a config.
        with pytest.raises(StrictDataclassFieldValidationError, match="normalize_pooled_states"):
            tiny_recurrent_llama_config(normalize_pooled_states=1)

    def test_defaults(self):
        # The recurrence's defaults, shared with the recurrent GPT-2: tests/test_families.py.
        config = RecurrentLlamaConfig()
        assert config.h_prev_rope_position is None
        assert isinstance(config, LlamaConfig)

    def test_llama_config_converted_without_a_window_gets_at_most_300(self, tmp_path):
        LlamaConfig(**TINY_LLAMA).save_pretrained(tmp_path)
        config = RecurrentLlamaConfig.from_pretrained(tmp_path, insertion_layer=1)
        assert config.model_type == "recurrent_llama" and config.window_size == 16
        large = LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": 8192}).to_dict()
        assert RecurrentLlamaConfig.from_dict(large, insertion_layer=1).window_size == 300


class TestForward:
    def test_the_cache_is_per_key_value_head(self):
        # The shapes it shares with the recurrent GPT-2: tests/test_families.py.
        out = make_model()(torch.randint(0, 99, (3, 21)))
        # The cache is kept per key-value head (GQA), not per query head.
        assert out.past_key_values.keys[1].shape[:2] == (3, 2)

    def test_control_h_prev_is_a_learned_constant_that_ignores_the_text(self):
        control = make_model(recurrence_input="zeros")
        ids = torch.randint(0, 99, (1, 16))
        changed = ids.clone()
        changed[0, :8] = ids[0, :8].flip(0)
        with torch.no_grad():
            torch.testing.assert_close(control(ids).logits[:, 8:], control(changed).logits[:, 8:])
            # ... but it is there: window 2 differs from the same tokens read as a first window.
            assert not torch.allclose(control(ids).logits[:, 8:], control(ids[:, 8:]).logits)

    @pytest.mark.parametrize("normalize", [False, True])
    def test_h_prev_is_the_ffn_of_the_layer_weighted_mean(self, normalize):
        model = make_model(normalize_pooled_states=normalize)
        with torch.no_grad():
            model.recurrence.layer_weight_logits.copy_(torch.tensor([0.5, -1.0, 2.0]))
            ids = torch.randint(0, 99, (2, 9))  # one full window, then one token that closes it
            layer_outputs = torch.stack(model(ids[:, :8], output_hidden_states=True).hidden_states[1:])
            state = model(ids, use_cache=True).past_key_values
        if normalize:
            layer_outputs = layer_outputs * torch.rsqrt(layer_outputs.pow(2).mean(-1, keepdim=True) + 1e-6)
        weights = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), dim=0)
        summary = (weights[:, None, None] * layer_outputs.mean(2)).sum(0)  # (batch, hidden)
        torch.testing.assert_close(state.h_prev, model.recurrence(summary))

    def test_normalized_pooling_ignores_a_token_with_huge_activations(self):
        # An attention-sink-like first token, 1000x the others: it dominates the plain mean, not the normalized one.
        model = make_model(normalize_pooled_states=True)
        plain = make_model(normalize_pooled_states=False)
        plain.load_state_dict(model.state_dict())
        embeds = torch.randn(1, 9, 32)
        louder = embeds.clone()
        louder[0, 0] *= 1000
        with torch.no_grad():
            memory = {
                name: [m(inputs_embeds=e, use_cache=True).past_key_values.h_prev for e in (embeds, louder)]
                for name, m in (("normalized", model), ("plain", plain))
            }
        normalized_change = (memory["normalized"][0] - memory["normalized"][1]).norm()
        plain_change = (memory["plain"][0] - memory["plain"][1]).norm()
        assert normalized_change < plain_change / 10

    def test_h_prev_rope_position_only_changes_later_windows(self):
        unrotated = make_model()
        rotated = make_model(h_prev_rope_position=-1)
        rotated.load_state_dict(unrotated.state_dict())
        ids = torch.randint(0, 99, (2, 24))
        first, later = unrotated(ids).logits, rotated(ids).logits
        torch.testing.assert_close(later[:, :8], first[:, :8])
        assert not torch.allclose(later[:, 8:], first[:, 8:])


class TestLlamaCompatibility:
    @pytest.mark.parametrize("tied", [True, False])
    def test_first_window_equals_stock_llama_and_weights_load_unchanged(self, tmp_path, tied):
        llama = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, tie_word_embeddings=tied)).eval()
        model = load_over_a_stock_checkpoint(llama, RecurrentLlamaForCausalLM, "recurrent_llama", tmp_path)
        assert (model.lm_head.weight is model.model.embed_tokens.weight) is tied
        ids = torch.randint(0, 99, (2, 8))
        long_ids = torch.randint(0, 99, (2, 30))
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, llama(ids).logits, **ACROSS_KERNELS)
            torch.testing.assert_close(model(long_ids).logits[:, :8], llama(long_ids[:, :8]).logits, **ACROSS_KERNELS)

    def test_invalid_window_for_the_checkpoint_is_refused(self, tmp_path):
        LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).save_pretrained(tmp_path)
        with pytest.raises(ValueError, match="window_size=32 exceeds .*max_position_embeddings=16"):
            RecurrentLlamaForCausalLM.from_pretrained(tmp_path, window_size=32)


class TestStateEquivalence:
    @pytest.mark.parametrize("overrides", [{"normalize_pooled_states": True}, {"recurrence_input": "zeros"}])
    def test_chunked_equals_one_shot_for_the_pooling_and_control_switches(self, overrides):
        model = make_model(window_overlap=3, **overrides)
        ids = torch.randint(0, 99, (2, 45))
        with torch.no_grad():
            full = model(ids).logits
            chunked, _ = chunked_logits(model, ids, [3, 11, 29, 30])
        torch.testing.assert_close(chunked, full)
