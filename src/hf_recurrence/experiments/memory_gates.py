# SPDX-License-Identifier: Apache-2.0
"""The memory's gates (issue 39): which writer and reader of `h_prev` carry context, each arm against its controls.

Gate 1, the toy from scratch (`experiments/memory_gate1.py` runs and records it):

- key recall (`hf_recurrence.data.key_recall`: one key among the `window_size` tokens of window 0, asked at the end of
  window 1) at several window sizes, with the key-recall toy's 2-layer GPT-2; arms `paper` (k=1, mean pooling: the
  paper's recurrence) and `attention` (k=1, one learned query over the window), and their zero-input twin;
- 4-pair associative recall (`hf_recurrence.data.associative_recall`) with a 4-layer reader; arms `paper`,
  `attention`, `slots` (k=4 attention queries, read at the insertion layer) and `slots_every_layer` (the same slots
  read at every layer), each with its zero-input twin.

A zero-input twin (`recurrence_input="zeros"`) is the same model whose recurrence reads zeros instead of the window:
its `h_prev` is k learned constants, so it can learn a window start but carries nothing. With k=1 the pooling of a
zero input is irrelevant, so one twin serves both k=1 arms. Every arm is trained from the same initial seed on the same
batches for the same steps, and scored on the same held-out rows, also with every row's earlier window swapped in
from another row (`swap_earlier_windows`): an arm that reads its answer from `h_prev` then falls to chance.

Everything here is data and arithmetic over the runs' records (`run_arm` makes one); the script owns the files.
"""

import datetime
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .key_recall import run_recall_experiment


ZEROS = {"recurrence_input": "zeros"}
ATTENTION = {"memory_pooling": "attention"}


def key_recall_arms() -> dict[str, dict]:
    """Name -> the memory settings (`RecurrentGPT2Config` fields) of the key-recall arms; the paper is `{}`."""
    return {"paper": {}, "attention": dict(ATTENTION), "zero_input": dict(ZEROS)}


def associative_arms(n_layer: int, slots: int = 4, selection: bool = False) -> dict[str, dict]:
    """Name -> the memory settings of the associative-recall arms of a reader with `n_layer` layers; each zero-input
    twin is its arm's settings with `recurrence_input="zeros"` (k=1: one twin for both pooling arms). `selection`
    adds the selecting memory (`memory_pooling="select"`, k slots read at every layer) and its twin."""
    k_slots = {"memory_slots": slots, **ATTENTION}
    every_layer = {**k_slots, "memory_read_layers": list(range(n_layer))}
    arms = {
        "paper": {},
        "attention": dict(ATTENTION),
        "slots": k_slots,
        "slots_every_layer": every_layer,
        "zero_input": dict(ZEROS),
        "slots_zero_input": {**k_slots, **ZEROS},
        "slots_every_layer_zero_input": {**every_layer, **ZEROS},
    }
    if selection:
        select = {**every_layer, "memory_pooling": "select"}
        arms |= {"select_every_layer": select, "select_every_layer_zero_input": {**select, **ZEROS}}
    return arms


def is_control(memory: dict) -> bool:
    """A zero-input twin: its recurrence reads zeros, not the window."""
    return memory.get("recurrence_input") == "zeros"


# The arm in place of the recurrent model: a stock GPT-2 reading a row's windows as one sequence.
FULL_CONTEXT = "full_context"
FULL_CONTEXT_DESCRIPTION = "none: full attention over both windows"


def describe_memory(memory: dict, n_layer: int | None = None) -> str:
    """ "k=1, mean" ... "k=4, attention, read at every layer; zero input": an arm's settings for a table."""
    parts = [f"k={memory.get('memory_slots', 1)}"]
    if not is_control(memory):
        parts.append(memory.get("memory_pooling", "mean"))
    read = memory.get("memory_read_layers")
    if read is not None:
        parts.append("read at every layer" if n_layer is not None and read == list(range(n_layer)) else f"read {read}")
    for name in ("memory_position_bias", "memory_source", "h_prev_rope_position"):
        if name in memory:
            parts.append(f"{name}={memory[name]}")
    text = ", ".join(parts)
    return f"{text}; zero input" if is_control(memory) else text


def run_id(task: str, window_size: int, arm: str, seed: int) -> str:
    return f"{task}/T={window_size}/{arm}/seed={seed}"


