"""Pretrain the small GPT-2 that `hf-recurrence reproduce` starts from, offline, on the standard library's train split.

Trains a byte-level BPE tokenizer and a GPT-2 with a short position table using the stock Trainer, then saves both
with a model card. The shipped `hf_recurrence/default_model` folder was made with the defaults below.
"""

import argparse
import json
import shlex
import sys
from dataclasses import asdict, fields
from pathlib import Path

from ..pretraining import PretrainingSettings, pretrain


HELP = {
    "vocab_size": "BPE vocabulary size.",
    "n_positions": "GPT-2 position table, also the training block length.",
    "n_embd": "Hidden size.",
    "n_layer": "Transformer blocks.",
    "n_head": "Attention heads.",
    "max_steps": "Optimizer steps.",
    "batch_size": "Blocks per step.",
    "learning_rate": "Peak AdamW learning rate (cosine decay after warm-up).",
    "warmup_steps": "Linear warm-up steps.",
    "seed": "Seed for initialisation and data order.",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output_dir", type=Path, required=True, help="Where the model and tokenizer are saved.")
    parser.add_argument(
        "--overwrite", action="store_true", help="Write into a non-empty output_dir, replacing the model there."
    )
    for name, value in asdict(PretrainingSettings()).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"{HELP[name]} (default: {value})")


def run(args: argparse.Namespace) -> int:
    settings = PretrainingSettings(**{f.name: getattr(args, f.name) for f in fields(PretrainingSettings)})
    metrics = pretrain(
        args.output_dir, settings, command=shlex.join(["hf-recurrence", *sys.argv[1:]]), overwrite=args.overwrite
    )
    print(json.dumps(metrics, indent=2))
    return 0
