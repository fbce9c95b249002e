"""Gate 1 of the memory (`hf_recurrence.experiments.memory_gates`, `experiments/memory_gate1.py`): the arms are the
settings they claim, the controls are wired so that they can only be at chance when nothing is carried (and are
caught when they are not), the goals judge every seed, and the script resumes a gate from its result file."""

import json

import pytest
import torch

from hf_recurrence.data import swap_earlier_windows
from hf_recurrence.experiments.key_recall import (
    Stage,
    build_models,
    check_curriculum,
    learning_rate_factor,
    recall_loss,
    task_data,
    train,
)
from hf_recurrence.experiments.memory_gates import (
    associative_arms,
    gate1_goals,
    is_control,
    key_recall_arms,
    plan_gate1,
    result_tables,
    run_arm,
)

from ..scripts import EXPERIMENTS, run_script, written


TINY = {
    "batch_size": 64,
    "lr": 2e-3,
    "num_filler": 16,
    "n_embd": 64,
    "n_head": 4,
    "insertion_layer": 1,
    "initializer_range": 0.1,
    "eval_size": 1024,
    "num_windows": 2,
    "recurrence_hidden_sizes": [64],
}


def model_of(task: str, window_size: int, n_layer: int, memory: dict):
    vocab, batches, _ = task_data(
        task, window_size=window_size, num_windows=2, num_keys=8, num_filler=16, num_values=8, num_pairs=2
    )
    model, _ = build_models(
        window_size=window_size,
        vocab=vocab,
        n_layer=n_layer,
        n_embd=32,
        n_head=2,
        insertion_layer=1,
        recurrence_hidden_sizes=[32],
        initializer_range=0.1,
        seed=0,
        memory=memory,
    )
    return model.eval(), batches


def test_the_plan_pairs_every_trained_arm_with_its_zero_input_twin_at_equal_steps():
    plan = plan_gate1(seeds=[0, 1, 2], common=TINY)
    by_group = {}
    for run in plan:
        by_group.setdefault((run["task"], run["window_size"]), {}).setdefault(run["arm"], []).append(run)
    assert list(by_group) == [("key", 16), ("key", 64), ("key", 128), ("associative", 32)]
    for (task, _), arms in by_group.items():
        assert all(len(runs) == 3 for runs in arms.values())
        # Equal steps for every arm of a task; 400 for key recall.
        assert len({run["kwargs"]["steps"] for runs in arms.values() for run in runs}) == 1
        if task == "key":
            assert arms["paper"][0]["kwargs"]["steps"] == 400
            assert arms["paper"][0]["kwargs"]["n_layer"] == 2
    key = key_recall_arms()
    assert key == {
        "paper": {},
        "attention": {"memory_pooling": "attention"},
        "zero_input": {"recurrence_input": "zeros"},
    }
    pairs = associative_arms(4)
    assert pairs["slots"] == {"memory_slots": 4, "memory_pooling": "attention"}
    assert pairs["slots_every_layer"]["memory_read_layers"] == [0, 1, 2, 3]
    # Each zero-input twin: its arm's settings, reading zeros (k=1: one twin for the mean and the attention arm).
    for twin, arm in (
        ("zero_input", "paper"),
        ("slots_zero_input", "slots"),
        ("slots_every_layer_zero_input", "slots_every_layer"),
    ):
        assert pairs[twin] == {**pairs[arm], "recurrence_input": "zeros"}
    assert {arm for arm, memory in pairs.items() if is_control(memory)} == {
        "zero_input",
        "slots_zero_input",
        "slots_every_layer_zero_input",
    }
    # The initial weights, the batches and the held-out rows depend on the seed: within a seed only the memory differs.
    for (task, window_size), arms in by_group.items():
        for seed in range(3):
            settings = [{**runs[seed]["kwargs"], "memory": None} for runs in arms.values()]
            assert all(other == settings[0] for other in settings), (task, window_size, seed)


