"""Registration, save/load round trips and trust_remote_code loading in a fresh interpreter."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM, RecurrentLlamaModel

from ...common import ACROSS_KERNELS, assert_loads_with_remote_code, tiny_recurrent_llama_config


def test_auto_classes_resolve_to_ours():
    kwargs = {k: v for k, v in tiny_recurrent_llama_config().to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("recurrent_llama", **kwargs)
    assert type(config) is RecurrentLlamaConfig
    assert type(AutoModel.from_config(config)) is RecurrentLlamaModel
    assert type(AutoModelForCausalLM.from_config(config)) is RecurrentLlamaForCausalLM


def test_save_load_round_trip(tmp_path):
    config = tiny_recurrent_llama_config(window_overlap=2, bptt_windows=3, h_prev_rope_position=0)
    model = RecurrentLlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "configuration_recurrent_llama.py",
        "modeling_recurrent_llama.py",
    } <= files
    saved_config = json.loads((tmp_path / "config.json").read_text())
    assert saved_config["auto_map"] == {
        "AutoConfig": "configuration_recurrent_llama.RecurrentLlamaConfig",
        "AutoModel": "modeling_recurrent_llama.RecurrentLlamaModel",
        "AutoModelForCausalLM": "modeling_recurrent_llama.RecurrentLlamaForCausalLM",
    }
    assert saved_config["window_overlap"] == 2 and saved_config["h_prev_rope_position"] == 0

    ids = torch.randint(0, 99, (2, 30))
    for loader in (RecurrentLlamaForCausalLM, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path).eval()
        assert type(loaded) is RecurrentLlamaForCausalLM
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, **ACROSS_KERNELS)
    base = AutoModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(base(ids).last_hidden_state, model.model(ids).last_hidden_state, **ACROSS_KERNELS)


@pytest.mark.remote_code
def test_trust_remote_code_in_a_fresh_interpreter_without_the_package(tmp_path):
    model = RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(window_overlap=3)).eval()
    generates = """
generated = model.generate(reference["inputs"]["input_ids"][:, :4], max_new_tokens=40, do_sample=False)
assert generated.shape == (2, 44)
"""
    inputs = {"input_ids": torch.randint(0, 99, (2, 40))}
    assert_loads_with_remote_code(model, inputs, tmp_path, "AutoModelForCausalLM", checks=generates)
