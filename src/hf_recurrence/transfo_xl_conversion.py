"""Convert a transformers 4.x `TransfoXLLMHeadModel` checkpoint (model_type "transfo-xl", e.g.
`transfo-xl/transfo-xl-wt103`) into this package's Transformer-XL, adaptive input and adaptive softmax included.

What differs from 4.x, and how the conversion handles it (docs/models/transformer_xl.md has the full list):

- `clamp_len <= 0` means "never clamp" in 4.x; here that is `clamp_len=None` (0 would clamp every distance to 0).
- 4.x starts from `mem_len` zero vectors of memory when `mems=None`; this model starts with no memory, as 4.x does
  when given empty memories. The converted model reproduces 4.x's outputs from the same (empty) start.
- 4.x processes each call as one segment; `segment_length` is a setting here (given, or 4.x's `mem_len`).
- 4.x's output layers have biases: the adaptive softmax here has them too.
- 4.x does not scale `inputs_embeds` by `sqrt(d_model)`; this model does (ids are scaled alike in both).
- Only 4.x's relative attention (`attn_type=0`) and post-norm layers convert: 4.x has no final layer norm after
  pre-norm layers and this model has one, so `pre_lnorm=True` checkpoints are refused.
"""

import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from .models.transformer_xl import TransformerXLConfig, TransformerXLLMHeadModel


LEGACY_MODEL_TYPE = "transfo-xl"
# 4.x parameter names -> ours (regular expressions over the full name).
RENAMES = [
    (r"^transformer\.layers\.(\d+)\.dec_attn\.", r"transformer.layers.\1.attn."),
    (r"^transformer\.layers\.(\d+)\.pos_ff\.CoreNet\.0\.", r"transformer.layers.\1.ff.fc1."),
    (r"^transformer\.layers\.(\d+)\.pos_ff\.CoreNet\.3\.", r"transformer.layers.\1.ff.fc2."),
    (r"^transformer\.layers\.(\d+)\.pos_ff\.layer_norm\.", r"transformer.layers.\1.ff.layer_norm."),
    (r"^crit\.", "lm_head."),
]
# Buffers 4.x saves that this model computes.
DROPPED = {"transformer.pos_emb.inv_freq"}


def is_legacy_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a transformers 4.x TransfoXL checkpoint."""
    config_file = Path(folder) / "config.json"
    return config_file.is_file() and json.loads(config_file.read_text()).get("model_type") == LEGACY_MODEL_TYPE


def config_from_legacy(legacy: dict, segment_length: int | None = None) -> TransformerXLConfig:
    """Our config for a 4.x TransfoXL `config.json` dict; refuses what this model cannot reproduce, naming it."""
    if legacy.get("model_type") != LEGACY_MODEL_TYPE:
        raise ValueError(f"Not a transformers 4.x TransfoXL config: model_type={legacy.get('model_type')!r}")
    for name, supported in (("attn_type", 0), ("pre_lnorm", False)):
        if legacy.get(name, supported) != supported:
            raise ValueError(
                f"{name}={legacy[name]!r} cannot be converted: only attn_type=0 (relative attention) and post-norm "
                "layers (4.x has no final layer norm after pre-norm layers; this model has one) are supported"
            )
    if legacy.get("sample_softmax", -1) > 0:
        raise ValueError(
            f"sample_softmax={legacy['sample_softmax']} (a training-time sampled softmax) is not supported"
        )
    clamp_len = legacy.get("clamp_len", 0)
    adaptive = legacy.get("adaptive", True)
    cutoffs = list(legacy.get("cutoffs", [])) if adaptive else None
    return TransformerXLConfig(
        vocab_size=legacy["vocab_size"],
        d_model=legacy["d_model"],
        n_head=legacy["n_head"],
        d_head=legacy["d_head"],
        d_inner=legacy["d_inner"],
        n_layer=legacy["n_layer"],
        segment_length=segment_length or legacy["mem_len"],
        mem_len=legacy["mem_len"],
        clamp_len=clamp_len if clamp_len > 0 else None,
        same_length=legacy.get("same_length", False),
        dropout=legacy.get("dropout", 0.1),
        dropatt=legacy.get("dropatt", 0.0),
        untie_r=legacy.get("untie_r", True),
        layer_norm_epsilon=legacy.get("layer_norm_epsilon", 1e-5),
        cutoffs=cutoffs,
        div_val=legacy.get("div_val", 1) if adaptive else 1,
        d_embed=legacy.get("d_embed") if adaptive else None,
        tie_projs=list(legacy["tie_projs"]) if adaptive and legacy.get("tie_projs") else None,
        tie_word_embeddings=legacy.get("tie_word_embeddings", True),
        eos_token_id=legacy.get("eos_token_id"),
        bos_token_id=legacy.get("bos_token_id"),
        pad_token_id=legacy.get("pad_token_id"),
    )


def _legacy_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def _renamed(name: str) -> str:
    for pattern, replacement in RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def convert_transfo_xl(folder: str | os.PathLike, segment_length: int | None = None) -> TransformerXLLMHeadModel:
    """A `TransformerXLLMHeadModel` with every weight of the 4.x checkpoint in `folder` (a local folder)."""
    folder = Path(folder)
    if not is_legacy_checkpoint(folder):
        raise ValueError(
            f"{folder} is not a transformers 4.x TransfoXL checkpoint (no config.json of model_type 'transfo-xl')"
        )
    config = config_from_legacy(json.loads((folder / "config.json").read_text()), segment_length)
    model = TransformerXLLMHeadModel(config)
    weights = {_renamed(name): tensor for name, tensor in _legacy_weights(folder).items() if name not in DROPPED}
    expected = model.state_dict()
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise ValueError(f"{folder} has weights this model has no place for: {unexpected}")
    tied = set(model._tied_weights_keys)
    missing = sorted(set(expected) - set(weights) - tied)
    if missing:
        raise ValueError(f"{folder} lacks weights that would be left random: {missing}")
    misshapen = [
        f"{n} {tuple(t.shape)} (expected {tuple(expected[n].shape)})"
        for n, t in weights.items()
        if t.shape != expected[n].shape
    ]
    if misshapen:
        raise ValueError(f"{folder} has weights of other shapes than its config implies: {misshapen}")
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    return model.eval()
