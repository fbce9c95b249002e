# SPDX-License-Identifier: Apache-2.0
"""Masked LM split by length (Nam et al. 2020, §5.2 and Table 2): I-BERT, BERT and I-BERT+PE trained on short
sentences of Jane Austen's novels, evaluated on longer ones, at a CPU size.

Every sentence of the six novels (`hf_recurrence.data.austen_sentences`, dialogue included) is split by its WordPiece
length (BERT's uncased vocabulary, special tokens excluded): 8..32 tokens to train, 33..64 to validate (the paper's
word thresholds, applied to tokens). One short sentence in ten, chosen by the hash of its text, is held out to score
the training lengths. Every piece of one word (a word with a letter) is masked per sentence: a fresh word every
epoch of training (`WholeWordMaskedSentences.set_epoch`), one fixed draw for the evaluation sets. The three models
have the same size, data, seed and steps, and the 30,522-token vocabulary; the masked-LM head runs at the masked
positions only (`sparse_prediction=True` for I-BERT, the same slice for BERT).

Reported per length bucket: masked-word accuracy (every piece of the word right) and the perplexity of the masked
pieces (exp of their mean loss), each with a 95% bootstrap interval over sentences, and the paired difference
I-BERT - BERT on the long split (a paired bootstrap over the same masked sentences).

Run (recorded):

    OMP_NUM_THREADS=1 python experiments/inductive_masked_lm.py --num-layers 4 --steps 6500 --log-every 250 --write-docs

(43 minutes of training for the three models on one thread of a 2-core machine; the other core was busy.)

Each model's evaluation is saved in `--work-dir` as it ends: a rerun with the same settings skips the models
already there (`--fresh` starts over), and the result file shows what finished.
"""

import argparse
import contextlib
import io
import json
import math
import os
import time
from pathlib import Path

import _common as bench
import numpy as np
import torch
from transformers import BertConfig, BertForMaskedLM

from hf_recurrence import IBertForMaskedLM, InductiveBertConfig
from hf_recurrence.data import (
    WholeWordMaskedSentences,
    austen_sentences,
    hold_out,
    minilm_tokenizer,
    pydoc_sentences,
    split_by_length,
)


