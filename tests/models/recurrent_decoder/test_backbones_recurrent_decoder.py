"""What the recurrence core (`RecurrentDecoderForCausalLM`) must do over every backbone, run over the backbone table
(`tests/families.py` BACKBONES, the shared base in `backbones.py`): its first window is the stock model, chunked calls carrying the state equal one
call, greedy generation past the position table equals an argmax loop, a left-padded row equals the row alone, a
saved state continues the text, the state detaches, resets and reorders, rows in lockstep plan their windows on the
host, attention weights come laid out by window position, and h_prev enters the insertion layer through the norm the
family's attention reads.
"""

import pytest
import torch

from hf_recurrence.models.recurrent_decoder import step_recurrent_decoder
from hf_recurrence.models.recurrent_decoder.configuration_recurrent_decoder import (
    PRE_ATTENTION_NORMS,
    rotary_refusal_reason,
)

from ...common import (
    ACROSS_KERNELS,
    assert_left_padded_rows_equal_the_rows_alone,
    attentions_and_hidden_states,
    chunked_logits,
    greedy_loop,
)
from ...families import BACKBONES
from .backbones import BY_NAME, REPRESENTATIVE, by_backbone, ids


@by_backbone()
def test_first_window_is_the_stock_model(backbone):
    model, stock = backbone.models()
    tokens = ids()
    with torch.no_grad():
        expected = stock(tokens[:, :8]).logits
        torch.testing.assert_close(model(tokens[:, :8]).logits, expected, **ACROSS_KERNELS)
        # The rest of a longer input does not change the first window.
        torch.testing.assert_close(model(tokens).logits[:, :8], expected, **ACROSS_KERNELS)
        # ... but the second window sees h_prev: the recurrence is there.
        alone = model(tokens[:, 8:16]).logits
        assert (model(tokens).logits[:, 8:16] - alone).abs().max() > 1e-3


# Every row at a few split points; the representative rows at every overlap and more split points besides (GPT-2 at
# every one: inside, at and across window boundaries), at least five windows for every overlap.
SPLITS = ((1,), (5,), (8,), (13, 14, 15, 16), (3, 11, 29, 30), (20,))
CHUNKINGS = [
    *((backbone, overlap, (3, 11, 28, 29)) for backbone in BACKBONES for overlap in (0, 3)),
    *(
        (backbone, overlap, splits)
        for backbone in REPRESENTATIVE
        for overlap in (0, 3, 7)
        for splits in (SPLITS if backbone.name == "gpt2" else SPLITS[3:5])
    ),
]


@pytest.mark.parametrize(
    ("backbone", "overlap", "splits"),
    CHUNKINGS,
    ids=[f"{b.name}-{o}-{'_'.join(map(str, s))}" for b, o, s in CHUNKINGS],
)
def test_chunked_calls_carrying_the_state_equal_one_call(backbone, overlap, splits):
    model, _ = backbone.models(window_overlap=overlap)
    tokens = ids(length=45)
    with torch.no_grad():
        whole = model(tokens).logits
        chunked, state = chunked_logits(model, tokens, splits)
    torch.testing.assert_close(chunked, whole)
    assert state.get_seq_length() == 45


@by_backbone(REPRESENTATIVE)
@pytest.mark.parametrize("overlap", [0, 3])
def test_token_by_token_equals_one_shot_and_keeps_one_window(backbone, overlap):
    model, _ = backbone.models(window_overlap=overlap)
    tokens = ids(length=42)
    with torch.no_grad():
        chunked, state = chunked_logits(model, tokens, list(range(1, 42)))
        torch.testing.assert_close(chunked, model(tokens).logits)
    assert state.slot_valid.shape[1] <= model.config.window_size


# Every row past the 16-entry position table; the representative rows over ten windows, at two overlaps.
GENERATIONS = [
    *((backbone, 2, 20) for backbone in BACKBONES),
    *((backbone, overlap, 80) for backbone in REPRESENTATIVE for overlap in (0, 3)),
]


@pytest.mark.parametrize(
    ("backbone", "overlap", "new_tokens"), GENERATIONS, ids=[f"{b.name}-{o}-{n}" for b, o, n in GENERATIONS]
)
def test_greedy_generate_past_the_position_table_equals_an_argmax_loop(backbone, overlap, new_tokens):
    model, _ = backbone.models(window_overlap=overlap)
    prompt = ids(length=4)
    generated = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
    )
    assert generated.shape[1] == 4 + new_tokens > model.config.text_config.max_position_embeddings
    assert torch.equal(generated, greedy_loop(model, prompt, new_tokens))


