"""Registration, save/load round trips and trust_remote_code loading in a fresh interpreter."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel, RecurrentGPT2Model

from ...common import ACROSS_KERNELS, assert_loads_with_remote_code, tiny_recurrent_config


def test_auto_classes_resolve_to_ours():
    kwargs = {k: v for k, v in tiny_recurrent_config().to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("recurrent_gpt2", **kwargs)
    assert type(config) is RecurrentGPT2Config
    assert type(AutoModel.from_config(config)) is RecurrentGPT2Model
    assert type(AutoModelForCausalLM.from_config(config)) is RecurrentGPT2LMHeadModel


def test_save_load_round_trip(tmp_path):
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=2, bptt_windows=3)).eval()
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "configuration_recurrent_gpt2.py",
        "modeling_recurrent_gpt2.py",
    } <= files
    saved_config = json.loads((tmp_path / "config.json").read_text())
    assert saved_config["auto_map"] == {
        "AutoConfig": "configuration_recurrent_gpt2.RecurrentGPT2Config",
        "AutoModel": "modeling_recurrent_gpt2.RecurrentGPT2Model",
        "AutoModelForCausalLM": "modeling_recurrent_gpt2.RecurrentGPT2LMHeadModel",
    }
    assert saved_config["window_overlap"] == 2 and saved_config["bptt_windows"] == 3

    ids = torch.randint(0, 99, (2, 30))
    for loader in (RecurrentGPT2LMHeadModel, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path).eval()
        assert type(loaded) is RecurrentGPT2LMHeadModel
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, **ACROSS_KERNELS)
    base = AutoModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(base(ids).last_hidden_state, model.transformer(ids).last_hidden_state, **ACROSS_KERNELS)


@pytest.mark.remote_code
def test_trust_remote_code_in_a_fresh_interpreter_without_the_package(tmp_path):
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=3)).eval()
    generates = """
generated = model.generate(reference["inputs"]["input_ids"][:, :4], max_new_tokens=40, do_sample=False)
assert generated.shape == (2, 44)
"""
    inputs = {"input_ids": torch.randint(0, 99, (2, 40))}
    assert_loads_with_remote_code(model, inputs, tmp_path, "AutoModelForCausalLM", checks=generates)
