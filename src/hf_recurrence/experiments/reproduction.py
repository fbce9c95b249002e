"""The recurrence paper's comparison, end to end (Yoshida et al. 2020, §5, Tables 1-2, Figures 4-5), with a control.

From one pretrained GPT-2, fine-tune a plain baseline, recurrent GPT-2s and their zero-input controls (the same
recurrence module reading zeros, `recurrence_input="zeros"`: its `h_prev` is a learned constant) with the stock
`Trainer` at equal steps on the same tokens, evaluate all of them on held-out documents with windowed perplexity at
several overlaps and window sizes, and report perplexity against FLOPs per token as a table and a plot, and the
recurrent model's gain over the baseline decomposed, with paired bootstrap intervals, into the control's learned
constant (control vs baseline) and carried context (recurrent vs control).
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import (
    AutoConfig,
    AutoTokenizer,
    GPT2LMHeadModel,
    PreTrainedConfig,
    TrainerCallback,
    set_seed,
)

from ..data import TokenBlocks, WindowedBlocksCollator, read_documents, token_stream
from ..evaluation import TokenNLL, plot_perplexity_vs_flops, windowed_perplexity, write_report
from ..evaluation.statistics import compare, describe
from ..models import RecurrentGPT2Config, RecurrentGPT2LMHeadModel
from ..outputs import REPORT_FILES, UsageError, finish_output_dir, prepare_output_dir
from .pretraining import default_model_path
from .training import RunProgress, fine_tune


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
    max_steps: int = field(
        default=270,
        metadata={"help": "Optimizer steps per model (every arm, the control included, takes the same steps)."},
    )
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate (linear warm-up, cosine decay)."})
    warmup_steps: int = field(default=20, metadata={"help": "Warm-up steps."})
    eval_documents: int | None = field(
        default=None, metadata={"help": "Evaluate on only the first N held-out documents (None: every one)."}
    )
    segment_tokens: int = field(
        default=512,
        metadata={"help": "Predicted tokens per bootstrap segment (the intervals pair the arms over these segments)."},
    )
    num_resamples: int = field(default=10_000, metadata={"help": "Bootstrap resamples."})
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
        for name in ("block_tokens", "batch_size", "max_steps", "segment_tokens", "num_resamples"):
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
        """Refuse a model that is not a GPT-2, and window sizes the model at `model_name_or_path` (of `config`) cannot
        read, before any training."""
        if config.model_type != "gpt2":
            raise UsageError(
                f"--model_name_or_path {self.model_name_or_path}: a {config.model_type} checkpoint; this reproduction "
                "fine-tunes a GPT-2 (model_type gpt2: unset for the embedded default, gpt2 from the Hub, or a GPT-2 "
                "folder). Other decoders: --preset smollm2 --model_name_or_path FOLDER_OR_GGUF"
            )
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


# Windows per forward for the baseline: small windows of a small model are otherwise dominated by per-call overhead.
BASELINE_EVAL_BATCH = 64

# The arms trained beside the baseline at each window size and recurrent overlap: name -> `recurrence_input` of their
# recurrence module. The control's reads zeros, so its `h_prev` is a learned constant whatever the text.
TRAINED_ARMS = {"recurrent": "window", "control": "zeros"}

# A recurrent model's gain over the baseline and its two parts, each (part, arm b, arm a): b vs a at the recurrent
# model's window and overlap. Perplexity ratios multiply (recurrent/baseline = control/baseline x recurrent/control),
# so the total is the sum of the parts in log perplexity, and nearly so in percent.
DECOMPOSITION = (
    ("total gain", "recurrent", "baseline"),
    ("learned constant", "control", "baseline"),
    ("carried context", "recurrent", "control"),
)

# Every evaluation's per-token NLLs, by (window size, overlap), then by arm: what `decomposition` pairs.
Reads = dict[tuple[int, int], dict[str, list[TokenNLL]]]


def evaluate_row(
    model, documents, name: str, window_size: int, overlap: int, batch_size: int = 8, **extra
) -> tuple[dict, list[TokenNLL]]:
    """Read `documents` with `model` in windows; returns its row and every predicted token's NLL (for the intervals)."""
    result = windowed_perplexity(model, documents, window_size, overlap, batch_size=batch_size, return_token_nll=True)
    row = {"model": name, **result.to_dict(), **extra}
    print(f"  {name:<10} window {window_size:>4} overlap {overlap:>4}: perplexity {result.perplexity:.2f}")
    return row, result.token_nll


