# SPDX-License-Identifier: Apache-2.0
"""Extra peak memory of `generate()` reading a long prompt: recurrent GPT-2 and recurrent Llama vs stock GPT-2.

Run (GPT-2-small shape, prompts of 1,000, 4,000 and 16,000 tokens; several minutes on 2 CPU cores):

    python benchmarks/prefill_memory.py [--device cuda] [--write-docs]

A quick run at a small shape:

    python benchmarks/prefill_memory.py --n-layer 2 --n-embd 64 --n-head 2 --vocab-size 8000 --n-positions 256 \
        --window-size 64 --prompt-tokens 250 1000 4000

Each measurement runs in a fresh subprocess: the model is built with random weights (the memory of a forward does
not depend on their values) and warmed up with a `generate()` on one window, then the peak-memory counter is reset
and `model.generate(prompt, max_new_tokens=--new-tokens, do_sample=False)` reads the prompt. Reported: the peak
during that call minus the memory in use just before it, i.e. what reading the prompt costs on top of the model at
rest. On the CPU that is peak RSS (`tracemalloc` does not see torch's allocations, and the CPU allocator keeps no
peak): the kernel's counter is reset through `/proc/self/clear_refs`, and glibc's `MALLOC_MMAP_THRESHOLD_=65536`
returns freed tensors to the system, so RSS follows the live tensors. On CUDA: `torch.cuda.max_memory_allocated`.

The recurrent models read the prompt window after window, keeping one window's keys and values and the recurrent
summary, so their activations do not grow with the prompt; what can grow is the logits: `generate()` asks for the
last position's only (`logits_to_keep=1`) from a head whose `forward` accepts it, and for all of them otherwise (the
table says which). Stock GPT-2 reads at most `n_positions` tokens (its learned position table), so it is measured
only on the prompts that fit with the new tokens.
"""

import argparse
import gc
import inspect

import torch
from _common import (
    GPT2_SMALL_SHAPE,
    add_child_argument,
    add_device_arguments,
    add_model_shape_arguments,
    command_line,
    device_and_dtype,
    gpt2_dims,
    in_child,
    load_at_end,
    markdown_table,
    peak_memory_method,
    peak_memory_mib,
    peak_memory_setup,
    reset_peak_memory,
    run_if_child,
    setup,
    write_section,
)
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import (
    RecurrentGPT2Config,
    RecurrentGPT2LMHeadModel,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
)


MODELS = ("recurrent GPT-2", "recurrent Llama", "stock GPT-2")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_shape_arguments(parser, GPT2_SMALL_SHAPE)
    add_device_arguments(parser)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--new-tokens", type=int, default=1, help="max_new_tokens of each generate() call")
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS), metavar="MODEL", help=", ".join(MODELS)
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--write-docs", action="store_true", help="replace this script's section of docs/benchmarks.md"
    )
    parser.add_argument(
        "--note", default="", help="a paragraph for the docs section, e.g. the numbers of an earlier commit"
    )
    add_child_argument(parser)
    return parser.parse_args()


def build(name: str, args: argparse.Namespace) -> torch.nn.Module:
    """One of `MODELS` at the shape of the flags; the recurrent Llama matches GPT-2's layers, width and heads."""
    recurrence = {"window_size": args.window_size, "window_overlap": 0, "insertion_layer": min(2, args.n_layer - 1)}
    if name == "recurrent GPT-2":
        return RecurrentGPT2LMHeadModel(RecurrentGPT2Config(**gpt2_dims(args), **recurrence))
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
    return GPT2LMHeadModel(GPT2Config(**gpt2_dims(args)))


def fits(name: str, prompt_tokens: int, args: argparse.Namespace) -> bool:
    """Whether the model can read the prompt and its new tokens (stock GPT-2 stops at its positions)."""
    return name != "stock GPT-2" or prompt_tokens + args.new_tokens <= args.n_positions


def run_child(args: argparse.Namespace, spec: dict) -> dict:
    """One model reading one prompt, in this (fresh) process."""
    setup(args.seed, args.threads)
    device, dtype = device_and_dtype(args)
    model = build(spec["model"], args).to(device, dtype).eval()
    generate = {"max_new_tokens": args.new_tokens, "do_sample": False, "pad_token_id": 0}
    prompt = torch.randint(0, args.vocab_size, (1, spec["prompt_tokens"]), device=device)
    with torch.inference_mode():
        # Warm-up on one window: lazy initialisation and thread pools are not what is measured.
        model.generate(prompt[:, : min(args.window_size, spec["prompt_tokens"])], **generate)
        gc.collect()
        before = reset_peak_memory(device)
        model.generate(prompt, **generate)
        peak = peak_memory_mib(device)
    return {
        "extra_mib": peak - before,
        "before_mib": before,
        # What generate() checks before passing logits_to_keep=1 (GenerationMixin._supports_logits_to_keep).
        "last_logits_only": "logits_to_keep" in inspect.signature(model.forward).parameters,
    }


def main() -> None:
    args = parse_args()
    if run_if_child(args, run_child):
        return
    device, dtype, info = peak_memory_setup(args)
    results = {}
    for name in args.models:
        for prompt_tokens in args.prompt_tokens:
            if fits(name, prompt_tokens, args):
                results[name, prompt_tokens] = in_child({"model": name, "prompt_tokens": prompt_tokens})
                print(f"{name}, {prompt_tokens} tokens: {results[name, prompt_tokens]}", flush=True)
    table = render_table(args, results, dtype)
    print(f"\n{info}\n\n{table}")
    if args.write_docs:
        write_section("prefill_memory", docs_section(args, info, table, device))


def render_table(args: argparse.Namespace, results: dict, dtype: torch.dtype) -> str:
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
    return markdown_table(
        ["model", *(f"{t:,} tokens (MiB)" for t in args.prompt_tokens), "MiB per 1,000 tokens", "last logits only"],
        rows,
    )


def docs_section(args: argparse.Namespace, info: str, table: str, device: torch.device) -> str:
    return f"""## Prefill memory: `generate()` on a long prompt (`prefill_memory.py`)

Goal: the extra peak memory of reading a prompt does not grow with the prompt for the recurrent models.

`{command_line()}`

Machine: {info}; {load_at_end()}.

Models: n_layer={args.n_layer}, n_embd={args.n_embd}, n_head={args.n_head}, vocab {args.vocab_size}, random weights;
the recurrent GPT-2 and Llama (same layers, width and heads; feed-forward {4 * args.n_embd}) read windows of
{args.window_size} tokens (overlap 0); stock GPT-2 has n_positions={args.n_positions} and is measured only on the
prompts that fit with the {args.new_tokens} new token(s) ("-": longer than its position table). Each cell: one
`generate(prompt, max_new_tokens={args.new_tokens}, do_sample=False)` in a fresh process after a warm-up on one
window, peak minus the memory in use just before it, measured as {peak_memory_method(device)}. "MiB per 1,000
tokens": the growth between the shortest and the longest prompt the model read. "Last logits only": whether
`generate()` asked the head for the last position's logits (`logits_to_keep=1`); otherwise the head computes those of
every prompt position, whose size the last row gives for scale.

{table}

{args.note}
"""


if __name__ == "__main__":
    main()
