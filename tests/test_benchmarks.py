"""The benchmark scripts that count rather than time run end to end at a tiny size (no timing is asserted)."""

import subprocess
import sys

import pytest
import torch

from .common import REPO_ROOT


def _run(*arguments: str) -> subprocess.CompletedProcess:
    script = REPO_ROOT / "benchmarks" / "host_syncs.py"
    return subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, timeout=300)


def test_host_syncs_counts_one_read_per_forward_without_padding():
    result = _run("--layers", "2", "--hidden", "32", "--window-size", "8", "--windows", "3", "--new-tokens", "4")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    for family in ("recurrent GPT-2", "recurrent Llama", "Transformer-XL"):
        assert rows[family].split("|")[2].strip() == "1"  # forward: host reads
    assert "stock GPT-2" in rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_cuda_device_this_machine_lacks_is_refused_by_name():
    result = _run("--device", "cuda:0")
    assert result.returncode != 0
    assert "--device cuda:0: no CUDA device on this machine" in result.stderr


@pytest.mark.parametrize("script", ["host_syncs.py", "forward_overhead.py"])
def test_device_and_dtype_are_options(script):
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    assert "--device" in result.stdout and "{float32,bfloat16,float16}" in result.stdout