def reproduce(
    settings: ReproductionSettings, output_dir: Path, *, overwrite: bool = False, caveat: str | None = None
) -> list[dict]:
    """Run the comparison; writes `results.json`, `results.md` and `perplexity_vs_flops.png` to `output_dir`.

    The model, the settings against it and `output_dir` (empty unless `overwrite`) are checked before any training;
    results.json and results.md are rewritten after each evaluation, so a later failure loses nothing finished. The
    plan is printed first, and each training as it starts with an estimate of the time left (`RunProgress`).
    `caveat`: a line said up front, first in the findings and in results.json (e.g. that a preset's numbers mean
    nothing). The finished report adds the decomposition (`decomposition`): results.json's `comparisons`, a second
    table in results.md, and its lines among the findings.
    """
    start = time.perf_counter()
    source = settings.model_name_or_path or str(default_model_path())
    settings.check_model(AutoConfig.from_pretrained(source))
    tokenizer = AutoTokenizer.from_pretrained(source)
    train_texts = [text for _, text in read_documents(settings.train_files, "train")]
    test_docs = read_documents(settings.test_files, "test")[: settings.eval_documents]
    stream = token_stream(train_texts, tokenizer)
    test_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for _, text in test_docs]
    check_segments(settings, test_ids)
    print(
        f"Model {source}; training stream {len(stream):,} tokens from {len(train_texts)} documents; held-out "
        f"{sum(map(len, test_ids)):,} tokens in {len(test_docs)} documents ({', '.join(n for n, _ in test_docs)})"
    )
    prepare_output_dir(output_dir, REPORT_FILES, writer="hf-recurrence reproduce", overwrite=overwrite)
    header = {"caveat": caveat} if caveat else {}
    progress = RunProgress(
        [training_name(*trained, t) for t in settings.window_sizes for trained in trained_models(settings, t)],
        settings.max_steps,
    )
    evaluations = len(settings.window_sizes) * (
        len(settings.baseline_overlap_fractions) + len(TRAINED_ARMS) * len(settings.recurrent_overlap_fractions)
    )
    print(progress.plan(evaluations))
    if caveat:
        print(caveat)
    rows = []
    reads: Reads = {}

    def record(row: dict, token_nll: list[TokenNLL]) -> None:
        rows.append(row)
        reads.setdefault((row["window_size"], row["overlap"]), {})[row["model"]] = token_nll
        write_report(output_dir, rows, finished=False, **report_header(settings, source, start), **header)

    for window_size in settings.window_sizes:
        print(
            f"[window {window_size}] blocks of {settings.block_tokens // window_size} windows, {settings.max_steps} "
            "steps per model"
        )
        for model, overlap in trained_models(settings, window_size):
            train_and_evaluate(model, window_size, overlap, settings, source, stream, test_ids, record, progress.start)

    comparisons = decomposition(reads, settings)
    summary = ([caveat] if caveat else []) + decomposed_findings(rows, comparisons)
    parts = decomposition_table(comparisons)
    table = write_report(
        output_dir,
        rows,
        summary,
        finished=True,
        sections=[parts],
        **report_header(settings, source, start),
        **header,
        comparisons=comparisons,
    )
    plot_perplexity_vs_flops(rows, output_dir / "perplexity_vs_flops.png", plot_notes(comparisons))
    shown = "\n\n".join(text for text in (table, parts) if text)
    finish_run(output_dir, shown, summary, (time.perf_counter() - start) / 60, "results, tables and plot")
    return rows


