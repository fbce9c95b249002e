"""The recurrence paper's comparison, end to end (Yoshida et al. 2020, §5, Tables 1-2, Figures 4-5).

From one pretrained GPT-2, fine-tune a plain baseline and recurrent GPT-2s with the stock `Trainer` at equal steps on
the same tokens, evaluate all of them on held-out documents with windowed perplexity at several overlaps and window
sizes, and report perplexity against FLOPs per token as a table and a plot.
"""

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from transformers import (
    AutoConfig,
    AutoTokenizer,
    GPT2LMHeadModel,
    PreTrainedConfig,
    PreTrainedModel,
    Trainer,
    set_seed,
)

from .data import TokenBlocks, WindowedBlocksCollator, read_documents, token_stream
from .evaluation import plot_perplexity_vs_flops, windowed_perplexity, write_report
from .models import RecurrentGPT2Config, RecurrentGPT2LMHeadModel
from .outputs import REPORT_FILES, UsageError, finish_output_dir, prepare_output_dir
from .pretraining import default_model_path, short_run_arguments


@dataclass
class ReproductionSettings:
    """What `reproduce` trains and evaluates. Overlaps are fractions of the window, rounded to whole tokens."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "GPT-2 checkpoint to start from (None: the embedded default model, hf_recurrence/default_model)."
        },
    )
    window_sizes: Sequence[int] = field(default=(32, 64), metadata={"help": "Window sizes T to train and evaluate."})
    baseline_overlap_fractions: Sequence[float] = field(
        default=(0.0, 0.125, 0.25, 0.5),
        metadata={"help": "Overlaps at which the baseline is evaluated, as fractions of T."},
    )
    recurrent_overlap_fractions: Sequence[float] = field(
        default=(0.0,),
        metadata={"help": "Overlaps at which a recurrent model is trained and evaluated, as fractions of T."},
    )
    block_tokens: int = field(
        default=256, metadata={"help": "Tokens per training block; a block holds block_tokens // T windows."}
    )
    batch_size: int = field(
        default=4, metadata={"help": "Blocks per optimizer step (the baseline gets the same blocks cut into windows)."}
    )
    max_steps: int = field(default=400, metadata={"help": "Optimizer steps per model."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate (linear warm-up, cosine decay)."})
    warmup_steps: int = field(default=20, metadata={"help": "Warm-up steps."})
    eval_documents: int | None = field(
        default=None, metadata={"help": "Evaluate on only the first N held-out documents (None: every one)."}
    )
    seed: int = field(default=0, metadata={"help": "Random seed."})
    train_files: Sequence[str] = field(
        default_factory=tuple,
        metadata={"help": "Text files to fine-tune on instead of the standard library's train modules."},
    )
    test_files: Sequence[str] = field(
        default_factory=tuple,
        metadata={"help": "Text files to evaluate on instead of the standard library's test modules."},
    )

    def __post_init__(self):
        for name in ("baseline_overlap_fractions", "recurrent_overlap_fractions"):
            bad = [f for f in getattr(self, name) if not 0 <= f < 1]
            if bad:
                raise UsageError(f"{name} must lie in [0, 1), got {bad}")
        for name in ("block_tokens", "batch_size", "max_steps"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {name}={getattr(self, name)}")
        too_long = [t for t in self.window_sizes if t < 2 or t > self.block_tokens]
        if too_long:
            raise UsageError(f"window_sizes must lie in [2, block_tokens={self.block_tokens}], got {too_long}")
        if self.eval_documents is not None and self.eval_documents < 1:
            raise UsageError(
                f"eval_documents must be at least 1 (or unset, for every held-out document), got "
                f"eval_documents={self.eval_documents}"
            )
        for name in ("baseline_overlap_fractions", "recurrent_overlap_fractions"):
            for window_size in self.window_sizes:
                # The overlap is rounded to whole tokens and must leave at least one new token per window.
                bad = [f for f in getattr(self, name) if overlap_tokens(window_size, f) >= window_size]
                if bad:
                    raise UsageError(
                        f"{name}={bad} round to an overlap of {window_size} tokens at window size {window_size}, "
                        f"leaving no new token per window; fractions must be below {(window_size - 0.5) / window_size:.4g} "
                        "at that window size"
                    )

    def check_model(self, config: PreTrainedConfig) -> None:
        """Refuse window sizes the model at `model_name_or_path` (of `config`) cannot read, before any training."""
        too_long = [t for t in self.window_sizes if t > config.n_positions]
        if too_long:
            raise UsageError(
                f"window_sizes={too_long} exceed the position table of {self.model_name_or_path or 'the default model'}"
                f" (n_positions={config.n_positions}); window sizes must lie in [2, {config.n_positions}]"
            )
        # The recurrent models' own rules (insertion layer, overlap against the window), from their config.
        for window_size in self.window_sizes:
            for fraction in self.recurrent_overlap_fractions:
                RecurrentGPT2Config.from_dict(
                    {**config.to_dict(), "model_type": "recurrent_gpt2"},
                    window_size=window_size,
                    window_overlap=overlap_tokens(window_size, fraction),
                )


def overlap_tokens(window_size: int, fraction: float) -> int:
    return round(window_size * fraction)


class TrainingSchedule(Protocol):
    """The training fields `fine_tune` reads (of `ReproductionSettings` or `BookReproductionSettings`)."""

    max_steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    seed: int


def fine_tune(
    model: PreTrainedModel,
    dataset,
    settings: TrainingSchedule,
    collator=None,
    parameter_groups: list[dict] | None = None,
    bf16: bool = False,
) -> float:
    """Fine-tune the trainable parameters of `model` with the stock Trainer; returns the final training loss.

    `parameter_groups`: AdamW parameter groups with their own `lr` (the schedule scales each), instead of every
    trainable parameter at `settings.learning_rate`.
    """
    set_seed(settings.seed)
    optimizer = None
    if parameter_groups is not None:
        optimizer = torch.optim.AdamW(parameter_groups, lr=settings.learning_rate, weight_decay=0.01)
    with tempfile.TemporaryDirectory(prefix="hf_recurrence_reproduce_") as scratch:
        trainer = Trainer(
            model=model,
            args=short_run_arguments(
                scratch,
                max_steps=settings.max_steps,
                batch_size=settings.batch_size,
                learning_rate=settings.learning_rate,
                warmup_steps=settings.warmup_steps,
                seed=settings.seed,
                bf16=bf16,
            ),
            train_dataset=dataset,
            data_collator=collator,
            optimizers=(optimizer, None),
        )
        return trainer.train().training_loss


# Windows per forward for the baseline: small windows of a small model are otherwise dominated by per-call overhead.
BASELINE_EVAL_BATCH = 64


def evaluate_row(model, documents, name: str, window_size: int, overlap: int, batch_size: int = 8, **extra) -> dict:
    result = windowed_perplexity(model, documents, window_size, overlap, batch_size=batch_size)
    row = {"model": name, **result.to_dict(), **extra}
    print(f"  {name:<10} window {window_size:>4} overlap {overlap:>4}: perplexity {result.perplexity:.2f}")
    return row


def reproduce(settings: ReproductionSettings, output_dir: Path, *, overwrite: bool = False) -> list[dict]:
    """Run the comparison; writes `results.json`, `results.md` and `perplexity_vs_flops.png` to `output_dir`.

    The model, the settings against it and `output_dir` (empty unless `overwrite`) are checked before any training;
    results.json and results.md are rewritten after each evaluation, so a later failure loses nothing finished.
    """
    start = time.perf_counter()
    source = settings.model_name_or_path or str(default_model_path())
    settings.check_model(AutoConfig.from_pretrained(source))
    tokenizer = AutoTokenizer.from_pretrained(source)
    train_texts = [text for _, text in read_documents(settings.train_files, "train")]
    test_docs = read_documents(settings.test_files, "test")[: settings.eval_documents]
    stream = token_stream(train_texts, tokenizer)
    test_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for _, text in test_docs]
    print(
        f"Model {source}; training stream {len(stream):,} tokens from {len(train_texts)} documents; held-out "
        f"{sum(map(len, test_ids)):,} tokens in {len(test_docs)} documents ({', '.join(n for n, _ in test_docs)})"
    )
    prepare_output_dir(output_dir, REPORT_FILES, writer="hf-recurrence reproduce", overwrite=overwrite)

    rows = []

    def record(row: dict) -> None:
        rows.append(row)
        write_report(output_dir, rows, finished=False, **report_header(settings, source, start))

    for window_size in settings.window_sizes:
        windows_per_block = settings.block_tokens // window_size
        print(f"[window {window_size}] blocks of {windows_per_block} windows, {settings.max_steps} steps per model")

        baseline = GPT2LMHeadModel.from_pretrained(source)
        blocks = TokenBlocks(stream, windows_per_block * window_size)
        train_loss = fine_tune(baseline, blocks, settings, collator=WindowedBlocksCollator(window_size))
        tokens = settings.max_steps * settings.batch_size * windows_per_block * window_size
        for fraction in settings.baseline_overlap_fractions:
            overlap = overlap_tokens(window_size, fraction)
            record(
                evaluate_row(
                    baseline,
                    test_ids,
                    "baseline",
                    window_size,
                    overlap,
                    batch_size=BASELINE_EVAL_BATCH,
                    train_loss=train_loss,
                    tokens=tokens,
                )
            )
        del baseline

        for fraction in settings.recurrent_overlap_fractions:
            overlap = overlap_tokens(window_size, fraction)
            recurrent = RecurrentGPT2LMHeadModel.from_pretrained(
                source, window_size=window_size, window_overlap=overlap
            )
            block_size = window_size + (windows_per_block - 1) * (window_size - overlap)
            train_loss = fine_tune(recurrent, TokenBlocks(stream, block_size), settings)
            tokens = settings.max_steps * settings.batch_size * block_size
            record(
                evaluate_row(
                    recurrent, test_ids, "recurrent", window_size, overlap, train_loss=train_loss, tokens=tokens
                )
            )
            del recurrent

    minutes = (time.perf_counter() - start) / 60
    summary = findings(rows)
    table = write_report(output_dir, rows, summary, finished=True, **report_header(settings, source, start))
    plot_perplexity_vs_flops(rows, output_dir / "perplexity_vs_flops.png")
    finish_output_dir(output_dir)
    print("\n" + table + "\n")
    for line in summary:
        print(line)
    print(f"\n{minutes:.1f} minutes; results, table and plot in {output_dir}")
    return rows


def report_header(settings, source: str, start: float) -> dict:
    """What a reproduction's results.json says before its rows: the settings, the model and the minutes so far."""
    return {"settings": asdict(settings), "source": source, "minutes": (time.perf_counter() - start) / 60}


