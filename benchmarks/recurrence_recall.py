# SPDX-License-Identifier: Apache-2.0
"""Does the recurrence carry information? The key-recall task of `hf_recurrence.key_recall` (the task, the baseline,
the control and the choices are described there): recurrent GPT-2 vs. the same GPT-2 without it, over seeds.

Run (about 1-3 minutes on a CPU, 3 seeds, one thread):

    python benchmarks/recurrence_recall.py

Options: `--steps`, `--seeds`, `--window-size`, `--num-keys`, ... (see `--help`).
"""

import argparse
import statistics
import time

import torch
from _common import add_device_arguments, device_and_dtype, machine_info

from hf_recurrence.key_recall import run_recall_experiment


def format_table(results: list[dict]) -> str:
    """Markdown table: one row per seed, then the mean."""
    columns = ("recurrent_accuracy", "baseline_accuracy", "swapped_accuracy")
    lines = [
        "| seed | recurrent GPT-2 | GPT-2, windows read independently | recurrent, earlier windows swapped "
        "| chance | train s (recurrent / baseline) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['settings']['seed']} | "
            + " | ".join(f"{r[c]:.3f}" for c in columns)
            + f" | {r['chance']:.3f} | {r['recurrent_train_seconds']:.1f} / {r['baseline_train_seconds']:.1f} |"
        )
    if len(results) > 1:
        means = " | ".join(f"**{statistics.mean(r[c] for r in results):.3f}**" for c in columns)
        lines.append(f"| mean | {means} | {results[0]['chance']:.3f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_arguments(parser, cuda_dtype="float32")
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
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; the matrices are tiny, so more threads mostly add synchronisation",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device, dtype = device_and_dtype(args)
    start = time.perf_counter()
    results = [
        run_recall_experiment(
            steps=args.steps,
            seed=seed,
            batch_size=args.batch_size,
            lr=args.lr,
            window_size=args.window_size,
            num_windows=args.num_windows,
            num_keys=args.num_keys,
            num_filler=args.num_filler,
            n_layer=args.n_layer,
            n_embd=args.n_embd,
            n_head=args.n_head,
            insertion_layer=args.insertion_layer,
            recurrence_hidden_sizes=tuple(args.recurrence_hidden_sizes),
            initializer_range=args.initializer_range,
            eval_size=args.eval_size,
            device=device,
            dtype=dtype,
        )
        for seed in args.seeds
    ]
    settings = {k: v for k, v in results[0]["settings"].items() if k != "seed"}
    print("Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"Recall accuracy on {args.eval_size} held-out sequences ({machine_info(device, dtype)}):")
    print(format_table(results))
    print(f"Total time: {time.perf_counter() - start:.0f} s")
    return results


if __name__ == "__main__":
    main()
