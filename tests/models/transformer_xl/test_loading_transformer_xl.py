"""Transformer-XL's own loading rules: a tied head after reloading, and transformers 4.x TransfoXL checkpoints refused
with the reason (the common loading tests are in tests/test_families.py)."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel

from ...common import tiny_transformer_xl_config


def test_reloaded_head_stays_tied_to_the_embedding(tmp_path):
    # Save/load itself is in tests/test_families.py; the tie is this family's own.
    TransformerXLLMHeadModel(tiny_transformer_xl_config()).save_pretrained(tmp_path)
    for loader in (TransformerXLLMHeadModel, AutoModelForCausalLM):
        loaded = loader.from_pretrained(tmp_path)
        assert loaded.lm_head.weight is loaded.transformer.word_emb.weight


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
    assert "adaptive softmax" in message and "cannot be loaded as it is" in message
    assert "hf-recurrence convert FOLDER OUTPUT_DIR" in message
