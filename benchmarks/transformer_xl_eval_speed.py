# SPDX-License-Identifier: Apache-2.0
"""Transformer-XL evaluation speed: reusing the memory (the state) against the vanilla model that re-encodes its
whole attention span for every predicted token (paper §3.2 and Table 9: 363x at span 800 up to 1,874x at 3,800, on
a GPU).

Run (about 5 minutes on 2 CPU cores):

    python benchmarks/transformer_xl_eval_speed.py [--write-docs]

What is measured and how: docs/benchmarks.md, "Transformer-XL evaluation speed".
"""

import argparse

import _common as bench
import torch

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel


GOAL = 100.0


def parse_args() -> argparse.Namespace:
    # One thread by default: no parallel regions to wait for on a busy machine.
    parser = bench.benchmark_parser(__doc__, __file__, threads=1)
    bench.add_transformer_xl_shape_arguments(
        parser, {"n_layer": 6, "d_model": 512, "n_head": 8, "d_head": 64, "d_inner": 2048, "vocab_size": 8000}
    )
    parser.add_argument("--spans", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--segment-length", type=int, default=128, help="tokens per call of the segment mode")
    parser.add_argument("--cached-tokens", type=int, default=256, help="tokens predicted per timed segment-mode run")
    parser.add_argument("--single-tokens", type=int, default=32, help="tokens predicted per timed token-by-token run")
    parser.add_argument("--vanilla-tokens", type=int, default=2, help="tokens predicted per timed vanilla call")
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def predict_with_state(model: TransformerXLLMHeadModel, state, tokens: torch.Tensor, per_call: int) -> None:
    for start in range(0, tokens.shape[1], per_call):
        hidden = model.transformer(tokens[:, start : start + per_call], past_key_values=state).last_hidden_state
        model.lm_head(hidden).argmax(-1)


def predict_vanilla(model: TransformerXLLMHeadModel, context: torch.Tensor, tokens: torch.Tensor, span: int) -> None:
    ids = torch.cat([context, tokens], dim=1)
    for i in range(tokens.shape[1]):
        stop = context.shape[1] + i + 1
        hidden = model.transformer(ids[:, stop - span - 1 : stop], use_cache=False).last_hidden_state
        model.lm_head(hidden[:, -1]).argmax(-1)


def measure(model: TransformerXLLMHeadModel, span: int, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per predicted token of every mode."""
    config = model.config
    context = torch.randint(0, config.vocab_size, (1, span), device=model.device)
    tokens = torch.randint(0, config.vocab_size, (1, args.cached_tokens), device=model.device)

    def reuse(per_call: int):
        config.mem_len, config.segment_length, config.same_length = span, args.segment_length, True
        state = model.transformer(context).past_key_values
        return lambda: predict_with_state(model, state, tokens if per_call > 1 else single_tokens, per_call)

    single_tokens = tokens[:, : args.single_tokens]
    segments, single = reuse(args.segment_length), reuse(1)

    def with_settings(run, mem_len: int, segment_length: int):
        def call() -> None:
            config.mem_len, config.segment_length, config.same_length = mem_len, segment_length, True
            run()

        return call

    fns = {
        "segments": with_settings(segments, span, args.segment_length),
        "token by token": with_settings(single, span, args.segment_length),
        "vanilla": with_settings(
            lambda: predict_vanilla(model, context, tokens[:, : args.vanilla_tokens], span), 0, span + 1
        ),
    }
    times = bench.interleaved(fns, repeats=args.repeats, device=model.device)
    counts = {"segments": args.cached_tokens, "token by token": args.single_tokens, "vanilla": args.vanilla_tokens}
    return {name: bench.median(times[name]) / counts[name] for name in fns}


def main() -> None:
    args = parse_args()
    device, dtype, machine = bench.start(args)
    config = TransformerXLConfig(**bench.transformer_xl_dims(args), dropout=0.0)
    model = TransformerXLLMHeadModel(config).to(device, dtype).eval()
    rows, ratios, values = [], [], {}
    with torch.inference_mode():
        for span in args.spans:
            seconds = values[span] = measure(model, span, args)
            segment_ratio = seconds["vanilla"] / seconds["segments"]
            token_ratio = seconds["vanilla"] / seconds["token by token"]
            ratios.append(segment_ratio)
            rows.append(
                [
                    span,
                    f"{seconds['vanilla'] * 1e3:.1f}",
                    f"{seconds['segments'] * 1e3:.2f}",
                    f"{segment_ratio:.0f}x",
                    f"{seconds['token by token'] * 1e3:.2f}",
                    f"{token_ratio:.0f}x",
                ]
            )
            print(rows[-1])
    verdict = (
        f"goal >= {GOAL:.0f}x (segment mode) at the shortest span and growing with the span: "
        f"{'met' if ratios[0] >= GOAL and ratios == sorted(ratios) else 'NOT met'}"
    )
    headers = [
        "attention span",
        "vanilla (ms/token)",
        f"state reuse, {args.segment_length}-token segments (ms/token)",
        "speed-up",
        "state reuse, token by token (ms/token)",
        "speed-up",
    ]
    tables = {"speed": bench.table(headers, rows)}
    bench.write_results(args, machine, tables, {"seconds_per_token": values}, {"verdict": [verdict + "."]}, goal=GOAL)


if __name__ == "__main__":
    main()
