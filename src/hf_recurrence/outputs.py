"""Output folders of the commands and example scripts: nothing the user had is overwritten or removed.

A folder that holds anything is refused unless the writer is told to overwrite. Even then only a folder that an
earlier run of the same writer wrote is accepted: each run leaves a manifest (`MANIFEST_NAME`) naming the writer and,
once it finishes, every entry it wrote. Overwriting removes exactly those entries (listed in a warning) and the
temporary files a killed write left, so no stale checkpoint, plot or weight file is left beside the new ones; a
folder without a manifest, of another writer, or holding anything else is refused, naming what is in the way. The
folder is checked writable before any work starts. Reports are written atomically (`write_atomically`).
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

from transformers.utils import logging


if TYPE_CHECKING:
    from transformers import TrainingArguments


logger = logging.get_logger(__name__)

# What a writer leaves in its output folder: {"writer": ..., "finished": bool, "entries": [names it wrote]}.
MANIFEST_NAME = ".hf_recurrence_outputs.json"
# The prefix of `write_atomically`'s temporary files, which a killed run may leave behind.
TEMPORARY_PREFIX = ".tmp"


class UsageError(ValueError):
    """What the user asked for cannot be done (a bad option value, a missing model, a folder in the way).

    The command line prints it in one line and exits with status 2, as argparse does for a bad option.
    """


# What `save_pretrained` of a tokenizer may write.
TOKENIZER_FILES = (
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
)
# What a saved model folder holds: `save_pretrained` of a model, its tokenizer and generation config, a model card,
# and PEFT adapters. Pickled weights are listed too: an old folder's `pytorch_model.bin` must not outlive new weights.
MODEL_FOLDER_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "*.py",
    *TOKENIZER_FILES,
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
    path: str | os.PathLike, owned: Sequence[str], *, writer: str, overwrite: bool, option: str = "--overwrite"
) -> Path:
    """Make `path` ready for `writer` (the command or script, e.g. "hf-recurrence convert") to write into, and leave
    the manifest that marks the folder as `writer`'s; call `finish_output_dir` when the run is done.

    A folder that holds anything is refused unless `overwrite`; with it, only a folder that an earlier run of
    `writer` left is accepted, and what that run recorded is removed: the entries its manifest lists, and if it did
    not finish, those matching the glob patterns `owned` too (a writer that records each entry before writing it,
    through `write_recorded`, passes none, so that a file the user added after a killed run is never taken for the
    run's); temporary files of killed writes go too. Anything else in the
    folder is refused by name. Call it after every other check and before any work, so that a refusal costs nothing.
    Raises `UsageError` naming the folder and `option`, the way out.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"output folder {path} is a file; choose a folder")
    entries = sorted(entry.name for entry in path.iterdir()) if path.is_dir() else []
    if entries and not overwrite:
        names = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise UsageError(
            f"output folder {path} is not empty ({names}); choose another folder, or pass {option} to replace "
            "what an earlier run wrote there"
        )
    if entries:
        _remove_earlier_run(path, entries, owned, writer, option)
    check_writable(path)
    write_atomically(path / MANIFEST_NAME, json.dumps({"writer": writer, "finished": False, "entries": []}))
    return path


def _remove_earlier_run(path: Path, entries: list[str], owned: Sequence[str], writer: str, option: str) -> None:
    manifest = _read_manifest(path)
    if manifest is None or manifest.get("writer") != writer:
        by = "no hf-recurrence run" if manifest is None else f"{manifest.get('writer')!r}"
        raise UsageError(
            f"{option} replaces only what an earlier run of {writer} wrote, and output folder {path} was written by "
            f"{by}; choose another folder, or empty it yourself"
        )
    ours = set(manifest.get("entries", []))
    if not manifest.get("finished"):
        # The run stopped before recording all it wrote: everything it writes unrecorded matches `owned`.
        ours |= {name for name in entries if any(fnmatch(name, pattern) for pattern in owned)}
    ours |= {MANIFEST_NAME, *(name for name in entries if name.startswith(TEMPORARY_PREFIX))}
    foreign = [name for name in entries if name not in ours]
    if foreign:
        raise UsageError(
            f"output folder {path} holds what no earlier run of {writer} wrote there ({', '.join(foreign)}); "
            f"{option} removes only that run's files: move these elsewhere first, or choose another folder"
        )
    removed = [name for name in entries if name != MANIFEST_NAME]
    if removed:
        logger.warning(f"Removing what an earlier run of {writer} wrote in {path}: {', '.join(removed)}")
    for name in removed:
        entry = path / name
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def _read_manifest(path: Path) -> dict | None:
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def finish_output_dir(path: str | os.PathLike) -> None:
    """Record in the manifest of `path` (left by `prepare_output_dir`) every entry the run wrote there: all of the
    folder's entries, since it held nothing else when the run began."""
    path = Path(path)
    manifest = _read_manifest(path) or {}
    entries = sorted(
        entry.name
        for entry in path.iterdir()
        if entry.name != MANIFEST_NAME and not entry.name.startswith(TEMPORARY_PREFIX)
    )
    write_atomically(path / MANIFEST_NAME, json.dumps({**manifest, "finished": True, "entries": entries}))


def write_recorded(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Run `write(folder)` into a temporary folder inside `path`, record the entries it wrote in the manifest of
    `path` (left by `prepare_output_dir`), then move them into `path`: each entry is recorded before it appears
    there, so `--overwrite` after a killed run removes exactly what the run wrote, and refuses what the user added."""
    path = Path(path)
    staging = Path(tempfile.mkdtemp(dir=path, prefix=TEMPORARY_PREFIX))
    try:
        write(staging)
        names = sorted(entry.name for entry in staging.iterdir())
        manifest = _read_manifest(path) or {}
        recorded = sorted({*manifest.get("entries", []), *names})
        write_atomically(path / MANIFEST_NAME, json.dumps({**manifest, "entries": recorded}))
        for name in names:
            os.replace(staging / name, path / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it, renamed over `path` once complete: a reader (or a
    run that is killed, or a full disk) sees the old file or the new one, never half of one."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=TEMPORARY_PREFIX)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp creates the file readable by its owner only; a report is an ordinary file.
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)


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
    training_args: "TrainingArguments", owned: Sequence[str], output_args: OutputDirArguments, *, writer: str
) -> None:
    """`prepare_output_dir` for an example script's `Trainer` run, its main process first (it removes files).

    A run given `--resume_from_checkpoint` continues in its folder, so that folder may hold the run already; with
    `--overwrite_output_dir` too, the checkpoint must not be one that would be removed.
    """
    # Optional in TrainingArguments' annotation only: its __post_init__ fills in the default folder.
    path = Path(training_args.output_dir)  # type: ignore[arg-type]
    checkpoint = training_args.resume_from_checkpoint
    with training_args.main_process_first(desc="checking the output folder"):
        if training_args.local_process_index != 0:
            # The node's main process has prepared the folder (and left its manifest there) already.
            check_writable(path)
        elif checkpoint is None:
            prepare_output_dir(
                path,
                owned,
                writer=writer,
                overwrite=output_args.overwrite_output_dir,
                option="--overwrite_output_dir",
            )
        elif not output_args.overwrite_output_dir:
            check_writable(path)
        elif Path(checkpoint).resolve().is_relative_to(path.resolve()):
            raise UsageError(
                f"--overwrite_output_dir would remove --resume_from_checkpoint {checkpoint}, which lies in "
                f"--output_dir {path}; drop --overwrite_output_dir to continue that run"
            )
        else:
            prepare_output_dir(path, owned, writer=writer, overwrite=True, option="--overwrite_output_dir")
