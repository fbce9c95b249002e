"""The named causal LMs keep the attributes of the stock classes they extend (`GPT2LMHeadModel`, `LlamaForCausalLM`),
which user code, hooks and tools reach for; and what the recurrence's attention check says about a bad name."""

import pytest
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hf_recurrence import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentGPT2LMHeadModel,
    RecurrentLlamaForCausalLM,
)

from ...common import TINY_GPT2, TINY_LLAMA, TINY_RECURRENCE, tiny_recurrent_config, tiny_recurrent_llama_config


# Per family: the stock class and its config, the recurrent class and its config maker, and the attribute paths user
# code reaches for (a call where the path ends in "()"). `base_model` itself is a view that reads window by window
# (TRL and Liger call it for hidden states); its attributes are the stock base model's.
FAMILIES = {
    "gpt2": (
        GPT2LMHeadModel,
        GPT2Config(**TINY_GPT2),
        RecurrentGPT2LMHeadModel,
        tiny_recurrent_config,
        (
            "lm_head",
            "transformer",
            "transformer.wte",
            "transformer.wpe",
            "transformer.h",
            "transformer.h.0.attn",
            "transformer.ln_f",
            "base_model.wte",
            "base_model.h",
            "get_decoder()",
            "get_decoder().h",
            "config.n_embd",
            "config.n_layer",
            "config.n_head",
            "config.hidden_size",
            "config.vocab_size",
        ),
    ),
    "llama": (
        LlamaForCausalLM,
        LlamaConfig(**TINY_LLAMA),
        RecurrentLlamaForCausalLM,
        tiny_recurrent_llama_config,
        (
            "lm_head",
            "vocab_size",
            "model",
            "model.embed_tokens",
            "model.layers",
            "model.layers.0.self_attn",
            "model.norm",
            "model.rotary_emb",
            "base_model.embed_tokens",
            "base_model.layers",
            "get_decoder()",
            "get_decoder().layers",
            "config.hidden_size",
            "config.num_hidden_layers",
            "config.vocab_size",
        ),
    ),
}
# What every causal LM has on top of its family's own attributes.
COMMON = ("get_input_embeddings()", "get_output_embeddings()")


def _resolve(obj: object, path: str) -> object:
    for part in path.split("."):
        obj = getattr(obj, part.removesuffix("()"))() if part.endswith("()") else getattr(obj, part)
    return obj


def _models(name: str) -> tuple[nn.Module, nn.Module]:
    stock_class, stock_config, recurrent_class, make_config, _ = FAMILIES[name]
    return stock_class(stock_config), recurrent_class(make_config())


@pytest.mark.parametrize("name", FAMILIES)
def test_the_attributes_user_code_reaches_for_are_the_stock_ones(name):
    stock, recurrent = _models(name)
    for path in (*FAMILIES[name][4], *COMMON):
        expected, found = _resolve(stock, path), _resolve(recurrent, path)
        if isinstance(expected, nn.Module):
            assert type(found) is type(expected), path
            shapes = {key: value.shape for key, value in expected.state_dict().items()}
            assert {key: value.shape for key, value in found.state_dict().items()} == shapes, path
        else:
            assert found == expected, path
    # The attributes are the recurrent model's own modules, not copies.
    assert recurrent.lm_head is recurrent.get_output_embeddings()
    embeddings = "transformer.wte" if name == "gpt2" else "model.embed_tokens"
    assert _resolve(recurrent, embeddings) is _resolve(recurrent, f"base_model.{embeddings.split('.')[1]}")
    assert _resolve(recurrent, embeddings) is recurrent.get_input_embeddings()


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("path", ["", "base_model", "get_decoder()", "config"])
def test_every_public_attribute_of_the_stock_model_is_there(name, path):
    stock, recurrent = _models(name)
    stock, recurrent = (_resolve(model, path) if path else model for model in (stock, recurrent))
    missing = []
    for attribute in dir(stock):
        if attribute.startswith("_"):
            continue
        try:
            getattr(stock, attribute)
        except (AttributeError, NotImplementedError):
            continue  # missing on the stock model too (GPT2Config.rope_scaling)
        if not hasattr(recurrent, attribute):
            missing.append(attribute)
    assert missing == []


@pytest.mark.parametrize("name", FAMILIES)
def test_a_resized_named_model_reports_its_new_vocabulary_as_the_stock_one_does(name):
    stock, recurrent = _models(name)
    for model in (stock, recurrent):
        model.resize_token_embeddings(TINY_GPT2["vocab_size"] + 5)
    assert recurrent.lm_head.weight.shape == stock.lm_head.weight.shape
    assert getattr(recurrent, "vocab_size", None) == getattr(stock, "vocab_size", None)


@pytest.mark.parametrize("core", [False, True])
def test_an_unknown_attn_implementation_is_named_with_the_ones_the_recurrence_runs_on(core):
    config = tiny_recurrent_llama_config(attn_implementation="bogus")
    model_class = RecurrentDecoderForCausalLM if core else RecurrentLlamaForCausalLM
    if core:
        config = RecurrentDecoderConfig(
            text_config=LlamaConfig(**TINY_LLAMA), attn_implementation="bogus", **TINY_RECURRENCE
        )
    with pytest.raises(ValueError) as refused:
        model_class(config)
    message = str(refused.value)
    assert "attn_implementation='bogus'" in message and "['sdpa', 'eager']" in message
    assert "not an attention implementation" in message and "flash" not in message


@pytest.mark.parametrize("implementation", ["flex_attention", "kernels-community/flash-attn2"])
def test_an_attn_implementation_that_cannot_carry_the_recurrence_still_says_why(implementation):
    with pytest.raises(ValueError, match=f"'{implementation}' .* per-row attention mask, which flash"):
        RecurrentLlamaForCausalLM(tiny_recurrent_llama_config()).set_attn_implementation(implementation)
