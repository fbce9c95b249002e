# SPDX-License-Identifier: Apache-2.0
"""Transformer-XL evaluation speed: reusing the memory (the state) against the vanilla model that re-encodes its
whole attention span for every predicted token (paper §3.2 and Table 9: 363x at span 800 up to 1,874x at 3,800, on
a GPU).

Run (about 5 minutes on 2 CPU cores):

    python benchmarks/transformer_xl_eval_speed.py [--write-docs]

One model with random weights (default n_layer=6, d_model=512, n_head=8, d_head=64, d_inner=2048, vocab 8000; the
cost of a forward pass does not depend on the weights' values), evaluated at attention spans 256, 512 and 1024.
Every prediction sees exactly `span` earlier tokens in all three modes:

- vanilla: `mem_len = 0`, `segment_length = span + 1`; every predicted token re-encodes its `span` predecessors and
  itself from scratch, and the head runs on the last position only;
- state reuse, segments (the paper's evaluation): `mem_len = span`, `same_length=True`, one call per segment of
  `--segment-length` tokens continuing the state; the head runs on every position;
- state reuse, token by token (what `generate()` does): the same with one token per call.

The modes are timed in interleaved rounds (so machine drift hits all alike) under `torch.inference_mode()`;
reported is the median time per predicted token and the ratios to vanilla.
"""

import argparse

import torch
from _common import (
    add_device_arguments,
    add_transformer_xl_shape_arguments,
    command_line,
    device_and_dtype,
    interleaved,
    load_at_end,
    machine_info,
    markdown_table,
    median,
    setup,
    transformer_xl_dims,
    write_section,
)

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel


GOAL = 100.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_transformer_xl_shape_arguments(
        parser, {"n_layer": 6, "d_model": 512, "n_head": 8, "d_head": 64, "d_inner": 2048, "vocab_size": 8000}
    )
    add_device_arguments(parser)
    parser.add_argument("--spans", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--segment-length", type=int, default=128, help="tokens per call of the segment mode")
    parser.add_argument("--cached-tokens", type=int, default=256, help="tokens predicted per timed segment-mode run")
    parser.add_argument("--single-tokens", type=int, default=32, help="tokens predicted per timed token-by-token run")
    parser.add_argument("--vanilla-tokens", type=int, default=2, help="tokens predicted per timed vanilla call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="1: no parallel regions to wait for on a busy machine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-docs", action="store_true")
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
    times = interleaved(fns, repeats=args.repeats, device=model.device)
    counts = {"segments": args.cached_tokens, "token by token": args.single_tokens, "vanilla": args.vanilla_tokens}
    return {name: median(times[name]) / counts[name] for name in fns}


def main() -> None:
    args = parse_args()
    setup(args.seed, args.threads)
    device, dtype = device_and_dtype(args)
    config = TransformerXLConfig(**transformer_xl_dims(args), dropout=0.0)
    model = TransformerXLLMHeadModel(config).to(device, dtype).eval()
    info = machine_info(device, dtype)
    rows, ratios = [], []
    with torch.inference_mode():
        for span in args.spans:
            seconds = measure(model, span, args)
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
    table = markdown_table(headers, rows)
    print(table)
    print(verdict)
    if args.write_docs:
        body = (
            "## Transformer-XL evaluation speed (`transformer_xl_eval_speed.py`)\n\n"
            "Reusing the memory (`past_key_values`) against re-encoding the whole attention span for every "
            "predicted token; same model, same number of earlier tokens seen by every prediction (paper Table 9: "
            "363x at span 800 up to 1,874x at 3,800, on a GPU). Segment mode is the paper's evaluation; token by "
            "token is what `generate()` does, and on a CPU it is bound by reading the weights once per token.\n\n"
            f"{info}; {load_at_end()}.\n\n`{command_line()}`\n\n"
            f"Model: n_layer={args.n_layer}, d_model={args.d_model}, n_head={args.n_head}, d_head={args.d_head}, "
            f"d_inner={args.d_inner}, vocab {args.vocab_size}, random weights.\n\n{table}\n\n{verdict}."
        )
        write_section("transformer_xl_eval_speed", body)


if __name__ == "__main__":
    main()
