"""The `hf-recurrence` command line: every command has --help, and generate / reproduce do their job (convert:
tests/test_convert.py; `gpt2_dir`: tests/conftest.py)."""

import json

import pytest
from transformers import GPT2LMHeadModel

from hf_recurrence.cli import COMMANDS, build_parser, main
from hf_recurrence.commands.reproduce import PRESETS, settings_from_args
from hf_recurrence.experiments.book_reproduction import BookReproductionSettings
from hf_recurrence.experiments.pretraining import default_model_path
from hf_recurrence.experiments.reproduction import ReproductionSettings, findings
from hf_recurrence.outputs import UsageError

from .common import TINY_GPT2, stdlib_tokenizer, user_error


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: hf-recurrence " + command in capsys.readouterr().out


def test_generate_writes_past_the_position_table(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "recurrent"
    main(["convert", str(gpt2_dir), str(out), "--window_size", "8"])
    capsys.readouterr()
    prompt = "def main():"
    main(["generate", str(out), "--prompt", prompt, "--max_new_tokens", "40"])
    text = capsys.readouterr().out
    tokenizer = stdlib_tokenizer()
    assert text.startswith(prompt)
    assert len(tokenizer(text.rstrip("\n"))["input_ids"]) > TINY_GPT2["n_positions"]


def test_generate_rejects_zero_tokens(gpt2_dir, capsys):
    assert "--max_new_tokens must be at least 1, got 0" in user_error(
        capsys, ["generate", str(gpt2_dir), "--prompt", "x", "--max_new_tokens", "0"]
    )


def test_a_missing_model_is_one_line_not_a_traceback(tmp_path, capsys):
    error = user_error(capsys, ["generate", str(tmp_path / "no-such-model"), "--prompt", "x"])
    assert "no-such-model" in error


def test_a_bug_keeps_its_traceback(gpt2_dir, monkeypatch):
    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr("hf_recurrence.commands.generate.run", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["generate", str(gpt2_dir), "--prompt", "x"])


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if `reproduce` starts fine-tuning: every check must come first."""

    def fine_tune(*args, **kwargs):
        raise AssertionError("fine-tuning started before the settings were checked")

    monkeypatch.setattr("hf_recurrence.experiments.reproduction.fine_tune", fine_tune)


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--recurrent_overlap_fractions", "0.99"], "recurrent_overlap_fractions=[0.99] round to an overlap of 32"),
        (["--baseline_overlap_fractions", "0.99"], "fractions must be below 0.9844"),
        (["--eval_documents", "0"], "eval_documents must be at least 1"),
        (["--eval_documents", "-1"], "eval_documents=-1"),
        (["--window_sizes", "1000", "--block_tokens", "2000"], "window sizes must lie in [2, 128]"),
        (["--num_resamples", "0"], "num_resamples must be at least 1"),
    ],
    ids=[
        "recurrent-overlap",
        "baseline-overlap",
        "zero-documents",
        "negative-documents",
        "window-over-positions",
        "no-resamples",
    ],
)
def test_reproduce_checks_its_settings_before_training(options, expected, tmp_path, capsys, no_training):
    out = tmp_path / "reproduce"
    error = user_error(capsys, ["reproduce", "--preset", "smoke", "--output_dir", str(out), *options])
    assert expected in error
    assert not out.exists()


def test_reproduce_writes_each_result_as_it_comes(tmp_path, monkeypatch):
    from hf_recurrence.experiments import reproduction

    rows = []

    def fails_second(*args, **kwargs):
        if rows:
            raise RuntimeError("interrupted")
        row, token_nll = evaluate_row(*args, **kwargs)
        rows.append(row)
        return row, token_nll

    evaluate_row = reproduction.evaluate_row
    monkeypatch.setattr(reproduction, "evaluate_row", fails_second)
    with pytest.raises(RuntimeError, match="interrupted"):
        main(["reproduce", "--preset", "smoke", "--output_dir", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"] == rows


def test_reproduce_refuses_a_non_empty_folder_before_training(tmp_path, capsys, no_training):
    (tmp_path / "results.json").write_text("{}")
    error = user_error(capsys, ["reproduce", "--preset", "smoke", "--output_dir", str(tmp_path)])
    assert "--overwrite" in error and (tmp_path / "results.json").read_text() == "{}"


def test_pretrain_checks_its_folder_before_training(tmp_path, capsys, monkeypatch):
    def train_byte_level_bpe(*args, **kwargs):
        raise AssertionError("training started before the output folder was checked")

    monkeypatch.setattr("hf_recurrence.experiments.pretraining.train_byte_level_bpe", train_byte_level_bpe)
    (tmp_path / "a-file").write_text("")
    error = user_error(capsys, ["pretrain", "--output_dir", str(tmp_path / "a-file" / "model"), "--max_steps", "1"])
    assert "cannot write to output folder" in error
    error = user_error(capsys, ["pretrain", "--output_dir", str(tmp_path), "--max_steps", "1"])
    assert "not empty" in error
    assert "n_embd=30 must be a multiple of n_head=4" in user_error(
        capsys, ["pretrain", "--output_dir", str(tmp_path / "new"), "--n_embd", "30"]
    )


def test_presets_are_overridden_by_explicit_options():
    args = build_parser().parse_args(["reproduce", "--preset", "smoke", "--max_steps", "7", "--window_sizes", "16"])
    settings = settings_from_args(args)
    assert settings.max_steps == 7 and list(settings.window_sizes) == [16]
    assert settings.batch_size == PRESETS["smoke"]["batch_size"]


def test_long_books_options_parse_into_their_settings_and_foreign_ones_are_refused():
    args = build_parser().parse_args(
        ["reproduce", "--preset", "smollm2", "--normalize_pooled_states", "false", "--overlap_fractions", "0", "0.5"]
    )
    settings = settings_from_args(args)
    assert settings.normalize_pooled_states is False and list(settings.overlap_fractions) == [0.0, 0.5]
    assert settings.window_size == BookReproductionSettings().window_size  # not given: the preset's
    args = build_parser().parse_args(["reproduce", "--preset", "smollm2", "--window_sizes", "64"])
    with pytest.raises(UsageError, match="--window_sizes do\\(es\\) not apply to --preset smollm2"):
        settings_from_args(args)


def test_reproduction_settings_name_bad_values():
    with pytest.raises(ValueError, match=r"baseline_overlap_fractions.*\[1.0\]"):
        ReproductionSettings(baseline_overlap_fractions=[0.0, 1.0])
    with pytest.raises(ValueError, match=r"window_sizes.*\[512\]"):
        ReproductionSettings(window_sizes=[64, 512], block_tokens=256)


def test_embedded_default_model_is_a_gpt2_with_a_model_card():
    path = default_model_path()
    model = GPT2LMHeadModel.from_pretrained(path)
    assert model.config.n_positions == 128
    card = (path / "README.md").read_text()
    assert "library_name: transformers" in card and "hf-recurrence pretrain" in card


def test_findings_check_the_papers_two_claims():
    def row(model, overlap, perplexity):
        return {
            "model": model,
            "window_size": 32,
            "overlap": overlap,
            "perplexity": perplexity,
            "flops_per_token": 32 / (32 - overlap),
        }

    rows = [row("baseline", 0, 100.0), row("baseline", 4, 96.0), row("baseline", 8, 94.0), row("recurrent", 0, 97.0)]
    same_overlap, matched = findings(rows)
    assert same_overlap == "window 32, overlap 0: recurrent 97.00 vs baseline 100.00 (-3.0%)"
    assert "overlap 0 is 4 (12% of the window, 1.14x the FLOPs/token): 96.00 vs 97.00" in matched
    (_, unmatched) = findings([row("baseline", 0, 100.0), row("recurrent", 0, 90.0)])
    assert "no baseline overlap up to 0 reaches" in unmatched
    # A family without an analytic FLOPs count (flops_per_token None) gets "n/a" for the cost, not a TypeError.
    uncounted = [{**r, "flops_per_token": None} for r in rows]
    assert "overlap 0 is 4 (12% of the window, n/a the FLOPs/token)" in findings(uncounted)[1]
