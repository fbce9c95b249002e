"""Convert a GPT-2 checkpoint into a recurrent GPT-2 (Yoshida et al. 2020) and save it with its tokenizer.

Every GPT-2 weight is kept; only the recurrence module (layer weights and the small FFN) is new and randomly
initialised, so the converted model's first window reproduces the GPT-2's logits exactly. Fine-tune it afterwards
(see examples/language-modeling/run_clm_recurrent.py) so that the recurrence learns to carry context.
"""

import argparse
from pathlib import Path

from transformers import AutoTokenizer

from ..models import RecurrentGPT2LMHeadModel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_name_or_path", help="GPT-2 checkpoint: a local folder or a Hub repo id.")
    parser.add_argument("output_dir", type=Path, help="Where the recurrent checkpoint is saved.")
    parser.add_argument("--window_size", type=int, default=300, help="Tokens per window (<= n_positions).")
    parser.add_argument("--window_overlap", type=int, default=0, help="Tokens each window repeats from the last.")
    parser.add_argument("--insertion_layer", type=int, default=2, help="Block that attends to h_prev.")
    parser.add_argument(
        "--recurrence_hidden_sizes", type=int, nargs="+", default=[200, 200, 200], help="Hidden sizes of the FFN."
    )
    parser.add_argument("--bptt_windows", type=int, default=None, help="Truncate backprop to this many windows.")
    parser.add_argument("--revision", default=None, help="Hub revision of the source checkpoint.")


def run(args: argparse.Namespace) -> int:
    model, info = RecurrentGPT2LMHeadModel.from_pretrained(
        args.model_name_or_path,
        revision=args.revision,
        window_size=args.window_size,
        window_overlap=args.window_overlap,
        insertion_layer=args.insertion_layer,
        recurrence_hidden_sizes=args.recurrence_hidden_sizes,
        bptt_windows=args.bptt_windows,
        output_loading_info=True,
    )
    unexpected_new = [k for k in info["missing_keys"] if ".recurrence." not in f".{k}"]
    if unexpected_new:
        raise ValueError(
            f"{args.model_name_or_path} is not a complete GPT-2 checkpoint: these weights were missing and would be "
            f"random: {unexpected_new}"
        )
    model.save_pretrained(args.output_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, revision=args.revision)
    except OSError:
        print(f"No tokenizer found with {args.model_name_or_path}; saved the model only.")
    else:
        tokenizer.save_pretrained(args.output_dir)
    print(
        f"Saved a recurrent GPT-2 (window_size={args.window_size}, window_overlap={args.window_overlap}, "
        f"insertion_layer={args.insertion_layer}) to {args.output_dir}; new weights: "
        f"{len(info['missing_keys'])} tensors of the recurrence module."
    )
    return 0
