"""The benchmark scripts: every one takes --device and --dtype, those that count rather than time run end to end
at a tiny size and write their JSON result (no timing is asserted), and docs/benchmarks.md and docs/experiments/ are
what the recorded results render to (the renderer, benchmarks/render.py, serves both folders)."""

import importlib.util

import pytest
import torch

from .scripts import BENCHMARKS, EXPERIMENTS, exit_of, run_script, scripts, written


def test_host_syncs_counts_one_read_per_forward_without_padding(tmp_path):
    output = tmp_path / "host_syncs.json"
    result = run_script(
        BENCHMARKS / "host_syncs.py",
        *("--layers", "2", "--hidden", "32", "--window-size", "8", "--windows", "3", "--new-tokens", "4"),
        *("--device", "cpu", "--output-json", str(output)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    counts = written(output, BENCHMARKS)["values"]
    for family in ("recurrent GPT-2", "recurrent Llama", "Transformer-XL"):
        assert counts[family]["forward_host_reads"] == 1
    assert "stock GPT-2" in counts


def test_generation_runs_end_to_end_with_stock_on_the_recurrent_models_weights(tmp_path):
    output = tmp_path / "generation.json"
    shape = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--vocab-size", "100", "--n-positions", "32"]
    lengths = ["--tokens", "2000", "--overlap", "2", "--overlap-tokens", "2000", "--generate-tokens", "2000"]
    result = run_script(
        BENCHMARKS / "generation.py",
        *shape,
        *lengths,
        *("--window-size", "8", "--stock-steady-tokens", "5", "--device", "cpu", "--output-json", str(output)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    tables = written(output, BENCHMARKS)["tables"]
    assert [row[0] for row in tables["recurrent"]["rows"]] == ["overlap 0", "overlap 2"]
    # generate() decodes the manual loop's tokens.
    assert tables["generate"]["rows"][0][-1].startswith("yes")


def test_prefill_memory_runs_end_to_end(tmp_path):
    output = tmp_path / "prefill.json"
    shape = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--vocab-size", "100", "--n-positions", "32"]
    result = run_script(
        BENCHMARKS / "prefill_memory.py",
        *shape,
        *("--window-size", "8", "--prompt-tokens", "24", "--models", "recurrent GPT-2"),
        *("--device", "cpu", "--output-json", str(output)),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    result = written(output, BENCHMARKS)
    assert result["settings"]["prompt_tokens"] == [24]
    # generate() asks the head for the last position's logits only.
    rows = {row[0]: row for row in result["tables"]["prefill"]["rows"]}
    assert rows["recurrent GPT-2"][-1] == "yes"
    assert result["values"]["recurrent GPT-2, 24 tokens"]["last_logits_only"] is True


def _render_module():
    spec = importlib.util.spec_from_file_location("render", BENCHMARKS / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_is_rendered_from_the_recorded_results():
    render = _render_module()
    for page, results_dir in render.pages().items():
        text = page.read_text()
        assert text == render.render(text, render.load_results(results_dir), results_dir), (
            f"{page.name}: run python benchmarks/render.py"
        )


@pytest.mark.parametrize(("folder", "marker"), [(BENCHMARKS, "benchmark"), (EXPERIMENTS, "experiment")])
def test_every_region_of_the_docs_has_a_result_and_every_result_is_shown(folder, marker):
    render = _render_module()
    pages = [page for page, results_dir in render.pages().items() if results_dir == folder / "results"]
    regions = [match for page in pages for match in render.REGION.finditer(page.read_text())]
    # A page shows the results of its own folder, under its own marker.
    assert {match["kind"] for match in regions} == {marker}
    results = render.load_results(folder / "results")
    assert {match["name"].split(".")[0] for match in regions} == set(results)
    for name, result in results.items():
        assert {"script", "command", "date", "machine", "tables"} <= set(result), name
        assert (folder / result["script"]).exists(), name
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
    with pytest.raises(ValueError, match="docs region 'x-y.t': a region is named SCRIPT.PART"):
        render.render("<!-- benchmark:x-y.t -->\n<!-- /benchmark:x-y.t -->", {"x-y": result})
    with pytest.raises(KeyError, match="no benchmarks/results/y.json"):
        render.render("<!-- benchmark:y.t -->\n<!-- /benchmark:y.t -->", {"x": result})
    # The experiments' pages keep their own marker.
    rendered = render.render("<!-- experiment:x.verdict -->\n<!-- /experiment:x.verdict -->", {"x": result})
    assert rendered == "<!-- experiment:x.verdict -->\nGoal met.\n<!-- /experiment:x.verdict -->"


@pytest.mark.parametrize(
    "script", [folder / name for folder in (BENCHMARKS, EXPERIMENTS) for name in scripts(folder)], ids=lambda p: p.name
)
def test_every_script_takes_device_and_dtype(script, monkeypatch, capsys):
    assert exit_of(script, "--help", monkeypatch=monkeypatch).code == 0
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
    assert exit_of(BENCHMARKS / "generation.py", *arguments, monkeypatch=monkeypatch).code == 2
    assert message in capsys.readouterr().err


def test_a_cuda_device_this_machine_lacks_is_refused_by_name(monkeypatch):
    absent = f"cuda:{torch.cuda.device_count()}"
    refusal = exit_of(BENCHMARKS / "host_syncs.py", "--device", absent, monkeypatch=monkeypatch).code
    assert refusal.startswith(f"--device {absent}: no such CUDA device on this machine")