def check_segments(settings: ReproductionSettings, test_ids: Sequence[Sequence[int]]) -> None:
    """Refuse, before any training, held-out text too short for the decomposition's bootstrap (2 segments)."""
    predicted = [len(ids) - 1 for ids in test_ids if len(ids) > 1]
    segments = sum(math.ceil(tokens / settings.segment_tokens) for tokens in predicted)
    if segments < 2:
        raise UsageError(
            f"The held-out documents predict {sum(predicted):,} tokens: {segments} bootstrap segment(s) of "
            f"segment_tokens={settings.segment_tokens}, and the intervals need at least 2; give more held-out text "
            "(--eval_documents, --test_files) or a smaller --segment_tokens"
        )


def trained_models(settings: ReproductionSettings, window_size: int) -> list[tuple[str, int | None]]:
    """The models trained at `window_size`, in order: the baseline, then at each recurrent overlap (tokens) the
    recurrent model and its control (`TRAINED_ARMS`)."""
    recurrent = [
        (arm, overlap_tokens(window_size, f)) for f in settings.recurrent_overlap_fractions for arm in TRAINED_ARMS
    ]
    return [("baseline", None), *recurrent]


def training_name(model_name: str, overlap: int | None, window_size: int) -> str:
    """How the progress lines name a training: "baseline at window 32", "control at window 300, overlap 5"."""
    return f"{model_name} at window {window_size}" + (f", overlap {overlap}" if overlap else "")


def train_and_evaluate(
    model_name: str,
    window_size: int,
    overlap: int | None,
    settings: ReproductionSettings,
    source: str,
    stream: list[int],
    test_ids: list[list[int]],
    record: Callable[[dict, list[TokenNLL]], None],
    start_training: Callable[[str], TrainerCallback],
) -> None:
    """Fine-tune one model from `source` at `window_size` on the same stream as every other, and `record` its
    evaluations (each row with its token NLLs): the baseline (`overlap` None) reads every block's windows
    independently and is evaluated at every baseline overlap; a recurrent model or its control (`model_name` in
    `TRAINED_ARMS`), each from the same initialisation of the recurrence module, is trained and evaluated at
    `overlap`."""
    windows_per_block = settings.block_tokens // window_size
    pace = start_training(training_name(model_name, overlap, window_size))
    if overlap is None:
        model = GPT2LMHeadModel.from_pretrained(source)
        block_size = windows_per_block * window_size
        collator = WindowedBlocksCollator(window_size)
        overlaps = [overlap_tokens(window_size, f) for f in settings.baseline_overlap_fractions]
        batch_size = BASELINE_EVAL_BATCH
    else:
        set_seed(settings.seed)  # the recurrence module's initialisation: the same for the recurrent model and control
        model = RecurrentGPT2LMHeadModel.from_pretrained(
            source, window_size=window_size, window_overlap=overlap, recurrence_input=TRAINED_ARMS[model_name]
        )
        block_size = window_size + (windows_per_block - 1) * (window_size - overlap)
        collator, overlaps, batch_size = None, [overlap], 8
    train_loss = fine_tune(model, TokenBlocks(stream, block_size), settings, collator=collator, callbacks=[pace])
    tokens = settings.max_steps * settings.batch_size * block_size
    for read_overlap in overlaps:
        record(
            *evaluate_row(
                model,
                test_ids,
                model_name,
                window_size,
                read_overlap,
                batch_size=batch_size,
                train_loss=train_loss,
                tokens=tokens,
            )
        )


def decomposition(reads: Reads, settings: ReproductionSettings) -> list[dict]:
    """Each recurrent model's gain over the baseline at its window and overlap, and its two parts (`DECOMPOSITION`):
    paired bootstrap intervals (`compare`) over the same `segment_tokens` segments of the held-out text, each a dict
    with `window_size`, `overlap` and `part`. The total and the constant only where the baseline was read at that
    overlap; a recurrent model read without its control is refused."""
    comparisons = []
    for (window_size, overlap), arms in reads.items():
        if "recurrent" not in arms:
            continue
        if "control" not in arms:
            raise ValueError(
                f"window {window_size}, overlap {overlap}: the recurrent model was read without its zero-input control; "
                "the decomposition needs the control trained beside it"
            )
        for part, b, a in DECOMPOSITION:
            if a in arms:
                where = {"window_size": window_size, "overlap": overlap, "part": part}
                comparisons.append({**where, **compare(arms, a, b, settings)})
    return comparisons


