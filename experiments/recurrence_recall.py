# SPDX-License-Identifier: Apache-2.0
"""Does the recurrence carry information? The key-recall task of `hf_recurrence.experiments.key_recall` (the task, the baseline,
the control and the choices are described there): recurrent GPT-2 vs. the same GPT-2 without it, over seeds.

Run (about 1-3 minutes on a CPU, 3 seeds, one thread):

    python experiments/recurrence_recall.py

Options: `--steps`, `--seeds`, `--window-size`, `--num-keys`, ... (see `--help`).
"""

import statistics
import time

import _common as bench

from hf_recurrence.experiments.key_recall import run_recall_experiment


# The flags passed on to `run_recall_experiment` under their own names.
EXPERIMENT_FLAGS = (
    "steps",
    "batch_size",
    "lr",
    "window_size",
    "num_windows",
    "num_keys",
    "num_filler",
    "n_layer",
    "n_embd",
    "n_head",
    "insertion_layer",
    "initializer_range",
    "eval_size",
)
COLUMNS = ("recurrent_accuracy", "baseline_accuracy", "swapped_accuracy")


def result_table(results: list[dict]) -> dict:
    """One row per seed, then the mean."""
    rows = [
        [
            r["settings"]["seed"],
            *(f"{r[c]:.3f}" for c in COLUMNS),
            f"{r['chance']:.3f}",
            f"{r['recurrent_train_seconds']:.1f} / {r['baseline_train_seconds']:.1f}",
        ]
        for r in results
    ]
    if len(results) > 1:
        means = [f"**{statistics.mean(r[c] for r in results):.3f}**" for c in COLUMNS]
        rows.append(["mean", *means, f"{results[0]['chance']:.3f}", ""])
    headers = [
        "seed",
        "recurrent GPT-2",
        "GPT-2, windows read independently",
        "recurrent, earlier windows swapped",
        "chance",
        "train s (recurrent / baseline)",
    ]
    return bench.table(headers, rows, align=["right"] * len(headers))


def main(argv: list[str] | None = None) -> list[dict]:
    # A trained model's quality is measured: float32 on CUDA too. One thread by default: the matrices are tiny, so
    # more threads mostly add synchronisation.
    parser = bench.benchmark_parser(__doc__, __file__, threads=1, cuda_dtype="float32", seed=False)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--window-size", type=int, default=16)
    parser.add_argument("--num-windows", type=int, default=2)
    parser.add_argument("--num-keys", type=int, default=8)
    parser.add_argument("--num-filler", type=int, default=32)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--insertion-layer", type=int, default=1)
    parser.add_argument("--recurrence-hidden-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--initializer-range", type=float, default=0.1)
    parser.add_argument("--eval-size", type=int, default=2048)
    args = parser.parse_args(argv)
    bench.setup(0, args.threads)
    device, dtype = bench.device_and_dtype(args)
    machine = bench.describe_machine(device, dtype)
    start = time.perf_counter()
    results = [
        run_recall_experiment(
            seed=seed,
            recurrence_hidden_sizes=tuple(args.recurrence_hidden_sizes),
            device=device,
            dtype=dtype,
            **{name: getattr(args, name) for name in EXPERIMENT_FLAGS},
        )
        for seed in args.seeds
    ]
    settings = {k: v for k, v in results[0]["settings"].items() if k != "seed"}
    findings = [
        "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + f"; {args.eval_size} held-out sequences, "
        f"{time.perf_counter() - start:.0f} s in all."
    ]
    bench.write_results(args, machine, {"recall": result_table(results)}, {"results": results}, {"settings": findings})
    return results


if __name__ == "__main__":
    main()