def findings(rows: list[dict]) -> list[str]:
    """The paper's two claims checked on these numbers, one line per recurrent model."""
    lines = []
    for row in (r for r in rows if r["model"] == "recurrent"):
        baselines = sorted(
            (r for r in rows if r["model"] == "baseline" and r["window_size"] == row["window_size"]),
            key=lambda r: r["overlap"],
        )
        same = next((b for b in baselines if b["overlap"] == row["overlap"]), None)
        if same is not None:
            change = 100 * (row["perplexity"] / same["perplexity"] - 1)
            lines.append(
                f"window {row['window_size']}, overlap {row['overlap']}: recurrent {row['perplexity']:.2f} vs baseline "
                f"{same['perplexity']:.2f} ({change:+.1f}%)"
            )
        matched = next((b for b in baselines if b["perplexity"] <= row["perplexity"]), None)
        if matched is None:
            lines.append(
                f"window {row['window_size']}: no baseline overlap up to {baselines[-1]['overlap']} reaches the "
                f"recurrent model's {row['perplexity']:.2f} at overlap {row['overlap']}"
            )
        else:
            # A family without an analytic FLOPs count (flops_per_token None) says so rather than a ratio.
            counted = matched.get("flops_per_token") is not None and row.get("flops_per_token") is not None
            cost = f"{matched['flops_per_token'] / row['flops_per_token']:.2f}x" if counted else "n/a"
            lines.append(
                f"window {row['window_size']}: the smallest baseline overlap at least as good as the recurrent model at "
                f"overlap {row['overlap']} is {matched['overlap']} "
                f"({math.floor(100 * matched['overlap'] / row['window_size'])}% of the window, {cost} the "
                f"FLOPs/token): {matched['perplexity']:.2f} vs {row['perplexity']:.2f}"
            )
    return lines
