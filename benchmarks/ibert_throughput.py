# SPDX-License-Identifier: Apache-2.0
"""Training throughput (tokens/s) of I-BERT vs BERT of the same size, measured side by side in one run.

Run (a couple of minutes on 2 CPU cores):

    python benchmarks/ibert_throughput.py [--write-docs]

Both models are built with random weights from the same sizes (BERT with its learned absolute position table,
I-BERT with the bidirectional LSTM instead) and trained on the same random batches of full-length rows (no padding,
attention mask all ones, 15 % of positions labelled): one step is forward + masked-LM loss + backward + AdamW step +
zero_grad, in `model.train()` (dropout on). Steps of the two models alternate in rounds (`interleaved`), so drift on
a shared machine hits both alike; the headline is the median over rounds of the paired ratio I-BERT / BERT of
tokens per second. The LSTM's own forward + backward on an input of the same shape is timed in the same rounds, to
show how much of the gap it explains. Paper (Table 2, Penn Treebank, GPU): 0.82x character-level, 0.87x word-level.
BERT-base sizes:

    python benchmarks/ibert_throughput.py --hidden-size 768 --num-layers 12 --num-heads 12 --seq-len 256
"""

import argparse

import torch
from _common import command_line, interleaved, load_at_end, machine_info, markdown_table, median, setup, write_section
from transformers import BertConfig, BertForMaskedLM

from hf_recurrence import IBertForMaskedLM, InductiveBertConfig


GOAL = 0.9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=30522, help="BERT's WordPiece vocabulary size")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=1, help="1 avoids OpenMP waits on a shared machine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-docs", action="store_true", help="write the result into docs/benchmarks.md")
    return parser.parse_args()


def sizes(args: argparse.Namespace) -> dict[str, int]:
    return {
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "intermediate_size": 4 * args.hidden_size,
    }


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """One optimiser step of `model` on `batch`, as a closure for `interleaved`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step() -> None:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def lstm_step(lstm: torch.nn.LSTM, hidden_states: torch.Tensor):
    """Forward + backward of the LSTM alone on a (batch, seq, hidden) input."""

    def step() -> None:
        output, _ = lstm(hidden_states)
        output.sum().backward()

    return step


def main() -> None:
    args = parse_args()
    setup(args.seed, args.threads)
    info = machine_info()
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len))
    labels = torch.where(torch.rand(ids.shape) < 0.15, ids, -100)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    bert = BertForMaskedLM(BertConfig(max_position_embeddings=max(512, args.seq_len), **sizes(args)))
    ibert = IBertForMaskedLM(InductiveBertConfig(**sizes(args)))
    lstm = ibert.bert.embeddings.lstm
    hidden_states = torch.randn(args.batch_size, args.seq_len, args.hidden_size, requires_grad=True)
    times = interleaved(
        {
            "bert": training_step(bert, batch),
            "ibert": training_step(ibert, batch),
            "lstm": lstm_step(lstm, hidden_states),
        },
        repeats=args.repeats,
        warmup=args.warmup,
    )
    tokens = args.batch_size * args.seq_len
    paired = median([b / i for b, i in zip(times["bert"], times["ibert"], strict=True)])
    med = {name: median(t) for name, t in times.items()}
    lstm_share = med["lstm"] / med["ibert"]
    without_lstm = med["bert"] / (med["ibert"] - med["lstm"])
    table = markdown_table(
        [
            "model",
            "parameters",
            "step (ms)",
            "tokens/s",
            "I-BERT / BERT (median paired)",
            "ratio of medians",
            "ratio of minima",
        ],
        [
            [
                "BERT",
                f"{bert.num_parameters():,}",
                f"{med['bert'] * 1e3:.0f}",
                f"{tokens / med['bert']:.0f}",
                "",
                "",
                "",
            ],
            [
                "I-BERT",
                f"{ibert.num_parameters():,}",
                f"{med['ibert'] * 1e3:.0f}",
                f"{tokens / med['ibert']:.0f}",
                f"**{paired:.3f}x**",
                f"{med['bert'] / med['ibert']:.3f}x",
                f"{min(times['bert']) / min(times['ibert']):.3f}x",
            ],
        ],
    )
    verdict = "meets" if paired >= GOAL else "misses"
    notes = (
        f"The LSTM's forward + backward alone takes {med['lstm'] * 1e3:.0f} ms per step, {lstm_share:.0%} of an I-BERT "
        f"step; I-BERT minus that time would run at {without_lstm:.3f}x BERT. The ratio {verdict} the goal of "
        f"{GOAL}x. All timings (ms): "
        + "; ".join(f"{name} " + " ".join(f"{t * 1e3:.0f}" for t in ts) for name, ts in times.items())
    )
    print(table + "\n\n" + notes)
    if args.write_docs:
        write_section("ibert_throughput", docs_section(args, info, table, notes))


def docs_section(args: argparse.Namespace, info: str, table: str, notes: str) -> str:
    return f"""## I-BERT training throughput vs BERT

Goal: I-BERT trains at least {GOAL}x as many tokens per second as BERT of the same size (paper, Table 2: 0.82x
character-level, 0.87x word-level, GPU).

`{command_line()}`

Machine: {info}; {load_at_end()}.

Models: hidden {args.hidden_size}, {args.num_layers} layers, {args.num_heads} heads, feed-forward
{4 * args.hidden_size}, vocabulary {args.vocab_size}, random weights; BERT with absolute learned positions, I-BERT
with the bidirectional LSTM (hidden/2 per direction) instead. One step: forward + masked-LM loss (15 % of positions
labelled) + backward + AdamW step on a batch of {args.batch_size} x {args.seq_len} tokens without padding;
{args.repeats} interleaved rounds after {args.warmup} warm-up rounds, medians. The ratio of minima compares the
least disturbed steps; when the three ratios disagree by more than a few percent, other processes were competing
for the cores and the spread is the resolution of the measurement.

{table}

{notes}
"""


if __name__ == "__main__":
    main()
