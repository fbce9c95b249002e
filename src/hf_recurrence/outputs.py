"""Output folders of the commands and example scripts: nothing the user had is overwritten unless they say so.

A folder that holds anything is refused unless the writer is told to overwrite; then the files the writer owns (its
own outputs, the checkpoints and logs of a training run) are removed first, so no stale checkpoint, plot or weight
file is left beside the new ones. The folder is checked writable before any work starts.
"""

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from transformers import TrainingArguments


class UsageError(ValueError):
    """What the user asked for cannot be done (a bad option value, a missing model, a folder in the way).

    The command line prints it in one line and exits with status 2, as argparse does for a bad option.
    """


# What a saved model folder holds: `save_pretrained` of a model, its tokenizer and generation config, a model card,
# and PEFT adapters. Pickled weights are listed too: an old folder's `pytorch_model.bin` must not outlive new weights.
MODEL_FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "*.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "README.md",
    "adapter_config.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)

# What `Trainer` leaves in its output folder besides the model.
TRAINING_RUN_FILES = (
    "checkpoint-*",
    "runs",
    "trainer_state.json",
    "training_args.bin",
    "*results.json",
)

# What an evaluation writes (`hf-recurrence evaluate` and `reproduce`).
REPORT_FILES = ("results.json", "results.md", "perplexity_vs_flops.png")


def prepare_output_dir(
    path: str | os.PathLike, owned: Sequence[str], *, overwrite: bool, option: str = "--overwrite"
) -> Path:
    """Make `path` ready to be written: refuse it if it holds anything and `overwrite` is false, else remove the
    entries matching the glob patterns `owned` (files or folders); then create it and check that it is writable.

    Call it after every other check and before any work, so that a refusal costs nothing. Raises `UsageError`
    naming the folder and `option`, the way out.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"output folder {path} is a file; choose a folder")
    entries = sorted(path.iterdir()) if path.is_dir() else []
    if entries and not overwrite:
        names = ", ".join(entry.name for entry in entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise UsageError(
            f"output folder {path} is not empty ({names}); choose another folder, or pass {option} to replace "
            "what an earlier run wrote there"
        )
    for entry in entries:
        if any(fnmatch(entry.name, pattern) for pattern in owned):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return check_writable(path)


def check_writable(path: Path) -> Path:
    """Create the folder `path` if needed and check that a file can be written in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        raise UsageError(f"cannot write to output folder {path}: {error.strerror or error}") from error
    return path


@dataclass
class OutputDirArguments:
    """The `--overwrite_output_dir` of transformers' example scripts (no longer a `TrainingArguments` field)."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Write into a non-empty output_dir, first removing what a run writes there (model, checkpoint-*, "
            "logs, results). Without it such a folder is refused, unless --resume_from_checkpoint continues it."
        },
    )


def prepare_training_output_dir(
    training_args: "TrainingArguments", owned: Sequence[str], output_args: OutputDirArguments
) -> None:
    """`prepare_output_dir` for an example script's `Trainer` run, its main process first (it removes files).

    A run given `--resume_from_checkpoint` continues in its folder, so that folder may hold the run already; with
    `--overwrite_output_dir` too, the checkpoint must not be one that would be removed.
    """
    path = Path(training_args.output_dir)
    checkpoint = training_args.resume_from_checkpoint
    with training_args.main_process_first(desc="checking the output folder"):
        if checkpoint is None:
            prepare_output_dir(
                path, owned, overwrite=output_args.overwrite_output_dir, option="--overwrite_output_dir"
            )
        elif not output_args.overwrite_output_dir:
            check_writable(path)
        elif Path(checkpoint).resolve().is_relative_to(path.resolve()):
            raise UsageError(
                f"--overwrite_output_dir would remove --resume_from_checkpoint {checkpoint}, which lies in "
                f"--output_dir {path}; drop --overwrite_output_dir to continue that run"
            )
        else:
            prepare_output_dir(path, owned, overwrite=True)
