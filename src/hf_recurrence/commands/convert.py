"""Convert a GPT-2 checkpoint into a recurrent GPT-2 (Yoshida et al. 2020) and save it with its tokenizer.

Every GPT-2 weight is kept; only the recurrence module (layer weights and the small FFN) is new and randomly
initialised, so the converted model's first window reproduces the GPT-2's logits exactly. Fine-tune it afterwards
(see examples/language-modeling/run_clm_recurrent.py) so that the recurrence learns to carry context.
"""

import argparse
from pathlib import Path

from transformers import AutoTokenizer

from ..models import RecurrentGPT2LMHeadModel
from ..outputs import MODEL_FOLDER_FILES, TRAINING_RUN_FILES, UsageError, prepare_output_dir


RECURRENCE_SETTINGS = ("window_size", "window_overlap", "insertion_layer", "recurrence_hidden_sizes", "bptt_windows")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_name_or_path", help="GPT-2 checkpoint: a local folder or a Hub repo id.")
    parser.add_argument("output_dir", type=Path, help="Where the recurrent checkpoint is saved.")
    parser.add_argument(
        "--window_size", type=int, help="Tokens per window, at most n_positions (default: min(300, n_positions))."
    )
    parser.add_argument("--window_overlap", type=int, help="Tokens each window repeats from the last (default: 0).")
    parser.add_argument("--insertion_layer", type=int, help="Block that attends to h_prev (default: 2).")
    parser.add_argument(
        "--recurrence_hidden_sizes", type=int, nargs="+", help="Hidden sizes of the FFN (default: 200 200 200)."
    )
    parser.add_argument("--bptt_windows", type=int, help="Truncate backprop to this many windows (default: all).")
    parser.add_argument("--revision", default=None, help="Hub revision of the source checkpoint.")
    parser.add_argument(
        "--overwrite", action="store_true", help="Write into a non-empty output_dir, replacing the model there."
    )


def run(args: argparse.Namespace) -> int:
    # Settings not given are left to the config, which fits them to the checkpoint (window_size <= n_positions).
    settings = {name: getattr(args, name) for name in RECURRENCE_SETTINGS if getattr(args, name) is not None}
    model, info = RecurrentGPT2LMHeadModel.from_pretrained(
        args.model_name_or_path, revision=args.revision, output_loading_info=True, **settings
    )
    unexpected_new = [k for k in info["missing_keys"] if ".recurrence." not in f".{k}"]
    if unexpected_new:
        raise UsageError(
            f"{args.model_name_or_path} is not a complete GPT-2 checkpoint: these weights were missing and would be "
            f"random: {unexpected_new}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, revision=args.revision)
    except OSError:
        tokenizer = None
    prepare_output_dir(args.output_dir, MODEL_FOLDER_FILES + TRAINING_RUN_FILES, overwrite=args.overwrite)
    model.save_pretrained(args.output_dir)
    if tokenizer is None:
        print(f"No tokenizer found with {args.model_name_or_path}; saved the model only.")
    else:
        tokenizer.save_pretrained(args.output_dir)
    config = model.config
    print(
        f"Saved a recurrent GPT-2 (window_size={config.window_size}, window_overlap={config.window_overlap}, "
        f"insertion_layer={config.insertion_layer}) to {args.output_dir}; new weights: "
        f"{len(info['missing_keys'])} tensors of the recurrence module."
    )
    return 0
