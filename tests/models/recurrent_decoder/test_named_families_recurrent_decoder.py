"""The named families (recurrent GPT-2 and Llama) as transformers' common tests use them: their flat configs, weight
initialisation of missing weights, and loading without any renaming (tests/hf_common runs the tests themselves)."""

import pytest
import torch
from safetensors import safe_open
from transformers import GenerationMixin, PreTrainedModel, set_seed

from hf_recurrence import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaModel,
)

from ...common import tiny_recurrent_config, tiny_recurrent_llama_config


NAMED = {
    "gpt2": (tiny_recurrent_config, RecurrentGPT2Model, RecurrentGPT2LMHeadModel),
    "llama": (tiny_recurrent_llama_config, RecurrentLlamaModel, RecurrentLlamaForCausalLM),
}


@pytest.mark.parametrize("name", NAMED)
def test_a_change_made_through_get_text_config_reaches_the_backbone_and_the_saved_config(name, tmp_path):
    make_config, _, causal_lm = NAMED[name]
    config = make_config()
    # transformers changes the text config in place (resize_token_embeddings, RoPE scaling): the flat config must be
    # its own, or the change is lost when any field is set next (as building a model does).
    config.get_text_config(decoder=True).vocab_size = 20
    assert config.vocab_size == 20
    model = causal_lm(config)
    assert model.get_input_embeddings().weight.shape[0] == 20
    model.resize_token_embeddings(24)
    model.save_pretrained(tmp_path)
    assert causal_lm.from_pretrained(tmp_path).config.vocab_size == 24


def test_rope_scaling_set_through_get_text_config_reaches_the_backbone():
    config = tiny_recurrent_llama_config()
    text_config = config.get_text_config(decoder=True)
    text_config.rope_parameters = {**text_config.rope_parameters, "rope_type": "linear", "factor": 10.0}
    model = RecurrentLlamaModel(config)
    assert model.backbone.config.rope_parameters["rope_type"] == "linear"
    assert model.backbone.rotary_emb.rope_type == "linear"


@pytest.mark.parametrize("name", NAMED)
def test_the_attention_asked_of_a_named_config_is_its_text_configs_too(name):
    make_config, _, _ = NAMED[name]
    config = make_config(attn_implementation="eager")
    assert config.text_config._attn_implementation == "eager"
    config._attn_implementation = "sdpa"
    assert config.text_config._attn_implementation == "sdpa"


def _state_dicts_of_init_and_of_loading_nothing(model_class, config, monkeypatch):
    """The state dict of `model_class(config)` and of `from_pretrained` with every weight missing, each module's
    initialisation seeded alike (as transformers' test_can_init_all_missing_weights does)."""
    initialize = PreTrainedModel._initialize_weights

    def seeded(*args, **kwargs):
        set_seed(0)
        initialize(*args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", seeded)
    built = model_class(config).state_dict()
    loaded = model_class.from_pretrained(None, config=config, state_dict={}).state_dict()
    return built, loaded


@pytest.mark.parametrize("name", NAMED)
def test_missing_weights_are_initialised_as_at_construction(name, monkeypatch):
    make_config, bare, causal_lm = NAMED[name]
    for model_class in (bare, causal_lm):
        built, loaded = _state_dicts_of_init_and_of_loading_nothing(model_class, make_config(), monkeypatch)
        assert built.keys() == loaded.keys()
        # GPT-2 scales its residual projections (`c_proj`) at the attention and MLP modules, which hold no weights.
        assert [key for key in built if not torch.equal(built[key], loaded[key])] == []


def _tiny_core_config() -> RecurrentDecoderConfig:
    return RecurrentDecoderConfig(
        text_config=tiny_recurrent_llama_config().text_config, window_size=8, insertion_layer=1
    )


@pytest.mark.parametrize("name", [*NAMED, "core"])
def test_a_causal_lm_loaded_without_any_renaming_saves_in_the_stock_layout(name, tmp_path):
    make_config, _, causal_lm = (
        NAMED[name] if name != "core" else (_tiny_core_config, None, RecurrentDecoderForCausalLM)
    )
    causal_lm(make_config()).save_pretrained(tmp_path / "built")
    causal_lm.from_pretrained(None, config=make_config(), state_dict={}).save_pretrained(tmp_path / "loaded")
    keys = {}
    for run in ("built", "loaded"):
        with safe_open(tmp_path / run / "model.safetensors", "pt") as f:
            keys[run] = sorted(f.keys())
    assert keys["loaded"] == keys["built"]
    assert not any(key.startswith("backbone.") for key in keys["loaded"])


def test_the_named_causal_lms_name_generation_mixin_among_their_bases():
    for causal_lm in (RecurrentGPT2LMHeadModel, RecurrentLlamaForCausalLM):
        assert GenerationMixin in causal_lm.__bases__
