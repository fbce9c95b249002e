"""The recurrence core's forward and its state's schedule, over the backbone table (shared base: `backbones.py`): what
a call returns with labels or without logits, settings changed after the model is built, left-padded rows, padding
that never grows the cache, a state with its own window schedule, bfloat16."""

import pytest
import torch

from hf_recurrence import RecurrentDecoderState

from ...common import ACROSS_KERNELS, chunked_logits
from .backbones import BY_NAME, REPRESENTATIVE, by_backbone, ids


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        # window_overlap == window_size left no room in a window: forward looped forever, memory growing.
        ({"window_overlap": 8}, "window_overlap=8"),
        ({"window_size": 4, "window_overlap": 4}, "window_overlap=4"),
        # These gave a bare IndexError from the position table or the block list.
        ({"window_size": 17}, "window_size=17 exceeds .*=16"),
        ({"window_size": 0}, "window_size=0"),
        (
            {"insertion_layer": 3},
            r"insertion_layer must be a layer index in \[0, num_hidden_layers=3\), got insertion_layer=3",
        ),
    ],
)
@by_backbone(REPRESENTATIVE)
def test_settings_changed_after_the_model_is_built_are_refused_at_forward(backbone, changes, match):
    model, _ = backbone.models()
    for name, value in changes.items():
        setattr(model.config, name, value)
    with pytest.raises(ValueError, match=match):
        model(ids(1, 20))


@by_backbone()
def test_labels_return_logits_in_eval_mode_only_and_num_items_in_batch_divides_the_summed_loss(backbone):
    model, _ = backbone.models()
    tokens = ids(length=20)
    # Evaluation (Trainer's prediction_step) gets the logits; training keeps the window-by-window loss.
    assert model(tokens, labels=tokens).logits.shape == (2, 20, 99)
    assert model(tokens, labels=tokens, return_logits=False).logits is None
    summed = model(tokens, labels=tokens, num_items_in_batch=1).loss
    torch.testing.assert_close(summed / (2 * 19), model(tokens, labels=tokens).loss)
    model.train()
    assert model(tokens, labels=tokens).logits is None
    assert model(tokens, labels=tokens, return_logits=True).logits.shape == (2, 20, 99)


@by_backbone()
def test_inputs_embeds_equal_input_ids(backbone):
    model, _ = backbone.models(window_overlap=2)
    tokens = ids()
    with torch.no_grad():
        embeds = model.get_input_embeddings()(tokens)
        torch.testing.assert_close(model(inputs_embeds=embeds).logits, model(tokens).logits)


def test_a_state_of_another_batch_size_is_refused():
    model, _ = BY_NAME["llama"].models()
    state = model(ids(2, 5)).past_key_values
    with pytest.raises(ValueError, match=r"batch_size=2 \(the input: 3\)"):
        model(ids(3, 1), past_key_values=state)


@by_backbone(REPRESENTATIVE)
def test_left_padded_rows_of_several_lengths_read_in_chunks_equal_each_row_alone(backbone):
    model, _ = backbone.models(window_overlap=3)
    lengths = [30, 23, 9]
    rows = [ids(1, n, seed=n) for n in lengths]
    width = max(lengths)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, row in enumerate(rows):
        tokens[i, width - row.shape[1] :] = row
        mask[i, width - row.shape[1] :] = 1
    with torch.no_grad():
        batched, state = chunked_logits(model, tokens, [7, 19], attention_mask=mask)
        for i, row in enumerate(rows):
            alone = model(row).logits
            torch.testing.assert_close(batched[i, width - row.shape[1] :], alone[0], atol=1e-5, rtol=1e-4)
    # A full window is closed lazily, when the next token arrives.
    assert state.fill.tolist() == [3 + (n - 9) % 5 + 1 if n > 8 else n for n in lengths]


