# SPDX-License-Identifier: Apache-2.0
"""Transformer-XL trained with a short memory, evaluated with 1x, 2x and 4x that memory (paper §4.1 and Table 8:
a longer memory at test time than in training keeps lowering perplexity).

Run (about 5 minutes on 2 CPU cores):

    python experiments/transformer_xl_memory_length.py [--write-docs]

What is measured and how: docs/experiments/transformer_xl_memory_length.md.
"""

import argparse
import math
import time

import _common as bench
import torch

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel
from hf_recurrence.data import END_OF_TEXT, python_stdlib_documents, train_byte_level_bpe


def parse_args() -> argparse.Namespace:
    # One thread by default: no parallel regions to wait for on a busy machine. The trained model's quality is what
    # is measured, so float32 on CUDA too.
    parser = bench.benchmark_parser(__doc__, __file__, threads=1, cuda_dtype="float32")
    bench.add_transformer_xl_shape_arguments(
        parser, {"n_layer": 4, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512, "vocab_size": 2000}
    )
    parser.add_argument("--segment-length", type=int, default=32)
    parser.add_argument("--mem-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--train-seconds", type=float, default=180.0)
    parser.add_argument("--eval-docs", type=int, default=12)
    parser.add_argument("--eval-tokens", type=int, default=40000)
    parser.add_argument("--eval-streams", type=int, default=8, help="the held-out text is read as parallel streams")
    return parser.parse_args()


def corpus(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Training and evaluation token streams (1-D) and the vocabulary size."""
    documents = [text for _, text in python_stdlib_documents(min_chars=2000)]
    held_out = set(range(0, len(documents), 10)[: args.eval_docs])
    train_texts = [t for i, t in enumerate(documents) if i not in held_out]
    eval_texts = [documents[i] for i in sorted(held_out)]
    tokenizer = train_byte_level_bpe(train_texts, vocab_size=args.vocab_size)

    def stream(texts: list[str]) -> torch.Tensor:
        ids = tokenizer(END_OF_TEXT.join(texts)).input_ids
        return torch.tensor(ids, dtype=torch.long)

    return stream(train_texts), stream(eval_texts)[: args.eval_tokens + 1], len(tokenizer)


def train(model: TransformerXLLMHeadModel, tokens: torch.Tensor, args: argparse.Namespace) -> tuple[int, float]:
    """Train for `--train-seconds`; returns the optimizer steps taken and the last 50 steps' mean loss."""
    length = tokens.shape[0] // args.batch_size
    streams = tokens[: length * args.batch_size].view(args.batch_size, length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    model.train()
    state, position, steps, losses = None, 0, 0, []
    start = time.perf_counter()
    while time.perf_counter() - start < args.train_seconds:
        if position + args.segment_length + 1 > length:
            state, position = None, 0
        segment = streams[:, position : position + args.segment_length + 1]
        out = model(segment[:, :-1], past_key_values=state)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), segment[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        # The memory carries over to the next segment; its cached projections belong to the old weights.
        state = out.past_key_values.detach()
        position += args.segment_length
        steps += 1
        losses.append(loss.item())
    return steps, sum(losses[-50:]) / len(losses[-50:])


@torch.inference_mode()
def perplexity(model: TransformerXLLMHeadModel, tokens: torch.Tensor, streams: int, segment_length: int) -> float:
    """Perplexity of every token but the first of each of `streams` parallel streams, read segment after segment."""
    model.eval()
    length = (tokens.shape[0] - 1) // streams
    inputs = tokens[: length * streams].view(streams, length)
    targets = tokens[1 : length * streams + 1].view(streams, length)
    state, total = None, 0.0
    for start in range(0, length, segment_length):
        out = model(inputs[:, start : start + segment_length], past_key_values=state)
        state = out.past_key_values
        segment_targets = targets[:, start : start + segment_length]
        total += torch.nn.functional.cross_entropy(
            out.logits.flatten(0, 1), segment_targets.flatten(), reduction="sum"
        ).item()
    return math.exp(total / targets.numel())


def main() -> None:
    args = parse_args()
    device, dtype, machine = bench.start(args)
    train_tokens, eval_tokens, vocab_size = corpus(args)
    train_tokens, eval_tokens = train_tokens.to(device), eval_tokens.to(device)
    config = TransformerXLConfig(
        **{**bench.transformer_xl_dims(args), "vocab_size": vocab_size},
        segment_length=args.segment_length,
        mem_len=args.mem_len,
        dropout=0.1,
    )
    model = TransformerXLLMHeadModel(config).to(device, dtype)
    steps, train_loss = train(model, train_tokens, args)
    print(f"trained {steps} steps of {args.batch_size} x {args.segment_length} tokens, final loss {train_loss:.3f}")
    rows, values = [], {"train_steps": steps, "last_train_loss": train_loss, "perplexity_by_mem_len": {}}
    for factor in (0, 1, 2, 4):
        model.config.mem_len = factor * args.mem_len
        ppl = perplexity(model, eval_tokens, args.eval_streams, args.segment_length)
        values["perplexity_by_mem_len"][model.config.mem_len] = ppl
        rows.append([f"{factor}x" if factor else "none", model.config.mem_len, f"{ppl:.2f}"])
        print(rows[-1])
    table = bench.table(["evaluation memory", "mem_len", "held-out perplexity"], rows)
    model_line = (
        f"Model: n_layer={args.n_layer}, d_model={args.d_model}, n_head={args.n_head}, d_head={args.d_head}, "
        f"d_inner={args.d_inner}, vocab {vocab_size} (byte-level BPE trained on the training modules), "
        f"segment_length={args.segment_length}, training mem_len={args.mem_len}; {steps} steps of "
        f"{args.batch_size} x {args.segment_length} tokens in {args.train_seconds:.0f} s, last training loss "
        f"{train_loss:.3f}; {eval_tokens.shape[0] - 1} held-out tokens."
    )
    bench.write_results(args, machine, {"perplexity": table}, values, {"model": [model_line]})


if __name__ == "__main__":
    main()