MODELS = {"ibert": "I-BERT", "bert": "BERT", "ibert_pe": "I-BERT+PE"}
TRAIN_LENGTHS = range(8, 33)
VALIDATION_LENGTHS = range(33, 65)
# Length buckets (WordPiece tokens, special tokens excluded) of the held-out short and the long sentences.
BUCKETS = {"short": ((8, 16), (17, 32)), "long": ((33, 40), (41, 48), (49, 64))}
SPLIT_NAMES = {"short": "held-out short", "long": "long (validation)"}
# Masks drawn for the evaluation sets: a seed no training epoch uses.
EVAL_MASK_SEED = 1_000_003
DOCS_IMAGE = bench.REPO_ROOT / "docs" / "images" / "inductive_masked_lm_accuracy.png"
DEFAULT_WORK_DIR = bench.REPO_ROOT / "outputs" / "inductive_masked_lm"
# The paper's Table 2, word-level Penn Treebank (BERT-base sizes, 100 epochs on a GPU; words, not word pieces).
PAPER_TABLE2_WORD = {
    "I-BERT": {"seq_s": 343, "train_acc": 0.58, "train_ppl": 6.86, "val_acc": 0.32, "val_ppl": 21.02},
    "XLNet": {"seq_s": 217, "train_acc": 0.58, "train_ppl": 5.22, "val_acc": 0.39, "val_ppl": 14.05},
    "LSTM seq2seq": {"seq_s": 1280, "train_acc": 0.34, "train_ppl": 15.11, "val_acc": 0.29, "val_ppl": 22.95},
    "BERT": {"seq_s": 394, "train_acc": 0.57, "train_ppl": 5.31, "val_acc": 0.25, "val_ppl": 34.43},
}
# Settings that make a model's saved run reusable: a change in any of them trains it again.
RUN_SETTINGS = (
    "corpus",
    "max_train_sentences",
    "max_eval_sentences",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "steps",
    "batch_size",
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "seed",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__, threads=1, cuda_dtype="float32")
    parser.add_argument("--models", default="ibert,bert,ibert_pe", help=f"comma-separated, from {list(MODELS)}")
    parser.add_argument("--corpus", choices=("austen", "pydoc"), default="austen")
    parser.add_argument("--max-train-sentences", type=int, help="keep the first N training sentences (tests)")
    parser.add_argument("--max-eval-sentences", type=int, help="keep the first N of each evaluation set (tests)")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the intervals")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="each model's saved run")
    parser.add_argument("--fresh", action="store_true", help="discard the saved runs of --work-dir")
    parser.add_argument(
        "--also-from",
        type=Path,
        action="append",
        default=[],
        help="a saved model run of another work dir (same data, other settings) to show and compare beside this "
        "run's models, labelled with the settings that differ",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        help=f"accuracy vs length (default: {DOCS_IMAGE.relative_to(bench.REPO_ROOT)} for the recorded run, else "
        "beside --output-json)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.models.split(",") if name not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    if args.plot is None:
        recorded = args.output_json.resolve() == Path(parser.get_default("output_json")).resolve()
        args.plot = DOCS_IMAGE if recorded else args.output_json.with_suffix(".png")
    return args


def length_split(args: argparse.Namespace, tokenizer) -> dict[str, list[str]]:
    """The training sentences, the held-out short ones and the long ones, deterministic for a corpus."""
    sentences = austen_sentences() if args.corpus == "austen" else pydoc_sentences()
    short, long = split_by_length(sentences, tokenizer, TRAIN_LENGTHS, VALIDATION_LENGTHS)
    train, held_out = hold_out(short)
    return {
        "train": train[: args.max_train_sentences],
        "short": held_out[: args.max_eval_sentences],
        "long": long[: args.max_eval_sentences],
    }


def build_model(name: str, args: argparse.Namespace, vocab_size: int, pad_token_id: int) -> torch.nn.Module:
    """One of the compared models, all of the same size; BERT's and I-BERT+PE's position tables reach the longest
    validation sentence with its [CLS] and [SEP]."""
    sizes = {
        "vocab_size": vocab_size,
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "intermediate_size": args.intermediate_size,
        "pad_token_id": pad_token_id,
        "type_vocab_size": 1,
    }
    positions = VALIDATION_LENGTHS[-1] + 2
    if name == "bert":
        return BertForMaskedLM(BertConfig(max_position_embeddings=positions, **sizes))
    ablation = {"ibert": {}, "ibert_pe": {"use_position_embeddings": True, "max_position_embeddings": positions}}
    return IBertForMaskedLM(InductiveBertConfig(sparse_prediction=True, **sizes, **ablation[name]))


def collate(examples: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors of a batch (padding masked out of attention, unlabelled)."""
    width = max(len(e["input_ids"]) for e in examples)

    def padded(key: str, value: int) -> torch.Tensor:
        return torch.tensor([e[key] + [value] * (width - len(e[key])) for e in examples])

    return {
        "input_ids": padded("input_ids", pad_token_id),
        "attention_mask": padded("attention_mask", 0),
        "labels": padded("labels", -100),
    }


def masked_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits at the labelled positions, `(labelled, vocab)` in row-major order, and their labels: I-BERT's
    sparse head, and for BERT its encoder followed by its head on those positions only (the same loss as the full
    head, at a fraction of the 30,522-way cost)."""
    labelled = batch["labels"] != -100
    if isinstance(model, BertForMaskedLM):
        hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        return model.cls(hidden[labelled]), batch["labels"][labelled]
    return model(**batch).logits, batch["labels"][labelled]


def learning_rate_factor(step: int, warmup_steps: int, steps: int) -> float:
    """Linear warm-up, then linear decay to 0 at `steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (steps - step) / max(1, steps - warmup_steps))


def train(model: torch.nn.Module, dataset: WholeWordMaskedSentences, args: argparse.Namespace, label: str) -> dict:
    """`args.steps` AdamW steps on shuffled batches; each new epoch re-masks every sentence (`set_epoch`) and
    reshuffles, both seeded. Prints the loss, steps/s and the time left every `args.log_every` steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(step, args.warmup_steps, args.steps)
    )
    generator = torch.Generator().manual_seed(args.seed)
    order: list[int] = []
    epoch, position, curve, window = -1, 0, [], []
    model.train()
    started = last = time.perf_counter()
    for step in range(args.steps):
        if position + args.batch_size > len(order):
            epoch += 1
            if epoch > 0:
                dataset.set_epoch(epoch)
            order, position = torch.randperm(len(dataset), generator=generator).tolist(), 0
        batch = collate([dataset[i] for i in order[position : position + args.batch_size]], args.pad_token_id)
        position += args.batch_size
        logits, labels = masked_logits(model, batch)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        window.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            now = time.perf_counter()
            rate = len(window) / (now - last)
            mean = sum(window) / len(window)
            curve.append({"step": step + 1, "epoch": epoch, "loss": round(mean, 4)})
            left = (args.steps - step - 1) / (step + 1) * (now - started)
            print(
                f"{label}: step {step + 1}/{args.steps} epoch {epoch} loss {mean:.3f} {rate:.2f} steps/s "
                f"{left / 60:.1f} min left",
                flush=True,
            )
            window, last = [], now
    seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 1),
        "epochs": epoch + 1,
        "steps_per_second": args.steps / seconds,
        "curve": curve,
    }


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: WholeWordMaskedSentences, args: argparse.Namespace) -> dict:
    """Per sentence: its length (tokens without [CLS]/[SEP]), whether every masked piece is the argmax, the summed
    loss of its masked pieces, and their count."""
    model.eval()
    order = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"]))
    correct, nll, pieces = [0] * len(dataset), [0.0] * len(dataset), [0] * len(dataset)
    for start in range(0, len(order), args.eval_batch_size):
        indices = order[start : start + args.eval_batch_size]
        batch = collate([dataset[i] for i in indices], args.pad_token_id)
        logits, labels = masked_logits(model, batch)
        rows = (batch["labels"] != -100).nonzero()[:, 0]
        losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        wrong = torch.zeros(len(indices)).index_add_(0, rows, (logits.argmax(-1) != labels).float())
        summed = torch.zeros(len(indices), dtype=torch.float64).index_add_(0, rows, losses.double())
        counts = torch.zeros(len(indices), dtype=torch.long).index_add_(0, rows, torch.ones_like(rows))
        for j, i in enumerate(indices):
            correct[i], nll[i], pieces[i] = int(wrong[j] == 0), round(summed[j].item(), 5), int(counts[j])
    model.train()
    lengths = [len(dataset[i]["input_ids"]) - 2 for i in range(len(dataset))]
    return {"length": lengths, "correct": correct, "nll": nll, "pieces": pieces}


