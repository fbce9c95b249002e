"""Pretrain the small GPT-2 that `hf-recurrence reproduce` starts from, offline, on the standard library's train split.

Trains a byte-level BPE tokenizer and a GPT-2 with a short position table using the stock Trainer, then saves both
with a model card. The shipped `hf_recurrence/default_model` folder was made with the defaults below.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..experiments.pretraining import PretrainingSettings, pretrain
from .options import add_overwrite_argument, given_options, preset_options


# The options HfArgumentParser adds: one per PretrainingSettings field, its help from the field's metadata.
OPTION_CLASSES = (preset_options(PretrainingSettings),)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output_dir", type=Path, required=True, help="Where the model and tokenizer are saved.")
    add_overwrite_argument(parser)


def run(args: argparse.Namespace) -> int:
    settings = PretrainingSettings(**given_options(args, OPTION_CLASSES))
    metrics = pretrain(
        args.output_dir, settings, command=shlex.join(["hf-recurrence", *sys.argv[1:]]), overwrite=args.overwrite
    )
    print(json.dumps(metrics, indent=2))
    return 0
