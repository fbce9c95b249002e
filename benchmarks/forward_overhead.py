# SPDX-License-Identifier: Apache-2.0
"""Forward-pass overhead of the recurrent GPT-2 over stock GPT-2 on the same windows.

Run (about 2-3 minutes on 2 CPU cores):

    python benchmarks/forward_overhead.py [--write-docs]

A GPT-2-small-shaped `transformers.GPT2LMHeadModel` with random weights is saved to a temporary directory and loaded
into `RecurrentGPT2LMHeadModel` (window_size=300, window_overlap=0), so both models hold the same weights. The
recurrent model reads 600 tokens (two 300-token windows) in one call; stock GPT-2 reads the same two windows as two
sequential (1, 300) calls (the apples-to-apples baseline: the second window must wait for the first in the
recurrent model) and as one (2, 300) batch (what stock GPT-2 can do because its windows are independent). The
models' calls are interleaved round by round and the median is reported, for `attn_implementation` "sdpa" and
"eager" (stock GPT-2 uses the same implementation as the recurrent model it is compared with). The transformer
bodies alone (no LM head) are timed too, to separate the head's cost from the blocks'. When a ratio misses the goal
(or with `--profile always`), two calls of each model are profiled with `torch.profiler` and the operators that cost
the recurrent model more are listed.

Bigger settings: `--windows 4 --window-size 512`, `--repeats 15`, `--batch-size 4`; `--threads 1` is far less
sensitive to other processes on a small machine (see docs/benchmarks.md).
"""

import argparse
import tempfile
from dataclasses import dataclass

import torch
from _common import (
    GPT2_SMALL_SHAPE,
    add_device_arguments,
    add_model_shape_arguments,
    command_line,
    device_and_dtype,
    gpt2_dims,
    interleaved,
    load_at_end,
    machine_info,
    markdown_table,
    median,
    setup,
    synchronize,
    write_section,
)
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2LMHeadModel


GOAL = 1.03


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_shape_arguments(parser, GPT2_SMALL_SHAPE)
    add_device_arguments(parser)
    parser.add_argument("--windows", type=int, default=2, help="input length = windows * window_size")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--attn", nargs="+", default=["sdpa", "eager"], help="attention implementations to compare")
    parser.add_argument("--repeats", type=int, default=11, help="timed rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--no-body", action="store_true", help="skip timing the transformer bodies without LM head")
    parser.add_argument(
        "--profile",
        choices=["auto", "always", "never"],
        default="auto",
        help="profile one call of each model: always, never, or only when a ratio misses the goal (default)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--write-docs", action="store_true", help="replace this script's section of docs/benchmarks.md"
    )
    return parser.parse_args()


def load_pair(checkpoint: str, args: argparse.Namespace, attn: str):
    device, dtype = device_and_dtype(args)
    stock = GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation=attn).to(device, dtype).eval()
    recurrent = RecurrentGPT2LMHeadModel.from_pretrained(
        checkpoint,
        window_size=args.window_size,
        window_overlap=0,
        insertion_layer=min(2, args.n_layer - 1),
        attn_implementation=attn,
    )
    return stock, recurrent.to(device, dtype).eval()


