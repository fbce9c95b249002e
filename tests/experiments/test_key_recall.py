"""Acceptance: the recurrence carries information across windows.

On the key-recall task (`hf_recurrence.experiments.key_recall`) the key is only in the window before the answer, so only
`h_prev` can carry it. A short CPU run of a tiny recurrent GPT-2 must solve it, while the same GPT-2 with the
recurrence output masked out (a stock `GPT2LMHeadModel` with the same initial weights, reading each window on its
own) stays at chance, and the trained recurrent model falls to chance when its earlier window comes from another row.
"""

import pytest

from hf_recurrence.experiments import key_recall
from hf_recurrence.experiments.key_recall import run_recall_experiment
from hf_recurrence.experiments.memory_gates import plan_gate1, run_arm


def test_recurrence_carries_the_key_to_the_next_window(one_thread):
    num_keys = 8
    result = run_recall_experiment(
        steps=150,
        seed=0,
        batch_size=64,
        lr=2e-3,
        window_size=8,
        num_windows=2,
        num_keys=num_keys,
        num_filler=16,
        n_layer=2,
        n_embd=64,
        n_head=4,
        insertion_layer=1,
        recurrence_hidden_sizes=(64,),
        initializer_range=0.1,
        eval_size=1024,
    )
    chance = 1 / num_keys
    summary = {k: round(v, 3) for k, v in result.items() if k.endswith("_accuracy")}
    assert result["recurrent_accuracy"] >= 0.9, summary
    assert result["baseline_accuracy"] <= chance + 0.1, summary
    assert result["recurrent_accuracy"] - result["baseline_accuracy"] >= 0.6, summary
    # The answer comes from the earlier window: with another row's earlier window, the row's own key is not recalled.
    assert result["swapped_accuracy"] <= chance + 0.1, summary


def test_a_selecting_memory_learns_to_keep_the_key(one_thread):
    """One selected token (with its predecessor) carries the key only if it is the key or the token after it. A choice
    that kept its start, the window's last token, would hold the key in 2 rows of 8 and recall at most about 0.34; so
    recall near 1 shows the straight-through gradient taught the scores to pick the key."""
    result = run_recall_experiment(
        steps=150,
        seed=0,
        window_size=8,
        num_keys=8,
        num_filler=16,
        eval_size=1024,
        baseline=False,
        memory={"memory_pooling": "select"},
    )
    assert result["recurrent_accuracy"] >= 0.9, result["recurrent_accuracy"]
    assert result["swapped_accuracy"] <= 1 / 8 + 0.05, result["swapped_accuracy"]


def test_a_baseline_with_full_context_reads_the_key_across_windows(one_thread):
    # The reference from above: with positions for the whole row and full attention over it, the stock GPT-2 reads
    # the key in window 0 itself. Reading each window alone (the default baseline) it could not beat chance.
    settings = {"steps": 100, "seed": 0, "window_size": 8, "num_filler": 16, "eval_size": 512, "eval_every": 50}
    result = run_recall_experiment(**settings, baseline_context="full", recurrent=False)
    chance = 1 / 8
    assert result["baseline_accuracy"] >= 0.9, result["baseline_accuracy"]
    assert result["baseline_curve"][-1] == {"step": 100, "accuracy": result["baseline_accuracy"]}
    # Another row's window 0, its own key asked: the answer is the other row's key.
    assert result["swapped_accuracy"] <= chance + 0.05, result["swapped_accuracy"]
    assert not any(name.startswith("recurrent_") for name in result)
    assert result["settings"]["baseline_context"] == "full" and result["settings"]["recurrent"] is False


def test_a_run_with_no_model_or_an_unknown_baseline_context_is_refused():
    with pytest.raises(ValueError, match="baseline_context must be one of .*'whole'"):
        run_recall_experiment(baseline_context="whole")
    with pytest.raises(ValueError, match="no model to train"):
        run_recall_experiment(recurrent=False, baseline=False)


