# SPDX-License-Identifier: Apache-2.0
"""Inductive generalization on NSP Add (Nam et al. 2020, Figure 4a): I-BERT vs I-BERT+PE vs BERT, trained on
d = 2..12 and validated on d = 13..16, at a CPU size. Runs the example script, then records its table and plot.

Run (about 30 minutes on 2 CPU cores with one thread):

    OMP_NUM_THREADS=1 python experiments/inductive_generalization.py [--write-docs] [-- extra example flags]

`--results-dir DIR` skips training and renders a finished run of
`examples/inductive_generalization/run_inductive_generalization.py` (its `results.json` and PNG) instead.
`--device` and `--dtype` pass on to the example's `Trainer`: `--use_cpu` for cpu, the first visible GPU for cuda,
and bfloat16 or float16 as its mixed precision (`--bf16`, `--fp16`; the weights stay float32).
"""

import importlib.util
from pathlib import Path

import _common as bench
import torch


SCRIPT = bench.REPO_ROOT / "examples" / "inductive_generalization" / "run_inductive_generalization.py"
IMAGE = bench.REPO_ROOT / "docs" / "images" / "inductive_generalization_add.png"
CPU_RUN = [
    "--task", "add", "--models", "ibert,bert,ibert_pe",
    "--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "4", "--intermediate_size", "256",
    "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "128",
    "--learning_rate", "1e-3", "--warmup_steps", "200", "--max_steps", "6000", "--logging_steps", "500",
    "--seed", "0", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
]  # fmt: skip
# Paper, Figure 4a (BERT-base sizes, 50 epochs, GPU): I-BERT's validation sequence accuracy per difficulty.
PAPER_IBERT = {13: 0.917, 14: 0.813, 15: 0.661, 16: 0.359}


def trainer_flags(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The example's `TrainingArguments` flags for `--device` and `--dtype`."""
    if device.type == "cuda" and (device.index or 0) != 0:
        # Trainer takes the first visible GPU; which one that is, is the environment's choice.
        raise SystemExit(f"--device {device}: Trainer uses cuda:0; pick another GPU with CUDA_VISIBLE_DEVICES")
    flags = ["--use_cpu", "true"] if device.type == "cpu" else []
    precision = {torch.bfloat16: ["--bf16", "true"], torch.float16: ["--fp16", "true"]}
    return flags + precision.get(dtype, [])


def run_example(output_dir: Path, extra: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("run_inductive_generalization", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([*CPU_RUN, *extra, "--output_dir", str(output_dir)])


def results_table(report: dict) -> dict:
    train_d, validation_d = report["train_difficulties"], report["validation_difficulties"]
    rows = []
    for result in report["results"].values():
        accuracy = {int(d): a for d, a in result["sequence_accuracy"].items()}
        seen = sum(accuracy[d] for d in train_d) / len(train_d)
        rows.append(
            [result["label"], f"{result['parameters']:,}", f"{result['train_runtime_s'] / 60:.1f}", f"{seen:.3f}"]
            + [f"{accuracy[d]:.3f}" for d in validation_d]
        )
    rows.append(
        ["I-BERT, paper (BERT-base, 50 epochs)", "", "", "about 1"] + [f"{PAPER_IBERT[d]}" for d in validation_d]
    )
    headers = ["model", "parameters", "training (min)", f"d {train_d[0]}..{train_d[-1]} (mean)"]
    return bench.table(headers + [f"d={d}" for d in validation_d], rows)


def main() -> None:
    args = bench.run_or_render_parser(__doc__, __file__, threads=1, runs="the example script").parse_args()
    bench.setup(0, args.threads)
    extra = [*trainer_flags(*bench.device_and_dtype(args)), *args.extra]
    report, machine = bench.run_or_render(
        args, lambda results_dir: run_example(results_dir, extra), {"accuracy_vs_difficulty.png": IMAGE}
    )
    if args.results_dir is None:
        origin = [
            f"`{bench.command_line()}`, which runs",
            f"`python {SCRIPT.relative_to(bench.REPO_ROOT)} {' '.join([*CPU_RUN, *extra])}`",
        ]
    else:
        origin = [
            f"`{report['command']}`, rendered by `python experiments/inductive_generalization.py --results-dir DIR`"
        ]
    if args.note:
        origin += ["", f"Run: {args.note}"]
    rendered = args.results_dir is not None
    bench.write_results(
        args,
        machine,
        {"accuracy": results_table(report)},
        report,
        {"origin": origin},
        rendered_from_results_dir=rendered,
    )


if __name__ == "__main__":
    main()
