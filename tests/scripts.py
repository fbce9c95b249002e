"""Running the benchmark and experiment scripts (`python benchmarks/X.py`, `python experiments/X.py`) from the tests,
and what every result file they write holds."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from .common import REPO_ROOT


BENCHMARKS = REPO_ROOT / "benchmarks"
EXPERIMENTS = REPO_ROOT / "experiments"


def scripts(folder: Path) -> list[str]:
    """The scripts of `folder`: not the shared modules (`_common.py`) nor the renderer (it measures nothing)."""
    return sorted(path.name for path in folder.glob("*.py") if not path.name.startswith("_") and path.stem != "render")


def run_script(script: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, timeout=300)


def exit_of(script: Path, *arguments: str, monkeypatch: pytest.MonkeyPatch) -> SystemExit:
    """How `python SCRIPT ARGUMENTS` exits, run in this process (a subprocess per script would spend seconds
    importing torch) for arguments that end it before any measurement."""
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), *arguments])
    # The harness and the renderer are imported by name: each run gets them afresh from the script's own folder.
    for name in ("_common", "render"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    return exit_info.value


# What every result file written by a run holds (`_common.write_results`).
RESULT_KEYS = {"script", "command", "date", "note", "machine", "settings", "values", "tables", "text"}
MACHINE_KEYS = {
    "commit",
    "cpu",
    "cpus",
    "torch_threads",
    "python",
    "torch",
    "transformers",
    "device",
    "gpu",
    "dtype",
    "load_average_at_start",
    "load_average_at_end",
    "description",
    "at_end",
}


def written(path: Path, folder: Path) -> dict:
    """The result file at `path`, checked to hold every field, written by a script of `folder` on the CPU."""
    result = json.loads(path.read_text())
    assert set(result) >= RESULT_KEYS
    assert set(result["machine"]) >= MACHINE_KEYS
    assert result["machine"]["device"] == "cpu" and result["machine"]["dtype"] == "float32"
    assert result["command"].startswith(f"python {folder.name}/{result['script']} ")
    return result
