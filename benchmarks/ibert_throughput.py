# SPDX-License-Identifier: Apache-2.0
"""Training throughput (tokens/s) of I-BERT vs BERT of the same size, measured side by side in one run.

Run (a couple of minutes on 2 CPU cores):

    python benchmarks/ibert_throughput.py [--write-docs]

What is measured and how: docs/benchmarks.md, "I-BERT training throughput vs BERT". BERT-base sizes:

    python benchmarks/ibert_throughput.py --hidden-size 768 --num-layers 12 --num-heads 12 --seq-len 256
"""

import argparse

import _common as bench
import torch
from transformers import BertConfig, BertForMaskedLM

from hf_recurrence import IBertForMaskedLM, InductiveBertConfig
from hf_recurrence.models.inductive_bert.modeling_inductive_bert import bidirectional_lstm


GOAL = 0.9


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__, threads=1)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=30522, help="BERT's WordPiece vocabulary size")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
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
    # One thread by default: OpenMP waits on a shared machine would blur the ratios.
    device, dtype, machine = bench.start(args)
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
    times = bench.interleaved(fns, repeats=args.repeats, warmup=args.warmup, device=device)
    rows, values = [], {"seconds_per_step": times}
    for kind in ("full", "padded"):
        bert_t, ibert_t, lstm_t = times[f"bert_{kind}"], times[f"ibert_{kind}"], bench.median(times[f"lstm_{kind}"])
        ratio = values[kind] = bench.ratios(bert_t, ibert_t)
        rows.append(
            [
                "full rows" if kind == "full" else "right-padded rows",
                f"{bench.median(bert_t) * 1e3:.0f}",
                f"{bench.median(ibert_t) * 1e3:.0f}",
                *bench.ratio_cells(ratio, bold_paired=True),
                f"{lstm_t * 1e3:.0f} ({lstm_t / bench.median(ibert_t):.0%})",
                f"{bench.median(bert_t) / (bench.median(ibert_t) - lstm_t):.3f}x",
            ]
        )
    table = bench.table(
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
    verdicts = ", ".join(
        f"{kind} rows {'meet' if values[kind]['paired'] >= GOAL else 'miss'} it" for kind in ("full", "padded")
    )
    notes = (
        f"Parameters: BERT {bert.num_parameters():,}, I-BERT {ibert.num_parameters():,}. Goal {GOAL}x: {verdicts}. "
        "The LSTM path runs the LSTM directly on full rows and packs the real tokens (`pack_padded_sequence`) when "
        "there is padding. All timings (ms): "
        + "; ".join(f"{name} " + " ".join(f"{t * 1e3:.0f}" for t in ts) for name, ts in times.items())
    )
    bench.write_results(args, machine, {"steps": table}, values, {"notes": [notes]}, goal=GOAL)


if __name__ == "__main__":
    main()