@by_backbone(REPRESENTATIVE)
def test_padding_never_grows_the_cache_past_one_window(backbone):
    model, _ = backbone.models()
    state = model(ids(2, 3)).past_key_values
    for _ in range(5):
        pad = torch.zeros(2, 10, dtype=torch.long)
        state = model(pad, attention_mask=torch.zeros_like(pad), past_key_values=state).past_key_values
    assert state.slot_valid.shape[1] <= model.config.window_size
    assert state.fill.tolist() == [3, 3]


@by_backbone()
def test_the_state_is_returned_even_when_trainer_switched_config_use_cache_off(backbone):
    model, _ = backbone.models()
    model.config.use_cache = False
    tokens = ids(1, 10)
    assert isinstance(model(tokens).past_key_values, RecurrentDecoderState)
    assert model(tokens, use_cache=False).past_key_values is None
    # return_logits=False without labels returns only the state.
    out = model(ids(1, 20), return_logits=False)
    assert out.logits is None and out.loss is None and out.past_key_values.get_seq_length() == 20


@by_backbone(REPRESENTATIVE)
def test_a_state_with_its_own_schedule_reads_like_a_model_configured_with_it(backbone):
    model, _ = backbone.models(window_overlap=2)
    resized, _ = backbone.models(window_overlap=2, window_size=12)
    resized.load_state_dict(model.state_dict())
    tokens = ids(length=40)
    with torch.no_grad():
        state = model.new_state(2, window_size=12)
        logits = model(tokens, past_key_values=state).logits
        # Same weights in two model objects: a stated tolerance, not exact equality.
        torch.testing.assert_close(logits, resized(tokens).logits, **ACROSS_KERNELS)
    assert model.config.window_size == 8
    assert (state.window_size, state.window_overlap) == (12, 2)


@by_backbone(REPRESENTATIVE)
def test_the_schedule_of_a_run_comes_from_its_state_not_the_config(backbone):
    model, _ = backbone.models()
    tokens = ids(1, 30)
    with torch.no_grad():
        expected = model(tokens).logits
        state = model(tokens[:, :13]).past_key_values
        model.config.window_size = 12  # changed mid-run: the state keeps the schedule it started with
        continued = model(tokens[:, 13:], past_key_values=state).logits
    torch.testing.assert_close(continued, expected[:, 13:], **ACROSS_KERNELS)


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        ({"window_size": 17}, "window_size=17 exceeds .*=16"),
        ({"window_size": 0}, "window_size=0"),
        ({"window_size": 4, "window_overlap": 4}, "window_overlap=4"),
    ],
)
def test_an_invalid_state_schedule_is_refused(schedule, match):
    model, _ = BY_NAME["llama"].models()
    with pytest.raises(ValueError, match=match):
        model.new_state(1, **schedule)


def test_the_schedule_is_fixed_for_the_states_life():
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    state = model.new_state(1)
    with pytest.raises(AttributeError):
        state.window_overlap = 3


@by_backbone(REPRESENTATIVE)
def test_bfloat16_runs_and_keeps_the_pooled_sum_in_float32(backbone):
    model, _ = backbone.models(window_overlap=2)
    model.to(torch.bfloat16)
    tokens = ids(length=40)
    with torch.no_grad():
        out = model(tokens)
        chunked, state = chunked_logits(model, tokens, [9, 17])
    assert out.logits.dtype == torch.bfloat16 and state.keys[0].dtype == torch.bfloat16
    assert state.pooled_sum.dtype == torch.float32
    torch.testing.assert_close(chunked.float(), out.logits.float(), atol=0.1, rtol=0.05)
    prompt = tokens[:, :3]
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, min_new_tokens=30, do_sample=False
    )
    assert generated.shape == (2, 33)


@by_backbone()
def test_the_cache_is_per_key_value_head(backbone):
    model, _ = backbone.models()
    out = model(ids(3, 21))
    text_config = model.config.text_config
    heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    assert out.past_key_values.keys[1].shape[:2] == (3, heads)
