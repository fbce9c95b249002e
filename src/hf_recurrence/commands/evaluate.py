"""Evaluate causal LMs with windowed perplexity (Yoshida et al. 2020, §4.2) over a grid of window sizes and overlaps.

Each document is read in windows of T tokens that repeat the last o tokens of the window before; every token but
the first is predicted once. Stock models run every (window, overlap) pair of the grid. Recurrent models run their
own schedule and only at the overlap they were trained with (config.window_overlap): other overlaps of the grid are
skipped for them, with a note. A Transformer-XL runs its own segments with its memory, at overlap 0 only (other
windows and overlaps of the grid are skipped for it, with a note). Every model and grid point is checked before the
first evaluation. Prints a Markdown table and writes results.json and results.md to --output_dir after each
evaluation (atomically, marked unfinished until the last one), and perplexity_vs_flops.png at the end. A model with
NaN or infinite weights is refused. A non-empty --output_dir is refused unless --overwrite is given, and then only if
an earlier evaluate wrote it (which replaces what that run wrote there).

Example:
    hf-recurrence evaluate ./baseline ./recurrent --windows 64 128 --overlaps 0 16 32 \\
        --corpus python-stdlib-test --output_dir eval_out
"""

import argparse
import math
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedConfig, PreTrainedModel

from ..data import stdlib_split
from ..evaluation import RECURRENT_MODEL_TYPES, plot_perplexity_vs_flops, windowed_perplexity, write_report
from ..evaluation.perplexity import SEGMENT_MODEL_TYPES, resolve_schedule
from ..outputs import REPORT_FILES, UsageError, finish_output_dir, prepare_output_dir
from .options import add_overwrite_argument


# --corpus choice -> split of the standard library documents (hf_recurrence.data.stdlib_split)
CORPORA = {f"python-stdlib-{split}": split for split in ("train", "validation", "test")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+", metavar="MODEL", help="Local model folders (each with its tokenizer).")
    parser.add_argument(
        "--windows", type=int, nargs="+", default=None, help="Window sizes T (default: each model's own)."
    )
    parser.add_argument(
        "--overlaps",
        type=int,
        nargs="+",
        default=None,
        help="Overlaps o in tokens (default: 0 for stock models, the trained overlap for recurrent ones).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text_file", nargs="+", type=Path, help="UTF-8 text files, one document each.")
    source.add_argument("--corpus", choices=sorted(CORPORA), help="Standard library modules of a split, by file.")
    parser.add_argument("--max_documents", type=int, default=None, help="Evaluate only the first N documents.")
    parser.add_argument("--tokenizer", default=None, help="Tokenizer folder (default: the first model's folder).")
    parser.add_argument("--batch_size", type=int, default=8, help="Windows per forward for stock models.")
    parser.add_argument("--output_dir", type=Path, required=True, help="Where results and the plot are written.")
    add_overwrite_argument(parser)


def run(args: argparse.Namespace) -> int:
    # Everything that can be wrong is checked before the first evaluation: texts, models, grid, output folder.
    texts = read_texts(args)
    grids = {path: checked_grid(path, args.windows, args.overlaps) for path in args.models}
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.models[0])
    encoded = [(tokenizer(text, add_special_tokens=False)["input_ids"], text) for text in texts]
    # A document of fewer than two tokens has nothing to predict.
    encoded = [(ids, text) for ids, text in encoded if len(ids) >= 2]
    if not encoded:
        raise UsageError(f"No document of at least 2 tokens among the {len(texts)} read")
    documents, texts = [ids for ids, _ in encoded], [text for _, text in encoded]
    for path in args.models:
        check_vocabulary(path, documents, args.tokenizer or args.models[0])
    prepare_output_dir(args.output_dir, REPORT_FILES, writer="hf-recurrence evaluate", overwrite=args.overwrite)
    print(f"{len(documents)} documents, {sum(map(len, documents)):,} tokens")

    rows = []
    for path, grid in grids.items():
        model = AutoModelForCausalLM.from_pretrained(path)
        check_finite_weights(model, f"MODEL {path}", "it cannot be evaluated")
        for window_size, overlap in grid:
            result = windowed_perplexity(
                model, documents, window_size, overlap, text=texts, batch_size=args.batch_size
            )
            if not math.isfinite(result.perplexity):
                raise UsageError(
                    f"MODEL {path} gives perplexity {result.perplexity} at window {window_size}, overlap {overlap}: "
                    f"its losses overflow; the rows before it are in {args.output_dir / 'results.json'}"
                )
            rows.append({"model": Path(path).name or path, "path": str(path), **result.to_dict()})
            # Written after every evaluation, so that a later failure loses nothing finished.
            write_report(args.output_dir, rows, finished=False)
        del model

    table = write_report(args.output_dir, rows, finished=True)
    print(f"\n{table}\n")
    # The analytic FLOPs count covers GPT-2-shaped models only; other models stay in the table but not the plot.
    plottable = [row for row in rows if row["flops_per_token"] is not None]
    if plottable:
        plot_perplexity_vs_flops(plottable, args.output_dir / "perplexity_vs_flops.png")
    finish_output_dir(args.output_dir)
    print(f"Results in {args.output_dir}")
    return 0


