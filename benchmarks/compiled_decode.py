# SPDX-License-Identifier: Apache-2.0
"""Compiled decoding: the recurrent GPT-2 over its fixed-shape state (`generate(cache_implementation="static")`,
single-token step compiled) against its default path and stock GPT-2's `generate(cache_implementation="static")`
compiled and its default cache: decode tokens/s at batch 1 and 8 and several generated lengths, and cold start.

Run (GPT-2 small, 300-token windows; meant for a GPU):

    python benchmarks/compiled_decode.py --device cuda [--write-docs]

The recorded CPU run, at a tiny shape (2 layers, 64 wide, vocabulary 512, 32-token windows):

    python benchmarks/compiled_decode.py --threads 1 --n-layer 2 --n-embd 64 --n-head 2 --vocab-size 512 \
        --window-size 32 [--write-docs]

Decode tokens/s: batch x (length - 1) new tokens over the time of `generate(max_new_tokens=length)` minus that of
`generate(max_new_tokens=1)` (the prompt's prefill), warm, median of `--repeats` interleaved rounds (`--long-repeats`
for lengths over 2,048). Cold start: in a fresh process with an empty compile cache folder, the first
`generate(max_new_tokens=--cold-start-length)` less the second, for the compiled ways only (compiling the decode step,
and for stock GPT-2's static cache its whole forward, is the difference; the default paths compile nothing).

Stock GPT-2 has `n_positions` learned positions and cannot decode past them; its static cache is sized to the call's
length. The stock models here get a position table long enough for the longest length (`--stock-positions`, default
prompt + longest length), so that every cell has a number; and with `--n-positions` (GPT-2's own table, 1,024) the
run tries each stock way once at batch 1 on every length that does not fit, and records what happens.
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
    parser.add_argument("--lengths", default="256,2048,8192", help="comma-separated new-token counts")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-repeats", type=int, default=1, help="rounds for lengths over 2,048")
    parser.add_argument("--cold-start-length", type=int, default=256)
    parser.add_argument("--cold-start-batches", default="1,8", help="the batch sizes whose cold start is measured")
    parser.add_argument(
        "--stock-positions", type=int, default=None, help="stock GPT-2's position table (default: the longest text)"
    )
    bench.add_child_argument(parser)
    return parser.parse_args()


RECURRENT_COMPILED = "recurrent, fixed-shape state, compiled"
RECURRENT_DEFAULT = "recurrent, default state"
STOCK_STATIC = "stock GPT-2, static cache, compiled"
STOCK_DEFAULT = "stock GPT-2, default cache"
COMPILED = (RECURRENT_COMPILED, STOCK_STATIC)


def compile_config() -> CompileConfig:
    # generate() compiles on accelerators only unless told otherwise; the flag lets a CPU run compile too.
    config = CompileConfig()
    config._compile_all_devices = True
    return config


def generate_fn(model, prompt: torch.Tensor, new_tokens: int, **kwargs) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **kwargs
            )

    return run


def stock_positions(args: argparse.Namespace) -> int:
    longest = max(int(n) for n in args.lengths.split(","))
    return args.stock_positions or max(args.n_positions, args.prompt_tokens + longest)


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, positions: int) -> dict[str, tuple]:
    """The four ways of decoding: name -> (model, generate() keywords); stock GPT-2 with `positions` positions."""
    dims = bench.gpt2_dims(args)
    # No end-of-text token, so that every call runs its full max_new_tokens with random weights.
    tokens = {"bos_token_id": None, "eos_token_id": None}
    recurrent = RecurrentGPT2LMHeadModel(
        RecurrentGPT2Config(**dims, **tokens, window_size=args.window_size, insertion_layer=min(2, args.n_layer - 1))
    )
    stock = GPT2LMHeadModel(GPT2Config(**{**dims, "n_positions": positions}, **tokens))
    recurrent, stock = (m.to(device=device, dtype=dtype).eval() for m in (recurrent, stock))
    static = {"cache_implementation": "static", "compile_config": compile_config()}
    return {
        RECURRENT_COMPILED: (recurrent, static),
        RECURRENT_DEFAULT: (recurrent, {"disable_compile": True}),
        STOCK_STATIC: (stock, static),
        STOCK_DEFAULT: (stock, {"disable_compile": True}),
    }


def prompt_of(args: argparse.Namespace, batch: int, device: torch.device) -> torch.Tensor:
    return torch.randint(1, args.vocab_size, (batch, args.prompt_tokens), device=device)


def cold_start(args: argparse.Namespace, spec: dict) -> dict:
    """In a fresh process: the first call's seconds less the second's, for one way of decoding (`spec`)."""
    device, dtype, _ = bench.start(args)
    model, kwargs = build(args, device, dtype, stock_positions(args))[spec["name"]]
    run = generate_fn(model, prompt_of(args, spec["batch"], device), spec["length"], **kwargs)
    first_start = bench.clock(device)
    run()
    second_start = bench.clock(device)
    run()
    end = bench.clock(device)
    return {
        "cold_start_s": (second_start - first_start) - (end - second_start),
        "first_call_s": second_start - first_start,
    }


def past_the_table(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, length: int) -> dict:
    """What stock GPT-2 with its own `--n-positions` table does when asked for `length` new tokens (batch 1)."""
    variants = build(args, device, dtype, args.n_positions)
    outcome = {}
    for name in (STOCK_STATIC, STOCK_DEFAULT):
        model, kwargs = variants[name]
        try:
            tokens = generate_fn(model, prompt_of(args, 1, device), length, **kwargs)().shape[1] - args.prompt_tokens
            outcome[name] = f"ran: {tokens} new tokens"
        except Exception as error:  # noqa: BLE001 - what happens is the measurement
            outcome[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return outcome


def main() -> None:
    args = parse_args()
    if bench.run_if_child(args, cold_start):
        return
    device, dtype, machine = bench.start(args)
    positions = stock_positions(args)
    variants = build(args, device, dtype, positions)
    values: dict = {"stock_positions": positions}
    rows, cold_rows, text = [], [], []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        prompt = prompt_of(args, batch, device)
        cold = {}
        for name in COMPILED if str(batch) in args.cold_start_batches.split(",") else ():
            # A cold start compiles everything: no graphs or kernels read back from an earlier run's cache.
            with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache):
                cold[name] = bench.in_child({"name": name, "batch": batch, "length": args.cold_start_length})
            values[f"batch {batch}, cold start, {name}"] = cold[name]
        if cold:
            ratio = cold[RECURRENT_COMPILED]["cold_start_s"] / cold[STOCK_STATIC]["cold_start_s"]
            values[f"batch {batch}, cold start, recurrent / stock static"] = ratio
            cold_rows.append([batch, *(f"{cold[name]['cold_start_s']:.1f}" for name in COMPILED), f"{ratio:.2f}x"])
        for length in (int(n) for n in args.lengths.split(",")):
            # generate() sizes a static cache for the longest call so far (`_previous_max_cache_length`): size it for
            # this length, so that the warm-up compiles for the timed calls' cache and a longer length earlier in
            # the run does not slow a shorter one.
            variants[STOCK_STATIC][0]._previous_max_cache_length = args.prompt_tokens + length
            fns = {}
            for name, (model, kwargs) in variants.items():
                fns[f"{name}|full"] = generate_fn(model, prompt, length, **kwargs)
                fns[f"{name}|prefill"] = generate_fn(model, prompt, 1, **kwargs)
                generate_fn(model, prompt, 8, **kwargs)()  # compiles for this batch and cache length, untimed
            repeats = args.repeats if length <= 2048 else args.long_repeats
            times = bench.interleaved(fns, repeats, warmup=0, device=device)
            same = torch.equal(fns[f"{RECURRENT_COMPILED}|full"](), fns[f"{RECURRENT_DEFAULT}|full"]())
            tps = {}
            for name in variants:
                decode = bench.median(times[f"{name}|full"]) - bench.median(times[f"{name}|prefill"])
                tps[name] = batch * (length - 1) / decode
                values[f"batch {batch}, {length} tokens, {name}"] = {
                    "decode_tokens_per_s": tps[name],
                    "full_s": times[f"{name}|full"],
                    "prefill_s": times[f"{name}|prefill"],
                }
            ratio = tps[RECURRENT_COMPILED] / tps[STOCK_STATIC]
            values[f"batch {batch}, {length} tokens, recurrent compiled / stock static"] = ratio
            values[f"batch {batch}, {length} tokens, recurrent compiled tokens == default tokens"] = same
            rows.append(
                [
                    batch,
                    length,
                    *(f"{tps[name]:.0f}" for name in variants),
                    f"**{ratio:.2f}x**",
                    "same" if same else "differ",
                ]
            )
    for length in (int(n) for n in args.lengths.split(",")):
        if args.prompt_tokens + length > args.n_positions:
            outcome = past_the_table(args, device, dtype, length)
            values[f"stock GPT-2 with {args.n_positions} positions, batch 1, {length} tokens"] = outcome
            text += [f"- {length} new tokens, {name}: {result}" for name, result in outcome.items()]
    headers = [
        "batch",
        "new tokens",
        *(f"{name} (tok/s)" for name in variants),
        "recurrent compiled / stock static",
        "recurrent compiled vs default tokens",
    ]
    tables = {
        "decode": bench.table(headers, rows, ["right", "right", "right", "right", "right", "right", "right", ""]),
        "cold_start": bench.table(
            ["batch", *(f"{name} (s)" for name in COMPILED), "recurrent / stock"],
            cold_rows,
            ["right", "right", "right", "right"],
        ),
    }
    decode_ratios = {k: v for k, v in values.items() if k.endswith("recurrent compiled / stock static")}
    cold_ratios = {k: v for k, v in values.items() if k.endswith("cold start, recurrent / stock static")}
    slower = [k.split(", recurrent")[0] for k, v in decode_ratios.items() if v < 1]
    colder = [k.split(", cold start")[0] for k, v in cold_ratios.items() if v > 1]
    verdict = [
        "- Decode at least as fast as stock's compiled static cache at every batch and length: "
        + ("met." if not slower else f"not met ({'; '.join(slower)}).")
        + f" Ratios {min(decode_ratios.values()):.2f}x to {max(decode_ratios.values()):.2f}x.",
        "- Cold start no slower than stock's static: "
        + ("met." if not colder else f"not met ({'; '.join(colder)}).")
        + f" Ratios {min(cold_ratios.values()):.2f}x to {max(cold_ratios.values()):.2f}x.",
    ]
    text_groups = {"past_the_table": text or ["(every length fits)"], "verdict": verdict}
    bench.write_results(args, machine, tables, values, text_groups)


if __name__ == "__main__":
    main()
