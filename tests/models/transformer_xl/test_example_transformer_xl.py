"""The Transformer-XL example script runs end to end with its smoke arguments (the command in its README)."""

import json
import subprocess
import sys

import pytest

from ...common import REPO_ROOT, SRC_ROOT


@pytest.mark.slow  # about 50 s on the loaded 2-core machine (tokenizer training, 2 steps, evaluation)
def test_example_smoke_run(tmp_path):
    script = REPO_ROOT / "examples" / "transformer_xl" / "run_clm_transformer_xl.py"
    command = [
        sys.executable,
        str(script),
        "--output_dir",
        str(tmp_path),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--report_to",
        "none",
        "--max_train_documents",
        "4",
        "--max_eval_documents",
        "2",
        "--sample_tokens",
        "20",
        "--config_overrides",
        "n_layer=2,d_model=64",
    ]
    readme = (script.parent / "README.md").read_text()
    assert " ".join(command[2:]).replace(str(tmp_path), "/tmp/txl") in " ".join(readme.replace("\\\n", " ").split())
    env = {"PYTHONPATH": str(SRC_ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert results["perplexity"] > 1
    assert {
        "model.safetensors",
        "config.json",
        "modeling_transformer_xl.py",
        "state_transformer_xl.py",
        "tokenizer.json",
    } <= {p.name for p in tmp_path.iterdir()}