def test_an_unknown_memory_setting_is_refused_not_ignored():
    with pytest.raises(ValueError, match=r"memory: \['memory_slotz'\] not recurrence settings"):
        model_of("key", 8, 2, {"memory_slotz": 4})


@pytest.mark.parametrize("task", ["key", "associative"])
def test_a_zero_input_twin_reads_no_earlier_window_and_the_paper_arm_does(task, one_thread):
    window_size = 8
    for memory, reads in (({}, True), ({"recurrence_input": "zeros"}, False)):
        model, batches = model_of(task, window_size, 2, memory)
        ids, _, _ = batches(16, torch.Generator().manual_seed(0))
        with torch.no_grad():
            own = model(ids, use_cache=False).logits[:, -window_size:]
            swapped = model(swap_earlier_windows(ids, window_size), use_cache=False).logits[:, -window_size:]
        assert (not torch.equal(own, swapped)) == reads, memory


def test_every_arm_of_the_gate_builds(one_thread):
    """The arms' settings are valid recurrence configs (once the core has the memory knobs), and the knobs change the
    model: a setting the config kept as an inert attribute would leave every arm the paper's."""
    parameters = {}
    for name, memory in {**key_recall_arms(), **associative_arms(4, selection=True)}.items():
        model, _ = model_of("associative", 8, 4, memory)
        for field, value in memory.items():
            assert getattr(model.config, field) == value, (name, field)
        parameters[name] = sum(p.numel() for p in model.parameters())
    assert parameters["attention"] > parameters["paper"]
    assert parameters["slots"] > parameters["attention"]
    assert parameters["slots_every_layer"] >= parameters["slots"]
    # One selecting query pair for the k slot queries.
    assert parameters["select_every_layer"] == parameters["slots_every_layer"] - 4 * 32 + 2 * 32


def test_trained_arms_carry_the_key_and_their_controls_stay_at_chance(one_thread):
    """The controls' wiring on a short run: the paper's arm learns key recall at T=8, and falls to chance when its
    earlier window is swapped; its zero-input twin stays at chance, its swapped score its own (it reads no window)."""
    plan = plan_gate1(
        seeds=[0],
        tasks=["key"],
        key_window_sizes=[8],
        key_steps=150,
        arms=["paper", "zero_input"],
        common=TINY,
        eval_every=50,
    )
    records = [run_arm(planned) for planned in plan]
    paper, zero = records
    chance = paper["chance"]
    assert chance == 1 / 8
    assert paper["accuracy"] >= 0.9, paper
    assert paper["swapped_accuracy"] <= chance + 0.05, paper
    assert zero["accuracy"] <= chance + 0.05, zero
    assert zero["swapped_accuracy"] == zero["accuracy"]
    assert [point["step"] for point in paper["curve"]] == [0, 50, 100, 150]
    assert paper["curve"][-1]["accuracy"] == paper["accuracy"]  # the curve scores every held-out row by default
    goals = gate1_goals(plan, records)
    assert [goal["passed"] for goal in goals] == [None, None, True]
    # Had the swap been wired wrong (the model reading its own window 0), the controls' goal catches it.
    miswired = [{**paper, "swapped_accuracy": paper["accuracy"]}, zero]
    assert gate1_goals(plan, miswired)[2]["passed"] is False
    assert "key/T=8/paper/seed=0 swapped" in gate1_goals(plan, miswired)[2]["line"]
    # So does a zero-input arm that reads its window after all.
    assert gate1_goals(plan, [paper, {**zero, "accuracy": paper["accuracy"]}])[2]["passed"] is False


def fake_records(plan, accuracy: dict[str, list[float]], swapped: float = 0.07, chance: dict | None = None):
    """Finished-run records of `plan` with the given final accuracies per `task/T/arm` (one per seed)."""
    records = []
    for run in plan:
        group = f"{run['task']}/T={run['window_size']}/{run['arm']}"
        value = accuracy.get(group, [0.06] * 3)[run["seed"]]
        records.append(
            {
                **run,
                "accuracy": value,
                "swapped_accuracy": swapped,
                "chance": 1 / 8 if run["task"] == "key" else 1 / 16,
                "curve": [{"step": 0, "accuracy": 0.0}, {"step": run["kwargs"]["steps"], "accuracy": value}],
                "train_seconds": 1.0,
                "seconds": 1.0,
                "cpu_seconds": 1.0,
            }
        )
    return records


