# SPDX-License-Identifier: Apache-2.0
"""Gate 1 of the memory (issue 39): which writer and reader of `h_prev` carry a key, or 4 bound pairs, to the next
window, each arm with its zero-input twin and read with swapped earlier windows (`hf_recurrence.experiments.
memory_gates` describes the task, the arms and the controls; `docs/experiments/memory_gates.md` the results).

Run (about 55 CPU-minutes on one thread, sized from a pilot: key recall 400 steps, the goal's budget; 4-pair recall
600, what the rest of the hour allows; resumable: each finished run is saved to the result file at once, and a rerun
with the same flags skips the runs it holds):

    python experiments/memory_gate1.py

A pilot of one arm, elsewhere: `python experiments/memory_gate1.py --tasks key --key-window-sizes 64 --arms attention
--seeds 0 --output-json outputs/pilot.json`. Options: see `--help`.
"""

import argparse
import contextlib
import datetime
import io
import json
import sys
import time
from pathlib import Path

import _common as bench

from hf_recurrence.experiments.memory_gates import (
    FULL_CONTEXT,
    FULL_CONTEXT_DESCRIPTION,
    describe_memory,
    gate1_goals,
    plan_gate1,
    plot_curves,
    progress_line,
    result_tables,
    run_arm,
)


DOCS_IMAGE = bench.REPO_ROOT / "docs" / "images" / "memory_gate1_accuracy_vs_steps.png"

# The flags every run shares, passed on to `run_recall_experiment` under their own names.
COMMON_FLAGS = (
    "batch_size",
    "lr",
    "num_filler",
    "n_embd",
    "n_head",
    "insertion_layer",
    "initializer_range",
    "eval_size",
)