def profile_ops(fn, device: torch.device, calls: int = 2) -> dict[str, tuple[float, int]]:
    """Self milliseconds and call count per operator over `calls` calls (after one untimed call): host time on the
    CPU, kernel time on CUDA (where the host only launches the kernels)."""
    fn()
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    return {
        e.key: ((e.self_device_time_total if cuda else e.self_cpu_time_total) / 1000 / calls, e.count // calls)
        for e in prof.key_averages()
    }


@dataclass
class Measured:
    """One attention implementation's timings (seconds per call, one per round) and operator profiles."""

    attn: str
    times: dict[str, list[float]]
    first_window_diff: float
    profiles: tuple[dict, dict] | None

    def paired_ratio(self, recurrent: str = "recurrent", stock: str = "stock_sequential") -> float:
        """Median over rounds of recurrent / stock measured back to back in the same round."""
        return median([r / s for r, s in zip(self.times[recurrent], self.times[stock], strict=True)])


def measure(args: argparse.Namespace, checkpoint: str, ids: torch.Tensor, attn: str) -> Measured:
    """Time both models on `ids` (batch, windows * window) with `attn`, interleaved round by round."""
    chunks = list(ids.split(args.window_size, dim=1))  # `windows` x (batch, window)
    stacked = torch.cat(chunks, dim=0)  # (windows * batch, window): all windows as one batch
    stock, recurrent = load_pair(checkpoint, args, attn)
    with torch.inference_mode():
        first_diff = (recurrent(chunks[0]).logits - stock(chunks[0]).logits).abs().max().item()
        fns = {
            "recurrent": lambda: recurrent(ids),
            "stock_sequential": lambda: [stock(c) for c in chunks],
            "stock_batched": lambda: stock(stacked),
        }
        if not args.no_body:
            fns |= {
                "recurrent_body": lambda: recurrent.transformer(ids),
                "stock_body_sequential": lambda: [stock.transformer(c) for c in chunks],
            }
        times = interleaved(fns, repeats=args.repeats, warmup=args.warmup, device=ids.device)
        profiles = None
        if args.profile != "never":
            profiles = tuple(profile_ops(fns[name], ids.device) for name in ("recurrent", "stock_sequential"))
    return Measured(attn, times, first_diff, profiles)


def summarise(measured: Measured) -> tuple[list[str], list[str] | None, str]:
    """The LM-head table row, the bodies' table row (None without bodies) and the details line."""
    times = measured.times
    med = {name: median(t) for name, t in times.items()}
    row = [
        measured.attn,
        f"{med['recurrent'] * 1e3:.0f}",
        f"{med['stock_sequential'] * 1e3:.0f}",
        f"{med['stock_batched'] * 1e3:.0f}",
        f"**{measured.paired_ratio():.3f}x**",
        f"{med['recurrent'] / med['stock_sequential']:.3f}x",
        f"{min(times['recurrent']) / min(times['stock_sequential']):.3f}x",
        f"{med['recurrent'] / med['stock_batched']:.3f}x",
    ]
    body_row = None
    if "recurrent_body" in times:
        body_row = [
            measured.attn,
            f"{med['recurrent_body'] * 1e3:.0f}",
            f"{med['stock_body_sequential'] * 1e3:.0f}",
            f"{measured.paired_ratio('recurrent_body', 'stock_body_sequential'):.3f}x",
            f"{med['recurrent_body'] / med['stock_body_sequential']:.3f}x",
            f"{min(times['recurrent_body']) / min(times['stock_body_sequential']):.3f}x",
        ]
    details = (
        f"- `{measured.attn}`: first-window logits of the two models differ by at most "
        f"{measured.first_window_diff:.2e} (same weights, no `h_prev` yet); all timings (ms): "
        + "; ".join(f"{name} " + " ".join(f"{t * 1e3:.0f}" for t in ts) for name, ts in times.items())
    )
    return row, body_row, details


def render_tables(args: argparse.Namespace, rows: list[list[str]], body_rows: list[list[str]]) -> tuple[str, str]:
    """The LM-head models' table and the bodies' table ("" without bodies)."""
    window, windows, batch = args.window_size, args.windows, args.batch_size
    headers = [
        "attn",
        "recurrent (ms)",
        "stock 2x(1,300) (ms)",
        "stock (2,300) (ms)",
        "ratio vs sequential (median paired)",
        "ratio of medians",
        "ratio of minima",
        "ratio vs batched",
    ]
    if (window, windows, batch) != (300, 2, 1):
        headers[2] = f"stock {windows}x({batch},{window}) (ms)"
        headers[3] = f"stock ({windows * batch},{window}) (ms)"
    body_headers = [
        "attn",
        "recurrent body (ms)",
        "stock body, sequential (ms)",
        "ratio (median paired)",
        "ratio of medians",
        "ratio of minima",
    ]
    return markdown_table(headers, rows), markdown_table(body_headers, body_rows) if body_rows else ""


def main() -> None:
    args = parse_args()
    setup(args.seed, args.threads)
    device, dtype = device_and_dtype(args)
    info = machine_info(device, dtype)
    window, windows, batch = args.window_size, args.windows, args.batch_size
    ids = torch.randint(0, args.vocab_size, (batch, windows * window), device=device)
    with tempfile.TemporaryDirectory() as checkpoint:
        GPT2LMHeadModel(GPT2Config(**gpt2_dims(args))).save_pretrained(checkpoint)
        measured = [measure(args, checkpoint, ids, attn) for attn in args.attn]

    summaries = [summarise(m) for m in measured]
    table, body_table = render_tables(args, [row for row, _, _ in summaries], [b for _, b, _ in summaries if b])
    details = [line for _, _, line in summaries]
    ratios = [m.paired_ratio() for m in measured]
    body_ratios = [] if args.no_body else [m.paired_ratio("recurrent_body", "stock_body_sequential") for m in measured]
    missed = any(ratio > GOAL for ratio in ratios)
    print(f"\n{info}\n\nLM-head models, {batch} x {windows * window} tokens = {windows} windows of {window}:\n")
    print(table)
    if body_table:
        print("\nTransformer bodies only (no LM head, no logits):\n")
        print(body_table)
    print("\n" + "\n".join(details))

    profile_text = ""
    profiles = {m.attn: m.profiles for m in measured if m.profiles is not None}
    if profiles and (args.profile == "always" or missed):
        profile_text = profile_report(profiles, device)
        print("\n" + profile_text)

    if args.write_docs:
        write_section(
            "forward_overhead",
            docs_section(args, info, table, body_table, details, profile_text, missed, ratios, body_ratios),
        )


def profile_report(profiles: dict[str, tuple[dict, dict]], device: torch.device) -> str:
    parts = []
    for attn, (rec, stock) in profiles.items():
        diffs = []
        for key in set(rec) | set(stock):
            (rt, rc), (st, sc) = rec.get(key, (0.0, 0)), stock.get(key, (0.0, 0))
            diffs.append((rt - st, key, rt, rc, st, sc))
        diffs.sort(reverse=True)
        total_r = sum(t for t, _ in rec.values())
        total_s = sum(t for t, _ in stock.values())
        rows = [[f"`{k}`", f"{d:+.1f}", f"{rt:.1f} ({rc})", f"{st:.1f} ({sc})"] for d, k, rt, rc, st, sc in diffs[:8]]
        rows += [
            [f"`{k}`", f"{d:+.1f}", f"{rt:.1f} ({rc})", f"{st:.1f} ({sc})"] for d, k, rt, rc, st, sc in diffs[-3:]
        ]
        parts.append(
            f"Profile, `{attn}` (self {'CUDA' if device.type == 'cuda' else 'CPU'} ms per call, operator calls in brackets; total {total_r:.0f} ms "
            f"recurrent vs {total_s:.0f} ms stock sequential). Most expensive extra operators first, then the three "
            "the recurrent model spends least on:\n\n"
            + markdown_table(["operator", "recurrent - stock", "recurrent", "stock sequential"], rows)
        )
    return "\n\n".join(parts)


def docs_section(args, info, table, body_table, details, profile_text, missed, ratios, body_ratios) -> str:
    window, windows, batch = args.window_size, args.windows, args.batch_size
    text = f"""## Forward overhead vs stock GPT-2

Goal: the recurrent model's forward pass costs at most {GOAL:.2f}x stock GPT-2's on the same windows.

`{command_line()}`

Machine: {info}; {load_at_end()}.

Model: GPT-2 shape n_layer={args.n_layer}, n_embd={args.n_embd}, n_head={args.n_head}, vocab {args.vocab_size},
random weights saved from `GPT2LMHeadModel` and loaded into `RecurrentGPT2LMHeadModel` (window_size={window},
window_overlap=0). Input: batch {batch}, {windows * window} tokens = {windows} windows, `torch.inference_mode()`,
logits returned by both. "Sequential" runs stock GPT-2 on the {windows} windows one after the other, the
apples-to-apples baseline; "batched" stacks them into one batch, which only stock GPT-2 can do since its windows
do not depend on each other. {args.repeats} interleaved rounds after {args.warmup} warm-up round(s); times are
medians. The headline ratio is the median over rounds of recurrent / stock measured back to back in the same round,
which cancels drift; "ratio of medians" compares the median times, "ratio of minima" the fastest calls (the least
disturbed by other processes). The three differ by a few percent even on an idle machine: that is the resolution
of this measurement.

{table}
"""
    if body_table:
        text += f"\nTransformer bodies only (`model.transformer`, no LM head and no logits):\n\n{body_table}\n"
    text += "\n" + "\n".join(details) + "\n"
    if profile_text:
        text += "\n" + profile_text + "\n"
    text += (
        f"\nGoal {'missed' if missed else 'met'}: "
        + ", ".join(f"{r:.3f}x ({a})" for a, r in zip(args.attn, ratios, strict=True))
        + " (LM-head models, median paired ratio vs sequential stock GPT-2)."
    )
    if body_ratios:
        text += " Transformer bodies alone: " + ", ".join(
            f"{r:.3f}x ({a})" for a, r in zip(args.attn, body_ratios, strict=True)
        )
        text += "."
    text += "\n"
    return text


if __name__ == "__main__":
    main()