def metric_intervals(
    correct: np.ndarray, nll: np.ndarray, pieces: np.ndarray, resamples: int, seed: int
) -> dict[str, float]:
    """Masked-word accuracy and masked-piece perplexity of a set of sentences, each with the 2.5 and 97.5
    percentiles of `resamples` bootstrap resamples of the sentences."""
    n = len(correct)
    result = {"n": n, "accuracy": float(correct.mean()), "perplexity": float(math.exp(nll.sum() / pieces.sum()))}
    rng = np.random.default_rng(seed)
    accuracies, perplexities = [], []
    for chunk in range(0, resamples, 200):
        index = rng.integers(0, n, size=(min(200, resamples - chunk), n))
        accuracies.append(correct[index].mean(1))
        perplexities.append(np.exp(nll[index].sum(1) / pieces[index].sum(1)))
    accuracies, perplexities = np.concatenate(accuracies), np.concatenate(perplexities)
    result["accuracy_low"], result["accuracy_high"] = (float(q) for q in np.percentile(accuracies, [2.5, 97.5]))
    result["perplexity_low"], result["perplexity_high"] = (float(q) for q in np.percentile(perplexities, [2.5, 97.5]))
    return result


def paired_difference(first: np.ndarray, second: np.ndarray, resamples: int, seed: int) -> dict[str, float]:
    """mean(first) - mean(second) over the same sentences, with a 95% paired bootstrap interval (the sentences are
    resampled together, so what the two models share cancels)."""
    if len(first) != len(second):
        raise ValueError(f"paired samples differ in size: {len(first)} and {len(second)}")
    differences = first.astype(float) - second.astype(float)
    rng = np.random.default_rng(seed)
    means = np.concatenate(
        [
            differences[rng.integers(0, len(differences), size=(min(200, resamples - chunk), len(differences)))].mean(
                1
            )
            for chunk in range(0, resamples, 200)
        ]
    )
    low, high = np.percentile(means, [2.5, 97.5])
    return {"n": len(differences), "difference": float(differences.mean()), "low": float(low), "high": float(high)}