def test_the_goals_are_judged_on_every_seed():
    plan = plan_gate1(seeds=[0, 1, 2], common=TINY)
    at_chance = {
        "key/T=64/zero_input": [0.12] * 3,
        "key/T=16/zero_input": [0.12] * 3,
        "key/T=128/zero_input": [0.12] * 3,
    }
    met = {
        **at_chance,
        "key/T=64/attention": [1.0, 0.99, 0.96],
        "key/T=64/paper": [0.13, 0.2, 0.3],
        "associative/T=32/slots": [0.95, 0.93, 0.91],
        "associative/T=32/paper": [0.31, 0.33, 0.4],
    }
    goals = gate1_goals(plan, fake_records(plan, met))
    assert [goal["passed"] for goal in goals] == [True, True, True], [goal["line"] for goal in goals]
    assert "Met by: slots." in goals[1]["line"]
    # One seed short fails a goal; so does a premise that does not hold (the paper's arm not failing).
    assert gate1_goals(plan, fake_records(plan, {**met, "key/T=64/attention": [1.0, 1.0, 0.94]}))[0]["passed"] is False
    premise = gate1_goals(plan, fake_records(plan, {**met, "key/T=64/paper": [0.13, 0.2, 0.5]}))[0]
    assert premise["passed"] is False and "the premise does not hold" in premise["line"]
    assert (
        gate1_goals(plan, fake_records(plan, {**met, "associative/T=32/slots": [0.95, 0.89, 0.91]}))[1]["passed"]
        is False
    )
    # A swapped score 0.021 above chance fails the controls' goal.
    assert gate1_goals(plan, fake_records(plan, met, swapped=1 / 16 + 0.021))[2]["passed"] is False
    # Unfinished arms leave a goal unjudged, and show as – in the tables.
    partial = fake_records(plan, met)[:5]
    assert gate1_goals(plan, partial)[0]["passed"] is None
    tables = result_tables(plan, partial)
    assert tables["key_recall"]["rows"][0][3:6] == ["0.060", "0.060", "–"]  # paper: seeds 0 and 1 finished


def test_the_script_records_each_run_and_a_rerun_resumes(tmp_path):
    output = tmp_path / "gate1.json"
    arguments = [
        *("--tasks", "key", "associative", "--seeds", "0", "--key-window-sizes", "8", "--key-steps", "4"),
        *("--associative-window-size", "8", "--associative-steps", "4", "--associative-layers", "2"),
        *("--eval-every", "2", "--eval-size", "32", "--curve-size", "16", "--device", "cpu"),
        *("--output-json", str(output)),
    ]
    first = run_script(EXPERIMENTS / "memory_gate1.py", *arguments, "--arms", "paper")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 runs planned, 0 recorded" in first.stdout
    first_runs = json.loads(output.read_text())["values"]["runs"]
    # A rerun that plans more resumes: the finished runs are kept, not trained again.
    second = run_script(EXPERIMENTS / "memory_gate1.py", *arguments, "--arms", "paper", "zero_input")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "4 runs planned, 2 recorded" in second.stdout
    assert "key/T=8/paper/seed=0 (k=1, mean): training" not in second.stdout
    assert "key/T=8/zero_input/seed=0 (k=1; zero input): training" in second.stdout
    recorded = written(output, EXPERIMENTS)
    runs = recorded["values"]["runs"]
    assert [run["id"] for run in runs] == [
        "key/T=8/paper/seed=0",
        "key/T=8/zero_input/seed=0",
        "associative/T=8/paper/seed=0",
        "associative/T=8/zero_input/seed=0",
    ]
    assert [runs[0], runs[2]] == first_runs
    assert recorded["values"]["finished"] is True and len(recorded["values"]["sessions"]) == 2
    assert [point["step"] for point in runs[0]["curve"]] == [0, 2, 4]
    assert set(recorded["tables"]) == {"key_recall", "associative_recall", "curves"}
    assert len(recorded["text"]["goals"]) == 3
    assert output.with_suffix(".png").exists()
    # A rerun with every run recorded trains nothing and keeps the sessions that ran, their date and machine.
    third = run_script(EXPERIMENTS / "memory_gate1.py", *arguments, "--arms", "paper", "zero_input")
    assert third.returncode == 0, third.stderr[-2000:]
    assert "4 runs planned, 4 recorded" in third.stdout and "): training" not in third.stdout
    again = json.loads(output.read_text())
    assert again["values"]["runs"] == runs and again["values"]["sessions"] == recorded["values"]["sessions"]
    assert (again["date"], again["machine"]) == (recorded["date"], recorded["machine"])
    # Runs recorded with other settings are not mixed in: the rerun is refused.
    other = run_script(EXPERIMENTS / "memory_gate1.py", *arguments, "--arms", "paper", "--lr", "0.001")
    assert other.returncode == 1 and "with other settings" in other.stderr


