"""transformers 4.x TransfoXL checkpoints convert into our Transformer-XL, adaptive input and softmax included.

The fixture (tests/fixtures/transfo_xl_4x, written by its make_fixture.py with transformers 4.35.2) is a tiny
checkpoint with wt103's structure (three clusters, div_val 2, tied tail projections) and 4.x's log-probabilities over
three 6-token calls that carry memory."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel
from hf_recurrence.cli import main as cli_main
from hf_recurrence.transfo_xl_conversion import config_from_legacy, convert_transfo_xl

from .common import REPO_ROOT


FIXTURE = REPO_ROOT / "tests" / "fixtures" / "transfo_xl_4x"
REFERENCE = torch.load(FIXTURE / "reference.pt")


def _log_probs_in_calls(model, ids: torch.Tensor, segment: int) -> torch.Tensor:
    state, pieces = None, []
    with torch.no_grad():
        for start in range(0, ids.shape[1], segment):
            out = model(ids[:, start : start + segment], past_key_values=state)
            state = out.past_key_values
            pieces.append(out.logits)
    return torch.cat(pieces, dim=1)


def test_a_converted_checkpoint_reproduces_4x_log_probabilities_across_segments():
    model = convert_transfo_xl(FIXTURE / "checkpoint", segment_length=REFERENCE["segment"])
    ids, expected = REFERENCE["input_ids"], REFERENCE["log_probs"]
    torch.testing.assert_close(_log_probs_in_calls(model, ids, REFERENCE["segment"]), expected, rtol=1e-5, atol=1e-5)
    # One call reading all three segments gives the same, and the loss is 4.x's negative log-likelihood.
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)
        nll = -expected[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        torch.testing.assert_close(model(ids, labels=ids).loss, nll, rtol=1e-5, atol=1e-5)
    # With same_length every query sees mem_len keys, itself included, as 4.x counts them.
    model.config.same_length = True
    torch.testing.assert_close(
        _log_probs_in_calls(model, ids, REFERENCE["segment"]), REFERENCE["log_probs_same_length"], rtol=1e-5, atol=1e-5
    )
    assert model.lm_head.out_layers[2].weight is model.transformer.word_emb.emb_layers[2].weight
    assert model.lm_head.out_projs[1] is model.transformer.word_emb.emb_projs[1]


def test_the_command_converts_a_folder_that_then_loads_saves_and_generates(tmp_path, capsys):
    output = tmp_path / "converted"
    assert cli_main(["convert", str(FIXTURE / "checkpoint"), str(output), "--segment_length", "6"]) == 0
    assert "with every weight of" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(output).eval()
    assert isinstance(model, TransformerXLLMHeadModel) and model.config.cutoffs == [10, 30]
    ids = REFERENCE["input_ids"]
    torch.testing.assert_close(_log_probs_in_calls(model, ids, 6), REFERENCE["log_probs"], rtol=1e-5, atol=1e-5)
    model.save_pretrained(tmp_path / "again")
    again = TransformerXLLMHeadModel.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    generated = model.generate(ids[:, :4], max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert generated.shape == (2, 12)
    # Nothing is overwritten without --overwrite, and Auto loading of the 4.x folder points to the converter.
    assert cli_main(["convert", str(FIXTURE / "checkpoint"), str(output)]) == 2
    with pytest.raises(ValueError, match="hf-recurrence convert FOLDER OUTPUT_DIR"):
        AutoModelForCausalLM.from_pretrained(FIXTURE / "checkpoint")


def _legacy_config() -> dict:
    return json.loads((FIXTURE / "checkpoint" / "config.json").read_text())


def test_settings_that_cannot_be_reproduced_are_refused_by_name():
    for name, value in (("attn_type", 1), ("pre_lnorm", True), ("sample_softmax", 100)):
        with pytest.raises(ValueError, match=rf"{name}={value!r}"):
            config_from_legacy({**_legacy_config(), name: value})
    # clamp_len 0 (or less) means "never clamp" in 4.x.
    assert config_from_legacy({**_legacy_config(), "clamp_len": 0}).clamp_len is None
    assert config_from_legacy({**_legacy_config(), "clamp_len": 5}).clamp_len == 5
    assert config_from_legacy(_legacy_config()).segment_length == 8  # mem_len unless given


def test_checkpoints_with_missing_or_foreign_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    weights = load_file(FIXTURE / "checkpoint" / "model.safetensors")
    for name, change in (("missing", "drop"), ("foreign", "add")):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(FIXTURE / "checkpoint" / "config.json", folder)
        edited = dict(weights)
        if change == "drop":
            del edited["transformer.layers.1.dec_attn.qkv_net.weight"]
        else:
            edited["transformer.layers.0.dec_attn.extra"] = torch.zeros(1)
        save_file(edited, str(folder / "model.safetensors"))
        with pytest.raises(ValueError, match="left random" if change == "drop" else "no place for"):
            convert_transfo_xl(folder)
    with pytest.raises(ValueError, match="not a transformers 4.x TransfoXL checkpoint"):
        convert_transfo_xl(tmp_path)


@pytest.mark.parametrize("div_val, d_embed", [(1, 32), (1, 16), (2, 32)])
def test_the_adaptive_softmax_is_a_distribution_and_its_loss_is_the_nll(div_val, d_embed):
    config = TransformerXLConfig(
        vocab_size=60, d_model=32, n_head=2, d_head=16, d_inner=48, n_layer=2, segment_length=8, mem_len=8,
        cutoffs=[10, 30], div_val=div_val, d_embed=d_embed, tie_projs=[False, True, True], dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TransformerXLLMHeadModel(config).eval()
    ids = torch.randint(0, 60, (2, 20))
    with torch.no_grad():
        log_probs = model(ids).logits
        torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 20))
        nll = -log_probs[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        torch.testing.assert_close(model(ids, labels=ids).loss, nll)
    with pytest.raises(ValueError, match="cutoffs must increase strictly"):
        TransformerXLConfig(vocab_size=60, cutoffs=[30, 10])


@pytest.mark.slow
def test_the_fixture_is_what_transformers_4x_writes(tmp_path):
    """Rebuild the fixture with transformers 4.35.2 in a fresh virtual environment and compare."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=1200)
    subprocess.run([*pip, "transformers==4.35.2", "numpy<2"], check=True, timeout=1200)
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(venv / "bin" / "python"), str(FIXTURE / "make_fixture.py"), str(tmp_path)],
        check=True, env=environment, timeout=600,
    )  # fmt: skip
    rebuilt = torch.load(tmp_path / "reference.pt")
    torch.testing.assert_close(rebuilt["log_probs"], REFERENCE["log_probs"])
    model = convert_transfo_xl(tmp_path / "checkpoint", segment_length=rebuilt["segment"])
    torch.testing.assert_close(
        _log_probs_in_calls(model, rebuilt["input_ids"], rebuilt["segment"]),
        rebuilt["log_probs"],
        rtol=1e-5,
        atol=1e-5,
    )


def test_the_fixture_is_small():
    assert sum(p.stat().st_size for p in Path(FIXTURE).rglob("*") if p.is_file()) < 200_000
