"""`experiments/memory_binding.py`: each variant is the gate's 4-pair arm with the one change it names, its record
says how often the answer is one of the row's stored values, and a rerun resumes or refuses other settings."""

import contextlib
import json
import runpy
from collections.abc import Iterator

import pytest
import torch

from hf_recurrence.data import AssociativeVocab
from hf_recurrence.models.recurrent_decoder.step_recurrent_decoder import RecurrentDecoderRecurrence

from ..scripts import EXPERIMENTS, run_script, written
from .test_memory_gates import model_of


# model_of's associative vocabulary (16 fillers, 8 keys, 8 values; 2 pairs per row).
VOCAB = AssociativeVocab(num_filler=16, num_keys=8, num_values=8)


def slots_at_both_layers(slots: int) -> dict:
    """The memory of the gate's arm on model_of's 2-layer models: attention slots read at every layer."""
    return {"memory_slots": slots, "memory_pooling": "attention", "memory_read_layers": [0, 1]}


@pytest.fixture
def script(monkeypatch) -> dict:
    """The namespace of experiments/memory_binding.py (whose `import _common` resolves from experiments/)."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    return runpy.run_path(str(EXPERIMENTS / "memory_binding.py"))


@contextlib.contextmanager
def spying_on_pool(model) -> Iterator[list]:
    """Records, per pooling while active, `model`'s source states and what the pooling in place (a patched writer's)
    returned. Set and undone by hand: monkeypatch would put the patched writer back on the class at teardown, and
    every later test would pool by it."""
    writer, pooled = RecurrentDecoderRecurrence.pool, []

    def spy(recurrence, layer_states, *args):
        pooled.append((recurrence._source_states(layer_states, model.config), writer(recurrence, layer_states, *args)))
        return pooled[-1][1]

    RecurrentDecoderRecurrence.pool = spy
    try:
        yield pooled
    finally:
        RecurrentDecoderRecurrence.pool = writer


def test_the_script_records_each_variant_and_a_rerun_resumes(tmp_path):
    output = tmp_path / "binding.json"
    arguments = [
        *("--steps", "4", "--curriculum-steps", "2", "--eval-size", "32", "--device", "cpu"),
        *("--output-json", str(output)),
    ]
    first = run_script(EXPERIMENTS / "memory_binding.py", *arguments, "--variants", "slots_every_layer", "pairs_2")
    assert first.returncode == 0, first.stderr[-2000:]
    runs = written(output, EXPERIMENTS)["values"]["runs"]
    assert list(runs) == ["slots_every_layer", "pairs_2"]
    arm, pairs = runs["slots_every_layer"], runs["pairs_2"]
    assert arm["kwargs"]["memory"] == {
        "memory_slots": 4,
        "memory_pooling": "attention",
        "memory_read_layers": [0, 1, 2, 3],
    }
    assert arm["kwargs"]["curriculum"] == [[8, 2]] and arm["kwargs"]["steps"] == 4
    # The variant changes only what it names.
    assert {k: v for k, v in pairs["kwargs"].items() if arm["kwargs"][k] != v} == {"num_pairs": 2}
    for record in runs.values():
        assert 0 <= record["row_value_rate"] <= 1 and 0 <= record["accuracy"] <= record["row_value_rate"]
    # A rerun skips what is recorded and adds what is asked; other settings are refused, naming the variant.
    second = run_script(EXPERIMENTS / "memory_binding.py", *arguments, "--variants", "slots_every_layer", "paper")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "slots_every_layer (" not in second.stdout and "paper (" in second.stdout
    again = json.loads(output.read_text())["values"]["runs"]
    assert list(again) == ["slots_every_layer", "paper", "pairs_2"] and again["pairs_2"] == pairs
    assert again["paper"]["kwargs"]["memory"] == {}
    other = run_script(EXPERIMENTS / "memory_binding.py", *arguments, "--steps", "5", "--variants", "pairs_2")
    assert other.returncode == 1 and "'pairs_2' run with other settings" in other.stderr


def test_the_full_context_reference_is_a_stock_gpt2_reading_both_windows(tmp_path):
    output = tmp_path / "binding.json"
    arguments = [
        *("--steps", "4", "--curriculum-steps", "2", "--eval-size", "32", "--device", "cpu"),
        *("--output-json", str(output), "--variants", "full_context"),
    ]
    finished = run_script(EXPERIMENTS / "memory_binding.py", *arguments)
    assert finished.returncode == 0, finished.stderr[-2000:]
    result = written(output, EXPERIMENTS)
    record = result["values"]["runs"]["full_context"]
    assert record["full_context"] is True
    assert record["settings"]["baseline_context"] == "full" and record["settings"]["recurrent"] is False
    assert 0 <= record["accuracy"] <= record["row_value_rate"] <= 1
    assert [point["step"] for point in record["curve"]] == [0, 4]
    row = next(row for row in result["tables"]["variants"]["rows"] if row[0] == "full_context")
    assert row[2] == "none: full attention over both windows"


@pytest.mark.parametrize("mode", ["value", "key_value"])
def test_the_oracle_writer_pools_each_pair_into_its_own_slot_and_is_undone_after(mode, script, one_thread):
    vocab, window, pairs = VOCAB, 16, 2
    memory = slots_at_both_layers(pairs)
    model, batches = model_of("associative", window, 2, memory)
    ids, _, _ = batches(3, torch.Generator().manual_seed(0))
    original = RecurrentDecoderRecurrence.pool
    with script["oracle_writer"](mode, vocab, pairs), spying_on_pool(model) as pooled:
        model(ids, use_cache=False)
    assert RecurrentDecoderRecurrence.pool is original
    states, (total, weight, reference) = pooled[0]  # window 0
    for row in range(3):
        value_columns = [c for c in range(window) if ids[row, c] >= vocab.value_offset]
        expected = states[row, value_columns]
        if mode == "key_value":
            expected = expected + states[row, [c - 1 for c in value_columns]]
        torch.testing.assert_close(total[row], expected)
    assert torch.equal(weight, torch.ones(3, pairs)) and torch.equal(reference, torch.zeros(3, pairs))
    # The last window pools as configured: softmax slots over its 16 columns.
    assert len(pooled) == 2 and torch.allclose(pooled[1][1][1], torch.full((3, pairs), 16.0))


@pytest.mark.parametrize("select", ["learned", "values"])
def test_the_selecting_writer_keeps_the_best_scoring_tokens_with_their_predecessors(select, script, one_thread):
    vocab, window, slots = VOCAB, 16, 2
    memory = slots_at_both_layers(slots)
    original = (RecurrentDecoderRecurrence.pool, RecurrentDecoderRecurrence.__init__)
    with script["selecting_writer"](select, vocab) as kept_values:
        model, batches = model_of("associative", window, 2, memory)
        ids, labels, _ = batches(3, torch.Generator().manual_seed(0))
        with spying_on_pool(model) as pooled:
            model(ids, labels=labels, use_cache=False).loss.backward()
            with torch.no_grad():
                model(ids, use_cache=False)
    assert (RecurrentDecoderRecurrence.pool, RecurrentDecoderRecurrence.__init__) == original
    scores = model.recurrence.selection_scores
    # Zero at first; trained by the loss through the kept tokens' gates.
    assert scores.shape == (2, 32) and scores.grad is not None and scores.grad.abs().sum() > 0
    states, (total, weight, reference) = pooled[0]  # window 0 of the trained call
    previous = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
    for row in range(3):
        if select == "values":
            # Every value token, each with its key (the token before it), scaled by 2 sigmoid(FORCED_SCORE).
            columns = [c for c in range(window) if ids[row, c] >= vocab.value_offset]
            gate = 2 * torch.sigmoid(torch.tensor(script["FORCED_SCORE"]))
        else:
            columns, gate = [window - 2, window - 1], torch.tensor(1.0)  # zero scores: the latest tokens
        expected = (states[row, columns] + previous[row, columns]) * gate
        torch.testing.assert_close(total[row], expected)
    assert torch.equal(weight, torch.ones(3, slots)) and torch.equal(reference, torch.zeros(3, slots))
    # The share of kept value tokens is recorded for the scoring, not for training.
    assert len(pooled) == 4 and len(kept_values) == 1
    assert kept_values[0] == (
        1.0 if select == "values" else float((ids[:, window - 2 : window] >= vocab.value_offset).float().mean())
    )


def kept_columns(window_0) -> torch.Tensor:
    """(rows, slots): the window columns a selecting writer kept, from what `spying_on_pool` saw of window 0; each
    slot is one column's states with its predecessor's, scaled by its gate."""
    states, (total, _, _) = window_0
    candidates = states + torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
    # (rows, slots, window)
    similarity = torch.nn.functional.cosine_similarity(total[:, :, None], candidates[:, None], dim=-1)
    assert torch.all(similarity.max(-1).values > 1 - 1e-5)
    return similarity.argmax(-1)


def test_the_writer_that_keeps_the_values_first_learns_its_choice_after(script, one_thread):
    window, slots = 16, 2  # model_of's rows hold 2 pairs
    with script["selecting_writer"]("values_first", VOCAB, forced_steps=1):
        model, batches = model_of("associative", window, 2, slots_at_both_layers(slots))
        ids, labels, _ = batches(3, torch.Generator().manual_seed(0))
        with spying_on_pool(model) as pooled:
            for _ in range(2):
                model(ids, labels=labels, use_cache=False)
    values = torch.stack([(row >= VOCAB.value_offset).nonzero()[:, 0] for row in ids[:, :window]])
    assert values.shape == (3, slots) and torch.equal(kept_columns(pooled[0]), values)
    # Then by the scores alone (all zero, no step taken: the latest tokens).
    assert torch.equal(kept_columns(pooled[2]), torch.arange(window - slots, window).expand(3, slots))


def test_the_sampling_writer_tries_every_token_in_training_and_keeps_the_best_when_scoring(script, one_thread):
    window, slots, rows = 16, 2, 64
    with script["selecting_writer"]("sampled", VOCAB):
        model, batches = model_of("associative", window, 2, slots_at_both_layers(slots))
        ids, labels, _ = batches(rows, torch.Generator().manual_seed(0))
        with spying_on_pool(model) as pooled:
            model(ids, labels=labels, use_cache=False)
            with torch.no_grad():
                model(ids, use_cache=False)
    trained, scored = kept_columns(pooled[0]), kept_columns(pooled[2])
    # In training, a sample: every column is kept in some row, in window order, never twice in a row.
    assert set(trained.flatten().tolist()) == set(range(window))
    assert torch.all(trained[:, 1:] > trained[:, :-1])
    # Scoring: the best scores alone (all zero: the latest tokens).
    assert torch.equal(scored, torch.tensor([window - 2, window - 1]).expand(rows, slots))


def test_a_writer_of_another_name_is_refused(script):
    with (
        pytest.raises(ValueError, match="selection must be one of .* got 'best'"),
        script["selecting_writer"]("best", VOCAB),
    ):
        pass
    with (
        pytest.raises(ValueError, match="oracle must be one of .* got 'key'"),
        script["oracle_writer"]("key", VOCAB, 2),
    ):
        pass


def test_the_recorded_command_drops_the_variants_once_every_variant_is_recorded(script, monkeypatch):
    argv = [str(EXPERIMENTS / "memory_binding.py"), "--variants", "paper", "pairs_2", "--steps", "9"]
    monkeypatch.setattr("sys.argv", argv)
    every = dict.fromkeys(script["VARIANTS"], {})
    assert script["reproducing_command"](every) == "python experiments/memory_binding.py --steps 9"
    some = {"paper": {}, "pairs_2": {}}
    assert (
        script["reproducing_command"](some)
        == "python experiments/memory_binding.py --variants paper pairs_2 --steps 9"
    )


def test_the_straight_through_writer_keeps_its_choice_unscaled_and_every_score_learns(script, one_thread):
    window, slots = 16, 2
    with script["selecting_writer"]("straight_through", VOCAB):
        model, batches = model_of("associative", window, 2, slots_at_both_layers(slots))
        ids, labels, _ = batches(3, torch.Generator().manual_seed(0))
        with spying_on_pool(model) as pooled:
            model(ids, labels=labels, use_cache=False).loss.backward()
    states, (total, _, _) = pooled[0]
    previous = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
    # The forward is the hard choice (zero scores: the latest tokens), unscaled; the scores learn through the soft mix.
    torch.testing.assert_close(total, (states + previous)[:, window - slots :])
    token_scores, previous_scores = model.recurrence.selection_scores.grad
    assert token_scores.abs().sum() > 0 and previous_scores.abs().sum() > 0


def test_the_projected_shift_adds_the_predecessor_through_its_projection(script, one_thread):
    window, slots = 16, 2
    with script["selecting_writer"]("values", VOCAB, shift="projected"):
        model, batches = model_of("associative", window, 2, slots_at_both_layers(slots))
        ids, _, _ = batches(3, torch.Generator().manual_seed(0))
        with spying_on_pool(model) as pooled, torch.no_grad():
            model(ids, use_cache=False)
    projection = model.recurrence.previous_projection.detach()
    torch.testing.assert_close(projection @ projection.T, torch.eye(32), atol=1e-5, rtol=0)  # orthogonal at first
    states, (total, _, _) = pooled[0]
    previous = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
    gate = 2 * torch.sigmoid(torch.tensor(script["FORCED_SCORE"]))
    for row in range(3):
        columns = [c for c in range(window) if ids[row, c] >= VOCAB.value_offset]
        torch.testing.assert_close(total[row], (states[row, columns] + previous[row, columns] @ projection) * gate)
    with (
        pytest.raises(ValueError, match="shift must be one of .* got 'rotated'"),
        script["selecting_writer"]("values", VOCAB, shift="rotated"),
    ):
        pass


def test_the_memory_token_writer_slots_are_the_backbones_states_at_its_tokens(script, one_thread):
    window, slots = 16, 2
    with script["memory_token_writer"]():
        model, batches = model_of("associative", window, 2, slots_at_both_layers(slots))
        ids, labels, _ = batches(3, torch.Generator().manual_seed(0))
        with spying_on_pool(model) as pooled:
            model(ids, labels=labels, use_cache=False).loss.backward()
    _, (total, weight, _) = pooled[0]
    backbone = model.backbone.base_model
    attention = backbone.config._attn_implementation
    assert attention.startswith("recurrent_")  # put back after the writer's own read of the window
    tokens = model.recurrence.memory_token_embeddings
    assert tokens.grad is not None and tokens.grad.abs().sum() > 0
    embeds = torch.cat([backbone.get_input_embeddings()(ids[:, :window]), tokens.expand(3, -1, -1)], 1)
    positions = torch.tensor([*range(window), window - 1, window - 1]).expand(3, -1)
    backbone.config._attn_implementation_internal = "eager"
    try:
        with torch.no_grad():
            expected = backbone(inputs_embeds=embeds, position_ids=positions).last_hidden_state[:, window:]
    finally:
        backbone.config._attn_implementation_internal = attention
    torch.testing.assert_close(total, expected, rtol=1e-4, atol=1e-5)
    assert torch.equal(weight, torch.ones(3, slots))