# The curriculum (`run_recall_experiment(curriculum=...)`): shorter windows first, within the run's steps.


def test_a_curriculum_stage_trains_on_its_own_window_layout_then_the_task_s(one_thread):
    model, _ = model_of("key", 16, 2, {})
    shapes = []

    def recording(window_size: int):
        _, batches, _ = task_data(
            "key", window_size=window_size, num_windows=2, num_keys=8, num_filler=16, num_values=8, num_pairs=2
        )

        def draw(batch_size, generator):
            ids, labels, answers = batches(batch_size, generator)
            shapes.append(tuple(ids.shape))
            return ids, labels, answers

        return draw

    steps_scored = []
    train(
        model,
        True,
        stages=[Stage(8, 2, recording(8)), Stage(16, 3, recording(16))],
        batch_size=4,
        lr=1e-3,
        data_seed=0,
        eval_every=2,
        evaluate=steps_scored.append,
    )
    assert shapes == [(4, 16)] * 2 + [(4, 32)] * 3
    assert steps_scored == [0, 2, 4, 5]  # counted over both stages


def test_a_short_stage_reads_the_windows_a_model_of_that_window_size_reads(one_thread):
    # The recurrent model of 16-token windows, given 8-token windows, computes the model built for 8-token windows.
    long_windows, batches = model_of("key", 16, 2, {"memory_pooling": "attention"})
    short_windows, _ = model_of("key", 8, 2, {"memory_pooling": "attention"})
    weights = long_windows.state_dict()
    # Positions restart in every window: the short model's position table is the long one's first 8 rows.
    weights["backbone.transformer.wpe.weight"] = weights["backbone.transformer.wpe.weight"][:8]
    short_windows.load_state_dict(weights)
    _, short_batches, _ = task_data(
        "key", window_size=8, num_windows=2, num_keys=8, num_filler=16, num_values=8, num_pairs=2
    )
    ids, labels, _ = short_batches(6, torch.Generator().manual_seed(0))
    with torch.no_grad():
        staged = recall_loss(long_windows, True, 8, ids, labels)
        built = recall_loss(short_windows, True, 8, ids, labels)
        whole = recall_loss(long_windows, True, 16, ids, labels)
    torch.testing.assert_close(staged, built)
    assert not torch.allclose(staged, whole)  # the 32 tokens as one 16-token window pair would be another input