@by_backbone()
def test_left_padded_rows_equal_the_rows_alone(backbone):
    model, _ = backbone.models(window_overlap=2)
    tokens = ids(length=20)
    mask = assert_left_padded_rows_equal_the_rows_alone(model, tokens)
    generated = model.generate(tokens, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    alone = model.generate(tokens[1:, 5:], max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert torch.equal(generated[1, -6:], alone[0, -6:])


@by_backbone()
def test_a_saved_state_continues_the_text(backbone, tmp_path):
    model, _ = backbone.models(window_overlap=2)
    tokens = ids()
    with torch.no_grad():
        state = model(tokens[:, :13]).past_key_values
        state.save(tmp_path / "state.safetensors")
        expected = model(tokens[:, 13:], past_key_values=state).logits
        loaded = model.load_state(tmp_path / "state.safetensors")
        assert loaded.get_seq_length() == 13
        torch.testing.assert_close(model(tokens[:, 13:], past_key_values=loaded).logits, expected)


@by_backbone()
def test_h_prev_passes_the_norm_that_the_attention_reads(backbone):
    """The pre-attention norm of the family table is what the stock layer puts before its attention: h_prev enters
    the insertion layer like a token."""
    model, stock = backbone.models()
    layer = stock.base_model.layers[1] if hasattr(stock.base_model, "layers") else stock.base_model.h[1]
    attention = layer.self_attn if hasattr(layer, "self_attn") else layer.attn
    seen = {}
    hooks = [
        layer.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.update(layer=(args or [kwargs["hidden_states"]])[0]), with_kwargs=True
        ),
        attention.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.update(attention=(args or [kwargs["hidden_states"]])[0]), with_kwargs=True
        ),
    ]
    with torch.no_grad():
        stock(ids(length=8))
    for hook in hooks:
        hook.remove()
    norm_name = PRE_ATTENTION_NORMS[backbone.name]
    norm = getattr(layer, norm_name) if norm_name is not None else torch.nn.Identity()
    with torch.no_grad():
        torch.testing.assert_close(seen["attention"], norm(seen["layer"]))


@by_backbone()
def test_state_detach_reset_and_reorder(backbone):
    model, _ = backbone.models(window_overlap=2)
    tokens, following = ids(3, 20), ids(3, 9).flip(1)
    state = model.train()(tokens).past_key_values
    assert state.h_prev.requires_grad and state.pooled_sum.requires_grad
    assert state.detach() is state
    assert not any(
        t.requires_grad for t in [*state.keys, *state.values, *map(state.__getattribute__, state._BATCH_TENSORS)]
    )
    assert "seen_tokens=20" in repr(state)
    # The cache follows the model's dtype; the pooled sum stays in float32.
    state.to(dtype=torch.float64)
    assert state.keys[0].dtype == torch.float64 and state.pooled_sum.dtype == torch.float32
    model.eval()
    with torch.no_grad():
        continued = model(following, past_key_values=model(tokens).past_key_values).logits
        state = model(tokens).past_key_values
        order = torch.tensor([2, 2, 0])
        state.reorder_cache(order)
        torch.testing.assert_close(model(following[order], past_key_values=state).logits, continued[order])
        assert state.batch_size == 3 and torch.equal(state.h_prev[0], state.h_prev[1])
        state.reset()
        assert state.get_seq_length() == 0 and state.lockstep == (0, 0)
        assert int(state.fill.sum()) == 0 and state.slot_valid.shape[1] == 0
        torch.testing.assert_close(model(following, past_key_values=state).logits, model(following).logits)


