"""The benchmark scripts: every one takes --device and --dtype, and those that count rather than time run end to end
at a tiny size (no timing is asserted)."""

import runpy
import subprocess
import sys

import pytest
import torch

from .common import REPO_ROOT


BENCHMARKS = REPO_ROOT / "benchmarks"
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))


def _run(script: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments], capture_output=True, text=True, timeout=300
    )


def _exit_of(script: str, *arguments: str, monkeypatch: pytest.MonkeyPatch) -> SystemExit:
    """How `python benchmarks/SCRIPT ARGUMENTS` exits, run in this process (a subprocess per script would spend
    seconds importing torch) for arguments that end it before any measurement."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), *arguments])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    return exit_info.value


def test_host_syncs_counts_one_read_per_forward_without_padding():
    result = _run(
        "host_syncs.py", "--layers", "2", "--hidden", "32", "--window-size", "8", "--windows", "3", "--new-tokens", "4"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    for family in ("recurrent GPT-2", "recurrent Llama", "Transformer-XL"):
        assert rows[family].split("|")[2].strip() == "1"  # forward: host reads
    assert "stock GPT-2" in rows


def test_prefill_memory_runs_end_to_end():
    shape = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--vocab-size", "100", "--n-positions", "32"]
    result = _run(
        "prefill_memory.py", *shape, "--window-size", "8", "--prompt-tokens", "24", "--models", "recurrent GPT-2"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    # generate() asks the head for the last position's logits only.
    assert rows["recurrent GPT-2"].split("|")[-2].strip() == "yes"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_takes_device_and_dtype(script, monkeypatch, capsys):
    assert _exit_of(script, "--help", monkeypatch=monkeypatch).code == 0
    help_text = capsys.readouterr().out
    assert "--device" in help_text and "{float32,bfloat16,float16}" in help_text


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--device", "gpu"], "argument --device: 'gpu' is not cpu, cuda or cuda:N"),
        (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    ],
)
def test_bad_device_and_dtype_values_are_refused_by_name(arguments, message, monkeypatch, capsys):
    assert _exit_of("generation.py", *arguments, monkeypatch=monkeypatch).code == 2
    assert message in capsys.readouterr().err


def test_a_cuda_device_this_machine_lacks_is_refused_by_name(monkeypatch):
    absent = f"cuda:{torch.cuda.device_count()}"
    refusal = _exit_of("host_syncs.py", "--device", absent, monkeypatch=monkeypatch).code
    assert refusal.startswith(f"--device {absent}: no such CUDA device on this machine")


def test_a_driver_refuses_a_dtype_the_job_does_not_run_in(monkeypatch):
    refusal = _exit_of("reproduce.py", "--dtype", "bfloat16", monkeypatch=monkeypatch).code
    assert refusal.startswith("--dtype bfloat16: not available here, `hf-recurrence reproduce` picks its device")
