# SPDX-License-Identifier: Apache-2.0
"""Extra peak memory of `generate()` reading a long prompt: recurrent GPT-2 and recurrent Llama vs stock GPT-2.

Run (GPT-2-small shape, prompts of 1,000, 16,000 and 64,000 tokens; long on 2 CPU cores, see docs/benchmarks.md for
the narrow shape recorded there):

    python benchmarks/prefill_memory.py [--device cuda] [--write-docs]

A quick run at a small shape:

    python benchmarks/prefill_memory.py --n-layer 2 --n-embd 64 --n-head 2 --vocab-size 8000 --n-positions 256 \
        --window-size 64 --prompt-tokens 250 1000 4000

What is measured and how: docs/benchmarks.md, "Prefill memory".
"""

import argparse
import gc
import inspect

import _common as bench
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import (
    RecurrentGPT2Config,
    RecurrentGPT2LMHeadModel,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
)


MODELS = ("recurrent GPT-2", "recurrent Llama", "stock GPT-2")
# The peak at the longest prompt within this factor of that at the shortest.
GOAL = 1.1


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__)
    bench.add_model_shape_arguments(parser, bench.GPT2_SMALL_SHAPE)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[1000, 16000, 64000])
    parser.add_argument("--new-tokens", type=int, default=1, help="max_new_tokens of each generate() call")
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS), metavar="MODEL", help=", ".join(MODELS)
    )
    bench.add_child_argument(parser)
    return parser.parse_args()


def build(name: str, args: argparse.Namespace) -> torch.nn.Module:
    """One of `MODELS` at the shape of the flags; the recurrent Llama matches GPT-2's layers, width and heads."""
    recurrence = {"window_size": args.window_size, "window_overlap": 0, "insertion_layer": min(2, args.n_layer - 1)}
    if name == "recurrent GPT-2":
        return RecurrentGPT2LMHeadModel(RecurrentGPT2Config(**bench.gpt2_dims(args), **recurrence))
    if name == "recurrent Llama":
        config = RecurrentLlamaConfig(
            vocab_size=args.vocab_size,
            hidden_size=args.n_embd,
            intermediate_size=4 * args.n_embd,
            num_hidden_layers=args.n_layer,
            num_attention_heads=args.n_head,
            num_key_value_heads=args.n_head,
            max_position_embeddings=args.window_size,
            **recurrence,
        )
        return RecurrentLlamaForCausalLM(config)
    return GPT2LMHeadModel(GPT2Config(**bench.gpt2_dims(args)))


def fits(name: str, prompt_tokens: int, args: argparse.Namespace) -> bool:
    """Whether the model can read the prompt and its new tokens (stock GPT-2 stops at its positions)."""
    return name != "stock GPT-2" or prompt_tokens + args.new_tokens <= args.n_positions


def run_child(args: argparse.Namespace, spec: dict) -> dict:
    """One model reading one prompt, in this (fresh) process."""
    bench.setup(args.seed, args.threads)
    device, dtype = bench.device_and_dtype(args)
    model = build(spec["model"], args).to(device, dtype).eval()
    generate = {"max_new_tokens": args.new_tokens, "do_sample": False, "pad_token_id": 0}
    prompt = torch.randint(0, args.vocab_size, (1, spec["prompt_tokens"]), device=device)
    with torch.inference_mode():
        # Warm-up on one window: lazy initialisation and thread pools are not what is measured.
        model.generate(prompt[:, : min(args.window_size, spec["prompt_tokens"])], **generate)
        gc.collect()
        before = bench.reset_peak_memory(device)
        model.generate(prompt, **generate)
        peak = bench.peak_memory_mib(device)
    return {
        "extra_mib": peak - before,
        "before_mib": before,
        "peak_mib": peak,
        # What generate() checks before passing logits_to_keep=1 (GenerationMixin._supports_logits_to_keep).
        "last_logits_only": "logits_to_keep" in inspect.signature(model.forward).parameters,
    }


def main() -> None:
    args = parse_args()
    if bench.run_if_child(args, run_child):
        return
    device, dtype, machine = bench.peak_memory_setup(args)
    results = {}
    for name in args.models:
        for prompt_tokens in args.prompt_tokens:
            if fits(name, prompt_tokens, args):
                results[name, prompt_tokens] = bench.in_child({"model": name, "prompt_tokens": prompt_tokens})
                print(f"{name}, {prompt_tokens} tokens: {results[name, prompt_tokens]}", flush=True)
    values = {f"{name}, {tokens} tokens": r for (name, tokens), r in results.items()}
    tables = {"prefill": result_table(args, results, dtype)}
    verdict = goal_lines(args, results)
    bench.write_results(
        args, machine, tables, values, {"verdict": verdict}, goal=GOAL, memory_method=bench.peak_memory_method(device)
    )


def goal_lines(args: argparse.Namespace, results: dict) -> list[str]:
    """Per recurrent model, the peak at the longest prompt over that at the shortest: the whole process's (the goal's
    measure) and the prefill's extra memory alone."""
    shortest, longest = min(args.prompt_tokens), max(args.prompt_tokens)
    lines = []
    for name in args.models:
        if (name, longest) not in results or longest == shortest:
            continue
        short, long = results[name, shortest], results[name, longest]
        whole = long["peak_mib"] / short["peak_mib"]
        lines.append(
            f"- {name}: peak at {longest:,} tokens {whole:.3f}x that at {shortest:,} "
            f"({long['peak_mib']:.1f} vs {short['peak_mib']:.1f} MiB, the whole process): goal (<= {GOAL}x) "
            f"{'met' if whole <= GOAL else 'missed'}; the prefill's extra memory alone "
            f"{long['extra_mib'] / short['extra_mib']:.2f}x ({long['extra_mib']:.1f} vs {short['extra_mib']:.1f} MiB)."
        )
    return lines


def result_table(args: argparse.Namespace, results: dict, dtype: torch.dtype) -> dict:
    """One row per model: extra peak MiB per prompt length, the growth per 1,000 prompt tokens between the shortest
    and the longest prompt it read, and whether generate() asked for the last position's logits only; then, for
    scale, what the logits of every prompt position would take."""
    rows = []
    for name in args.models:
        measured = {tokens: r for (model, tokens), r in results.items() if model == name}
        cells = [f"{measured[t]['extra_mib']:.1f}" if t in measured else "-" for t in args.prompt_tokens]
        shortest, longest = min(measured), max(measured)
        growth = "-"
        if longest > shortest:
            slope = (measured[longest]["extra_mib"] - measured[shortest]["extra_mib"]) / (longest - shortest)
            growth = f"{slope * 1000:.2f}"
        keeps_last = "yes" if measured[shortest]["last_logits_only"] else "no (all positions)"
        rows.append([name, *cells, growth, keeps_last])
    logits = [f"{t * args.vocab_size * dtype.itemsize / 2**20:.1f}" for t in args.prompt_tokens]
    rows.append(["(logits of every prompt position)", *logits, "", ""])
    return bench.table(
        ["model", *(f"{t:,} tokens (MiB)" for t in args.prompt_tokens), "MiB per 1,000 tokens", "last logits only"],
        rows,
    )


if __name__ == "__main__":
    main()
