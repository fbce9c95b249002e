"""The benchmark scripts: every one takes --device and --dtype, those that count rather than time run end to end
at a tiny size and write their JSON result (no timing is asserted), and docs/benchmarks.md is what the recorded
results render to."""

import importlib.util
import json
import runpy
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .common import REPO_ROOT, TINY_LLAMA, austen_books_or_skip, stdlib_tokenizer


BENCHMARKS = REPO_ROOT / "benchmarks"
# render.py measures nothing: it has no device.
SCRIPTS = sorted(
    path.name for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_") and path.stem != "render"
)


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


def _written(path) -> dict:
    result = json.loads(path.read_text())
    assert set(result) >= RESULT_KEYS
    assert set(result["machine"]) >= MACHINE_KEYS
    assert result["machine"]["device"] == "cpu" and result["machine"]["dtype"] == "float32"
    assert result["command"].startswith(f"python benchmarks/{result['script']} ")
    return result


def test_host_syncs_counts_one_read_per_forward_without_padding(tmp_path):
    output = tmp_path / "host_syncs.json"
    result = _run(
        "host_syncs.py",
        *("--layers", "2", "--hidden", "32", "--window-size", "8", "--windows", "3", "--new-tokens", "4"),
        *("--device", "cpu", "--output-json", str(output)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    counts = _written(output)["values"]
    for family in ("recurrent GPT-2", "recurrent Llama", "Transformer-XL"):
        assert counts[family]["forward_host_reads"] == 1
    assert "stock GPT-2" in counts


def test_prefill_memory_runs_end_to_end(tmp_path):
    output = tmp_path / "prefill.json"
    shape = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--vocab-size", "100", "--n-positions", "32"]
    result = _run(
        "prefill_memory.py",
        *shape,
        *("--window-size", "8", "--prompt-tokens", "24", "--models", "recurrent GPT-2"),
        *("--device", "cpu", "--output-json", str(output)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    written = _written(output)
    assert written["settings"]["prompt_tokens"] == [24]
    # generate() asks the head for the last position's logits only.
    rows = {row[0]: row for row in written["tables"]["prefill"]["rows"]}
    assert rows["recurrent GPT-2"][-1] == "yes"
    assert written["values"]["recurrent GPT-2, 24 tokens"]["last_logits_only"] is True


def test_window_start_reads_the_book_after_each_window_start_on_any_stock_model(tmp_path):
    austen_books_or_skip()
    tokenizer = stdlib_tokenizer()
    LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    output = tmp_path / "window_start.json"
    arguments = ["--window-size", "8", "--eval-tokens-per-book", "60", "--device", "cpu", "--output-json", str(output)]
    result = _run("window_start.py", "--model", str(tmp_path / "llama"), *arguments)
    assert result.returncode == 0, result.stderr[-2000:]
    written = _written(output)
    # The tests' tokenizer has no BOS: its EOS stands in; each window start against the bare window, with an interval.
    rows = {row[0]: row for row in written["tables"]["window_start"]["rows"]}
    assert list(rows) == ["bare window", "BOS", "BOS + prompt", "prompt alone"]
    assert rows["bare window"][1] == "0" and rows["BOS"][1] == "1"
    comparison = written["values"]["comparisons"]["BOS"]
    assert comparison["low"] <= comparison["relative_difference"] <= comparison["high"]
    assert written["values"]["held_out"][0]["title"] == "Sense & Sensibility"
    missing = _run("window_start.py", "--model", str(tmp_path / "nothing"), *arguments)
    assert missing.returncode == 2 and f"--model {tmp_path / 'nothing'}:" in missing.stderr


def _render_module():
    spec = importlib.util.spec_from_file_location("render", BENCHMARKS / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_benchmarks_is_rendered_from_the_recorded_results():
    render = _render_module()
    text = render.DOCS_PATH.read_text()
    assert text == render.render(text, render.load_results()), "run python benchmarks/render.py"


def test_every_region_of_the_docs_has_a_result_and_every_result_is_shown():
    render = _render_module()
    names = render.REGION.findall(render.DOCS_PATH.read_text())
    results = render.load_results()
    assert {name.split(".")[0] for name in names} == set(results)
    for name, result in results.items():
        assert {"script", "command", "date", "machine", "tables"} <= set(result), name
        assert (BENCHMARKS / result["script"]).exists(), name
        # Recorded before the JSON files existed: the page's numbers, marked as transcribed.
        if "values" not in result:
            assert result["transcribed_from"] == "docs/benchmarks.md", name


def test_a_rendered_region_follows_its_result():
    render = _render_module()
    result = {
        "command": "python benchmarks/x.py",
        "machine": {"description": "commit abc", "at_end": "at the end: load average 1.00"},
        "tables": {"t": {"headers": ["a", "b"], "rows": [["1", "2"]], "align": ["", "right"]}},
        "text": {"verdict": ["Goal met."]},
    }
    page = "".join(
        f"<!-- benchmark:x.{part} -->\nstale\n<!-- /benchmark:x.{part} -->\n"
        for part in ("command", "machine", "t", "verdict")
    )
    rendered = render.render(page, {"x": result})
    assert "stale" not in rendered
    assert "`python benchmarks/x.py`" in rendered
    assert "Machine: commit abc; at the end: load average 1.00." in rendered
    assert "| a | b |\n| --- | ---: |\n| 1 | 2 |" in rendered
    assert "Goal met." in rendered
    with pytest.raises(KeyError, match="no benchmarks/results/y.json"):
        render.render("<!-- benchmark:y.t -->\n<!-- /benchmark:y.t -->", {"x": result})


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