def bucket_metrics(evaluation: dict, resamples: int, seed: int) -> dict[str, dict]:
    """`metric_intervals` for the whole split and for each of its length buckets, by name ("all", "33-40", ...)."""
    lengths = np.array(evaluation["length"])
    arrays = [np.array(evaluation[key], dtype=float) for key in ("correct", "nll", "pieces")]
    groups = {"all": np.ones(len(lengths), dtype=bool)}
    for buckets in BUCKETS.values():
        for low, high in buckets:
            groups[f"{low}-{high}"] = (lengths >= low) & (lengths <= high)
    return {
        name: metric_intervals(*(a[chosen] for a in arrays), resamples, seed)
        for name, chosen in groups.items()
        if chosen.any()
    }


def run_fingerprint(args: argparse.Namespace, sizes: dict[str, int]) -> dict:
    return {**{name: getattr(args, name) for name in RUN_SETTINGS}, **sizes}


def run_model(name: str, args: argparse.Namespace, data: dict, sizes: dict) -> dict:
    """Train and evaluate one model, or take its saved run from `--work-dir` if it was made with these settings."""
    path = args.work_dir / f"{name}.json"
    fingerprint = run_fingerprint(args, sizes)
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["settings"] == fingerprint:
            print(f"{MODELS[name]}: saved in {path}, not trained again", flush=True)
            return saved
    torch.manual_seed(args.seed)
    model = build_model(name, args, args.vocab_size, args.pad_token_id)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{MODELS[name]}: {parameters:,} parameters, {args.steps} steps of {args.batch_size}", flush=True)
    training = train(model, data["train"], args, MODELS[name])
    started = time.perf_counter()
    evaluations = {split: evaluate(model, data[split], args) for split in BUCKETS}
    record = {
        "model": name,
        "label": MODELS[name],
        "settings": fingerprint,
        "parameters": parameters,
        "training": training,
        "evaluation_seconds": round(time.perf_counter() - started, 1),
        "evaluations": evaluations,
    }
    args.work_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.partial")
    temporary.write_text(json.dumps(record) + "\n")
    os.replace(temporary, path)
    return record


def other_run(path: Path, fingerprint: dict, planned: list[str]) -> dict:
    """A saved model run from another work dir (`--also-from`), checked to be scored on the same masked sentences,
    labelled with the settings in which it differs from this run."""
    record = json.loads(Path(path).read_text())
    if record["model"] in planned:
        raise SystemExit(f"--also-from {path}: {record['label']} is also trained by this run (--models)")
    same_data = ("corpus", "max_train_sentences", "max_eval_sentences", "train", "short", "long")
    if any(record["settings"].get(key) != fingerprint.get(key) for key in same_data):
        raise SystemExit(f"--also-from {path}: scored on other sentences than this run's")
    differing = [
        f"{key.replace('_', ' ')} {record['settings'][key]}"
        for key in RUN_SETTINGS
        if record["settings"].get(key) != fingerprint.get(key)
    ]
    return {**record, "label": f"{record['label']} ({', '.join(differing)})" if differing else record["label"]}


def interval_cell(metrics: dict | None, key: str, digits: int) -> str:
    if metrics is None:
        return "–"
    return f"{metrics[key]:.{digits}f} ({metrics[key + '_low']:.{digits}f}–{metrics[key + '_high']:.{digits}f})"


def result_tables(records: list[dict], summaries: dict[str, dict], comparisons: list[dict]) -> dict[str, dict]:
    columns = [(split, f"{low}-{high}") for split, buckets in BUCKETS.items() for low, high in buckets]
    columns += [("short", "all"), ("long", "all")]
    headers = ["model"] + [f"{split} {bucket}" for split, bucket in columns]
    tables = {}
    for key, digits, what in (("accuracy", 3, "accuracy"), ("perplexity", 1, "perplexity")):
        rows = [
            [record["label"]]
            + [interval_cell(summaries[record["model"]][split].get(bucket), key, digits) for split, bucket in columns]
            for record in records
        ]
        tables[what] = bench.table(headers, rows, [""] + ["right"] * len(columns))
    tables["models"] = bench.table(
        ["model", "parameters", "steps", "epochs", "training (min)", "steps/s", "final training loss"],
        [
            [
                record["label"],
                f"{record['parameters']:,}",
                f"{record['training']['curve'][-1]['step']:,}",
                str(record["training"]["epochs"]),
                f"{record['training']['seconds'] / 60:.1f}",
                f"{record['training']['steps_per_second']:.2f}",
                f"{record['training']['curve'][-1]['loss']:.3f}",
            ]
            for record in records
        ],
        ["", "right", "right", "right", "right", "right", "right"],
    )
    tables["paired"] = bench.table(
        ["difference", "split", "sentences", "accuracy difference (95% paired bootstrap)"],
        [
            [
                c["label"],
                SPLIT_NAMES[c["split"]],
                f"{c['n']:,}",
                f"{c['difference']:+.3f} ({c['low']:+.3f} to {c['high']:+.3f})",
            ]
            for c in comparisons
        ],
        ["", "", "right", "right"],
    )
    tables["paper"] = bench.table(
        ["model (paper, word-level PTB)", "seq/s", "training acc", "training PPL", "validation acc", "validation PPL"],
        [
            [model, str(v["seq_s"]), f"{v['train_acc']:.2f}", f"{v['train_ppl']:.2f}", f"{v['val_acc']:.2f}"]
            + [f"{v['val_ppl']:.2f}"]
            for model, v in PAPER_TABLE2_WORD.items()
        ],
        ["", "right", "right", "right", "right", "right"],
    )
    return tables