def curriculum_stage(text: str) -> list[int]:
    """ "16:200" -> [16, 200]: a curriculum stage of 200 steps at 16-token windows."""
    try:
        window_size, steps = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a curriculum stage is WINDOW:STEPS, e.g. 16:200") from None
    return [window_size, steps]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # A trained model's quality is measured: float32 on CUDA too. One thread: the matrices are tiny.
    parser = bench.benchmark_parser(__doc__, __file__, threads=1, cuda_dtype="float32", seed=False)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", choices=["key", "associative"], default=["key", "associative"])
    parser.add_argument("--arms", nargs="+", help="only the arms of these names (default: every arm of each task)")
    parser.add_argument("--key-window-sizes", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--key-steps", type=int, default=400)
    parser.add_argument("--key-layers", type=int, default=2)
    parser.add_argument("--num-keys", type=int, default=8, help="keys of the key-recall task (chance 1/num_keys)")
    parser.add_argument("--associative-window-size", type=int, default=32)
    parser.add_argument("--associative-steps", type=int, default=600)
    parser.add_argument("--associative-layers", type=int, default=4)
    parser.add_argument("--associative-keys", type=int, default=16)
    parser.add_argument("--num-values", type=int, default=16, help="values of the 4-pair task (chance 1/num_values)")
    parser.add_argument("--num-pairs", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4, help="k of the k-slot arms")
    parser.add_argument(
        "--key-curriculum",
        type=curriculum_stage,
        nargs="+",
        default=[],
        metavar="WINDOW:STEPS",
        help="key recall: train first STEPS steps on the task at WINDOW-token windows, stage after stage, within "
        "--key-steps (a stage not shorter than a run's T is left out of that run); none by default",
    )
    parser.add_argument(
        "--associative-curriculum",
        type=curriculum_stage,
        nargs="+",
        default=[],
        metavar="WINDOW:STEPS",
        help="4-pair recall's curriculum, the same way, within --associative-steps",
    )
    parser.add_argument(
        "--selection-arms",
        action="store_true",
        help="4-pair recall: add the selecting memory (memory_pooling='select', k slots read at every layer) and its "
        "zero-input twin",
    )
    parser.add_argument(
        "--full-context-reference",
        action="store_true",
        help="4-pair recall: add the reference from above, a stock GPT-2 reading both windows as one sequence",
    )
    parser.add_argument(
        "--pretraining-steps",
        type=int,
        default=0,
        help="4-pair recall: train every arm this many steps on the bare task first (pairs, then their questions, no "
        "filler); none by default",
    )
    parser.add_argument(
        "--bare-fraction",
        type=float,
        default=0.0,
        help="4-pair recall: the share of bare-task rows mixed into every batch after the curriculum (default 0)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--lr-schedule",
        choices=["linear", "constant"],
        default="linear",
        help="linear: warmup over a tenth of the steps, then linear decay; constant: the peak throughout",
    )
    parser.add_argument("--num-filler", type=int, default=32)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--insertion-layer", type=int, default=1)
    parser.add_argument("--recurrence-hidden-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--initializer-range", type=float, default=0.1)
    parser.add_argument("--eval-size", type=int, default=4096, help="held-out rows per run (final and swapped scores)")
    parser.add_argument("--eval-every", type=int, default=100, help="score the curve's rows every N steps")
    parser.add_argument("--curve-size", type=int, default=512, help="the first N held-out rows: the curve's")
    parser.add_argument(
        "--plot",
        type=Path,
        help=f"the accuracy-vs-steps plot (default: {DOCS_IMAGE.relative_to(bench.REPO_ROOT)} for the recorded "
        "run, else beside --output-json)",
    )
    parser.add_argument("--fresh", action="store_true", help="discard the runs --output-json holds and start over")
    args = parser.parse_args(argv)
    if args.plot is None:
        recorded = args.output_json.resolve() == Path(parser.get_default("output_json")).resolve()
        args.plot = DOCS_IMAGE if recorded else args.output_json.with_suffix(".png")
    return args


def gate_plan(args: argparse.Namespace) -> list[dict]:
    common = {name: getattr(args, name) for name in COMMON_FLAGS}
    common |= {"num_windows": 2, "recurrence_hidden_sizes": list(args.recurrence_hidden_sizes)}
    if args.lr_schedule != "linear":  # the default stays out of the plan: the recorded run's plan is unchanged
        common["lr_schedule"] = args.lr_schedule
    plan = plan_gate1(
        seeds=args.seeds,
        tasks=args.tasks,
        key_window_sizes=args.key_window_sizes,
        key_steps=args.key_steps,
        key_layers=args.key_layers,
        num_keys=args.num_keys,
        associative_window_size=args.associative_window_size,
        associative_steps=args.associative_steps,
        associative_layers=args.associative_layers,
        associative_keys=args.associative_keys,
        num_values=args.num_values,
        num_pairs=args.num_pairs,
        slots=args.slots,
        key_curriculum=args.key_curriculum,
        associative_curriculum=args.associative_curriculum,
        eval_every=args.eval_every,
        curve_size=args.curve_size,
        arms=args.arms,
        common=common,
        selection_arms=args.selection_arms,
        full_context_reference=args.full_context_reference,
        pretraining_steps=args.pretraining_steps,
        bare_fraction=args.bare_fraction,
    )
    if not plan:
        sys.exit(f"--arms {' '.join(args.arms)}: no such arm in the tasks {' '.join(args.tasks)}")
    # JSON values, so that the plan compares equal to the one a result file recorded.
    return json.loads(json.dumps(plan))


def recorded_runs(args: argparse.Namespace, plan: list[dict]) -> tuple[dict[str, dict], dict | None]:
    """The finished runs the result file holds, checked to be runs of this plan with its settings, and the file;
    none with `--fresh` or without a file."""
    if args.fresh or not args.output_json.exists():
        return {}, None
    recorded = json.loads(args.output_json.read_text())
    values = recorded.get("values", {})
    planned = {p["id"]: p for p in plan}
    runs = {record["id"]: record for record in values.get("runs", [])}
    for run_id, record in runs.items():
        if run_id not in planned:
            sys.exit(
                f"{args.output_json} holds {run_id}, which these flags do not plan: rerun with its flags, or --fresh"
            )
        if record["kwargs"] != planned[run_id]["kwargs"]:
            sys.exit(
                f"{args.output_json} holds {run_id} with other settings ({record['kwargs']}): rerun with its flags, "
                "or --fresh"
            )
    return runs, recorded


def describe_curricula(args: argparse.Namespace) -> str:
    """ "; curriculum: key recall 200 steps at T=16, then the rest at the run's T": the stages, if any."""
    parts = []
    for task, stages in (("key recall", args.key_curriculum), ("associative recall", args.associative_curriculum)):
        if stages:
            staged = ", then ".join(f"{steps} steps at T={window_size}" for window_size, steps in stages)
            parts.append(f"{task} {staged}, then the rest at the run's T (a stage not shorter than T left out)")
    return f"; curriculum: {'; '.join(parts)}" if parts else ""


def describe_tasks(args: argparse.Namespace) -> str:
    """ "key recall: T=16/64/128, 400 steps, ...; associative recall: T=32, ...": the tasks this run plans."""
    parts = []
    if "key" in args.tasks:
        parts.append(
            f"key recall: T={'/'.join(map(str, args.key_window_sizes))}, {args.key_steps} steps, {args.key_layers} "
            f"layers, {args.num_keys} keys"
        )
    if "associative" in args.tasks:
        parts.append(
            f"associative recall: T={args.associative_window_size}, {args.associative_steps} steps, "
            f"{args.associative_layers} layers, {args.num_pairs} pairs of {args.associative_keys} keys and "
            f"{args.num_values} values; k-slot arms k={args.slots}"
        )
    return "; ".join(parts)


def describe_pretraining(args: argparse.Namespace) -> str:
    """ "; 4-pair recall: first 1500 steps of the bare task, then bare rows as 0.5 of every batch": if any."""
    parts = []
    if args.pretraining_steps:
        parts.append(f"first {args.pretraining_steps} steps of the bare task (pairs, then their questions, no filler)")
    if args.bare_fraction:
        parts.append(f"bare rows as {args.bare_fraction:g} of every batch after the curriculum")
    return f"; 4-pair recall: {', then '.join(parts)}" if parts else ""


def save(
    args: argparse.Namespace,
    machine: dict,
    plan: list[dict],
    runs: dict[str, dict],
    sessions: list[dict],
    *,
    final: bool,
    kept: dict | None = None,
) -> None:
    """Write the result file: every run so far, the tables, the goals' verdicts; quietly and atomically while runs are
    left, printed (and the plot drawn) at the end of this invocation. `kept`: the recorded file of a rerun that
    trained nothing, whose command, date and machine (those of the sessions that ran) are kept."""
    records = [runs[p["id"]] for p in plan if p["id"] in runs]
    finished = len(records) == len(plan)
    goals = gate1_goals(
        plan,
        records,
        key_window_size=64,
        goal_steps=400,
        associative_window_size=args.associative_window_size,
    )
    seconds = sum(record["seconds"] for record in records)
    cpu_seconds = sum(record["cpu_seconds"] for record in records)
    settings = {**plan[0]["kwargs"]}
    planned_per_task = (
        "task",
        "window_size",
        "steps",
        "n_layer",
        "seed",
        "memory",
        "num_keys",
        "num_values",
        "num_pairs",
        "curriculum",
        "pretraining_steps",
        "bare_fraction",
    )
    for name in (*planned_per_task, "eval_every", "curve_size", "eval_size"):
        settings.pop(name, None)
    text = {
        "settings": [
            f"Shared settings: {', '.join(f'{k}={v}' for k, v in settings.items())}; {describe_tasks(args)}; "
            f"seeds {', '.join(map(str, args.seeds))}{describe_curricula(args)}{describe_pretraining(args)}. "
            f"Accuracy: the argmax at the query over all {args.eval_size} held-out rows (own and swapped earlier "
            f"windows); the curves: the first {args.curve_size} of them, every {args.eval_every} steps.",
        ],
        "time": [
            f"{len(records)} of {len(plan)} runs finished"
            + ("" if finished else " (an unfinished gate: the rest are shown as –)")
            + f": {cpu_seconds / 60:.1f} CPU-minutes of training and scoring in all, {seconds / 60:.1f} minutes of "
            f"wall time (the runs' own times, summed, over {len(sessions)} session{'s' if len(sessions) != 1 else ''}"
            "; the wall time also counts the waits for the cores other processes kept busy)."
            if records
            else "No run finished yet."
        ],
        "goals": [f"- {goal['line']}" for goal in goals],
    }
    values = {"finished": finished, "plan": plan, "runs": records, "sessions": sessions, "goals": goals}
    tables = result_tables(plan, records)
    if final:
        if records:
            plot_curves(plan, records, args.plot)
            print(f"wrote {args.plot}")
        result = bench.write_results(args, machine, tables, values, text, plot=str(args.plot))
        if kept is not None:
            bench.write_json(
                args.output_json, result | {name: kept[name] for name in ("command", "date", "note", "machine")}
            )
        return
    # After each run: quietly, and the docs only at the end.
    scratch = argparse.Namespace(**{**vars(args), "write_docs": False})
    with contextlib.redirect_stdout(io.StringIO()):
        bench.write_results(scratch, machine, tables, values, text, plot=str(args.plot))


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    bench.setup(0, args.threads)
    device, dtype = bench.device_and_dtype(args)
    machine = bench.describe_machine(device, dtype)
    plan = gate_plan(args)
    runs, recorded = recorded_runs(args, plan)
    sessions = recorded["values"].get("sessions", []) if recorded else []
    todo = [p for p in plan if p["id"] not in runs]
    print(
        f"gate 1: {len(plan)} runs planned, {len(plan) - len(todo)} recorded in {args.output_json}, {len(todo)} to run",
        flush=True,
    )
    if not todo and recorded is not None:
        # Nothing to train: the tables, goals and plot are made again from the runs, under the sessions that ran.
        save(args, machine, plan, runs, sessions, final=True, kept=recorded)
        return [runs[p["id"]] for p in plan]
    sessions.append(
        {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine["description"],
            "runs_recorded_at_start": len(runs),
        }
    )
    started = time.perf_counter()
    for index, planned in enumerate(plan, 1):
        if planned["id"] in runs:
            continue
        memory = (
            FULL_CONTEXT_DESCRIPTION
            if planned.get(FULL_CONTEXT)
            else describe_memory(planned["kwargs"]["memory"], planned["kwargs"]["n_layer"])
        )
        print(f"[{index}/{len(plan)}] {planned['id']} ({memory}): training", flush=True)
        runs[planned["id"]] = run_arm(planned, device, dtype)
        print(progress_line(runs[planned["id"]], index, len(plan)), flush=True)
        sessions[-1]["seconds"] = round(time.perf_counter() - started, 1)
        save(args, machine, plan, runs, sessions, final=False)
    sessions[-1]["seconds"] = round(time.perf_counter() - started, 1)
    save(args, machine, plan, runs, sessions, final=True)
    return [runs[p["id"]] for p in plan]


if __name__ == "__main__":
    main()
