"""benchmarks/real_size.py end to end on a tiny random Llama saved as a stock model (the script's `--model FOLDER`):
every part writes its fields, stock's limit is recorded instead of a number, and ours decodes the same greedy tokens
as stock. No timing is asserted."""

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence.weights import recurrent_decoder_from_causal_lm

from ..common import REPO_ROOT, TINY_LLAMA
from ..scripts import BENCHMARKS, run_script, written


SCRIPT = BENCHMARKS / "real_size.py"
WINDOW = 32
PROMPT = 8
SETTINGS = (
    "k=1, attention",
    "k=4, attention",
    "k=4, attention, read at every layer",
    "k=4, select, read at every layer",
)
WAYS = ("ours, default", "ours, fixed-shape state, compiled", "stock, default cache", "stock, static cache, compiled")


@pytest.fixture
def tiny_stock(tmp_path):
    """A 3-layer Llama (the paper's insertion layer 2 exists) whose 32 positions hold one 32-token window."""
    folder = tmp_path / "tiny-llama"
    LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": WINDOW})).save_pretrained(folder)
    return folder


def run(tiny_stock, tmp_path, *arguments: str) -> dict:
    output = tmp_path / "real_size.json"
    common = ["--model", str(tiny_stock), "--window-size", str(WINDOW), "--prompt-tokens", str(PROMPT)]
    # The eager backend traces what inductor would compile, without generating code: seconds, not a minute.
    common += ["--compile-backend", "eager", "--device", "cpu", "--output-json", str(output)]
    result = run_script(SCRIPT, *common, *arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = written(output, BENCHMARKS)
    assert recorded["values"]["window"] == WINDOW
    return recorded


def test_decode_and_training_write_their_fields_and_ours_decodes_stocks_greedy_tokens(tiny_stock, tmp_path):
    # 8 + 20 tokens fit the first window and stock's positions; 8 + 40 pass both.
    decode = ["--parts", "decode", "training", "--batch-sizes", "1", "2", "--new-tokens", "20", "40", "--repeats", "1"]
    training = ["--train-batch-sizes", "1", "2", "--train-windows", "2", "--train-repeats", "1"]
    recorded = run(tiny_stock, tmp_path, *decode, *training)
    values = recorded["values"]
    assert set(recorded["tables"]) == {"decode", "training"}
    for batch in (1, 2):
        cell = values["decode"][f"batch {batch}, 20 new tokens"]
        assert all(cell[way]["decode_tokens_per_s"] > 0 for way in WAYS)
        assert cell["stock best"] in WAYS[2:]
        assert cell["ours compiled / stock best"] > 0 and cell["ours default / stock best"] > 0
        # The whole text lies in ours' first window, where ours is the stock model: the same greedy tokens.
        assert cell["ours default tokens == stock default tokens, first window"] is True
        assert cell["ours compiled tokens == ours default tokens"] is True

        past = values["decode"][f"batch {batch}, 40 new tokens"]
        assert all(past[way]["decode_tokens_per_s"] > 0 for way in WAYS[:2])
        assert not any(way in past for way in WAYS[2:]) and "ours compiled / stock best" not in past
        assert past["stock"] == "not run: 48 tokens pass the model's 32 positions (its context)"
        assert past["ours compiled tokens == ours default tokens"] is True
        training = values["training"][f"batch {batch}"]
        assert training["tokens_per_step"] == batch * 2 * WINDOW
        assert set(training["tokens_per_s"]) == {"ours", "stock"}
        assert set(training["ours / stock"]) == {"paired", "medians", "minima"}
        # Ours runs the layers once per window (2 here), stock once over the windows stacked.
        calls = training["aten_calls_per_step"]
        assert calls["ours"] > 1.5 * calls["stock"] > 0
    assert len(recorded["tables"]["decode"]["rows"]) == 4
    assert any("batch 2, 40 new tokens: stock not run" in line for line in recorded["text"]["stock_limits"])


def test_stocks_compiled_static_cache_can_be_left_out_and_is_recorded_as_not_run(tiny_stock, tmp_path):
    recorded = run(
        tiny_stock,
        tmp_path,
        "--parts",
        "decode",
        "--batch-sizes",
        "2",
        "--new-tokens",
        "20",
        "--repeats",
        "1",
        "--no-stock-static",
    )
    cell = recorded["values"]["decode"]["batch 2, 20 new tokens"]
    assert all(cell[way]["decode_tokens_per_s"] > 0 for way in WAYS[:3])
    assert cell[WAYS[3]] == "not run (--no-stock-static)"
    assert cell["stock best"] == WAYS[2]
    assert cell["ours compiled / stock best"] == pytest.approx(
        cell[WAYS[1]]["decode_tokens_per_s"] / cell[WAYS[2]]["decode_tokens_per_s"]
    )
    assert recorded["text"]["stock_limits"] == [
        "- batch 2, 20 new tokens: stock, static cache, compiled not run (--no-stock-static)."
    ]
    row = recorded["tables"]["decode"]["rows"][0]
    assert row[5] == "–" and row[2:5] != ["–"] * 3


def test_stocks_calls_can_be_stopped_after_a_time_and_are_recorded_as_bounds(tiny_stock, tmp_path):
    # No time at all: every stock call stops at its 8th new token, the fewest a stopped call decodes.
    arguments = ["--parts", "decode", "--batch-sizes", "2", "--new-tokens", "20", "--repeats", "2"]
    recorded = run(tiny_stock, tmp_path, *arguments, "--stock-max-call-s", "0")
    cell = recorded["values"]["decode"]["batch 2, 20 new tokens"]
    assert cell["stopped by --stock-max-call-s"] == list(WAYS[2:])
    for way in WAYS[2:]:
        assert cell[way]["new_tokens_reached"] == [8, 8]
        seconds = [full - statistics.median(cell[way]["prefill_s"]) for full in cell[way]["full_s"]]
        assert cell[way]["decode_tokens_per_s"] == pytest.approx(statistics.median([2 * 7 / s for s in seconds]))
    # Ours ran every token: its tokens/s over the whole call, as without the option.
    for way in WAYS[:2]:
        assert "new_tokens_reached" not in cell[way]
        full, prefill = (statistics.median(cell[way][key]) for key in ("full_s", "prefill_s"))
        assert cell[way]["decode_tokens_per_s"] == pytest.approx(2 * 19 / (full - prefill))
    # Stock's first 8 new tokens lie in ours' first window: the same greedy tokens.
    assert cell["ours default tokens == stock default tokens, first window"] is True
    row = recorded["tables"]["decode"]["rows"][0]
    assert [cell.startswith("<=") for cell in row[2:6]] == [False, False, True, True]
    assert row[6].startswith("**>=") and row[7].startswith(">=")
    limits = recorded["text"]["stock_limits"]
    assert len(limits) == 2 and all("stopped by --stock-max-call-s (8 in" in line for line in limits)


def test_ours_ratios_are_bounds_only_where_the_stopped_way_is_stocks_best(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    real_size = importlib.import_module("real_size")
    stopped = {"stopped by --stock-max-call-s": [real_size.STOCK_STATIC], "ours compiled / stock best": 1.5}
    # Stock's static cache stopped, at an upper bound below its default cache's exact speed: that one is stock's best.
    assert real_size.ratio_text({**stopped, "stock best": real_size.STOCK_DEFAULT}, "ours compiled / stock best") == (
        "1.50x"
    )
    # The stopped way is stock's best: its true speed may be lower, so ours' ratio may be higher.
    assert real_size.ratio_text({**stopped, "stock best": real_size.STOCK_STATIC}, "ours compiled / stock best") == (
        ">=1.50x"
    )
    assert real_size.ratio_text({"ours / stock, tokens/s": 2.0}, "ours / stock, tokens/s") == "2.00x"


def test_a_negative_stock_call_limit_is_refused_by_name(tiny_stock):
    result = run_script(SCRIPT, "--model", str(tiny_stock), "--parts", "decode", "--stock-max-call-s", "-1")
    assert result.returncode == 2
    assert "--stock-max-call-s must be 0 or more seconds, not -1" in result.stderr


def test_a_folder_with_only_a_config_runs_that_shape_with_random_weights(tmp_path):
    folder = tmp_path / "tiny-config"
    LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": WINDOW}).save_pretrained(folder)
    recorded = run(folder, tmp_path, "--parts", "decode", "--batch-sizes", "1", "--new-tokens", "20", "--repeats", "1")
    assert recorded["values"]["model"] == f"random weights in the shape of {folder}/config.json"
    cell = recorded["values"]["decode"]["batch 1, 20 new tokens"]
    assert cell["ours default tokens == stock default tokens, first window"] is True


@pytest.mark.slow  # four fresh processes: most of a minute, mostly importing torch
def test_cold_start_and_prefill_write_their_fields(tiny_stock, tmp_path):
    cold = ["--parts", "cold_start", "prefill", "--cold-start-batches", "1", "--cold-start-tokens", "4"]
    recorded = run(tiny_stock, tmp_path, *cold, "--prompt-lengths", "24", "--prefill-repeats", "1")
    values = recorded["values"]
    assert set(recorded["tables"]) == {"cold_start", "prefill"}
    cold_start = values["cold_start"]["batch 1"]
    for way in ("ours, fixed-shape state, compiled", "stock, static cache, compiled"):
        first, compiled = (
            cold_start[way]["cold_time_to_first_token_s"],
            cold_start[way]["cold_time_to_first_compiled_token_s"],
        )
        assert 0 < first < compiled <= cold_start[way]["cold_call_s"]
        assert {"warm_call_s", "warm_time_to_first_compiled_token_s", "cold_start_s"} <= set(cold_start[way])
        phases = cold_start[way]["compile_phases_s"]
        assert 0 <= phases["backend_compile"] < phases["entire_frame_compile"] < compiled
    assert {"ours / stock, cold_start_s", "ours / stock, cold_time_to_first_compiled_token_s"} <= set(cold_start)
    prefill = values["prefill"]["24 prompt tokens"]
    for model in ("ours", "stock"):
        (run_,) = prefill[model]
        assert run_["tokens_per_s"] > 0 and run_["peak_mib"] >= run_["before_mib"] > 0
    assert {"ours / stock, tokens/s", "ours / stock, peak memory"} <= set(prefill)
    assert "memory_method" in recorded


def test_cold_start_rounds_alternate_the_ways_and_report_medians_and_paired_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    real_size = importlib.import_module("real_size")
    ours, stock = real_size.OURS_COMPILED, real_size.STOCK_STATIC
    # Round by round, (ours, stock) seconds to the first compiled token; the first call less the second is half that.
    seconds = {ours: [60.0, 50.0, 52.0], stock: [50.0, 52.0, 40.0]}
    order = []

    def child(spec: dict) -> dict:
        order.append(spec["name"])
        s = seconds[spec["name"]][order.count(spec["name"]) - 1]
        phases = {"entire_frame_compile": s - 5, "backend_compile": s - 10}
        return {"cold_time_to_first_compiled_token_s": s, "cold_start_s": s / 2, "compile_phases_s": phases}

    monkeypatch.setattr(real_size.bench, "in_child", child)
    args = argparse.Namespace(
        prompt_tokens=8, cold_start_tokens=4, cold_start_batches=[1], cold_start_rounds=3, stock_past_context=False
    )
    values, rows, limits = real_size.cold_start(args, "unused", max_positions=64)
    assert order == [ours, stock, stock, ours, ours, stock] and limits == []
    cell = values["batch 1"]
    assert cell[ours]["cold_time_to_first_compiled_token_s"] == 52.0 and cell[stock]["cold_start_s"] == 25.0
    assert [r["cold_time_to_first_compiled_token_s"] for r in cell[ours]["rounds"]] == seconds[ours]
    assert cell[ours]["compile_phases_s"] == {"entire_frame_compile": 47.0, "backend_compile": 42.0}
    paired = [60 / 50, 50 / 52, 52 / 40]
    assert cell["ours / stock, cold_time_to_first_compiled_token_s, rounds"] == pytest.approx(paired)
    assert cell["ours / stock, cold_time_to_first_compiled_token_s"] == pytest.approx(1.2)
    assert rows == [
        [
            1,
            "52.00",
            "50.00",
            "26.00",
            "25.00",
            "1.20x (0.96-1.30x)",
            "1.20x (0.96-1.30x)",
            "5.0 + 42.0",
            "5.0 + 40.0",
        ]
    ]


def test_a_cold_start_without_rounds_is_refused_by_name(tiny_stock):
    result = run_script(SCRIPT, "--model", str(tiny_stock), "--parts", "cold_start", "--cold-start-rounds", "0")
    assert result.returncode == 2
    assert "--cold-start-rounds must be at least 1, not 0" in result.stderr


def test_the_memory_part_times_each_setting_against_the_paper_and_their_first_windows_agree(tiny_stock, tmp_path):
    sizes = ["--memory-windows", "2", "--memory-new-tokens", "40", "--memory-repeats", "1"]
    recorded = run(tiny_stock, tmp_path, "--parts", "memory", *sizes)
    memory = recorded["values"]["memory"]
    assert list(memory) == ["paper (k=1, mean)", *SETTINGS]
    for name in SETTINGS:
        cell = memory[name]
        assert cell["forward_tokens_per_s"] > 0 and cell["decode_tokens_per_s"] > 0
        assert (
            set(cell["forward time / paper's"])
            == set(cell["decode time / paper's"])
            == {"paired", "medians", "minima"}
        )
        # No setting reads a memory in the first window: there, every one is the stock model.
        assert cell["tokens == paper's, first window"] is True
    assert len(recorded["tables"]["memory"]["rows"]) == 1 + len(SETTINGS)
    assert recorded["tables"]["memory"]["headers"][1] == "forward, 2 windows (tok/s)"


def test_the_memory_part_can_time_a_forward_without_every_positions_logits(tiny_stock, tmp_path):
    sizes = ["--memory-windows", "2", "--memory-new-tokens", "4", "--memory-repeats", "1"]
    recorded = run(tiny_stock, tmp_path, "--parts", "memory", "--memory-logits-to-keep", "1", *sizes)
    assert recorded["settings"]["memory_logits_to_keep"] == 1
    assert recorded["tables"]["memory"]["headers"][1] == "forward, 2 windows, the last position's logits (tok/s)"
    assert all(cell["forward_tokens_per_s"] > 0 for cell in recorded["values"]["memory"].values())


def test_the_memory_forward_computes_only_the_logits_it_is_told_to_keep(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    real_size = importlib.import_module("real_size")
    stock = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": WINDOW}))
    ours = recurrent_decoder_from_causal_lm(stock, window_size=WINDOW).eval()
    shapes = []
    ours.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.logits.shape)))
    ids = torch.randint(1, TINY_LLAMA["vocab_size"], (1, 2 * WINDOW))
    for kept in (1, 0):
        real_size.forward_fn(ours, ids, kept)()
    assert shapes == [(1, 1, TINY_LLAMA["vocab_size"]), (1, 2 * WINDOW, TINY_LLAMA["vocab_size"])]


