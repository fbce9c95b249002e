"""The `hf-recurrence` command line: every command has --help, and convert / generate / reproduce do their job."""

import json
import logging
import os

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2LMHeadModel
from hf_recurrence.cli import COMMANDS, build_parser, main
from hf_recurrence.commands.reproduce import PRESETS, settings_from_args
from hf_recurrence.experiments.book_reproduction import BookReproductionSettings
from hf_recurrence.experiments.pretraining import default_model_path
from hf_recurrence.experiments.reproduction import ReproductionSettings, findings
from hf_recurrence.outputs import UsageError

from .common import ACROSS_KERNELS, TINY_GPT2, stdlib_tokenizer, user_error


@pytest.fixture
def gpt2_dir(tmp_path):
    path = tmp_path / "gpt2"
    tokenizer = stdlib_tokenizer()
    GPT2LMHeadModel(GPT2Config(**{**TINY_GPT2, "vocab_size": len(tokenizer)})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: hf-recurrence " + command in capsys.readouterr().out


def test_convert_keeps_gpt2_and_adds_the_recurrence(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "recurrent"
    main(["convert", str(gpt2_dir), str(out), "--window_size", "8", "--window_overlap", "2", "--insertion_layer", "1"])
    assert "new weights" in capsys.readouterr().out
    model = RecurrentGPT2LMHeadModel.from_pretrained(out).eval()
    assert (model.config.window_size, model.config.window_overlap, model.config.insertion_layer) == (8, 2, 1)
    assert (out / "tokenizer.json").exists()
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    stock = GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    torch.testing.assert_close(model(ids).logits, stock(ids).logits, **ACROSS_KERNELS)


def test_convert_says_the_new_recurrence_is_untrained_and_what_to_do(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "recurrent"
    assert main(["convert", str(gpt2_dir), str(out), "--window_size", "8", "--insertion_layer", "1"]) == 0
    printed = capsys.readouterr().out
    assert "The recurrence is untrained: past its first 8 tokens the model no longer sees the prompt" in printed
    assert "Fine-tune it" in printed and "--window_size as long as the model's own context" in printed
    # Re-windowing a recurrent checkpoint keeps its recurrence: nothing new to warn about.
    assert main(["convert", str(out), str(tmp_path / "rewindowed"), "--window_size", "4"]) == 0
    assert "untrained" not in capsys.readouterr().out


def test_convert_rejects_a_bad_window_naming_it(gpt2_dir, tmp_path, capsys):
    error = user_error(capsys, ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "99"])
    assert "window_size=99" in error
    assert not (tmp_path / "out").exists()


def test_convert_without_window_flags_fits_the_window_to_the_position_table(tmp_path, capsys):
    out = tmp_path / "recurrent"
    assert main(["convert", str(default_model_path()), str(out)]) == 0
    config = RecurrentGPT2LMHeadModel.config_class.from_pretrained(out)
    n_positions = GPT2Config.from_pretrained(default_model_path()).n_positions
    assert config.window_size == min(300, n_positions) and config.window_overlap == 0
    assert f"window_size={config.window_size}" in capsys.readouterr().out


def test_convert_refuses_a_non_empty_folder_and_overwrite_replaces_only_its_own_run(
    gpt2_dir, tmp_path, capsys, caplog
):
    out = tmp_path / "trained"
    argv = ["convert", str(gpt2_dir), str(out), "--window_size", "8", "--insertion_layer", "1"]
    assert main(argv) == 0
    written = sorted(path.name for path in out.iterdir())
    weights = (out / "model.safetensors").read_bytes()

    error = user_error(capsys, [*argv[:3], "--window_size", "4", "--insertion_layer", "1"])
    assert "not empty" in error and "--overwrite" in error
    assert (out / "model.safetensors").read_bytes() == weights

    # A training run's files and the user's own beside the converted model: nothing convert wrote, so refused.
    (out / "checkpoint-30").mkdir()
    (out / "checkpoint-30" / "optimizer.pt").write_bytes(b"state")
    (out / "runs").mkdir()
    (out / "train.py").write_text("mine")
    (out / "README.md").write_text("mine too")
    again = [*argv[:3], "--window_size", "4", "--insertion_layer", "1", "--overwrite"]
    error = user_error(capsys, again)
    assert "README.md, checkpoint-30, runs, train.py" in error
    assert (out / "train.py").read_text() == "mine" and (out / "checkpoint-30" / "optimizer.pt").exists()
    assert (out / "model.safetensors").read_bytes() == weights

    for name in ("train.py", "README.md"):
        (out / name).unlink()
    for name in ("checkpoint-30/optimizer.pt", "checkpoint-30", "runs"):
        (out / name).unlink() if (out / name).is_file() else (out / name).rmdir()
    with caplog.at_level(logging.WARNING, logger="hf_recurrence.outputs"):
        assert main(again) == 0
    assert "Removing what an earlier run of hf-recurrence convert wrote" in caplog.text
    assert sorted(path.name for path in out.iterdir()) == written
    assert RecurrentGPT2LMHeadModel.config_class.from_pretrained(out).window_size == 4


@pytest.mark.parametrize("killed", ["while_saving", "before_finishing"])
def test_overwrite_after_a_killed_convert_keeps_the_files_the_user_added_since(
    killed, gpt2_dir, tmp_path, capsys, monkeypatch
):
    import transformers.modeling_utils

    from hf_recurrence.commands import convert

    def kill(*args, **kwargs):
        raise KeyboardInterrupt

    argv = ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    with monkeypatch.context() as patch:
        if killed == "while_saving":
            patch.setattr(transformers.modeling_utils, "safe_save_file", kill)
        else:
            patch.setattr(convert, "finish_output_dir", kill)
        with pytest.raises(KeyboardInterrupt):
            main(argv)
    out = tmp_path / "out"
    written = {path.name for path in out.iterdir()}
    # What the user adds next: the names convert's own files match, which a killed run once took for its own.
    (out / "runs" / "exp1").mkdir(parents=True)
    user_files = {"train.py": "mine", "README.md": "notes", "paper_results.json": "{}", "runs/exp1/log": "step 1"}
    for name, text in user_files.items():
        (out / name).write_text(text)
    error = user_error(capsys, [*argv, "--overwrite"])
    assert "README.md, paper_results.json, runs, train.py" in error
    assert {name: (out / name).read_text() for name in user_files} == user_files
    assert written <= {path.name for path in out.iterdir()}

    for name in ("train.py", "README.md", "paper_results.json", "runs/exp1/log", "runs/exp1", "runs"):
        (out / name).unlink() if (out / name).is_file() else (out / name).rmdir()
    assert main([*argv, "--overwrite"]) == 0
    assert RecurrentGPT2LMHeadModel.from_pretrained(out).config.window_size == 8


def test_convert_into_a_user_folder_is_refused_even_with_overwrite(gpt2_dir, tmp_path, capsys):
    project = tmp_path / "project"
    for name in ("checkpoint-30", "runs"):
        (project / name).mkdir(parents=True)
    (project / "train.py").write_text("mine")
    (project / "README.md").write_text("mine too")
    error = user_error(capsys, ["convert", str(gpt2_dir), str(project), "--window_size", "8", "--overwrite"])
    assert "written by no hf-recurrence run" in error
    assert sorted(path.name for path in project.iterdir()) == ["README.md", "checkpoint-30", "runs", "train.py"]


def test_convert_of_a_checkpoint_without_tokenizer_is_refused_unless_one_is_given(gpt2_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    GPT2LMHeadModel.from_pretrained(gpt2_dir).save_pretrained(bare)
    error = user_error(capsys, ["convert", str(bare), str(tmp_path / "out"), "--window_size", "8"])
    assert f"{bare} has no tokenizer files (none of tokenizer.json, vocab.json" in error and "--tokenizer" in error
    assert not (tmp_path / "out").exists()

    argv = ["convert", str(bare), str(tmp_path / "out"), "--window_size", "8", "--tokenizer", str(gpt2_dir)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "out"), "--prompt", "def main():", "--max_new_tokens", "5"]) == 0
    assert len(capsys.readouterr().out.strip()) > len("def main():")


def test_a_full_disk_during_convert_is_one_line_and_overwrite_clears_the_partial_output(
    gpt2_dir, tmp_path, capsys, monkeypatch
):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as file:
            file.write(b"half a shard")
        raise SafetensorError("Error while serializing: No space left on device (os error 28)")

    argv = ["convert", str(gpt2_dir), str(tmp_path / "out"), "--window_size", "8", "--insertion_layer", "1"]
    with monkeypatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "safe_save_file", disk_full)
        error = user_error(capsys, argv)
    assert "cannot write the converted checkpoint" in error and "No space left on device" in error
    assert "--overwrite" in error
    assert main([*argv, "--overwrite"]) == 0
    assert RecurrentGPT2LMHeadModel.from_pretrained(tmp_path / "out").config.window_size == 8


def test_a_malicious_pickle_is_refused_in_one_line_without_advising_weights_only_false(gpt2_dir, tmp_path, capsys):
    class RunsCode:
        def __reduce__(self):
            return (os.getcwd, ())

    evil = tmp_path / "evil"
    GPT2Config.from_pretrained(gpt2_dir).save_pretrained(evil)
    torch.save({"transformer.wte.weight": RunsCode()}, evil / "pytorch_model.bin")
    error = user_error(capsys, ["convert", str(evil), str(tmp_path / "out"), "--window_size", "8"])
    assert "hold objects other than tensors" in error and "refused" in error
    assert "weights_only" not in error


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
    ],
    ids=["recurrent-overlap", "baseline-overlap", "zero-documents", "negative-documents", "window-over-positions"],
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
        rows.append(evaluate_row(*args, **kwargs))
        return rows[-1]

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
