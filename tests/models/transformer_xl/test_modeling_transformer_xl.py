"""Transformer-XL: segment recurrence equals the one-shot forward, memory bounds, stop-gradient, relative shift."""

import pytest
import torch

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel, TransformerXLState
from hf_recurrence.models.transformer_xl.modeling_transformer_xl import relative_shift

from ...common import tiny_transformer_xl_config


def make_model(**overrides) -> TransformerXLLMHeadModel:
    return TransformerXLLMHeadModel(tiny_transformer_xl_config(**overrides)).eval()


def run_chunks(model, ids: torch.Tensor, bounds: list[int]) -> tuple[torch.Tensor, TransformerXLState]:
    state, logits = None, []
    for start, stop in zip([0, *bounds], [*bounds, ids.shape[1]], strict=True):
        out = model(ids[:, start:stop], past_key_values=state)
        state = out.past_key_values
        logits.append(out.logits)
    return torch.cat(logits, dim=1), state


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"mem_len": 0},
        {"mem_len": 20},
        {"same_length": True},
        {"clamp_len": 3},
        {"untie_r": False, "pre_lnorm": True},
    ],
    ids=["default", "no_memory", "memory_longer_than_segment", "same_length", "clamp_len", "shared_r_pre_lnorm"],
)
def test_segment_aligned_chunks_with_state_equal_one_shot(overrides):
    model = make_model(**overrides)
    ids = torch.randint(1, 99, (3, 45))
    full = model(ids)
    chunked, state = run_chunks(model, ids, [8, 24, 32, 40])
    torch.testing.assert_close(chunked, full.logits)
    assert state.get_seq_length() == 45
    # The loss is the ordinary shifted causal-LM loss over the whole input, with or without returned logits.
    loss = model(ids, labels=ids)
    assert loss.logits is None
    expected = torch.nn.functional.cross_entropy(full.logits[:, :-1].reshape(-1, 99), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(loss.loss, expected)
    torch.testing.assert_close(model(ids, labels=ids, return_logits=True).loss, expected)


def test_grad_mode_recomputes_memory_projections_to_the_same_numbers():
    model = make_model()
    ids = torch.randint(1, 99, (2, 30))
    with torch.no_grad():
        cached = model(ids).logits
    torch.testing.assert_close(model(ids).logits, cached)


def test_token_by_token_attends_to_exactly_the_memory():
    # One token per call: every token sees the last mem_len positions and itself, which is the one-shot forward of a
    # model with segment_length=1.
    model = make_model()
    ids = torch.randint(1, 99, (2, 20))
    stepped, _ = run_chunks(model, ids, list(range(1, 20)))
    model.config.segment_length = 1
    torch.testing.assert_close(stepped, model(ids).logits)


def test_memory_never_exceeds_mem_len_and_holds_the_layer_inputs():
    model = make_model(mem_len=5)
    ids = torch.randint(1, 99, (2, 37))
    state = None
    for start in range(0, 37, 3):
        state = model(ids[:, start : start + 3], past_key_values=state).past_key_values
        assert all(m.shape[1] <= 5 for m in state.mems)
        assert all(k.shape[2] <= 5 for k in state.keys)
    assert state.mems[0].shape == (2, 5, 32) and bool(state.mem_valid.all())
    # Memory of layer 0 is what entered layer 0: the scaled embeddings of the last mem_len tokens.
    expected = model.transformer.word_emb(ids[:, -5:]) * 32**0.5
    torch.testing.assert_close(state.mems[0], expected)


def test_output_ignores_tokens_older_than_the_memory_horizon():
    # With one layer the memory is made of embeddings, so the horizon of segment k is mem_len tokens before it.
    model = make_model(n_layer=1, mem_len=5)
    ids = torch.randint(1, 99, (1, 24))
    reference = model(ids).logits[:, 16:]
    older = ids.clone()
    older[:, :11] = torch.randint(1, 99, (1, 11))
    torch.testing.assert_close(model(older).logits[:, 16:], reference, rtol=0, atol=0)
    inside = ids.clone()
    inside[:, 11] = (ids[:, 11] % 98) + 1
    assert not torch.allclose(model(inside).logits[:, 16:], reference)


def test_gradients_never_flow_into_memories():
    model = make_model().train()
    embeds = model.transformer.word_emb(torch.randint(1, 99, (2, 16))).detach().requires_grad_()
    labels = torch.randint(1, 99, (2, 16))
    labels[:, :9] = -100  # only predictions made inside the second segment count
    out = model(inputs_embeds=embeds, labels=labels)
    out.loss.backward()
    assert embeds.grad[:, 8:].abs().sum() > 0
    assert torch.count_nonzero(embeds.grad[:, :8]) == 0
    assert not any(m.requires_grad for m in out.past_key_values.mems)
    # ... although the second segment's outputs do depend on the first segment through the memory.
    with torch.no_grad():
        changed = embeds.detach().clone()
        changed[:, :8] += 1
        assert not torch.allclose(
            model.eval()(inputs_embeds=changed).logits[:, 8:], model(inputs_embeds=embeds).logits[:, 8:]
        )


def test_relative_shift_equals_direct_position_terms():
    torch.manual_seed(1)
    batch, heads, q, slots, d_head = 2, 3, 5, 7, 4
    klen = slots + q
    query = torch.randn(batch, heads, q, d_head)
    table = torch.randn(heads, klen, d_head)  # position keys for distances 0 .. klen - 1
    shifted = relative_shift(query @ table.flip(1).transpose(-1, -2))
    for i in range(q):
        for j in range(slots + i + 1):
            direct = (query[:, :, i] * table[:, slots + i - j]).sum(-1)
            torch.testing.assert_close(shifted[:, :, i, j], direct)


def test_state_detach_reset_and_reorder():
    model = make_model()
    ids = torch.randint(1, 99, (3, 12))
    state = model.train()(ids).past_key_values
    state.detach()
    assert not any(t.requires_grad for t in [*state.mems, *state.keys, *state.values])
    state.reorder_cache(torch.tensor([2, 2, 0]))
    assert torch.equal(state.mems[1][0], state.mems[1][1])
    state.reset()
    assert state.get_seq_length() == 0 and state.mems[0].shape[1] == 0
    # A reset state continues like a fresh start.
    model.eval()
    torch.testing.assert_close(model(ids, past_key_values=state).logits, model(ids).logits)


def test_base_model_and_shapes():
    model = TransformerXLModel(tiny_transformer_xl_config()).eval()
    out = model(torch.randint(1, 99, (2, 19)))
    assert out.last_hidden_state.shape == (2, 19, 32)
    assert out.past_key_values.keys[0].shape == (2, 2, 6, 16)


def test_invalid_inputs_are_refused():
    model = make_model()
    ids = torch.randint(1, 99, (2, 5))
    with pytest.raises(ValueError, match="position 3 follows 1"):
        model(ids, position_ids=torch.tensor([[0, 1, 3, 4, 5]]))
    with pytest.raises(ValueError, match=r"batch_size=2 \(the input: 3\)"):
        model(torch.randint(1, 99, (3, 5)), past_key_values=model(ids).past_key_values)


@pytest.mark.parametrize(
    ("field", "value"),
    [("mem_len", -1), ("segment_length", 0), ("n_head", 0), ("dropout", 1.0), ("dropatt", -0.1), ("d_model", 33)],
)
def test_config_errors_name_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"{field}={value}"):
        TransformerXLConfig(**{field: value})