def check_finite_weights(model: PreTrainedModel, source: str, consequence: str) -> None:
    """Refuse a model whose weights hold NaN or inf, naming `source` (where it was read from), the first such tensor
    and the `consequence`: every perplexity it gives would be NaN, and what it generates noise or the prompt."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"{source} has non-finite weights (NaN or inf) in {name}; {consequence}")


def check_vocabulary(path: str, documents: list[list[int]], tokenizer: str) -> None:
    """Refuse a tokenizer whose ids the model at `path` has no embedding for (the embedding would fail deep inside)."""
    vocab_size = AutoConfig.from_pretrained(path).get_text_config().vocab_size
    largest = max(max(ids) for ids in documents)
    if largest >= vocab_size:
        raise UsageError(
            f"MODEL {path} has a vocabulary of {vocab_size:,} tokens, but the tokenizer of {tokenizer} gives ids up "
            f"to {largest:,}; evaluate it with the tokenizer it was trained with (--tokenizer)"
        )


def checked_grid(path: str, windows: list[int] | None, overlaps: list[int] | None) -> list[tuple[int, int]]:
    """The (window, overlap) pairs to evaluate the model in folder `path` at, each checked against its config."""
    if not (Path(path) / "config.json").is_file():
        raise UsageError(f"MODEL {path} is not a saved model folder (no config.json there)")
    config = AutoConfig.from_pretrained(path)
    grid = []
    for window_size, overlap in schedule_grid(config, windows, overlaps):
        try:
            grid.append(resolve_schedule(config, window_size, overlap))
        except ValueError as error:
            raise UsageError(f"MODEL {path} cannot be evaluated on this grid: {error}") from error
    return grid


def read_texts(args: argparse.Namespace) -> list[str]:
    if args.text_file:
        texts = [path.read_text(encoding="utf-8") for path in args.text_file]
    else:
        texts = [text for _, text in stdlib_split(CORPORA[args.corpus])]
    if args.max_documents is not None:
        if args.max_documents < 1:
            raise UsageError(f"--max_documents must be at least 1, got {args.max_documents}")
        texts = texts[: args.max_documents]
    return texts


def schedule_grid(
    config: PreTrainedConfig, windows: list[int] | None, overlaps: list[int] | None
) -> list[tuple[int | None, int | None]]:
    """The (window, overlap) pairs to evaluate a model of `config` at; `None` leaves the choice to
    `windowed_perplexity`.

    A recurrent model is evaluated only at its trained overlap, so other overlaps are dropped for it with a note; a
    Transformer-XL only in its own segments with its memory, so the grid is dropped for it with a note.
    """
    if config.model_type in SEGMENT_MODEL_TYPES:
        if windows or overlaps:
            print(
                f"note: {config.name_or_path} is a Transformer-XL: evaluated in its own segments of "
                f"{config.segment_length} tokens with its memory, not at --windows / --overlaps"
            )
        return [(None, None)]
    # None: the window (or overlap) windowed_perplexity chooses.
    grid_windows: list[int | None] = [*windows] if windows else [None]
    grid_overlaps: list[int | None] = [*overlaps] if overlaps else [None]
    if config.model_type in RECURRENT_MODEL_TYPES:
        trained = config.window_overlap
        if overlaps and trained not in overlaps:
            print(
                f"note: {config.name_or_path} is recurrent with window_overlap={trained}, not among --overlaps "
                f"{overlaps}; evaluating it at its own overlap"
            )
        elif overlaps and len(overlaps) > 1:
            print(f"note: {config.name_or_path} is recurrent: evaluated at its overlap {trained} only")
        return [(window, trained) for window in grid_windows]
    return [(window, overlap) for window in grid_windows for overlap in grid_overlaps]