def plan_gate1(
    *,
    seeds: Sequence[int],
    tasks: Sequence[str] = ("key", "associative"),
    key_window_sizes: Sequence[int] = (16, 64, 128),
    key_steps: int = 400,
    key_layers: int = 2,
    num_keys: int = 8,
    associative_window_size: int = 32,
    associative_steps: int = 600,
    associative_layers: int = 4,
    associative_keys: int = 16,
    num_values: int = 16,
    num_pairs: int = 4,
    slots: int = 4,
    key_curriculum: Sequence[Sequence[int]] = (),
    associative_curriculum: Sequence[Sequence[int]] = (),
    eval_every: int = 100,
    curve_size: int | None = None,
    arms: Sequence[str] | None = None,
    common: dict | None = None,
    selection_arms: bool = False,
    full_context_reference: bool = False,
    pretraining_steps: int = 0,
    bare_fraction: float = 0.0,
) -> list[dict]:
    """Every run of gate 1, in order: `{"id", "task", "window_size", "arm", "seed", "kwargs"}`, `kwargs` being
    `run_recall_experiment`'s. `common`: the keywords every run shares (batch size, learning rate, width, evaluation
    size, ...). Scored every `eval_every` steps on the first `curve_size` held-out rows (default: all). `arms` keeps
    only the arms of those names. `key_curriculum` / `associative_curriculum`: each task's `(window_size, steps)`
    stages trained first, within its steps (`run_recall_experiment`'s `curriculum`; none by default).

    4-pair recall only: `selection_arms` adds the selecting memory and its twin (`associative_arms`);
    `full_context_reference` the reference from above, arm `full_context` (a run with `"full_context": True`:
    `run_arm` trains a stock GPT-2 reading both windows as one sequence instead); `pretraining_steps` and
    `bare_fraction`, `run_recall_experiment`'s, train every arm on the bare task first and mix bare rows in after,
    a backbone that binds within a window before it reads the task (none by default)."""
    common = {**(common or {}), "eval_every": eval_every, "curve_size": curve_size}
    tasks_plan = []
    if "key" in tasks:
        for window_size in key_window_sizes:
            settings = {"task": "key", "window_size": window_size, "steps": key_steps, "n_layer": key_layers}
            settings |= {"num_keys": num_keys} | _curriculum(key_curriculum, window_size)
            tasks_plan.append((settings, key_recall_arms()))
    if "associative" in tasks:
        settings = {
            "task": "associative",
            "window_size": associative_window_size,
            "steps": associative_steps,
            "n_layer": associative_layers,
            "num_keys": associative_keys,
            "num_values": num_values,
            "num_pairs": num_pairs,
            **_curriculum(associative_curriculum, associative_window_size),
        }
        # Absent when unused, so that a plan without them is the plan recorded before the options.
        settings |= {"pretraining_steps": pretraining_steps} if pretraining_steps else {}
        settings |= {"bare_fraction": bare_fraction} if bare_fraction else {}
        task_arms = associative_arms(associative_layers, slots, selection_arms)
        if full_context_reference:
            task_arms[FULL_CONTEXT] = {}
        tasks_plan.append((settings, task_arms))
    plan = []
    for settings, task_arms in tasks_plan:
        for seed in seeds:
            for arm, memory in task_arms.items():
                if arms is not None and arm not in arms:
                    continue
                kwargs = {**common, **settings, "seed": seed, "memory": memory}
                planned = {
                    "id": run_id(settings["task"], settings["window_size"], arm, seed),
                    "task": settings["task"],
                    "window_size": settings["window_size"],
                    "arm": arm,
                    "seed": seed,
                    "kwargs": kwargs,
                }
                plan.append(planned | ({FULL_CONTEXT: True} if arm == FULL_CONTEXT else {}))
    return plan


def _curriculum(stages: Sequence[Sequence[int]], window_size: int) -> dict:
    """A task's `curriculum` keyword: its stages shorter than the task's windows (at `window_size` itself a stage would
    be the task); none when there are none, so that a plan without one is the plan recorded before the option."""
    kept = [list(stage) for stage in stages if stage[0] < window_size]
    return {"curriculum": kept} if kept else {}