@pytest.mark.parametrize(("field", "value"), [("mem_len", -1), ("segment_length", 0), ("clamp_len", -2)])
def test_settings_changed_after_the_model_is_built_are_refused_at_forward(field, value):
    # mem_len=-1 once failed deep inside with "narrow(): length must be non-negative".
    model = make_model()
    ids = torch.randint(1, 99, (2, 5))
    state = model(ids).past_key_values
    setattr(model.config, field, value)
    for past in (None, state):
        with pytest.raises(ValueError, match=rf"{field} must be an integer >= [01], got {field}={value}"):
            model(ids, past_key_values=past)
    with pytest.raises(ValueError, match=rf"{field}={value}"):
        model.transformer(ids)


def test_config_has_aliases_and_no_position_limit():
    config = tiny_transformer_xl_config()
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (32, 2, 2)
    assert (config.intermediate_size, config.head_dim) == (37, 16)
    assert not hasattr(config, "max_position_embeddings")


def test_sdpa_equals_eager_attention_with_memory_and_padding():
    sdpa = make_model()
    eager = TransformerXLLMHeadModel(tiny_transformer_xl_config(attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    ids = torch.randint(1, 99, (2, 30))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        fused = run_chunks(sdpa, ids, [16])[0]
        explicit = run_chunks(eager, ids, [16])[0]
        torch.testing.assert_close(fused, explicit)
        padded = sdpa(ids, attention_mask=mask)
        torch.testing.assert_close(padded.logits, eager(ids, attention_mask=mask).logits)
        # Weights asked for are computed explicitly whatever the implementation.
        assert sdpa(ids, output_attentions=True).attentions[0].shape == (2, 2, 30, 6 + 8)
