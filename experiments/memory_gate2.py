"""Gate 2 of the memory (issue 39): the planted-name probe as a training task on SmolLM2-135M-Instruct, LoRA in every
arm, scored on the validation book with own and swapped memory and against the stock model.

What is trained and measured, and the goals: docs/experiments/memory_gate2.md. Each arm is saved to --work-dir as it
ends; the same command run again skips the finished arms.

    python experiments/memory_gate2.py --bf16
    python experiments/memory_gate2.py --arms paper 'slots8={"memory_slots": 8, "memory_pooling": "select"}' \
        slots8-zeros --bf16
"""

import time
from pathlib import Path

import _common as bench

from hf_recurrence.data.fact_probe import CURRICULUM_REACHES
from hf_recurrence.experiments.book_reproduction import RECURRENCE_INITS
from hf_recurrence.experiments.memory_gate2 import (
    ARM_PRESETS,
    DEFAULT_ARMS,
    gate2_settings,
    parse_arms,
    run_gate2,
)
from hf_recurrence.outputs import UsageError


# The gate's training settings (`BookReproductionSettings` fields) that flags of the same names set.
TRAINING_FLAGS = (
    "model_name_or_path",
    "window_size",
    "batch_size",
    "max_steps",
    "learning_rate",
    "backbone_learning_rate",
    "recurrence_init",
    "bf16",
    "seed",
)


def main(argv: list[str] | None = None, model=None, streams=None) -> dict:
    """Run the gate; `model` (stock model, tokenizer) and `streams` (training, held-out token streams) stand in for
    SmolLM2 and the books (the tests' tiny ones)."""
    # The arms' quality is what is measured: float32 weights and evaluation (the Trainer's), bf16 autocast if asked.
    parser = bench.benchmark_parser(__doc__, __file__, cuda_dtype="float32", seed=False)
    parser.add_argument(
        "--arms",
        nargs="+",
        default=list(DEFAULT_ARMS),
        help=f"presets ({', '.join(ARM_PRESETS)}), NAME='{{json recurrence settings}}', or NAME-zeros (the zero-input "
        'twin of an arm given before it); memory_read_layers "all" names every layer',
    )
    parser.add_argument("--max-steps", type=int, default=1000, help="optimizer steps per arm")
    parser.add_argument("--batch-size", type=int, default=8, help="two-window examples per step")
    parser.add_argument("--window-size", type=int, default=64)
    parser.add_argument("--held-out", type=int, default=256, help="validation-book examples scored")
    parser.add_argument(
        "--probe-fraction", type=float, default=1.0, help="share of name-probe examples; the rest are LM blocks"
    )
    parser.add_argument(
        "--reaches",
        type=float,
        nargs="+",
        default=list(CURRICULUM_REACHES),
        help="the curriculum's stages: how far before window 1's end the name may be planted, as fractions of it",
    )
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="the recurrence module's peak rate")
    parser.add_argument("--backbone-learning-rate", type=float, default=1e-4, help="LoRA's peak rate")
    parser.add_argument("--recurrence-init", default="model", choices=RECURRENCE_INITS)
    parser.add_argument("--bf16", action="store_true", help="train under bfloat16 autocast")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model-name-or-path", default=None, help="a causal LM folder, .gguf, smollm2-135m (default) or gemma3-270m"
    )
    parser.add_argument("--progress-every", type=int, default=50, help="print the pace every N steps")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=bench.REPO_ROOT / "outputs" / "memory_gate2",
        help="where each finished arm is saved, and found again by a run with the same settings",
    )
    args = parser.parse_args(argv)
    bench.setup(args.seed, args.threads)
    device, dtype = bench.trainer_device(args, "the arms are trained by the Trainer, on its device in float32")
    machine = bench.describe_machine(device, dtype)
    start = time.perf_counter()
    try:
        settings = gate2_settings(**{name: getattr(args, name) for name in TRAINING_FLAGS})
        report = run_gate2(
            settings,
            parse_arms(args.arms),
            args.work_dir,
            held_out=args.held_out,
            probe_fraction=args.probe_fraction,
            reaches=args.reaches,
            progress_every=args.progress_every,
            model=model,
            streams=streams,
        )
    except (UsageError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    stock = report["stock"]
    rows = [
        [
            "stock, window 2 alone",
            "–",
            f"{100 * stock['recalled']:.1f}%",
            "–",
            f"{stock['name_nll']:.3f}",
            "–",
            "–",
            "–",
        ]
    ]
    for name, arm in report["arms"].items():
        own, swapped, difference = arm["own"], arm["swapped"], arm["swapped_minus_own"]
        rows.append([
            name,
            ", ".join(f"{key}={shown(value)}" for key, value in arm["recurrence"].items()) or "the paper's",
            f"{100 * own['recalled']:.1f}%",
            f"{100 * swapped['recalled']:.1f}%",
            f"{own['name_nll']:.3f}",
            f"{swapped['name_nll']:.3f}",
            f"{difference['nats']:+.3f} [{difference['low']:+.3f}, {difference['high']:+.3f}]",
            f"{arm['train_minutes']:.1f} ({arm['seconds_per_step']:.2f} s/step)",
        ])  # fmt: skip
    headers = [
        "arm",
        "recurrence settings",
        "recall",
        "recall, another example's memory",
        "name NLL",
        "name NLL, another example's memory",
        "swapped - own (95% interval)",
        "train minutes",
    ]
    notes = [
        f"Model {report['source']}; {(time.perf_counter() - start) / 60:.1f} minutes in this run. Name NLL: mean "
        f"nats per name token on {report['held_out']} validation examples; recall: examples whose every name token "
        "is the argmax."
    ]
    return bench.write_results(
        args,
        machine,
        {"arms": bench.table(headers, rows), "by_distance": distance_table(report)},
        report,
        {"goals": [f"- {line}" for line in report["goals"]], "notes": notes},
    )


def shown(value: object) -> str:
    """A setting as the table shows it: a run of consecutive layers as its ends ([0, 1, ..., 29] as 0-29)."""
    if isinstance(value, list) and len(value) > 2 and value == list(range(value[0], value[0] + len(value))):
        return f"{value[0]}-{value[-1]}"
    return str(value)


def distance_table(report: dict) -> dict:
    """Exact recall by how far before window 1's end the name was planted (the curriculum's reaches, in tokens), for
    the stock reader and every arm with its own and another example's memory."""
    readers = {"stock, window 2 alone": report["stock"]}
    for name, arm in report["arms"].items():
        readers[f"{name}, own memory"] = arm["own"]
        readers[f"{name}, another example's"] = arm["swapped"]
    distances = list(report["stock"]["recalled_by_distance"])
    rows = [
        [reader, *("–" if r is None else f"{100 * r:.1f}%" for r in scores["recalled_by_distance"].values())]
        for reader, scores in readers.items()
    ]
    return bench.table(["reader", *(f"planted {d} tokens before the boundary" for d in distances)], rows)


if __name__ == "__main__":
    main()
