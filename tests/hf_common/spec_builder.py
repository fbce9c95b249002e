"""What the spec modules share: transformers' tiny test sizes, the random batches, and `causal_spec`, which builds a
causal family's spec attributes from its classes and a config factory."""

from collections.abc import Callable

import torch
from stateful_checks import generation_checks, unbounded_char_tokenizer


BATCH, SEQ, VOCAB = 13, 7, 99
# 4-token windows (or segments), so that the 7-token inputs cross a window boundary.
WINDOW = 4
# The sizes of transformers' own model testers (BertModelTester, CausalLMModelTester), by the common config names.
TINY_SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
}
# CausalLMModelTester's, with GQA (4 query heads over 2 key/value heads) and a 512-position table.
CAUSAL_LM_SIZES = {**TINY_SIZES, "num_key_value_heads": 2, "max_position_embeddings": 512}
# The causal families' bos, eos and pad: the last id of the vocabulary.
SPECIAL_TOKENS = dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), VOCAB - 1)


def random_ids(high: int = VOCAB) -> torch.Tensor:
    """A fresh (BATCH, SEQ) tensor of random ids in [0, high)."""
    return torch.randint(0, high, (BATCH, SEQ))


def causal_batch() -> dict[str, torch.Tensor]:
    """A fresh random batch whose row i keeps its first i + 1 tokens (right padding of every length)."""
    input_ids = random_ids()
    return {"input_ids": input_ids, "attention_mask": torch.tril(torch.ones_like(input_ids))}


def causal_spec(
    classes: tuple[type | None, type],
    state_class: type,
    make_config: Callable,
    attention_columns: Callable,
    derived_attributes: tuple[str, ...] = (),
    **attributes,
) -> dict:
    """The spec's attributes for a causal family. `classes`: its (bare model, causal LM), the bare model None where
    the family has none; `make_config()`: its tiny config; `attention_columns(config)`: the fixed width of every
    attention map, which is also the model tester's key_length; `derived_attributes`: see `generation_checks`;
    `attributes`: the rest (skip_tests, config_tester_kwargs, ...)."""
    bare, causal = classes

    def get_config_and_inputs():
        return make_config(), causal_batch()

    tasks = {"feature-extraction": bare, "text-generation": causal}
    return {
        "config_class": causal.config_class,
        "all_model_classes": tuple(cls for cls in classes if cls is not None),
        "pipeline_model_mapping": {task: cls for task, cls in tasks.items() if cls is not None},
        "get_config_and_inputs": get_config_and_inputs,
        "test_class_attrs": generation_checks(state_class, attention_columns, derived_attributes),
        "model_tester_attrs": {"key_length": attention_columns(make_config())},
        "get_tokenizer": unbounded_char_tokenizer,
        **attributes,
    }


_CHECKPOINTING = (
    "gradient checkpointing recomputes whole window steps (RecurrentDecoderWindowStep, one GradientCheckpointingLayer "
    "for the whole backbone over one window) and turns the stock decoder layers' own checkpointing off, since "
    "recomputing them inside a recomputed step would run them a third time; the test {what}. "
    "tests/models/recurrent_decoder checks that checkpointed training gives the plain autograd gradients"
)


def recurrence_core_skips(stock_models: str, reverse_mapping_reason: str) -> dict[str, str]:
    """The skips every model over the recurrence core needs by design (the core's and the named families'):
    `stock_models` names the stock base model that test_correct_missing_keys saves; `reverse_mapping_reason`: why its
    checkpoint renamings name a stock prefix its backbone has no weights under."""
    return {
        "test_can_set_attention_dynamically": (
            "it expects every nested config to read 'eager' after set_attn_implementation('eager'); the backbone's "
            "config reads recurrent_eager by design: the recurrence's attention wraps the chosen one (eager or sdpa) to "
            "add h_prev and the window cache, and the model's own config reads the plain name"
        ),
        "test_can_capture_specific_layers_hidden_states": (
            "not implemented: output_hidden_states given as a list of layer indices (selective capture) is read as "
            "True, so every layer's states come back; the states themselves are checked by the other hidden-state "
            "tests"
        ),
        "test_correct_missing_keys": (
            f"it saves the base model ({stock_models}) and loads it without recurrence settings; the default "
            "insertion_layer=2 (the paper's l_ins) is not a layer of the 2-layer tiny backbone the harness requires, "
            "so the config is refused with that reason. Loading a stock checkpoint with its settings loads every stock "
            "weight and reports only recurrence.* missing (tests/models/recurrent_decoder/test_modeling_recurrent_decoder.py)"
        ),
        "test_reverse_loading_mapping": reverse_mapping_reason,
        "test_gradient_checkpointing_enable_disable": _CHECKPOINTING.format(
            what="expects every module with a gradient_checkpointing flag to have it set"
        ),
        "test_peft_gradient_checkpointing_enable_disable": _CHECKPOINTING.format(
            what="expects every module with a gradient_checkpointing flag to have it set"
        ),
        **{
            f"test_training_gradient_checkpointing{suffix}": _CHECKPOINTING.format(
                what="counts the recomputations of the first GradientCheckpointingLayer, a stock decoder layer"
            )
            for suffix in ("", "_use_reentrant_false", "_use_reentrant_true")
        },
    }
