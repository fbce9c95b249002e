# SPDX-License-Identifier: Apache-2.0
"""Configuration of I-BERT, the inductive BERT of Nam et al. (2020), "I-BERT: Inductive Generalization of Transformer
to Arbitrary Context Lengths". Not transformers' `IBertConfig` (model type "ibert"), which is Integer-BERT."""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import BertConfig
from transformers.utils import logging


logger = logging.get_logger(__name__)


AUTO_MAP = {
    "AutoConfig": "configuration_inductive_bert.InductiveBertConfig",
    "AutoModel": "modeling_inductive_bert.IBertModel",
    "AutoModelForMaskedLM": "modeling_inductive_bert.IBertForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_inductive_bert.IBertForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_inductive_bert.IBertForTokenClassification",
}


@strict
class InductiveBertConfig(BertConfig):
    r"""
    Configuration of the I-BERT models ([`IBertModel`], [`IBertForMaskedLM`], [`IBertForSequenceClassification`],
    [`IBertForTokenClassification`]): every field of [`~transformers.BertConfig`], so any BERT checkpoint's config
    loads into it, plus the two ablation switches of the paper (§4, §6.2).

    I-BERT replaces BERT's position embeddings with a bidirectional LSTM (`hidden_size / 2` units per direction)
    between the token embeddings and the first encoder layer. With the defaults the model has no maximum input
    length, and `max_position_embeddings` is unused.

    Args:
        use_position_embeddings (`bool`, *optional*, defaults to `False`):
            The paper's "I-BERT+PE" ablation: also add BERT's learned absolute position embeddings (a table of
            `max_position_embeddings` rows) to the LSTM output. Inputs are then limited to
            `max_position_embeddings` tokens.
        lstm_feed_forward (`bool`, *optional*, defaults to `False`):
            The paper's "I-BERT2" ablation: replace the feed-forward network of every encoder layer by a
            bidirectional LSTM (residual connection and LayerNorm kept), on top of the LSTM after the embeddings.
        sparse_prediction (`bool`, *optional*, defaults to `False`):
            A training-cost switch of [`IBertForMaskedLM`] (ModernBERT's field of the same name): when `labels` are
            given, the masked-LM head runs only at the labelled positions (`labels != -100`), and `logits` holds
            those positions only, shape `(num_labelled, vocab_size)` in row-major order. The loss is the full head's.
            Without `labels` the logits cover every position, as with `False`.

    Example:

    ```python
    >>> from hf_recurrence import IBertForMaskedLM, InductiveBertConfig

    >>> config = InductiveBertConfig(
    ...     vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37
    ... )
    >>> model = IBertForMaskedLM(config)
    >>> hasattr(model.bert.embeddings, "position_embeddings")
    False

    ```"""

    model_type = "inductive_bert"
    # The config fields this family adds to BERT (the paper's ablation switches), in the order model cards list them;
    # from_pretrained(..., field=value) applies them before validation, and tools read the list from here.
    family_settings = ("use_position_embeddings", "lstm_feed_forward")

    use_position_embeddings: bool = False
    lstm_feed_forward: bool = False
    sparse_prediction: bool = False

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)
        self.check_inductive_bert_settings()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == BertConfig.model_type:
            # Initialising I-BERT from a BERT checkpoint is the intended use, not a type mismatch worth a warning.
            if not kwargs.get("use_position_embeddings", config_dict.get("use_position_embeddings", False)):
                logger.warning(
                    f"Converting the BERT config of {pretrained_model_name_or_path} into an I-BERT config: I-BERT has "
                    "no position embeddings, so the checkpoint's position table is ignored, and its BiLSTM is newly "
                    "initialised (pass use_position_embeddings=True to keep the table)."
                )
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> "InductiveBertConfig":
        # Switches given to from_pretrained must be in place when the config is validated, not set after it.
        config_dict = dict(config_dict)
        for name in cls.family_settings:
            if name in kwargs:
                config_dict[name] = kwargs.pop(name)
        return super().from_dict(config_dict, **kwargs)

    def validate_inductive_bert_settings(self):
        """Part of `@strict` validation, so a config changed after construction is checked again when saved."""
        self.check_inductive_bert_settings()

    def check_inductive_bert_settings(self) -> None:
        """Raise `ValueError` naming the first invalid field and its value (`@strict` already checked the types)."""
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be a positive integer, got {name}={value!r}")
        if self.hidden_size % 2:
            raise ValueError(
                f"hidden_size must be even (the BiLSTM has hidden_size / 2 units per direction), got "
                f"hidden_size={self.hidden_size}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads={self.num_attention_heads}"
            )
        if self.use_position_embeddings and self.max_position_embeddings < 1:
            raise ValueError(
                "max_position_embeddings must be positive when use_position_embeddings=True, got "
                f"max_position_embeddings={self.max_position_embeddings}"
            )
        if self.type_vocab_size < 1:
            raise ValueError(f"type_vocab_size must be positive, got type_vocab_size={self.type_vocab_size}")
        # The BiLSTM reads the whole input in both directions, so no position may be decoded causally.
        if self.is_decoder:
            raise ValueError("is_decoder=True is not supported: I-BERT is a bidirectional encoder")
        if self.add_cross_attention:
            raise ValueError("add_cross_attention=True is not supported: I-BERT is a bidirectional encoder")


__all__ = ["InductiveBertConfig"]