@pytest.mark.parametrize(
    ("curriculum", "message"),
    [
        ([(32, 10)], r"stage \(32, 10\)"),
        ([(2, 10)], r"stage \(2, 10\)"),
        ([(8, 0)], r"stage \(8, 0\)"),
        ([(8, 5, 1)], r"stage \(8, 5, 1\)"),
        ([(8, 30), (12, 10)], "take 40 of steps=40"),
    ],
)
def test_a_bad_curriculum_is_refused_naming_the_stage(curriculum, message):
    with pytest.raises(ValueError, match=message):
        check_curriculum(curriculum, 16, 40)


def test_the_learning_rate_schedules():
    linear = learning_rate_factor("linear", 100)
    assert [linear(step) for step in (0, 9, 10, 55, 100)] == pytest.approx([0.1, 1.0, 1.0, 0.5, 0.0])
    constant = learning_rate_factor("constant", 100)
    assert {constant(step) for step in range(101)} == {1.0}
    with pytest.raises(ValueError, match="'cosine'"):
        learning_rate_factor("cosine", 100)


def test_the_plan_gives_each_longer_task_the_curriculum_and_leaves_the_recorded_plan_unchanged():
    plain = plan_gate1(seeds=[0], tasks=["key"], key_window_sizes=[16, 64], common=TINY)
    assert all("curriculum" not in p["kwargs"] for p in plain)
    staged = plan_gate1(
        seeds=[0],
        key_window_sizes=[16, 64],
        key_curriculum=[[16, 200]],
        associative_curriculum=[[8, 100]],
        common=TINY,
    )
    by_task = {(p["task"], p["window_size"]): p["kwargs"].get("curriculum") for p in staged}
    assert by_task == {("key", 16): None, ("key", 64): [[16, 200]], ("associative", 32): [[8, 100]]}
    assert [{k: v for k, v in p["kwargs"].items() if k != "curriculum"} for p in staged if p["task"] == "key"] == [
        p["kwargs"] for p in plain
    ]


def test_the_script_runs_a_curriculum_and_names_a_malformed_stage(tmp_path):
    output = tmp_path / "gate1.json"
    arguments = [
        *("--tasks", "key", "--seeds", "0", "--key-window-sizes", "8", "--key-steps", "4", "--arms", "attention"),
        *("--key-curriculum", "4:2", "--lr-schedule", "constant", "--eval-every", "2", "--eval-size", "32"),
        *("--curve-size", "16", "--device", "cpu", "--output-json", str(output)),
    ]
    staged = run_script(EXPERIMENTS / "memory_gate1.py", *arguments)
    assert staged.returncode == 0, staged.stderr[-2000:]
    run = json.loads(output.read_text())["values"]["runs"][0]
    assert (run["kwargs"]["curriculum"], run["kwargs"]["lr_schedule"]) == ([[4, 2]], "constant")
    assert (run["settings"]["curriculum"], run["settings"]["lr_schedule"]) == ([[4, 2]], "constant")
    assert "curriculum: key recall 2 steps at T=4" in json.loads(output.read_text())["text"]["settings"][0]
    malformed = run_script(EXPERIMENTS / "memory_gate1.py", *arguments[:-2], "--key-curriculum", "4x2")
    assert malformed.returncode == 2 and "'4x2': a curriculum stage is WINDOW:STEPS" in malformed.stderr


# The binding rerun's options: the selecting memory, the reference from above, a backbone pretrained to bind.


def test_the_binding_options_add_the_selection_the_reference_and_the_pretraining_to_4_pair_recall_only():
    plain = plan_gate1(seeds=[0], common=TINY)
    assert all(
        "pretraining_steps" not in p["kwargs"] and "bare_fraction" not in p["kwargs"] and "full_context" not in p
        for p in plain
    )
    plan = plan_gate1(
        seeds=[0, 1],
        common=TINY,
        selection_arms=True,
        full_context_reference=True,
        pretraining_steps=1500,
        bare_fraction=0.5,
    )
    pairs = [p for p in plan if p["task"] == "associative"]
    assert all(p["kwargs"]["pretraining_steps"] == 1500 and p["kwargs"]["bare_fraction"] == 0.5 for p in pairs)
    # The key task is as before: the bare task is 4-pair recall's.
    assert [p for p in plan if p["task"] == "key"] == [
        p for p in plan_gate1(seeds=[0, 1], common=TINY) if p["task"] == "key"
    ]
    arms = associative_arms(4, selection=True)
    assert arms["select_every_layer"] == {**arms["slots_every_layer"], "memory_pooling": "select"}
    assert arms["select_every_layer_zero_input"] == {**arms["select_every_layer"], "recurrence_input": "zeros"}
    reference = [p for p in pairs if p["arm"] == "full_context"]
    assert [p["seed"] for p in reference] == [0, 1]
    assert all(p["full_context"] is True and p["kwargs"]["memory"] == {} for p in reference)
    assert sum("full_context" in p for p in plan) == 2