def _load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def run_arm(planned: dict, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """Train and score one planned run (`plan_gate1`); returns its record: the plan's fields, `accuracy` (own earlier
    windows, all held-out rows), `swapped_accuracy`, on associative recall `row_value_rate` (how often the answer is
    one of the row's stored values, right or not), `chance`, `curve` (`{"step", "accuracy"}` on the first
    `curve_size` held-out rows every `eval_every` steps, from step 0), `final_loss`, `train_seconds` (training
    alone), `eval_seconds` (the curve's scoring), `seconds` (all of it, the final and swapped scoring and the model's
    construction included), `cpu_seconds` (the process's CPU time over the same span: what the run cost, however
    busy the machine), the settings `run_recall_experiment` recorded, the date and the load average at the start and
    the end.

    A run with `"full_context": True` trains and scores, in place of the recurrent model, the reference from above: a
    stock GPT-2 reading every window of a row as one sequence (`run_recall_experiment(baseline_context="full")`; the
    plan's memory settings are then unused)."""
    full_context = planned.get(FULL_CONTEXT, False)
    load_at_start, started, cpu_started = _load_average(), time.perf_counter(), time.process_time()
    models = {"recurrent": False, "baseline_context": "full"} if full_context else {"baseline": False}
    result = run_recall_experiment(**planned["kwargs"], **models, device=device, dtype=dtype)
    model = "baseline" if full_context else "recurrent"
    return {
        **planned,
        "accuracy": result[f"{model}_accuracy"],
        "swapped_accuracy": result["swapped_accuracy"],
        **({"row_value_rate": result[f"{model}_row_value_rate"]} if f"{model}_row_value_rate" in result else {}),
        "chance": result["chance"],
        "curve": result[f"{model}_curve"],
        "final_loss": result[f"{model}_final_loss"],
        "train_seconds": result[f"{model}_train_seconds"],
        "eval_seconds": result[f"{model}_eval_seconds"],
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "settings": result["settings"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_start": load_at_start,
        "load_average_at_end": _load_average(),
    }


def progress_line(record: dict, index: int, total: int) -> str:
    """One line for a finished run, for the log."""
    curve = ", ".join(f"{point['step']}: {point['accuracy']:.3f}" for point in record["curve"])
    return (
        f"[{index}/{total}] {record['id']}: accuracy {record['accuracy']:.3f}, swapped {record['swapped_accuracy']:.3f}"
        f" (chance {record['chance']:.3f}); by step {curve}; {record['train_seconds']:.0f} s training, "
        f"{record['seconds']:.0f} s in all ({record['cpu_seconds']:.0f} CPU-s)"
    )


# Arithmetic over the records.


def _by_id(records: Sequence[dict]) -> dict[str, dict]:
    return {record["id"]: record for record in records}


def _groups(plan: Sequence[dict]) -> list[tuple[str, int, str]]:
    """(task, window size, arm) in plan order, each once."""
    return list(dict.fromkeys((p["task"], p["window_size"], p["arm"]) for p in plan))


def accuracy_at(record: dict, step: int) -> float:
    """The accuracy after `step` steps: the final accuracy (every held-out row) if the run trained no more, else the
    curve's last point at or before `step` (its rows)."""
    if step >= record["kwargs"]["steps"]:
        return record["accuracy"]
    points = [point for point in record["curve"] if point["step"] <= step]
    return points[-1]["accuracy"] if points else record["accuracy"]


def first_step_reaching(record: dict, level: float) -> int | None:
    return next((point["step"] for point in record["curve"] if point["accuracy"] >= level), None)


def _finished(plan: Sequence[dict], done: dict, task: str, window_size: int, arm: str) -> list[dict]:
    """The finished runs of an arm, in plan order."""
    group = (task, window_size, arm)
    return [done[p["id"]] for p in plan if (p["task"], p["window_size"], p["arm"]) == group and p["id"] in done]


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def result_tables(plan: Sequence[dict], records: Sequence[dict]) -> dict[str, dict]:
    """The docs' tables: per task, one row per (window size, arm) with each seed's accuracy, their mean, each seed's
    swapped accuracy, chance and mean training seconds (a run not finished shows –); and the mean accuracy by step."""
    done = _by_id(records)
    seeds = list(dict.fromkeys(p["seed"] for p in plan))
    tables = {}
    for task, name in (("key", "key_recall"), ("associative", "associative_recall")):
        rows = []
        for group in (g for g in _groups(plan) if g[0] == task):
            _, window_size, arm = group
            runs = [done.get(run_id(task, window_size, arm, seed)) for seed in seeds]
            finished = [run for run in runs if run is not None]
            planned = next(p for p in plan if (p["task"], p["window_size"], p["arm"]) == group)
            memory = planned["kwargs"]["memory"]
            rows.append(
                [
                    arm,
                    FULL_CONTEXT_DESCRIPTION
                    if planned.get(FULL_CONTEXT)
                    else describe_memory(memory, planned["kwargs"]["n_layer"]),
                    window_size,
                    *(_cell(run and run["accuracy"]) for run in runs),
                    f"**{statistics.mean(r['accuracy'] for r in finished):.3f}**" if finished else "–",
                    " / ".join(_cell(run and run["swapped_accuracy"]) for run in runs),
                    f"{finished[0]['chance']:.3f}" if finished else "–",
                    f"{statistics.mean(r['train_seconds'] for r in finished):.0f}" if finished else "–",
                ]
            )
        if rows:
            headers = [
                "arm",
                "memory",
                "T",
                *(f"seed {seed}" for seed in seeds),
                "mean",
                "swapped windows (per seed)",
                "chance",
                "train s (mean)",
            ]
            align = ["", "", "right", *(["right"] * len(seeds)), "right", "right", "right", "right"]
            tables[name] = {"headers": headers, "rows": rows, "align": align}
    steps = _curve_columns(sorted({point["step"] for record in records for point in record["curve"]}))
    curve_rows = []
    for task, window_size, arm in _groups(plan):
        runs = _finished(plan, done, task, window_size, arm)
        if not runs:
            continue
        cells = []
        for step in steps:
            values = [point["accuracy"] for run in runs for point in run["curve"] if point["step"] == step]
            cells.append(_cell(statistics.mean(values)) if len(values) == len(runs) else "–")
        curve_rows.append([task, window_size, arm, len(runs), *cells])
    if curve_rows:
        tables["curves"] = {
            "headers": ["task", "T", "arm", "seeds", *(f"step {step}" for step in steps)],
            "rows": curve_rows,
            "align": ["", "right", "", "right", *(["right"] * len(steps))],
        }
    return tables


# The most step columns the curves' table shows (the plot shows every step).
CURVE_COLUMNS = 11


def _curve_columns(steps: list[int]) -> list[int]:
    """The scored steps the curves' table shows: all of them up to `CURVE_COLUMNS`, else every n-th from the first
    and the last."""
    if len(steps) <= CURVE_COLUMNS:
        return steps
    stride = -(-(len(steps) - 1) // (CURVE_COLUMNS - 1))
    shown = steps[::stride]
    return shown if shown[-1] == steps[-1] else [*shown, steps[-1]]


def _all_seeds(plan: Sequence[dict], done: dict, task: str, window_size: int, arm: str) -> list[dict] | None:
    """The records of every planned seed of an arm, or None if the arm is not planned or not finished."""
    ids = [p["id"] for p in plan if (p["task"], p["window_size"], p["arm"]) == (task, window_size, arm)]
    if not ids or any(i not in done for i in ids):
        return None
    return [done[i] for i in ids]


def _values(runs: Sequence[dict], key: str = "accuracy", step: int | None = None) -> str:
    return ", ".join(f"{accuracy_at(r, step) if step is not None else r[key]:.3f}" for r in runs)


def _not_run(name: str, plan: Sequence[dict], task: str, window_size: int) -> dict:
    """An unjudged goal: its runs are planned but not all finished, or this plan has none of them."""
    planned = any((p["task"], p["window_size"]) == (task, window_size) for p in plan)
    why = "its runs are not all finished" if planned else f"this run plans no {task} recall at T={window_size}"
    return {"goal": name, "passed": None, "line": f"NOT RUN: {name} ({why})."}


def gate1_goals(
    plan: Sequence[dict],
    records: Sequence[dict],
    *,
    key_window_size: int = 64,
    goal_steps: int = 400,
    associative_window_size: int = 32,
    margin: float = 0.02,
) -> list[dict]:
    """The issue's three goals, judged on the finished runs: `{"goal", "passed" (True, False or None: not run),
    "line"}` each. Every seed must meet a goal (the lines give each seed's value):

    1. key recall at T=`key_window_size`: attention >= 0.95 by `goal_steps` steps where mean pooling (the paper)
       stays <= 0.3;
    2. 4-pair recall: a k-slot arm >= 0.9 where the paper's arm stays <= 0.4 (each k-slot arm judged, and named);
    3. every zero-input arm, and every trained arm read with swapped earlier windows, <= chance + `margin`.
    """
    done = _by_id(records)
    goals = []

    attention = _all_seeds(plan, done, "key", key_window_size, "attention")
    paper = _all_seeds(plan, done, "key", key_window_size, "paper")
    name = f"attention >= 0.95 by step {goal_steps} at T={key_window_size} on every seed, where mean pooling <= 0.3"
    if attention is None or paper is None:
        goals.append(_not_run(name, plan, "key", key_window_size))
    else:
        reached = all(accuracy_at(r, goal_steps) >= 0.95 for r in attention)
        premise = all(accuracy_at(r, goal_steps) <= 0.3 for r in paper)
        firsts = ", ".join(str(first_step_reaching(r, 0.95) or "never") for r in attention)
        line = (
            f"{'PASS' if reached and premise else 'FAIL'}: {name}. Attention at step {goal_steps}: "
            f"{_values(attention, step=goal_steps)} (first step >= 0.95: {firsts}); mean pooling: "
            f"{_values(paper, step=goal_steps)}" + ("" if premise else " (above 0.3: the premise does not hold)") + "."
        )
        goals.append({"goal": name, "passed": reached and premise, "line": line})

    paper = _all_seeds(plan, done, "associative", associative_window_size, "paper")
    name = "a k-slot arm >= 0.9 on 4-pair recall on every seed, where the paper's arm <= 0.4"
    verdicts, parts = [], []
    for arm in ("slots", "slots_every_layer", "select_every_layer"):
        runs = _all_seeds(plan, done, "associative", associative_window_size, arm)
        if runs is not None:
            verdicts.append((arm, all(r["accuracy"] >= 0.9 for r in runs)))
            parts.append(f"{arm}: {_values(runs)}")
    if paper is None or not verdicts:
        goals.append(_not_run(name, plan, "associative", associative_window_size))
    else:
        premise = all(r["accuracy"] <= 0.4 for r in paper)
        winners = [arm for arm, met in verdicts if met]
        passed = bool(winners) and premise
        line = (
            f"{'PASS' if passed else 'FAIL'}: {name}. "
            + "; ".join(parts)
            + f"; paper: {_values(paper)}"
            + ("" if premise else " (above 0.4: the premise does not hold)")
            + (f". Met by: {', '.join(winners)}." if winners else ". Met by no k-slot arm.")
        )
        goals.append({"goal": name, "passed": passed, "line": line})

    name = f"zero-input arms and swapped earlier windows at chance (<= chance + {margin})"
    scores = []
    for record in records:
        # A zero-input arm reads no window: its swapped score is its own (`tests/experiments/test_memory_gates.py`).
        if is_control(record["kwargs"]["memory"]):
            scores.append((record["accuracy"] - record["chance"], f"{record['id']} (zero input)", record["accuracy"]))
        else:
            scores.append(
                (record["swapped_accuracy"] - record["chance"], f"{record['id']} swapped", record["swapped_accuracy"])
            )
    if not scores:
        goals.append({"goal": name, "passed": None, "line": f"NOT RUN: {name} (no run finished)."})
    else:
        above = [score for score in scores if score[0] > margin + 1e-12]
        worst = max(scores)
        line = (
            f"{'PASS' if not above else 'FAIL'}: {name}, {len(scores)} scores. Highest above chance: {worst[1]} "
            f"{worst[2]:.3f} ({worst[0]:+.3f})"
            + (f"; above the bound: {', '.join(f'{s[1]} {s[2]:.3f}' for s in above)}" if above else "")
            + "."
        )
        goals.append({"goal": name, "passed": not above, "line": line})
    return goals


def plot_curves(plan: Sequence[dict], records: Sequence[dict], path: str | Path) -> Path:
    """Accuracy against training steps, one panel per task and window size, one colour per arm (zero-input twins
    dashed): each seed a thin line, their mean a thick one; chance dotted. Needs matplotlib (the `eval` extra)."""
    from matplotlib.figure import Figure

    done = _by_id(records)
    panels = list(dict.fromkeys((p["task"], p["window_size"]) for p in plan))
    figure = Figure(figsize=(4.2 * len(panels), 4.0), layout="constrained")
    axes_row = figure.subplots(1, len(panels), squeeze=False)[0]
    for axes, (task, window_size) in zip(axes_row, panels, strict=True):
        arms = [g[2] for g in _groups(plan) if g[:2] == (task, window_size)]
        chance = None
        for index, arm in enumerate(arms):
            runs = _finished(plan, done, task, window_size, arm)
            if not runs:
                continue
            chance = runs[0]["chance"]
            control = is_control(runs[0]["kwargs"]["memory"])
            style = {"color": f"C{index % 10}", "linestyle": "--" if control else "-"}
            for run in runs:
                axes.plot(
                    [p["step"] for p in run["curve"]],
                    [p["accuracy"] for p in run["curve"]],
                    alpha=0.3,
                    lw=0.8,
                    **style,
                )
            steps = [p["step"] for p in runs[0]["curve"]]
            mean = [statistics.mean(run["curve"][i]["accuracy"] for run in runs) for i in range(len(steps))]
            axes.plot(steps, mean, lw=2, label=f"{arm} ({len(runs)} seeds)", **style)
        if chance is not None:
            axes.axhline(chance, color="grey", linestyle=":", lw=1, label="chance")
        title = "key recall" if task == "key" else "4-pair associative recall"
        axes.set_title(f"{title}, T={window_size}", fontsize=10)
        axes.set_xlabel("training step")
        axes.set_ylabel("held-out accuracy")
        axes.set_ylim(-0.02, 1.02)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path
