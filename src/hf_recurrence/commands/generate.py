"""Generate text with a causal LM (recurrent GPT-2, Transformer-XL or any transformers model) through the pipeline.

Recurrent models continue past their position table at constant memory: their state is carried from window to
window, so `--max_new_tokens` is not bounded by `n_positions`.
"""

import argparse
import sys
from pathlib import Path

from transformers import pipeline, set_seed

from ..outputs import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_name_or_path", help="A local folder or a Hub repo id (with its tokenizer).")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="Text to continue.")
    prompt.add_argument("--prompt_file", type=Path, help="File whose text is continued ('-' for stdin).")
    parser.add_argument("--max_new_tokens", type=int, default=200, help="Tokens to generate.")
    parser.add_argument("--do_sample", action="store_true", help="Sample instead of greedy decoding.")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (with --do_sample).")
    parser.add_argument("--top_k", type=int, default=50, help="Top-k sampling (with --do_sample).")
    parser.add_argument("--seed", type=int, default=0, help="Random seed for sampling.")
    parser.add_argument("--revision", default=None, help="Hub revision.")
    parser.add_argument(
        "--trust_remote_code", action="store_true", help="Allow the model folder's own code (Hub checkpoints)."
    )


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if str(args.prompt_file) == "-":
        return sys.stdin.read()
    return args.prompt_file.read_text(encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise UsageError(f"--max_new_tokens must be at least 1, got {args.max_new_tokens}")
    set_seed(args.seed)
    generator = pipeline(
        "text-generation",
        model=args.model_name_or_path,
        revision=args.revision,
        trust_remote_code=args.trust_remote_code,
    )
    sampling = {"temperature": args.temperature, "top_k": args.top_k} if args.do_sample else {}
    (result,) = generator(
        read_prompt(args),
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        return_full_text=True,
        **sampling,
    )
    print(result["generated_text"])
    return 0