def comparisons_of(records: dict[str, dict], resamples: int, seed: int) -> list[dict]:
    """Paired accuracy differences on each split: I-BERT - BERT, and I-BERT - I-BERT+PE, for the models present."""
    pairs = [("ibert", "bert"), ("ibert", "ibert_pe"), ("ibert_pe", "bert")]
    comparisons = []
    for first, second in pairs:
        if first in records and second in records:
            for split in ("long", "short"):
                difference = paired_difference(
                    np.array(records[first]["evaluations"][split]["correct"]),
                    np.array(records[second]["evaluations"][split]["correct"]),
                    resamples,
                    seed,
                )
                label = f"{records[first]['label']} − {records[second]['label']}"
                comparisons.append({"label": label, "first": first, "second": second, "split": split, **difference})
    return comparisons


def verdict(comparisons: list[dict], summaries: dict[str, dict], labels: dict[str, str]) -> list[str]:
    """The goal (issue 36): I-BERT ahead of BERT on the long split, with an interval excluding 0; and what the lead
    means, read against the same difference on the held-out short sentences (the training lengths)."""
    lines = []
    found = {(c["first"], c["second"], c["split"]): c for c in comparisons}
    long, short = found.get(("ibert", "bert", "long")), found.get(("ibert", "bert", "short"))
    if long is None:
        lines.append("- Goal, I-BERT ahead of BERT on the long split: not measured (I-BERT or BERT did not finish).")
    else:
        lines.append(
            f"- Goal, I-BERT ahead of BERT on the long split with a 95% interval excluding 0: "
            f"**{'met' if long['low'] > 0 else 'not met'}** ({long['label']} = {long['difference']:+.3f}, "
            f"{long['low']:+.3f} to {long['high']:+.3f}, {long['n']:,} paired sentences)."
        )
        if short is not None:
            grows = long["difference"] > short["high"]
            lines.append(
                f"- On the held-out short sentences (the training lengths) the same difference is "
                f"{short['difference']:+.3f} ({short['low']:+.3f} to {short['high']:+.3f}): "
                + (
                    "the lead grows beyond the training lengths, as inductive generalization would have it."
                    if grows
                    else "the lead on long sentences is no larger than on the lengths both models trained on, so it "
                    "measures how well each model learned the task, not generalization to unseen lengths."
                )
            )
    for name, summary in summaries.items():
        short_all, long_all = summary["short"]["all"], summary["long"]["all"]
        lines.append(
            f"- {labels[name]}: accuracy {short_all['accuracy']:.3f} on held-out short sentences and "
            f"{long_all['accuracy']:.3f} on long ones (perplexity {short_all['perplexity']:.1f} and "
            f"{long_all['perplexity']:.1f})."
        )
    return lines


