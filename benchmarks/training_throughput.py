# SPDX-License-Identifier: Apache-2.0
"""Training throughput of the recurrent GPT-2 vs stock GPT-2 batched, over batch sizes: the curve.

One training step is a forward with labels and its backward (no optimizer step, which costs both models the same).
The recurrent model reads (batch, windows * window_size) tokens window by window; stock GPT-2 reads the same tokens
as (batch * windows, window_size) independent windows in one call, the fastest it can train on them. Both are timed
interleaved, round by round, at every batch size.

Run (a small GPT-2, 64-token windows; several minutes on 2 CPU cores):

    python benchmarks/training_throughput.py [--device cuda] [--write-docs]

What is measured and how: docs/benchmarks.md, "Training throughput".
"""

import argparse

import _common as bench
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel


GOAL = 0.8
# Stock GPT-2's tokens/s has flattened at the first batch size where it reaches this share of its best.
FLAT = 0.9
# Small enough for every batch size to be timed several times on a CPU, with a vocabulary whose head is not the
# whole step.
SMALL_SHAPE = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 8192, "n_positions": 1024, "window_size": 64}


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__)
    bench.add_model_shape_arguments(parser, SMALL_SHAPE)
    parser.add_argument("--windows", type=int, default=4, help="windows per row: length = windows * window_size")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    return parser.parse_args()


def training_step(model: torch.nn.Module, ids: torch.Tensor):
    """Forward with labels and backward, gradients dropped after."""

    def step() -> None:
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def main() -> None:
    args = parse_args()
    device, dtype, machine = bench.start(args)
    dims = bench.gpt2_dims(args)
    stock = GPT2LMHeadModel(GPT2Config(**dims)).to(device, dtype).train()
    recurrent = RecurrentGPT2LMHeadModel(
        RecurrentGPT2Config(
            **dims, window_size=args.window_size, window_overlap=0, insertion_layer=min(2, args.n_layer - 1)
        )
    )
    recurrent.backbone.load_state_dict(stock.state_dict())
    recurrent.to(device, dtype).train()
    window, windows = args.window_size, args.windows
    values, rows = {}, []
    for batch in args.batch_sizes:
        ids = torch.randint(0, args.vocab_size, (batch, windows * window), device=device)
        stacked = torch.cat(list(ids.split(window, dim=1)), dim=0)  # (windows * batch, window)
        fns = {"recurrent": training_step(recurrent, ids), "stock_batched": training_step(stock, stacked)}
        times = bench.interleaved(fns, repeats=args.repeats, warmup=args.warmup, device=device)
        tokens = ids.numel()
        # Recurrent throughput / stock's: the times' ratios with stock's on top (the minima's: the maxima's rates).
        ratio = bench.ratios(times["stock_batched"], times["recurrent"])
        values[batch] = {"tokens_per_step": tokens, "seconds_per_step": times, "throughput_ratio": ratio}
        rates = {name: tokens / bench.median(t) for name, t in times.items()}
        values[batch]["tokens_per_second"] = rates
        rows.append(
            [
                batch,
                tokens,
                f"{rates['recurrent']:,.0f}",
                f"{rates['stock_batched']:,.0f}",
                *bench.ratio_cells(ratio, bold_paired=True),
            ]
        )
        print(f"batch {batch}: {rows[-1]}", flush=True)

    best = max(v["tokens_per_second"]["stock_batched"] for v in values.values())
    flat = next(b for b, v in values.items() if v["tokens_per_second"]["stock_batched"] >= FLAT * best)
    at_flat = values[flat]["throughput_ratio"]["paired"]
    verdict = (
        f"Goal {'met' if at_flat >= GOAL else 'missed'}: {at_flat:.3f}x stock GPT-2's batched training throughput at "
        f"batch {flat}, where stock's curve flattens (first batch size at {FLAT:.0%} of its best, "
        f"{best:,.0f} tokens/s); goal >= {GOAL}x."
    )
    headers = [
        "batch",
        "tokens per step",
        "recurrent (tokens/s)",
        f"stock batched, ({windows} x batch, {window}) (tokens/s)",
        "throughput ratio (median paired)",
        "ratio of medians",
        "ratio of maxima",
    ]
    tables = {"curve": bench.table(headers, rows, ["right"] * len(headers))}
    bench.write_results(
        args,
        machine,
        tables,
        values,
        {"verdict": [verdict]},
        goal=GOAL,
        goal_met=at_flat >= GOAL,
        flattens_at_batch=flat,
    )


if __name__ == "__main__":
    main()
