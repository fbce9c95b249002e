# SPDX-License-Identifier: Apache-2.0
"""Forward-pass overhead of the recurrent GPT-2 over stock GPT-2 on the same windows.

Run (about 2-3 minutes on 2 CPU cores):

    python benchmarks/forward_overhead.py [--write-docs]

What is measured and how: docs/benchmarks.md, "Forward overhead vs stock GPT-2".
"""

import argparse
import tempfile
from dataclasses import dataclass

import _common as bench
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2LMHeadModel


GOAL = 1.03


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__)
    bench.add_model_shape_arguments(parser, bench.GPT2_SMALL_SHAPE)
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
    return parser.parse_args()


def load_pair(checkpoint: str, args: argparse.Namespace, attn: str):
    device, dtype = bench.device_and_dtype(args)
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
        bench.synchronize(device)
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
        return bench.ratios(self.times[recurrent], self.times[stock])["paired"]


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
        times = bench.interleaved(fns, repeats=args.repeats, warmup=args.warmup, device=ids.device)
        profiles = None
        if args.profile != "never":
            profiles = tuple(profile_ops(fns[name], ids.device) for name in ("recurrent", "stock_sequential"))
    return Measured(attn, times, first_diff, profiles)


def summarise(measured: Measured) -> tuple[list[str], list[str] | None, str]:
    """The LM-head table row, the bodies' table row (None without bodies) and the details line."""
    times = measured.times
    med = {name: bench.median(t) for name, t in times.items()}
    lm_head = bench.ratios(times["recurrent"], times["stock_sequential"])
    row = [
        measured.attn,
        f"{med['recurrent'] * 1e3:.0f}",
        f"{med['stock_sequential'] * 1e3:.0f}",
        f"{med['stock_batched'] * 1e3:.0f}",
        *bench.ratio_cells(lm_head, bold_paired=True),
        f"{med['recurrent'] / med['stock_batched']:.3f}x",
    ]
    body_row = None
    if "recurrent_body" in times:
        body = bench.ratios(times["recurrent_body"], times["stock_body_sequential"])
        body_row = [
            measured.attn,
            f"{med['recurrent_body'] * 1e3:.0f}",
            f"{med['stock_body_sequential'] * 1e3:.0f}",
            *bench.ratio_cells(body),
        ]
    details = (
        f"- `{measured.attn}`: first-window logits of the two models differ by at most "
        f"{measured.first_window_diff:.2e} (same weights, no `h_prev` yet); all timings (ms): "
        + "; ".join(f"{name} " + " ".join(f"{t * 1e3:.0f}" for t in ts) for name, ts in times.items())
    )
    return row, body_row, details


def result_tables(args: argparse.Namespace, rows: list[list[str]], body_rows: list[list[str]]) -> dict[str, dict]:
    """The LM-head models' table and, unless `--no-body`, the bodies' table."""
    window, windows, batch = args.window_size, args.windows, args.batch_size
    headers = [
        "attn",
        "recurrent (ms)",
        f"stock {windows}x({batch},{window}) (ms)",
        f"stock ({windows * batch},{window}) (ms)",
        "ratio vs sequential (median paired)",
        "ratio of medians",
        "ratio of minima",
        "ratio vs batched",
    ]
    body_headers = [
        "attn",
        "recurrent body (ms)",
        "stock body, sequential (ms)",
        "ratio (median paired)",
        "ratio of medians",
        "ratio of minima",
    ]
    tables = {"lm_head": bench.table(headers, rows)}
    if body_rows:
        tables["bodies"] = bench.table(body_headers, body_rows)
    return tables


def main() -> None:
    args = parse_args()
    device, dtype, machine = bench.start(args)
    window, windows, batch = args.window_size, args.windows, args.batch_size
    ids = torch.randint(0, args.vocab_size, (batch, windows * window), device=device)
    with tempfile.TemporaryDirectory() as checkpoint:
        GPT2LMHeadModel(GPT2Config(**bench.gpt2_dims(args))).save_pretrained(checkpoint)
        measured = [measure(args, checkpoint, ids, attn) for attn in args.attn]

    summaries = [summarise(m) for m in measured]
    tables = result_tables(args, [row for row, _, _ in summaries], [b for _, b, _ in summaries if b])
    ratios = [m.paired_ratio() for m in measured]
    body_ratios = [] if args.no_body else [m.paired_ratio("recurrent_body", "stock_body_sequential") for m in measured]
    missed = any(ratio > GOAL for ratio in ratios)
    findings = [line for _, _, line in summaries]
    profiles = {m.attn: m.profiles for m in measured if m.profiles is not None}
    if profiles and (args.profile == "always" or missed):
        findings += ["", profile_report(profiles, device)]
    goal = (
        f"Goal {'missed' if missed else 'met'}: "
        + ", ".join(f"{r:.3f}x ({a})" for a, r in zip(args.attn, ratios, strict=True))
        + " (LM-head models, median paired ratio vs sequential stock GPT-2)."
    )
    if body_ratios:
        goal += (
            " Transformer bodies alone: "
            + ", ".join(f"{r:.3f}x ({a})" for a, r in zip(args.attn, body_ratios, strict=True))
            + "."
        )
    values = {
        m.attn: {"seconds_per_call": m.times, "first_window_max_logit_diff": m.first_window_diff} for m in measured
    }
    bench.write_results(
        args, machine, tables, values, {"details": findings, "verdict": [goal]}, goal=GOAL, goal_met=not missed
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
            + bench.markdown_table(
                bench.table(["operator", "recurrent - stock", "recurrent", "stock sequential"], rows)
            )
        )
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
