# SPDX-License-Identifier: Apache-2.0
"""Training throughput (tokens/s) of I-BERT vs BERT of the same size, measured side by side in one run.

Run (a couple of minutes on 2 CPU cores):

    python benchmarks/ibert_throughput.py [--write-docs]

Both models are built with random weights from the same sizes (BERT with its learned absolute position table,
I-BERT with the bidirectional LSTM instead) and trained on the same random batches, once of full-length rows and
once right-padded to random lengths as `Trainer` batches are (15 % of real positions labelled): one step is forward
+ masked-LM loss + backward + AdamW step + zero_grad, in `model.train()` (dropout on). All steps alternate in rounds
(`interleaved`), so drift on a shared machine hits every variant alike; the headline is the median over rounds of
the paired ratio of step times BERT / I-BERT, which is the ratio of tokens per second I-BERT / BERT. I-BERT's LSTM
path alone (forward + backward, packed when there is padding) is timed in the same rounds, to show how much of the
gap it explains. Paper (Table 2, Penn Treebank, GPU): 0.82x character-level, 0.87x word-level.
BERT-base sizes:

    python benchmarks/ibert_throughput.py --hidden-size 768 --num-layers 12 --num-heads 12 --seq-len 256
"""

import argparse

import torch
from _common import (
    add_device_arguments,
    command_line,
    device_and_dtype,
    interleaved,
    load_at_end,
    machine_info,
    markdown_table,
    median,
    setup,
    write_section,
)
from transformers import BertConfig, BertForMaskedLM

from hf_recurrence import IBertForMaskedLM, InductiveBertConfig
from hf_recurrence.models.inductive_bert.modeling_inductive_bert import bidirectional_lstm


GOAL = 0.9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_arguments(parser)
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


def lstm_step(lstm: torch.nn.LSTM, hidden_states: torch.Tensor, padding_mask: torch.Tensor):
    """Forward + backward of I-BERT's LSTM path alone (`bidirectional_lstm`: packed when there is padding)."""

    def step() -> None:
        bidirectional_lstm(lstm, hidden_states, padding_mask).sum().backward()

    return step


def make_batch(args: argparse.Namespace, padded: bool, device: torch.device) -> dict[str, torch.Tensor]:
    """Random ids with 15 % of real positions labelled; padded rows are right-padded to random lengths in
    [seq_len / 2, seq_len], as `Trainer` batches of varying lengths are. Drawn on the CPU, so that every device
    reads the same batches."""
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len))
    low = args.seq_len // 2 if padded else args.seq_len
    lengths = torch.randint(low, args.seq_len + 1, (args.batch_size, 1))
    attention_mask = (torch.arange(args.seq_len) < lengths).long()  # (batch, seq)
    labels = torch.where((torch.rand(ids.shape) < 0.15) & attention_mask.bool(), ids, -100)
    return {"input_ids": ids.to(device), "attention_mask": attention_mask.to(device), "labels": labels.to(device)}


def main() -> None:
    args = parse_args()
    setup(args.seed, args.threads)
    device, dtype = device_and_dtype(args)
    info = machine_info(device, dtype)
    bert = BertForMaskedLM(BertConfig(max_position_embeddings=max(512, args.seq_len), **sizes(args)))
    ibert = IBertForMaskedLM(InductiveBertConfig(**sizes(args)))
    bert, ibert = bert.to(device, dtype), ibert.to(device, dtype)
    lstm = ibert.bert.embeddings.lstm
    hidden_states = torch.randn(args.batch_size, args.seq_len, args.hidden_size, device=device, dtype=dtype)
    hidden_states.requires_grad_(True)
    fns = {}
    for kind in ("full", "padded"):
        batch = make_batch(args, padded=kind == "padded", device=device)
        fns |= {
            f"bert_{kind}": training_step(bert, batch),
            f"ibert_{kind}": training_step(ibert, batch),
            f"lstm_{kind}": lstm_step(lstm, hidden_states, batch["attention_mask"]),
        }
    times = interleaved(fns, repeats=args.repeats, warmup=args.warmup, device=device)
    med = {name: median(t) for name, t in times.items()}
    rows, paired = [], {}
    for kind in ("full", "padded"):
        bert_t, ibert_t, lstm_t = times[f"bert_{kind}"], times[f"ibert_{kind}"], med[f"lstm_{kind}"]
        paired[kind] = median([b / i for b, i in zip(bert_t, ibert_t, strict=True)])
        rows.append(
            [
                "full rows" if kind == "full" else "right-padded rows",
                f"{median(bert_t) * 1e3:.0f}",
                f"{median(ibert_t) * 1e3:.0f}",
                f"**{paired[kind]:.3f}x**",
                f"{median(bert_t) / median(ibert_t):.3f}x",
                f"{min(bert_t) / min(ibert_t):.3f}x",
                f"{lstm_t * 1e3:.0f} ({lstm_t / median(ibert_t):.0%})",
                f"{median(bert_t) / (median(ibert_t) - lstm_t):.3f}x",
            ]
        )
    table = markdown_table(
        [
            "batch",
            "BERT step (ms)",
            "I-BERT step (ms)",
            "I-BERT / BERT (median paired)",
            "ratio of medians",
            "ratio of minima",
            "LSTM path alone (ms, share of I-BERT step)",
            "ratio without the LSTM path",
        ],
        rows,
    )
    verdicts = ", ".join(f"{kind} rows {'meet' if r >= GOAL else 'miss'} it" for kind, r in paired.items())
    notes = (
        f"Parameters: BERT {bert.num_parameters():,}, I-BERT {ibert.num_parameters():,}. Goal {GOAL}x: {verdicts}. "
        "The LSTM path runs the LSTM directly on full rows and packs the real tokens (`pack_padded_sequence`) when "
        "there is padding. All timings (ms): "
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
labelled) + backward + AdamW step on a batch of {args.batch_size} x {args.seq_len} tokens, once with full rows
(no padding) and once right-padded to random lengths of at least half a row;
{args.repeats} interleaved rounds after {args.warmup} warm-up rounds, medians. The ratio of minima compares the
least disturbed steps; when the three ratios disagree by more than a few percent, other processes were competing
for the cores and the spread is the resolution of the measurement.

{table}

{notes}

"Ratio without the LSTM path" subtracts the LSTM path's own time from I-BERT's step: near 1x, the LSTM path is the
whole gap. The same LSTM on the same rows costs several times more packed (padded rows) than run directly (full
rows): PyTorch's CPU kernel for a `PackedSequence` (a batch that shrinks along time) is the slow path here, not
the gather and scatter around it. Training on padded batches pays mostly for packing, not for the recurrence.
"""


if __name__ == "__main__":
    main()
