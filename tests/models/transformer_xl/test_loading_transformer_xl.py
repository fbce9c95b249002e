"""Registration, save/load round trips and trust_remote_code loading in a fresh interpreter."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel

from ...common import ACROSS_KERNELS, assert_loads_with_remote_code, tiny_transformer_xl_config


def test_auto_classes_resolve_to_ours():
    kwargs = {k: v for k, v in tiny_transformer_xl_config().to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("transformer_xl", **kwargs)
    assert type(config) is TransformerXLConfig
    assert type(AutoModel.from_config(config)) is TransformerXLModel
    assert type(AutoModelForCausalLM.from_config(config)) is TransformerXLLMHeadModel


def test_save_load_round_trip(tmp_path):
    model = TransformerXLLMHeadModel(tiny_transformer_xl_config(clamp_len=5, untie_r=False)).eval()
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "configuration_transformer_xl.py",
        "modeling_transformer_xl.py",
    } <= files
    saved_config = json.loads((tmp_path / "config.json").read_text())
    assert saved_config["auto_map"] == {
        "AutoConfig": "configuration_transformer_xl.TransformerXLConfig",
        "AutoModel": "modeling_transformer_xl.TransformerXLModel",
        "AutoModelForCausalLM": "modeling_transformer_xl.TransformerXLLMHeadModel",
    }
    assert saved_config["clamp_len"] == 5 and saved_config["untie_r"] is False

    ids = torch.randint(0, 99, (2, 30))
    for loader in (TransformerXLLMHeadModel, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path).eval()
        assert type(loaded) is TransformerXLLMHeadModel
        assert loaded.lm_head.weight is loaded.transformer.word_emb.weight
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, **ACROSS_KERNELS)
    base = AutoModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(base(ids).last_hidden_state, model.transformer(ids).last_hidden_state, **ACROSS_KERNELS)


@pytest.mark.remote_code
def test_trust_remote_code_in_a_fresh_interpreter_without_the_package(tmp_path):
    model = TransformerXLLMHeadModel(tiny_transformer_xl_config()).eval()
    generates = """
ids = reference["inputs"]["input_ids"][:, :4]
generated = model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False)
assert generated.shape == (2, 44)
"""
    inputs = {"input_ids": torch.randint(0, 99, (2, 40))}
    assert_loads_with_remote_code(model, inputs, tmp_path, "AutoModelForCausalLM", checks=generates)


@pytest.fixture
def transformers_4_transfo_xl_folder(tmp_path):
    """What transformers 4.x's TransfoXLLMHeadModel.save_pretrained wrote (transformers 5 has no such class to run):
    its config fields and some of its adaptive-embedding / adaptive-softmax weights."""
    config = {
        "architectures": ["TransfoXLLMHeadModel"],
        "model_type": "transfo-xl",
        "transformers_version": "4.35.2",
        "vocab_size": 100,
        "cutoffs": [20, 40],
        "d_model": 32,
        "d_embed": 32,
        "n_head": 2,
        "d_head": 16,
        "d_inner": 64,
        "div_val": 2,
        "n_layer": 2,
        "mem_len": 8,
        "tgt_len": 8,
        "clamp_len": 1000,
        "same_length": True,
        "adaptive": True,
        "tie_projs": [False, True, True],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(
        {
            "transformer.word_emb.emb_layers.0.weight": torch.randn(20, 32),
            "transformer.word_emb.emb_layers.1.weight": torch.randn(20, 16),
            "transformer.word_emb.emb_projs.1": torch.randn(32, 16),
            "transformer.layers.0.dec_attn.qkv_net.weight": torch.randn(96, 32),
            "crit.out_layers.0.weight": torch.randn(20, 32),
            "crit.cluster_weight": torch.randn(2, 32),
        },
        tmp_path / "model.safetensors",
    )
    return tmp_path


@pytest.mark.parametrize(
    "load",
    [
        TransformerXLLMHeadModel.from_pretrained,
        TransformerXLModel.from_pretrained,
        TransformerXLConfig.from_pretrained,
        AutoModelForCausalLM.from_pretrained,
        AutoModel.from_pretrained,
        AutoConfig.from_pretrained,
    ],
    ids=["lm_head_model", "model", "config", "auto_causal_lm", "auto_model", "auto_config"],
)
def test_a_transformers_4_transfo_xl_checkpoint_is_refused_with_the_reason(transformers_4_transfo_xl_folder, load):
    # It once loaded as a model whose every weight was random, with warnings only.
    with pytest.raises(ValueError) as info:
        load(transformers_4_transfo_xl_folder)
    message = str(info.value)
    assert "transformers 4.x TransfoXLLMHeadModel checkpoint" in message
    assert "adaptive softmax" in message and "cannot be loaded into TransformerXLLMHeadModel" in message
    assert "No converter exists yet" in message
