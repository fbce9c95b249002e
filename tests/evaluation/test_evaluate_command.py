"""`hf-recurrence evaluate`: a grid of windows and overlaps over saved models, table, JSON and plot."""

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2LMHeadModel, TransformerXLLMHeadModel, cli
from hf_recurrence.commands import evaluate as evaluate_command
from hf_recurrence.evaluation import windowed_perplexity

from ..common import (
    SRC_ROOT,
    TINY_GPT2,
    stdlib_tokenizer,
    tiny_recurrent_config,
    tiny_transformer_xl_config,
    user_error,
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    evaluate_command.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    tokenizer = stdlib_tokenizer()
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    vocab = {"vocab_size": len(tokenizer)}
    models = {
        "baseline": GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, **vocab})),
        "recurrent": RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=2, **vocab)),
        "short": GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, **vocab, "n_positions": 8})),
        # Not GPT-2-shaped: no analytic FLOPs count, so it is left out of the plot.
        "transformer_xl": TransformerXLLMHeadModel(tiny_transformer_xl_config(**vocab)),
    }
    for name, model in models.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root, models, tokenizer


def test_grid_over_text_files(saved_models, tmp_path, capsys):
    root, models, tokenizer = saved_models
    texts = ["def add(a, b):\n    return a + b\n" * 4, "class Point:\n    x: int = 0\n    y: int = 0\n" * 3]
    files = []
    for index, text in enumerate(texts):
        files.append(tmp_path / f"doc{index}.txt")
        files[-1].write_text(text)
    argv = [str(root / "baseline"), str(root / "recurrent"), "--windows", "8", "16", "--overlaps", "0", "2"]
    out = tmp_path / "out"
    assert evaluate_command.run(parse([*argv, "--text_file", *map(str, files), "--output_dir", str(out)])) == 0

    rows = json.loads((out / "results.json").read_text())["rows"]
    grid = [(row["model"], row["window_size"], row["overlap"]) for row in rows]
    # The recurrent model is evaluated only at its trained overlap (2), at both windows.
    assert grid == [
        ("baseline", 8, 0), ("baseline", 8, 2), ("baseline", 16, 0), ("baseline", 16, 2),
        ("recurrent", 8, 2), ("recurrent", 16, 2),
    ]  # fmt: skip
    documents = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    for row, model in ((rows[1], models["baseline"]), (rows[5], models["recurrent"])):
        expected = windowed_perplexity(model, documents, row["window_size"], row["overlap"], text=texts)
        assert row["perplexity"] == pytest.approx(expected.perplexity, rel=1e-5)
        assert row["word_perplexity"] == pytest.approx(expected.word_perplexity, rel=1e-5)
    assert (out / "perplexity_vs_flops.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert (out / "results.md").read_text().strip() in printed
    assert "evaluated at its overlap 2 only" in printed


def test_transformer_xl_is_evaluated_with_its_memory_at_its_segment_length(saved_models, tmp_path, capsys):
    root, models, tokenizer = saved_models
    text = "def add(a, b):\n    return a + b\n" * 6
    (tmp_path / "doc.txt").write_text(text)
    argv = [str(root / "transformer_xl"), "--windows", "8", "16", "--overlaps", "0", "2", "--text_file"]
    assert evaluate_command.run(parse([*argv, str(tmp_path / "doc.txt"), "--output_dir", str(tmp_path / "o")])) == 0

    (row,) = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    model = models["transformer_xl"].eval()
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert row["nll"] == pytest.approx(model(ids, labels=ids).loss.item(), rel=1e-5)
    assert (row["window_size"], row["overlap"]) == (model.config.segment_length, 0)
    assert "evaluated in its own segments of 8 tokens with its memory" in capsys.readouterr().out


def test_standard_library_test_split_through_the_cli(saved_models, tmp_path):
    root, _, _ = saved_models
    argv = [str(root / "baseline"), "--windows", "16", "--corpus", "python-stdlib-test", "--max_documents", "1"]
    assert cli.main(["evaluate", *argv, "--output_dir", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["num_documents"] == 1 and row["num_tokens"] > 100 and row["overlap"] == 0


def test_text_file_and_corpus_are_exclusive(saved_models, tmp_path):
    root, _, _ = saved_models
    with pytest.raises(SystemExit):
        parse([str(root / "baseline"), "--text_file", "a.txt", "--corpus", "python-stdlib-test", "--output_dir", "o"])


STDLIB_DOCUMENT = ["--corpus", "python-stdlib-test", "--max_documents", "1"]


def test_a_missing_model_is_one_line_not_a_traceback(tmp_path, capsys):
    argv = ["evaluate", "/no/such/model", "--windows", "32", *STDLIB_DOCUMENT, "--output_dir", str(tmp_path / "o")]
    assert "/no/such/model is not a saved model folder" in user_error(capsys, argv)


def test_every_model_and_window_is_checked_before_the_first_evaluation(saved_models, tmp_path, capsys, monkeypatch):
    root, _, _ = saved_models

    def evaluate(*args, **kwargs):
        raise AssertionError("an evaluation started before every model was checked")

    monkeypatch.setattr(evaluate_command, "windowed_perplexity", evaluate)
    out = tmp_path / "out"
    models = [str(root / "baseline"), str(root / "short")]
    error = user_error(capsys, ["evaluate", *models, "--windows", "16", *STDLIB_DOCUMENT, "--output_dir", str(out)])
    assert "short" in error and "window_size=16" in error
    assert not out.exists()


def test_results_are_written_after_each_evaluation(saved_models, tmp_path, monkeypatch):
    root, _, _ = saved_models
    calls = []

    def fails_second(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return windowed_perplexity(*args, **kwargs)

    monkeypatch.setattr(evaluate_command, "windowed_perplexity", fails_second)
    out = tmp_path / "out"
    argv = [str(root / "baseline"), "--windows", "8", "16", *STDLIB_DOCUMENT, "--output_dir", str(out)]
    with pytest.raises(RuntimeError, match="interrupted"):
        cli.main(["evaluate", *argv])
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["window_size"] == 8 and "| 8 |" in (out / "results.md").read_text()


def test_a_non_empty_folder_is_refused_and_overwrite_replaces_the_earlier_results(saved_models, tmp_path, capsys):
    root, _, _ = saved_models
    argv = ["evaluate", "--windows", "8", *STDLIB_DOCUMENT, "--output_dir", str(tmp_path)]
    assert cli.main([*argv[:1], str(root / "baseline"), *argv[1:]]) == 0
    plot = (tmp_path / "perplexity_vs_flops.png").read_bytes()
    argv = [*argv[:1], str(root / "transformer_xl"), *argv[1:]]

    error = user_error(capsys, argv)
    assert "not empty" in error and "--overwrite" in error
    assert (tmp_path / "perplexity_vs_flops.png").read_bytes() == plot
    (tmp_path / "notes.txt").write_text("mine")
    error = user_error(capsys, [*argv, "--overwrite"])
    assert "holds what no earlier run of hf-recurrence evaluate wrote there (notes.txt)" in error
    assert (tmp_path / "perplexity_vs_flops.png").read_bytes() == plot

    (tmp_path / "notes.txt").unlink()
    assert cli.main([*argv, "--overwrite"]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    (row,) = report["rows"]
    assert report["finished"] is True
    assert row["model"] == "transformer_xl" and row["flops_per_token"] is None
    # No plot of this run (nothing plottable), and none of the earlier one left beside its results.
    assert not (tmp_path / "perplexity_vs_flops.png").exists()


# Writes more than this many bytes to one file fail, as on a full disk (RLIMIT_FSIZE, SIGXFSZ ignored).
FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
from hf_recurrence.cli import main
sys.exit(main({argv!r}))
"""


def test_a_full_disk_mid_run_keeps_the_finished_rows_in_valid_json(saved_models, tmp_path):
    root, _, _ = saved_models
    one_row = tmp_path / "one_row"
    # A stock model: it is evaluated at every window of the grid (a Transformer-XL only at its own segment length).
    argv = ["evaluate", str(root / "baseline"), "--windows", "8", *STDLIB_DOCUMENT, "--output_dir"]
    assert cli.main([*argv, str(one_row)]) == 0
    # Room for the report of one evaluation, not of two (nor for the weights the models load: they are only read).
    limit = (one_row / "results.json").stat().st_size + 100
    out = tmp_path / "out"
    code = FULL_DISK.format(limit=limit, argv=[*argv[:2], "--windows", "8", "16", *argv[4:], str(out)])
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC_ROOT)}
    )
    assert result.returncode == 2, result.stderr
    assert "File too large" in result.stderr.strip().splitlines()[-1]
    report = json.loads((out / "results.json").read_text())
    assert report["finished"] is False and [row["window_size"] for row in report["rows"]] == [8]
    assert (out / "results.md").read_text().startswith("Unfinished run")
    assert not [path.name for path in out.iterdir() if path.name.startswith(".tmp")]


def test_a_model_with_non_finite_weights_is_refused_by_name(saved_models, tmp_path, capsys):
    root, models, tokenizer = saved_models
    broken = GPT2LMHeadModel(models["baseline"].config)
    with torch.no_grad():
        broken.transformer.h[1].mlp.c_fc.weight[0, 0] = float("nan")
    broken.save_pretrained(tmp_path / "broken")
    tokenizer.save_pretrained(tmp_path / "broken")
    argv = ["evaluate", str(tmp_path / "broken"), "--windows", "8", *STDLIB_DOCUMENT]
    error = user_error(capsys, [*argv, "--output_dir", str(tmp_path / "out")])
    assert "has non-finite weights (NaN or inf) in transformer.h.1.mlp.c_fc.weight" in error


def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused_in_one_line(saved_models, tmp_path, capsys):
    root, models, tokenizer = saved_models
    small = GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, "vocab_size": 50}))
    small.save_pretrained(tmp_path / "small")
    argv = ["evaluate", str(tmp_path / "small"), "--tokenizer", str(root / "baseline"), "--windows", "8"]
    error = user_error(capsys, [*argv, *STDLIB_DOCUMENT, "--output_dir", str(tmp_path / "out")])
    assert (
        f"MODEL {tmp_path / 'small'} has a vocabulary of 50 tokens, but the tokenizer of {root / 'baseline'}" in error
    )
    assert not (tmp_path / "out").exists()