def test_a_negative_logits_to_keep_is_refused_by_name(tiny_stock, tmp_path):
    result = run_script(SCRIPT, "--model", str(tiny_stock), "--parts", "memory", "--memory-logits-to-keep", "-1")
    assert result.returncode == 2
    assert "--memory-logits-to-keep must be 0 (every position) or more, not -1" in result.stderr


def test_the_gpu_parts_helper_runs_each_part_under_its_limit_into_its_own_file(tmp_path):
    """benchmarks/gpu_parts.sh, run here on the CPU as its header says to check a command before device time."""
    folder = tmp_path / "tiny-config"
    LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": WINDOW}).save_pretrained(folder)
    out = tmp_path / "out"
    out.mkdir()
    flags = f"--model {folder} --window-size {WINDOW} --prompt-tokens {PROMPT} --compile-backend eager --repeats 1"
    command = f"source benchmarks/gpu_parts.sh; part quick 120 {flags} --parts decode --batch-sizes 1 --new-tokens 4"
    command += f"; part stopped 1 {flags} --parts decode --batch-sizes 1 --new-tokens 4"
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "NO_INSTALL": "1", "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "quick.json").read_text())["values"]["decode"]["batch 1, 4 new tokens"]
    log = (out / "run.log").read_text()
    assert "== quick rc=0" in log and "== stopped rc=124" in log and not (out / "stopped.json").exists()
