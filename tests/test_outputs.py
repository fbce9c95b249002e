"""Output folders (`hf_recurrence.outputs`): `--overwrite` removes only what an earlier run of the same writer
recorded in its manifest, refuses anything else, and clears temporary files a killed write left; reports are replaced
atomically."""

import errno
import json
import logging

import pytest

from hf_recurrence import outputs
from hf_recurrence.outputs import (
    MANIFEST_NAME,
    MODEL_FOLDER_FILES,
    TRAINING_RUN_FILES,
    UsageError,
    finish_output_dir,
    prepare_output_dir,
    write_atomically,
)


OWNED = MODEL_FOLDER_FILES + TRAINING_RUN_FILES


def earlier_run(path, writer: str = "hf-recurrence convert", finished: bool = True) -> None:
    """What a run of `writer` leaves in `path`: its files, a temporary file of a killed write, its manifest."""
    prepare_output_dir(path, OWNED, writer=writer, overwrite=False)
    (path / "model.safetensors").write_text("weights")
    (path / "config.json").write_text("{}")
    if finished:
        finish_output_dir(path)
    (path / ".tmpk1ll3d").write_text("half a report")


def user_files(path) -> None:
    for name in ("checkpoint-30", "runs"):
        (path / name).mkdir()
    (path / "train.py").write_text("my training script")
    (path / "README.md").write_text("my notes")


def test_a_folder_no_run_wrote_is_refused_even_with_overwrite(tmp_path):
    user_files(tmp_path)
    (tmp_path / "model.safetensors").write_text("weights")
    with pytest.raises(UsageError, match="written by no hf-recurrence run"):
        prepare_output_dir(tmp_path, OWNED, writer="hf-recurrence convert", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "checkpoint-30", "model.safetensors", "runs", "train.py"
    ]  # fmt: skip


def test_overwrite_removes_exactly_what_the_earlier_run_recorded_and_lists_it(tmp_path, caplog):
    earlier_run(tmp_path)
    user_files(tmp_path)
    with pytest.raises(
        UsageError, match=r"holds what no earlier run .* wrote there \(README.md, checkpoint-30, runs, "
    ):
        prepare_output_dir(tmp_path, OWNED, writer="hf-recurrence convert", overwrite=True)
    assert (tmp_path / "train.py").read_text() == "my training script"
    assert (tmp_path / "model.safetensors").exists()

    for name in ("README.md", "train.py"):
        (tmp_path / name).unlink()
    for name in ("checkpoint-30", "runs"):
        (tmp_path / name).rmdir()
    with caplog.at_level(logging.WARNING, logger="hf_recurrence.outputs"):
        prepare_output_dir(tmp_path, OWNED, writer="hf-recurrence convert", overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]
    (removed,) = [r.getMessage() for r in caplog.records if "Removing" in r.getMessage()]
    assert removed.endswith(": .tmpk1ll3d, config.json, model.safetensors")
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["finished"] is False


def test_a_folder_of_another_writer_is_refused(tmp_path):
    earlier_run(tmp_path, writer="hf-recurrence evaluate")
    with pytest.raises(UsageError, match="written by 'hf-recurrence evaluate'"):
        prepare_output_dir(tmp_path, OWNED, writer="hf-recurrence convert", overwrite=True)


def test_a_killed_run_is_cleared_of_its_own_kind_of_files_and_temporary_files(tmp_path):
    earlier_run(tmp_path, finished=False)
    prepare_output_dir(tmp_path, OWNED, writer="hf-recurrence convert", overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_atomically(path, '{"rows": [1]}')

    def disk_full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, '{"rows": [1, 2]}')
    assert json.loads(path.read_text()) == {"rows": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
