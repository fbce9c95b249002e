"""`hf-recurrence evaluate`: a grid of windows and overlaps over saved models, table, JSON and plot."""

import argparse
import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2LMHeadModel, cli
from hf_recurrence.commands import evaluate as evaluate_command
from hf_recurrence.evaluation import windowed_perplexity

from ..common import TINY_GPT2, stdlib_tokenizer, tiny_recurrent_config


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

    rows = json.loads((out / "results.json").read_text())
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


def test_standard_library_test_split_through_the_cli(saved_models, tmp_path):
    root, _, _ = saved_models
    argv = [str(root / "baseline"), "--windows", "16", "--corpus", "python-stdlib-test", "--max_documents", "1"]
    assert cli.main(["evaluate", *argv, "--output_dir", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["num_documents"] == 1 and row["num_tokens"] > 100 and row["overlap"] == 0


def test_text_file_and_corpus_are_exclusive(saved_models, tmp_path):
    root, _, _ = saved_models
    with pytest.raises(SystemExit):
        parse([str(root / "baseline"), "--text_file", "a.txt", "--corpus", "python-stdlib-test", "--output_dir", "o"])
