"""Reproduce the recurrence paper's comparison (Yoshida et al. 2020) offline: the project's main job.

From the embedded default GPT-2 (or --model_name_or_path), fine-tune a plain baseline and a recurrent GPT-2 with the
stock Trainer at equal steps on the same tokens (the Python standard library's train modules), then evaluate both on
held-out modules with windowed perplexity at several overlaps and window sizes. Prints the paper's Table 1/2-shaped
comparison with FLOPs/token and writes results.json, results.md and the Figure 5-shaped perplexity_vs_flops.png.
The settings, the model and --output_dir (empty, unless --overwrite) are checked before any training, and the
results are written after each evaluation.

Presets: `default` (about 10 minutes on 2 idle CPU cores), `smoke` (seconds: a wiring check, numbers meaningless) and
`paper` (GPT-2 small with 300-token windows and the paper's overlaps; for a GPU and a model from the Hub). Any option
given explicitly overrides the preset.
"""

import argparse
from dataclasses import fields
from pathlib import Path

from ..reproduction import ReproductionSettings, reproduce


PRESETS = {
    "default": {},
    "smoke": {
        "window_sizes": [32],
        "baseline_overlap_fractions": [0.0, 0.25],
        "block_tokens": 64,
        "batch_size": 2,
        "max_steps": 2,
        "warmup_steps": 0,
        "eval_documents": 1,
    },
    "paper": {
        "model_name_or_path": "gpt2",
        "window_sizes": [300],
        # The paper's overlaps at T=300: 0, 5, 30, 50, 75, 100, 200 tokens.
        "baseline_overlap_fractions": [0.0, 5 / 300, 0.1, 50 / 300, 0.25, 100 / 300, 200 / 300],
        "recurrent_overlap_fractions": [0.0, 5 / 300],
        "block_tokens": 3000,
        "batch_size": 4,
        "max_steps": 5000,
        "learning_rate": 5e-5,
        "warmup_steps": 100,
    },
}

# option -> (type, takes a list, help); one per ReproductionSettings field
OPTIONS = {
    "model_name_or_path": (str, False, "GPT-2 checkpoint to start from (default: the embedded default model)."),
    "window_sizes": (int, True, "Window sizes T to train and evaluate."),
    "baseline_overlap_fractions": (float, True, "Overlaps at which the baseline is evaluated, as fractions of T."),
    "recurrent_overlap_fractions": (
        float,
        True,
        "Overlaps at which a recurrent model is trained and evaluated, as fractions of T.",
    ),
    "block_tokens": (int, False, "Tokens per training block; a block holds block_tokens // T windows."),
    "batch_size": (int, False, "Blocks per optimizer step."),
    "max_steps": (int, False, "Optimizer steps per model."),
    "learning_rate": (float, False, "Peak learning rate (linear warm-up, cosine decay)."),
    "warmup_steps": (int, False, "Warm-up steps."),
    "eval_documents": (int, False, "Evaluate on only the first N held-out documents."),
    "seed": (int, False, "Random seed."),
    "train_files": (str, True, "Text files to fine-tune on instead of the standard library's train modules."),
    "test_files": (str, True, "Text files to evaluate on instead of the standard library's test modules."),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default", help="Settings to start from.")
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/reproduce"), help="Where results go.")
    parser.add_argument(
        "--overwrite", action="store_true", help="Write into a non-empty output_dir, replacing earlier results."
    )
    defaults = ReproductionSettings()
    for name, (kind, is_list, help_text) in OPTIONS.items():
        help_text += f" Default preset: {getattr(defaults, name)}."
        parser.add_argument(f"--{name}", type=kind, nargs="+" if is_list else None, help=help_text)


def settings_from_args(args: argparse.Namespace) -> ReproductionSettings:
    chosen = dict(PRESETS[args.preset])
    chosen.update(
        {f.name: getattr(args, f.name) for f in fields(ReproductionSettings) if getattr(args, f.name) is not None}
    )
    return ReproductionSettings(**chosen)


def run(args: argparse.Namespace) -> int:
    reproduce(settings_from_args(args), args.output_dir, overwrite=args.overwrite)
    return 0
