# SPDX-License-Identifier: Apache-2.0
"""Compiled decoding: the recurrent GPT-2 over its fixed-shape state (`generate(cache_implementation="static")`,
single-token step compiled) against its default path and stock GPT-2's `generate(cache_implementation="static")`
compiled and its default cache: decode tokens/s and cold start, at batch 1 and 8.

Run (GPT-2 small, 300-token windows; meant for a GPU):

    python benchmarks/compiled_decode.py --device cuda [--write-docs]

A small CPU run: `--n-layer 2 --n-embd 64 --n-head 2 --window-size 32 --lengths 64,256 --batch-sizes 1,2`.

Decode tokens/s: batch x (length - 1) new tokens over the time of `generate(max_new_tokens=length)` minus that of
`generate(max_new_tokens=1)` (the prompt's prefill), warm, median of `--repeats` interleaved rounds. Cold start: in a
fresh process with an empty compile cache folder, the first `generate(max_new_tokens=length)` less the second
(compiling the decode step, and for stock GPT-2's static cache the whole forward, is the difference). Stock GPT-2 cannot decode past its `n_positions` table (its static cache is sized to the call's
length, but positions past the table do not exist): those cells say so.
"""

import argparse
import os
import tempfile
from collections.abc import Callable
from unittest import mock

import _common as bench
import torch
from transformers import CompileConfig, GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__)
    bench.add_model_shape_arguments(parser, bench.GPT2_SMALL_SHAPE)
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--lengths", default="256,2048", help="comma-separated new-token counts")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    bench.add_child_argument(parser)
    return parser.parse_args()


RECURRENT_COMPILED = "recurrent, fixed-shape state, compiled"
RECURRENT_DEFAULT = "recurrent, default state"


def compile_config() -> CompileConfig:
    # generate() compiles on accelerators only unless told otherwise; the flag lets a CPU run compile too.
    config = CompileConfig()
    config._compile_all_devices = True
    return config


def generate_fn(model, prompt: torch.Tensor, new_tokens: int, **kwargs) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **kwargs)

    return run


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, tuple]:
    """The four ways of decoding: name -> (model, generate() keywords)."""
    dims = bench.gpt2_dims(args)
    # No end-of-text token, so that every call runs its full max_new_tokens with random weights.
    tokens = {"bos_token_id": None, "eos_token_id": None}
    recurrent = RecurrentGPT2LMHeadModel(
        RecurrentGPT2Config(**dims, **tokens, window_size=args.window_size, insertion_layer=min(2, args.n_layer - 1))
    )
    stock = GPT2LMHeadModel(GPT2Config(**dims, **tokens))
    recurrent, stock = (m.to(device=device, dtype=dtype).eval() for m in (recurrent, stock))
    return {
        RECURRENT_COMPILED: (recurrent, {"cache_implementation": "static", "compile_config": compile_config()}),
        RECURRENT_DEFAULT: (recurrent, {"disable_compile": True}),
        "stock GPT-2, static cache, compiled": (
            stock,
            {"cache_implementation": "static", "compile_config": compile_config()},
        ),
        "stock GPT-2, default cache": (stock, {"disable_compile": True}),
    }


def prompt_of(args: argparse.Namespace, batch: int, device: torch.device) -> torch.Tensor:
    return torch.randint(1, args.vocab_size, (batch, args.prompt_tokens), device=device)


def cold_start(args: argparse.Namespace, spec: dict) -> dict:
    """In a fresh process: the first call's seconds less the second's, for one way of decoding (`spec`)."""
    device, dtype, _ = bench.start(args)
    model, kwargs = build(args, device, dtype)[spec["name"]]
    run = generate_fn(model, prompt_of(args, spec["batch"], device), spec["length"], **kwargs)
    first_start = bench.clock(device)
    run()
    second_start = bench.clock(device)
    run()
    end = bench.clock(device)
    return {"cold_start_s": (second_start - first_start) - (end - second_start)}


def main() -> None:
    args = parse_args()
    if bench.run_if_child(args, cold_start):
        return
    device, dtype, machine = bench.start(args)
    variants = build(args, device, dtype)
    recurrent = variants[RECURRENT_COMPILED][0]
    values, rows = {}, []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        prompt = prompt_of(args, batch, device)
        for length in (int(n) for n in args.lengths.split(",")):
            fits = args.prompt_tokens + length <= args.n_positions
            usable = {name: v for name, v in variants.items() if v[0] is recurrent or fits}
            cold = {}
            for name in usable:
                # A cold start compiles everything: no graphs or kernels read back from an earlier run's cache.
                with (
                    tempfile.TemporaryDirectory() as cache,
                    mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache),
                ):
                    cold[name] = bench.in_child({"name": name, "batch": batch, "length": length})["cold_start_s"]
            fns = {}
            for name, (model, kwargs) in usable.items():
                fns[f"{name}|full"] = generate_fn(model, prompt, length, **kwargs)
                fns[f"{name}|prefill"] = generate_fn(model, prompt, 1, **kwargs)
            times = bench.interleaved(fns, args.repeats, device=device)
            same = torch.equal(fns[f"{RECURRENT_COMPILED}|full"](), fns[f"{RECURRENT_DEFAULT}|full"]())
            for name in variants:
                key = f"batch {batch}, {length} tokens, {name}"
                if name not in usable:
                    values[key] = None
                    cell = f"cannot: {args.prompt_tokens} + {length} tokens pass its {args.n_positions} positions"
                    rows.append([batch, length, name, cell, "-", "-"])
                    continue
                decode = bench.median(times[f"{name}|full"]) - bench.median(times[f"{name}|prefill"])
                tps = batch * (length - 1) / decode
                values[key] = {
                    "cold_start_s": cold[name],
                    "decode_tokens_per_s": tps,
                    "full_s": times[f"{name}|full"],
                    "prefill_s": times[f"{name}|prefill"],
                }
                check = ("same tokens" if same else "tokens differ") if name == RECURRENT_COMPILED else ""
                # round() or 0.0: a first call of an eager path as fast as the second shows 0.0, not -0.0.
                rows.append([batch, length, name, f"{tps:.0f}", f"{round(cold[name], 1) or 0.0:.1f}", check])
            values[f"batch {batch}, {length} tokens, recurrent compiled tokens == default tokens"] = same
    headers = [
        "batch",
        "new tokens",
        "decoding",
        "decode tokens/s",
        "cold start (s)",
        "recurrent: compiled vs default",
    ]
    tables = {"decode": bench.table(headers, rows, ["right", "right", "", "right", "right", ""])}
    bench.write_results(args, machine, tables, values)


if __name__ == "__main__":
    main()
