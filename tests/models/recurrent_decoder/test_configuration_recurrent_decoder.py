"""`RecurrentDecoderConfig` says what it runs with: a checkpoint without its window warns, a head's labels and the
tokenizer-bound settings (`vocab_size`, the special token ids) are the backbone's, and all of it round-trips."""

import json
import logging

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

from hf_recurrence import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentDecoderForSequenceClassification,
    RecurrentGPT2Config,
    RecurrentLlamaConfig,
)

from ...common import TINY_GPT2, TINY_LLAMA, TINY_RECURRENCE, tiny_recurrent_config, tiny_recurrent_llama_config


def _core_config(text: dict | None = None, **overrides) -> RecurrentDecoderConfig:
    return RecurrentDecoderConfig(
        text_config=LlamaConfig(**{**TINY_LLAMA, **(text or {})}), **{**TINY_RECURRENCE, **overrides}
    )


# Per config class: a recurrent config with a window of 8 and an overlap of 2, and the stock config it converts.
WINDOWED = {
    "recurrent_decoder": (
        RecurrentDecoderConfig,
        lambda: _core_config(window_overlap=2),
        LlamaConfig(**TINY_LLAMA),
        TINY_LLAMA["max_position_embeddings"],
    ),
    "recurrent_gpt2": (
        RecurrentGPT2Config,
        lambda: tiny_recurrent_config(window_overlap=2),
        GPT2Config(**TINY_GPT2),
        TINY_GPT2["n_positions"],
    ),
    "recurrent_llama": (
        RecurrentLlamaConfig,
        lambda: tiny_recurrent_llama_config(window_overlap=2),
        LlamaConfig(**TINY_LLAMA),
        TINY_LLAMA["max_position_embeddings"],
    ),
}


@pytest.mark.parametrize("model_type", WINDOWED)
@pytest.mark.parametrize("missing", ["window_size", "window_overlap"])
def test_a_checkpoint_without_its_window_warns_and_a_converted_stock_one_does_not(
    model_type, missing, tmp_path, caplog
):
    config_class, make_recurrent, stock, positions = WINDOWED[model_type]
    make_recurrent().save_pretrained(tmp_path / "recurrent")
    stock.save_pretrained(tmp_path / "stock")
    config_file = tmp_path / "recurrent" / "config.json"
    saved = json.loads(config_file.read_text())
    del saved[missing]
    config_file.write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING):
        converted = config_class.from_pretrained(tmp_path / "stock")
        config_class.from_pretrained(tmp_path / "stock", window_size=8)
        config_class.from_pretrained(tmp_path / "recurrent", **{missing: 8 if missing == "window_size" else 2})
        assert "config has no" not in caplog.text
        loaded = config_class.from_pretrained(tmp_path / "recurrent")
    # One piece of code says it for every config class.
    assert f"This {model_type} config has no {missing}: running with the defaults" in caplog.text
    assert getattr(loaded, missing) == {"window_size": positions, "window_overlap": 0}[missing]
    # Converted, a stock model gets the paper's window bounded by its position table, and no overlap.
    assert (converted.window_size, converted.window_overlap) == (positions, 0)


def test_a_heads_labels_come_from_the_backbone_config_unless_given(tmp_path):
    labels = {i: f"topic_{i}" for i in range(5)}
    config = _core_config({"id2label": labels, "problem_type": "single_label_classification"})
    assert (config.num_labels, config.id2label, config.problem_type) == (5, labels, "single_label_classification")
    assert RecurrentDecoderForSequenceClassification(config).score.out_features == 5
    assert _core_config({"id2label": labels}, num_labels=3).num_labels == 3
    assert _core_config({"id2label": labels}, id2label={0: "no", 1: "yes"}).id2label == {0: "no", 1: "yes"}
    for name, given in (("taken", {}), ("given", {"num_labels": 2})):
        saved = _core_config({"id2label": labels}, **given)
        saved.save_pretrained(tmp_path / name)
        loaded = RecurrentDecoderConfig.from_pretrained(tmp_path / name)
        assert (loaded.id2label, loaded.label2id) == (saved.id2label, saved.label2id), name


def test_a_config_saved_without_labels_keeps_the_two_labels_its_head_was_saved_with(tmp_path):
    # transformers writes no `id2label` for two labels, so an older head over a backbone config with others has two.
    _core_config({"num_labels": 5}).save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    config.pop("id2label", None), config.pop("label2id", None)
    config_file.write_text(json.dumps(config))
    assert RecurrentDecoderConfig.from_pretrained(tmp_path).num_labels == 2
    assert RecurrentDecoderConfig.from_pretrained(tmp_path, num_labels=4).num_labels == 4


@pytest.mark.parametrize("name", ["vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"])
def test_a_tokenizer_bound_setting_given_or_set_at_the_top_level_is_the_backbones(name, tmp_path):
    value = 4096 if name == "vocab_size" else 7
    config = _core_config(**{name: value})
    assert getattr(config.text_config, name) == value and getattr(config, name) == value
    config = _core_config()
    setattr(config, name, value)
    assert getattr(config.text_config, name) == value
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert name not in saved and saved["text_config"][name] == value
    assert getattr(RecurrentDecoderConfig.from_pretrained(tmp_path), name) == value
    assert getattr(RecurrentDecoderConfig.from_pretrained(tmp_path, **{name: 5}).text_config, name) == 5


def test_a_larger_vocabulary_given_at_the_top_level_is_the_models():
    model = RecurrentDecoderForCausalLM(_core_config(vocab_size=4096))
    ids = torch.tensor([[1, 4000, 4095, 2]])
    assert model(ids).logits.shape == (1, 4, 4096)


def test_a_padding_id_set_on_the_config_afterwards_reaches_the_classification_head():
    # The stock remedy for "Cannot handle batch sizes > 1 if no padding token is defined".
    model = RecurrentDecoderForSequenceClassification(_core_config({"pad_token_id": None})).eval()
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    with pytest.raises(ValueError, match="no padding token"):
        model(ids)
    model.config.pad_token_id = 0
    logits = model(ids).logits
    torch.testing.assert_close(logits[1], model(ids[1:, :2]).logits[0], rtol=1e-5, atol=1e-5)