def test_pretraining_on_the_bare_task_comes_first_and_each_model_reads_it_as_it_reads_the_task(monkeypatch):
    read = []

    def recording_loss(model, recurrent, window_size, ids, labels):
        read.append((recurrent, window_size, int((labels != -100).sum()) // ids.shape[0]))
        return original(model, recurrent, window_size, ids, labels)

    original = key_recall.recall_loss
    monkeypatch.setattr(key_recall, "recall_loss", recording_loss)
    settings = {"steps": 3, "window_size": 16, "task": "associative", "num_keys": 8, "num_values": 8}
    result = run_recall_experiment(
        **settings,
        num_filler=8,
        eval_size=16,
        eval_every=2,
        pretraining_steps=2,
        curriculum=[(8, 1)],
        baseline_context="full",
    )
    # Pretraining (2 steps, every question of the 2 blocks a row labelled), then the curriculum and the task (one
    # label a row); the recurrent model in its 16-token windows, the full-context baseline the 32-token rows whole.
    assert (
        read
        == [(True, 16, 8)] * 2
        + [(True, 8, 1)]
        + [(True, 16, 1)] * 2
        + [(False, 32, 8)] * 2
        + [(False, 16, 1)]
        + [(False, 32, 1)] * 2
    )
    assert [point["step"] for point in result["recurrent_curve"]] == [0, 2, 4, 5]
    assert result["settings"]["pretraining_steps"] == 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"task": "key"}, "need task='associative' \\(got 'key'\\)"),
        ({"window_size": 24}, "4 \\* num_pairs = 16 tokens \\(got 24\\)"),
    ],
)
def test_pretraining_refuses_the_key_task_and_windows_that_cut_a_block(settings, message):
    with pytest.raises(ValueError, match=message):
        run_recall_experiment(**{"task": "associative", "window_size": 32, **settings}, pretraining_steps=1)
    with pytest.raises(ValueError, match=message):
        run_recall_experiment(**{"task": "associative", "window_size": 32, **settings}, bare_fraction=0.5)


def test_a_bare_fraction_mixes_bare_rows_into_the_tasks_batches_after_the_curriculum(monkeypatch):
    batches = []

    def recording_loss(model, recurrent, window_size, ids, labels):
        batches.append((window_size, ids.clone(), labels.clone()))
        return original(model, recurrent, window_size, ids, labels)

    original = key_recall.recall_loss
    monkeypatch.setattr(key_recall, "recall_loss", recording_loss)
    run_recall_experiment(
        steps=3,
        batch_size=8,
        window_size=16,
        task="associative",
        num_filler=8,
        num_keys=8,
        num_values=8,
        eval_size=16,
        baseline=False,
        curriculum=[(8, 1)],
        bare_fraction=0.5,
    )
    (short, *_), task_batches = batches[0], batches[1:]
    assert short == 8 and len(task_batches) == 2
    for window_size, ids, labels in task_batches:
        labelled = (labels != -100).sum(1)
        # 4 bare rows (no filler; every question of the 2 blocks labelled), then 4 of the task (its answer alone).
        assert window_size == 16 and labelled.tolist() == [8] * 4 + [1] * 4
        assert (ids[:4] >= 8).all() and (ids[4:] < 8).any(1).all()
    with pytest.raises(ValueError, match="bare_fraction must be in \\[0, 1\\): the share of a batch's rows, got 1"):
        run_recall_experiment(task="associative", window_size=32, bare_fraction=1)


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_after_a_curriculum_the_memory_carries_one_key_among_64_tokens(pooling, one_thread):
    # Trained at 64-token windows from the start, every arm stays at chance (the memory gates' page); after 150
    # steps at 8-token windows and 150 at 32, both poolings carry the key, and the zero-input twin does not.
    settings = {
        "steps": 400,
        "seed": 0,
        "window_size": 64,
        "num_keys": 8,
        "eval_size": 1024,
        "baseline": False,
        "curriculum": [(8, 150), (32, 150)],
    }
    trained = run_recall_experiment(**settings, memory={"memory_pooling": pooling})
    twin = run_recall_experiment(**settings, memory={"recurrence_input": "zeros"})
    chance = 1 / 8
    assert trained["recurrent_accuracy"] >= 0.9, trained["recurrent_accuracy"]
    assert trained["swapped_accuracy"] <= chance + 0.05, trained["swapped_accuracy"]
    assert twin["recurrent_accuracy"] <= chance + 0.05, twin["recurrent_accuracy"]


@pytest.mark.slow
def test_on_a_backbone_that_binds_the_selecting_memory_carries_4_bound_pairs(one_thread):
    # Memory gate 1's binding rerun on its pilot seed (docs/experiments/memory_gates.md): after 1,500 steps of the bare
    # task and with half of every batch bare rows, 4 selected tokens read at every layer recall the value of the key
    # asked; 4 attention slots, the same otherwise, stay at the unbound 1/4.
    plan = plan_gate1(
        seeds=[0],
        tasks=["associative"],
        associative_steps=1500,
        associative_curriculum=[[8, 300]],
        arms=["select_every_layer", "slots_every_layer"],
        common={"lr": 1e-3, "eval_size": 1024},
        eval_every=1500,
        selection_arms=True,
        pretraining_steps=1500,
        bare_fraction=0.5,
    )
    pooling, selecting = (run_arm(planned) for planned in plan)
    assert selecting["accuracy"] >= 0.9, selecting["accuracy"]
    assert selecting["swapped_accuracy"] <= 1 / 16 + 0.03, selecting["swapped_accuracy"]
    assert pooling["accuracy"] <= 0.3, pooling["accuracy"]
