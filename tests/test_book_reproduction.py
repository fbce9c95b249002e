"""`hf-recurrence reproduce --preset smollm2`: the baseline / recurrent / control arms on the Austen books, run end to end
on a tiny Llama (the real SmolLM2 run is recorded in docs/benchmarks.md)."""

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence.book_reproduction import BookReproductionSettings
from hf_recurrence.cli import main
from hf_recurrence.commands.reproduce import BOOK_PRESETS
from hf_recurrence.data import books as books_module
from hf_recurrence.data import books_cache_dir
from hf_recurrence.outputs import UsageError

from .common import TINY_LLAMA, stdlib_tokenizer


@pytest.fixture(scope="module")
def books_available():
    pytest.importorskip("rdata", reason="reading the R data files needs `pip install rdata`")
    cached = (books_cache_dir() / f"janeaustenr-{books_module.JANEAUSTENR_VERSION}").is_dir()
    if not cached and not (shutil.which("apt-get") and shutil.which("dpkg")):
        pytest.skip("r-cran-janeaustenr is not cached and apt-get/dpkg are unavailable to download it")


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = stdlib_tokenizer()
    LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TINY_RUN = [
    "--window_size", "8", "--insertion_layer", "1", "--windows_per_block", "2", "--batch_size", "2",
    "--max_steps", "3", "--warmup_steps", "0", "--learning_rate", "0.05", "--eval_tokens_per_book", "60",
    "--segment_tokens", "8", "--num_resamples", "50",
]  # fmt: skip


def test_three_arms_end_to_end(books_available, tiny_llama_folder, tmp_path, capsys):
    out = tmp_path / "run"
    status = main(["reproduce", "--preset", "smollm2", "--model_name_or_path", str(tiny_llama_folder),
                   "--output_dir", str(out), *TINY_RUN])  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    assert "Northanger Abbey (60 of" in printed and "Persuasion (60 of" in printed

    results = json.loads((out / "results.json").read_text())
    arms = [(row["model"], row["overlap"]) for row in results["rows"]]
    # T = 8: overlaps 0, T/8 = 1, T/4 = 2, T/2 = 4 for the baseline; the trained arms at 0.
    assert arms == [("baseline", 0), ("baseline", 1), ("baseline", 2), ("baseline", 4), ("recurrent", 0),
                    ("control", 0)]  # fmt: skip
    assert all(row["num_tokens"] == 2 * 59 for row in results["rows"])
    assert all(row["flops_per_token"] > 0 for row in results["rows"])
    assert [row["tokens"] for row in results["rows"][4:]] == [3 * 2 * 2 * 8] * 2
    assert set(results["comparisons"]) == {
        "recurrent vs baseline@0", "recurrent vs control", "control vs baseline@0", "recurrent vs baseline@T/8"
    }  # fmt: skip
    versus_control = results["comparisons"]["recurrent vs control"]
    assert versus_control["low"] <= versus_control["relative_difference"] <= versus_control["high"]
    assert versus_control["num_segments"] == 2 * 8  # two books of 59 predicted tokens in pieces of 8
    assert set(results["nll_by_window_position"]) == {"baseline@0", "recurrent@0", "control@0"}
    assert all(len(values) == 8 for values in results["nll_by_window_position"].values())
    assert [r["title"] for r in results["held_out"]] == ["Northanger Abbey", "Persuasion"]

    split = json.loads((out / "split.json").read_text())
    assert [book["title"] for book in split["splits"]["test"]] == ["Northanger Abbey", "Persuasion"]
    assert (out / "perplexity_vs_flops.png").stat().st_size > 0
    assert (out / "nll_by_window_position.png").stat().st_size > 0
    report = (out / "results.md").read_text()
    for goal in ("goal 1", "goal 2", "goal 3"):
        assert goal in report

    # The control's recurrence reads zeros: its layer weights get no gradient and keep their initial value, while the
    # recurrent arm's move; both FFNs are trained.
    recurrent = load_file(out / "recurrence_recurrent.safetensors")
    control = load_file(out / "recurrence_control.safetensors")
    assert torch.equal(control["layer_weight_logits"], torch.zeros(3))
    assert not torch.equal(recurrent["layer_weight_logits"], torch.zeros(3))
    assert not torch.equal(recurrent["ffn.0.weight"], control["ffn.0.weight"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--train_files", "a.txt"], "--train_files do(es) not apply to --preset smollm2"),
        (["--overlap_fractions", "0.25"], "overlap_fractions must include 0"),
        (["--overlap_fractions", "0", "1.0"], "overlap_fractions=[1.0]"),
        (["--eval_tokens_per_book", "8"], "eval_tokens_per_book=8"),
        (["--eval_split", "dev"], "eval_split='dev'"),
    ],
)
def test_bad_options_are_refused_before_any_work(options, message, tmp_path, capsys):
    assert main(["reproduce", "--preset", "smollm2", "--output_dir", str(tmp_path / "out"), *options]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_bool_option_takes_only_a_truth_value(tmp_path, capsys):
    # HfArgumentParser's reading of booleans: true/false, yes/no, t/f, y/n, 1/0; anything else is refused by argparse.
    with pytest.raises(SystemExit):
        main(["reproduce", "--preset", "smollm2", "--output_dir", str(tmp_path), "--normalize_pooled_states", "maybe"])
    assert "Truthy value expected: got maybe" in capsys.readouterr().err


def test_gpt2_options_stay_refused_by_the_gpt2_presets(tmp_path, capsys):
    assert main(["reproduce", "--preset", "smoke", "--eval_split", "test", "--output_dir", str(tmp_path)]) == 2
    assert "--eval_split do(es) not apply to --preset smoke" in capsys.readouterr().err


def test_insertion_layer_outside_the_model_is_refused_before_training(tiny_llama_folder, tmp_path, capsys):
    status = main(["reproduce", "--preset", "smollm2", "--model_name_or_path", str(tiny_llama_folder),
                   "--output_dir", str(tmp_path / "out"), *TINY_RUN, "--insertion_layer", "3"])  # fmt: skip
    assert status == 2
    assert "insertion_layer=3" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_settings_name_bad_values():
    with pytest.raises(UsageError, match="batch_size=0"):
        BookReproductionSettings(batch_size=0)
    with pytest.raises(UsageError, match="window_size=1"):
        BookReproductionSettings(window_size=1)


def test_a_missing_book_reader_names_the_package_to_install(
    books_available, tiny_llama_folder, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "rdata", None)  # `import rdata` now raises ImportError
    status = main(["reproduce", "--preset", "smollm2", "--model_name_or_path", str(tiny_llama_folder),
                   "--output_dir", str(tmp_path / "out"), *TINY_RUN])  # fmt: skip
    assert status == 2
    assert "needs the `rdata` package: pip install rdata" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("preset", sorted(BOOK_PRESETS))
def test_every_book_preset_is_valid_and_reads_the_papers_overlaps(preset):
    settings = BookReproductionSettings(**BOOK_PRESETS[preset])
    assert list(settings.overlap_fractions) == [0.0, 0.125, 0.25, 0.5]
    assert settings.eval_split == "test"