def _scalar_reads(fn) -> int:
    """How many times `fn` reads a scalar from a tensor (a device-to-host sync on a GPU)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        fn()
    return sum(event.count for event in profiler.key_averages() if event.key == "aten::_local_scalar_dense")


@by_backbone()
def test_rows_in_lockstep_plan_their_windows_on_the_host(backbone):
    model, _ = backbone.models(window_overlap=3)
    tokens = ids()
    with torch.no_grad():
        assert model(tokens[:, :12]).past_key_values.lockstep == (7, 1)
        on_device = model.new_state(2)
        on_device.leave_lockstep()
        torch.testing.assert_close(model(tokens, past_key_values=on_device).logits, model(tokens).logits)
        # One read per call (whether the input has padding), none in the window loop or the stock forward.
        assert _scalar_reads(lambda: model(tokens)) == 1
        assert _scalar_reads(lambda: model(tokens, attention_mask=torch.ones_like(tokens))) == 1
        # A left-padded batch leaves the lockstep until the state is reset.
        mask = torch.ones_like(tokens)
        mask[0, :3] = 0
        padded = model(tokens, attention_mask=mask).past_key_values
        assert padded.lockstep is None and padded.reset().lockstep == (0, 0)


@by_backbone()
def test_single_token_steps_in_lockstep_attend_without_masks_as_masked_steps_do(backbone, monkeypatch):
    model, _ = backbone.models(window_overlap=3)
    tokens = ids()
    splits = range(4, tokens.shape[1])  # a prompt, then one token at a time across windows (with and without h_prev)
    with torch.no_grad():
        masked_state = model.new_state(2)
        masked_state.leave_lockstep()
        masked, _ = chunked_logits(model, tokens, splits, state=masked_state)
        masks_made = []
        real_masks = step_recurrent_decoder._attention_masks
        monkeypatch.setattr(
            step_recurrent_decoder,
            "_attention_masks",
            lambda real, *a: masks_made.append(real.shape) or real_masks(real, *a),
        )
        unmasked, state = chunked_logits(model, tokens, splits)
    # Eager attention (Gemma2's soft-cap) keeps its masks; sdpa builds none for a single column.
    eager = model.config._attn_implementation == "eager"
    assert state.lockstep is not None and (eager or all(cols > 1 for _, cols in masks_made))
    torch.testing.assert_close(unmasked, masked)


@by_backbone()
def test_attentions_are_laid_out_by_window_position(backbone):
    model, _ = backbone.models(window_overlap=3)
    tokens = ids()
    mask = torch.ones_like(tokens)
    mask[1, :5] = 0
    # Asking for the weights (eager attention for the call) does not change the result but by rounding.
    out = attentions_and_hidden_states(model, tokens, mask, 1 + 8, rtol=1e-5, atol=1e-5)
    for layer, weights in enumerate(out.attentions):
        # h_prev is attended at the insertion layer only, and only after a row's first window.
        h_prev = weights[..., 0]
        assert not h_prev[0, :, :8].any()
        assert bool(h_prev[0, :, 8:].all()) if layer == 1 else not h_prev.any()


ROTARY_AT_INSERTION = [b for b in BACKBONES if rotary_refusal_reason(b.text_config(), 1) is None]


@by_backbone(ROTARY_AT_INSERTION)
def test_a_rotated_h_prev_key_carries_the_state_and_changes_only_later_windows(backbone):
    model, _ = backbone.models(window_overlap=2, h_prev_rope_position=-1)
    unrotated, _ = backbone.models(window_overlap=2)
    tokens = ids()
    with torch.no_grad():
        whole = model(tokens).logits
        first = model(tokens[:, :13])
        rest = model(tokens[:, 13:], past_key_values=first.past_key_values)
        torch.testing.assert_close(torch.cat([first.logits, rest.logits], dim=1), whole)
        plain = unrotated(tokens).logits
    # Same weights: the first window has no h_prev, later windows see its key at another angle.
    torch.testing.assert_close(whole[:, :8], plain[:, :8])
    assert (whole[:, 8:] - plain[:, 8:]).abs().max() > 1e-4


@pytest.mark.parametrize(
    ("name", "reason"), [("gpt2", "no rotary position embeddings"), ("smollm3", "NoPE")], ids=["gpt2", "smollm3"]
)
def test_a_rotated_h_prev_key_is_refused_where_the_insertion_layer_is_not_rotary(name, reason):
    backbone = BY_NAME[name]
    with pytest.raises(
        ValueError, match=rf"h_prev_rope_position=-1 cannot be used over a '{name}' backbone: .*{reason}"
    ):
        backbone.models(h_prev_rope_position=-1)


@pytest.mark.parametrize("position", [1, -9])
def test_h_prev_rope_position_outside_the_trained_offsets_is_refused_naming_the_value(position):
    backbone = BY_NAME["llama"]
    with pytest.raises(ValueError, match=rf"h_prev_rope_position={position!r}"):
        backbone.models(h_prev_rope_position=position)