def test_the_selecting_arm_can_meet_the_binding_goal_and_the_reference_is_a_row_of_its_own():
    plan = plan_gate1(
        seeds=[0, 1, 2], tasks=["associative"], common=TINY, selection_arms=True, full_context_reference=True
    )
    met = {
        "associative/T=32/select_every_layer": [0.98, 0.95, 0.97],
        "associative/T=32/full_context": [1.0, 1.0, 1.0],
        "associative/T=32/paper": [0.26, 0.25, 0.25],
    }
    goal = gate1_goals(plan, fake_records(plan, met))[1]
    assert goal["passed"] is True and "Met by: select_every_layer." in goal["line"], goal["line"]
    rows = {row[0]: row for row in result_tables(plan, fake_records(plan, met))["associative_recall"]["rows"]}
    assert rows["full_context"][1] == "none: full attention over both windows"
    assert rows["select_every_layer"][1] == "k=4, select, read at every layer"


def test_the_script_runs_the_reference_and_the_selection_on_a_pretrained_backbone(tmp_path):
    output = tmp_path / "gate1.json"
    arguments = [
        *("--tasks", "associative", "--seeds", "0", "--associative-window-size", "8", "--associative-steps", "4"),
        *("--associative-layers", "2", "--num-pairs", "2", "--selection-arms", "--full-context-reference"),
        *("--pretraining-steps", "2", "--bare-fraction", "0.5", "--arms", "select_every_layer", "full_context"),
        *("--eval-every", "2", "--eval-size", "32", "--curve-size", "16", "--device", "cpu"),
        *("--output-json", str(output)),
    ]
    result = run_script(EXPERIMENTS / "memory_gate1.py", *arguments)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "full_context/seed=0 (none: full attention over both windows): training" in result.stdout
    recorded = json.loads(output.read_text())
    select, reference = recorded["values"]["runs"]
    assert select["kwargs"]["memory"]["memory_pooling"] == "select" and "full_context" not in select
    assert reference["full_context"] is True
    assert select["settings"]["pretraining_steps"] == 2 and select["settings"]["bare_fraction"] == 0.5
    settings = recorded["text"]["settings"][0]
    assert (
        "4-pair recall: first 2 steps of the bare task" in settings and "bare rows as 0.5 of every batch" in settings
    )
    assert "key recall" not in settings
    assert (
        "NOT RUN" in recorded["text"]["goals"][0]
        and "this run plans no key recall at T=64" in recorded["text"]["goals"][0]
    )


def test_a_long_curve_is_tabled_at_every_n_th_step_and_its_last():
    plan = plan_gate1(seeds=[0], tasks=["associative"], arms=["paper"], common=TINY)
    record = fake_records(plan, {})[0]
    record["curve"] = [{"step": step, "accuracy": 0.1} for step in range(0, 3001, 100)]
    headers = result_tables(plan, [record])["curves"]["headers"]
    assert headers[4:] == [f"step {step}" for step in range(0, 3001, 300)]
    record["curve"] = [{"step": step, "accuracy": 0.1} for step in range(0, 601, 100)]
    assert result_tables(plan, [record])["curves"]["headers"][4:] == [f"step {step}" for step in range(0, 601, 100)]