def decomposition_lines(comparisons: Sequence[dict]) -> list[str]:
    """One line per part of the decomposition; the carried-context line says whether its interval excludes 0."""
    lines = []
    for comparison in comparisons:
        line = f"window {comparison['window_size']}, overlap {comparison['overlap']}, {comparison['part']}: "
        line += describe(comparison)
        if comparison["part"] == "carried context":
            excludes = comparison["low"] > 0 or comparison["high"] < 0
            line += "; the interval excludes 0" if excludes else "; the interval includes 0: no carried context shown"
        lines.append(line)
    return lines


def decomposed_findings(rows: list[dict], comparisons: Sequence[dict]) -> list[str]:
    """The findings of a run with its control, window by window: the paper's two claims (`findings`), then the
    decomposition's lines (`decomposition_lines`)."""
    lines = []
    for window_size in dict.fromkeys(row["window_size"] for row in rows):
        lines += findings([row for row in rows if row["window_size"] == window_size])
        lines += decomposition_lines([c for c in comparisons if c["window_size"] == window_size])
    return lines


def plot_notes(comparisons: Sequence[dict]) -> list[str]:
    """The decomposition's two parts in short, for the plot: a legend line, then one line per window and overlap."""
    cells = {}
    for c in comparisons:
        if c["part"] != "total gain":
            cells.setdefault((c["window_size"], c["overlap"]), []).append(
                f"{c['b']} vs {c['a']} {100 * c['relative_difference']:+.2f}% "
                f"[{100 * c['low']:+.2f}, {100 * c['high']:+.2f}]"
            )
    if not cells:
        return []
    legend = "learned constant = control vs baseline; carried context = recurrent vs control (95% intervals)"
    return [legend, *(f"T={window}, o={overlap}: {'; '.join(parts)}" for (window, overlap), parts in cells.items())]


def decomposition_cells(comparisons: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """The decomposition as a table: headers, and one row per window and overlap with each part's change and interval
    ("–" where the baseline was not read at that overlap)."""
    headers = ["Window", "Overlap", *(f"{part} ({b} vs {a})".capitalize() for part, b, a in DECOMPOSITION)]
    cells = {}
    for c in comparisons:
        row = cells.setdefault((c["window_size"], c["overlap"]), {})
        row[c["part"]] = f"{100 * c['relative_difference']:+.2f}% ({100 * c['low']:+.2f}% to {100 * c['high']:+.2f}%)"
    rows = [
        [str(window), str(overlap), *(parts.get(part, "–") for part, _, _ in DECOMPOSITION)]
        for (window, overlap), parts in cells.items()
    ]
    return headers, rows


def decomposition_table(comparisons: Sequence[dict]) -> str:
    """`decomposition_cells` as a Markdown table, titled with what its intervals are ("" without comparisons)."""
    if not comparisons:
        return ""
    headers, rows = decomposition_cells(comparisons)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(["---:"] * len(headers)) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    first = comparisons[0]
    title = (
        f"The recurrent model's gain decomposed: perplexity change ({100 * first['confidence']:.0f}% paired bootstrap "
        f"interval over {first['num_segments']} segments of the held-out text)"
    )
    return title + ":\n\n" + "\n".join(lines)


def finish_run(output_dir: Path, table: str, summary: Sequence[str], minutes: float, written: str) -> None:
    """Mark a reproduction's `output_dir` finished, then print its report's table, the summary lines and where
    `written` (what the run wrote) is."""
    finish_output_dir(output_dir)
    print("\n" + table + "\n")
    for line in summary:
        print(line)
    print(f"\n{minutes:.1f} minutes; {written} in {output_dir}")


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