def plot(records: list[dict], summaries: dict[str, dict], path: Path) -> None:
    """Accuracy per length bucket, one line per model, with the 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = [(split, f"{a}-{b}") for split, pairs in BUCKETS.items() for a, b in pairs]
    figure, axes = plt.subplots(figsize=(6.4, 4))
    for record in records:
        summary = summaries[record["model"]]
        points = [(i, summary[split][bucket]) for i, (split, bucket) in enumerate(buckets) if bucket in summary[split]]
        x = [i for i, _ in points]
        y = [m["accuracy"] for _, m in points]
        errors = [
            [m["accuracy"] - m["accuracy_low"] for _, m in points],
            [m["accuracy_high"] - m["accuracy"] for _, m in points],
        ]
        axes.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=record["label"])
    axes.axvline(len(BUCKETS["short"]) - 0.5, color="grey", linestyle=":", label="longest training sentence")
    axes.set_xticks(range(len(buckets)), [bucket for _, bucket in buckets])
    axes.set_xlabel("sentence length (WordPiece tokens)")
    axes.set_ylabel("masked-word accuracy")
    axes.set_title("Masked LM split by length (Jane Austen)")
    axes.set_ylim(bottom=0)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def save(args, machine, data_sizes, records: dict[str, dict], planned: list[str], final: bool) -> dict:
    """The result file: every finished model's metrics, the paired differences, the tables, the goal's verdict."""
    done = [records[name] for name in planned if name in records]
    done += [record for name, record in records.items() if name not in planned]
    summaries = {
        record["model"]: {
            split: bucket_metrics(record["evaluations"][split], args.bootstrap, args.seed) for split in BUCKETS
        }
        for record in done
    }
    comparisons = comparisons_of(records, args.bootstrap, args.seed)
    finished = all(name in records for name in planned)
    text = {
        "data": [
            f"{args.corpus} sentences: {data_sizes['train']:,} for training (8..32 WordPiece tokens), "
            f"{data_sizes['short']:,} held-out short (8..32, one in ten by hash), {data_sizes['long']:,} long (33..64)."
        ],
        "time": [
            f"{sum(name in records for name in planned)} of {len(planned)} models finished"
            + ("" if finished else " (the others are missing from the tables)")
            + (
                f": {sum(records[n]['training']['seconds'] for n in planned if n in records) / 60:.1f} minutes of "
                f"training and {sum(records[n]['evaluation_seconds'] for n in planned if n in records) / 60:.1f} of "
                "evaluation in all" + (" (those of --also-from not counted)." if args.also_from else ".")
                if done
                else "."
            )
        ],
        "verdict": verdict(comparisons, summaries, {record["model"]: record["label"] for record in done}),
    }
    values = {
        "finished": finished,
        "data": data_sizes,
        "summaries": summaries,
        "comparisons": comparisons,
        "training": {r["model"]: {"parameters": r["parameters"], **r["training"]} for r in done},
        "paper_table2_word_level": PAPER_TABLE2_WORD,
    }
    tables = result_tables(done, summaries, comparisons)
    if final:
        if done:
            plot(done, summaries, args.plot)
            print(f"wrote {args.plot}")
        return bench.write_results(args, machine, tables, values, text, plot=str(args.plot))
    partial = argparse.Namespace(**{**vars(args), "write_docs": False})
    with contextlib.redirect_stdout(io.StringIO()):
        return bench.write_results(partial, machine, tables, values, text, plot=str(args.plot))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device, dtype = bench.device_and_dtype(args)
    bench.require_device_and_dtype(args, torch.device("cpu"), torch.float32, "the runs are sized for a CPU")
    bench.setup(args.seed, args.threads)
    machine = bench.describe_machine(device, dtype)
    tokenizer = minilm_tokenizer()
    args.vocab_size, args.pad_token_id = len(tokenizer), tokenizer.pad_token_id
    split = length_split(args, tokenizer)
    data = {
        "train": WholeWordMaskedSentences(split["train"], tokenizer, seed=args.seed, letters_only=True),
        **{
            name: WholeWordMaskedSentences(split[name], tokenizer, seed=EVAL_MASK_SEED, letters_only=True)
            for name in BUCKETS
        },
    }
    data_sizes = {name: len(sentences) for name, sentences in split.items()}
    print(f"sentences: {data_sizes}", flush=True)
    if args.fresh and args.work_dir.exists():
        for name in MODELS:
            (args.work_dir / f"{name}.json").unlink(missing_ok=True)
    planned = args.models.split(",")
    records = {}
    for path in args.also_from:
        record = other_run(path, run_fingerprint(args, data_sizes), planned)
        records[record["model"]] = record
    for index, name in enumerate(planned):
        records[name] = run_model(name, args, data, data_sizes)
        save(args, machine, data_sizes, records, planned, final=index == len(planned) - 1)
    return json.loads(args.output_json.read_text())


if __name__ == "__main__":
    main()
