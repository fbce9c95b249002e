# SPDX-License-Identifier: Apache-2.0
"""Configuration of a recurrent Llama: the recurrence of Yoshida, Ettinger and Gimpel (2020), "Adding Recurrence to
Pretrained Transformers for Improved Efficiency and Context Size", on the Llama architecture."""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig
from transformers.utils import logging


logger = logging.get_logger(__name__)


AUTO_MAP = {
    "AutoConfig": "configuration_recurrent_llama.RecurrentLlamaConfig",
    "AutoModel": "modeling_recurrent_llama.RecurrentLlamaModel",
    "AutoModelForCausalLM": "modeling_recurrent_llama.RecurrentLlamaForCausalLM",
    "AutoModelForSequenceClassification": "modeling_recurrent_llama.RecurrentLlamaForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_recurrent_llama.RecurrentLlamaForTokenClassification",
}

# What the recurrence reads: the window's summary (the paper), or zeros (the control: a learned constant h_prev).
RECURRENCE_INPUTS = ("window", "zeros")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@strict
class RecurrentLlamaConfig(LlamaConfig):
    r"""
    Configuration of a [`RecurrentLlamaForCausalLM`]: every field of [`~transformers.LlamaConfig`] (so any Llama
    checkpoint's config loads into it) plus the recurrence settings below.

    The input is read in windows of `window_size` tokens, each window repeating the last `window_overlap` tokens of
    the one before. A window's hidden states, weighted across layers and mean-pooled, pass through a small
    feed-forward network to `h_prev`, which the next window sees as one extra key/value (one slot per key-value head)
    at layer `insertion_layer`. RoPE positions restart at 0 in every window, so the model reads inputs of any length
    while its attention only ever sees positions `0 .. window_size - 1`.

    Args:
        window_size (`int`, *optional*, defaults to 300):
            Tokens per window (the paper's T). At most `max_position_embeddings`. A Llama config converted without
            one gets `min(300, max_position_embeddings)`.
        window_overlap (`int`, *optional*, defaults to 0):
            Tokens each window repeats from the previous one (the paper's overlap, §4.2). Must be smaller than
            `window_size`. A model must be evaluated with the overlap it was trained with.
        insertion_layer (`int`, *optional*, defaults to 2):
            0-based index of the decoder layer whose self-attention receives `h_prev` as an extra key/value (the
            paper's l_ins = 2).
        recurrence_hidden_sizes (`list[int]`, *optional*, defaults to `[200, 200, 200]`):
            Hidden layer widths of the feed-forward network mapping the pooled summary to `h_prev` (paper §5). Its
            activation is the backbone's `hidden_act`.
        bptt_windows (`int`, *optional*):
            Truncation of backpropagation through time. `None` backpropagates through every window of an input.
            `k` lets gradient flow back through at most `k` earlier windows (windows after the first are grouped into
            runs of `k + 1` and gradient crosses window boundaries only inside a run).
        h_prev_rope_position (`int`, *optional*):
            RoPE policy of the `h_prev` key. `None` (default) leaves it unrotated, so its attention score depends
            only on the query's content and position, like an attention sink at position 0. An integer `p <= 0`
            rotates it as a token at window position `p`; `-1` puts it just before the window's first token, where
            the summarised text was. The issue-14 prototype on SmolLM2-135M trained well unrotated; the field exists
            so the choice can be measured.
        normalize_pooled_states (`bool`, *optional*, defaults to `False`):
            Scale every layer's token states to unit RMS (no learned weight) before the layer-weighted mean. Llama
            decoders put attention-sink activations on a window's first token that are ~100x larger than the other
            tokens' (SmolLM2-135M: a norm of ~23,800 against ~150 at layer 15) and layers' scales differ ~30x, so
            the plain mean of the paper is mostly a constant; normalised, each token and layer counts alike.
        recurrence_input (`str`, *optional*, defaults to `"window"`):
            `"window"`: `h_prev` is computed from the previous window's summary (the paper). `"zeros"`: the
            recurrence network reads zeros, so `h_prev` is a learned constant, the same for every window: the control
            that separates the gain from carried context from that of one extra learned key/value (a one-token
            prefix).

    Example:

    ```python
    >>> from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM

    >>> config = RecurrentLlamaConfig(
    ...     vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    ...     num_key_value_heads=2, max_position_embeddings=64, window_size=16, insertion_layer=1,
    ... )
    >>> model = RecurrentLlamaForCausalLM(config)
    >>> model.config.window_size
    16

    ```"""

    model_type = "recurrent_llama"
    # The config fields this family adds to its base architecture, in the order model cards list them;
    # from_pretrained(..., field=value) applies them before validation, and tools read the list from here.
    family_settings = (
        "window_size",
        "window_overlap",
        "insertion_layer",
        "recurrence_hidden_sizes",
        "bptt_windows",
        "h_prev_rope_position",
        "normalize_pooled_states",
        "recurrence_input",
    )

    window_size: int = 300
    window_overlap: int = 0
    insertion_layer: int = 2
    recurrence_hidden_sizes: list[int] | None = None
    bptt_windows: int | None = None
    h_prev_rope_position: int | None = None
    normalize_pooled_states: bool = False
    recurrence_input: str = "window"

    def __post_init__(self, **kwargs):
        if self.recurrence_hidden_sizes is None:
            self.recurrence_hidden_sizes = [200, 200, 200]
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)
        self.check_recurrence_settings()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == LlamaConfig.model_type:
            # Converting a stock Llama checkpoint is the intended use, not a type mismatch worth a warning.
            logger.info(
                f"Converting the Llama config of {pretrained_model_name_or_path} into a recurrent Llama config"
            )
            config_dict = {**config_dict, "model_type": cls.model_type}
            # It has no window yet: the family's defaults (or from_pretrained's settings) are meant, unlike in a
            # recurrent checkpoint whose config lacks them (see `from_dict`).
            config_dict.setdefault("window_overlap", cls.window_overlap)
            if "max_position_embeddings" in config_dict:
                config_dict.setdefault("window_size", min(cls.window_size, config_dict["max_position_embeddings"]))
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> "RecurrentLlamaConfig":
        # Recurrence settings given to from_pretrained must be in place when the config is validated, not set after:
        # a Llama config plus window_size=... is only valid as a whole.
        config_dict = dict(config_dict)
        for name in cls.family_settings:
            if name in kwargs:
                config_dict[name] = kwargs.pop(name)
        missing = [name for name in ("window_size", "window_overlap") if name not in config_dict]
        if missing and config_dict.get("model_type") == cls.model_type:
            # Every recurrent checkpoint saved by this package records its window; one that does not was edited
            # or written elsewhere, and the defaults may not be what it was trained with.
            logger.warning(
                f"This {cls.model_type} config has no {' or '.join(missing)}: running with the defaults "
                f"(window_size={cls.window_size} or the position table if shorter, window_overlap="
                f"{cls.window_overlap}). Set them in config.json to the values the model was trained with"
            )
        if "window_size" not in config_dict and "max_position_embeddings" in config_dict:
            config_dict["window_size"] = min(cls.window_size, config_dict["max_position_embeddings"])
        return super().from_dict(config_dict, **kwargs)

    def validate_recurrence_settings(self):
        """Part of `@strict` validation, so a config changed after construction is checked again when saved."""
        self.check_recurrence_settings()

    def check_recurrence_settings(self) -> None:
        """Raise `ValueError` naming the first invalid recurrence field and its value."""
        self.check_window_schedule(self.window_size, self.window_overlap)
        self.check_model_settings()

    def check_window_schedule(self, window_size: int, window_overlap: int) -> None:
        """Raise `ValueError` unless `window_size` and `window_overlap` form a schedule this model can run.

        Checked for the config's own schedule and for every state a forward runs (the state may carry another).
        """
        if not _is_int(window_size) or window_size < 1:
            raise ValueError(f"window_size must be a positive integer, got window_size={window_size!r}")
        if window_size > self.max_position_embeddings:
            raise ValueError(
                f"window_size={window_size} exceeds max_position_embeddings={self.max_position_embeddings}: a "
                "window's RoPE positions must stay inside the range the model was trained on"
            )
        if not _is_int(window_overlap) or not 0 <= window_overlap < window_size:
            raise ValueError(
                f"window_overlap must satisfy 0 <= window_overlap < window_size={window_size}, got "
                f"window_overlap={window_overlap!r}"
            )

    def check_model_settings(self) -> None:
        """Raise `ValueError` naming the first invalid field other than the window schedule; checked on every forward,
        since the config may have been changed after the model was built."""
        if not _is_int(self.insertion_layer) or not 0 <= self.insertion_layer < self.num_hidden_layers:
            raise ValueError(
                f"insertion_layer must be a layer index in [0, num_hidden_layers={self.num_hidden_layers}), got "
                f"insertion_layer={self.insertion_layer!r}"
            )
        sizes = self.recurrence_hidden_sizes
        if not sizes or any(not _is_int(s) or s < 1 for s in sizes):
            raise ValueError(
                f"recurrence_hidden_sizes must be a non-empty list of positive integers, got "
                f"recurrence_hidden_sizes={sizes!r}"
            )
        if self.bptt_windows is not None and (not _is_int(self.bptt_windows) or self.bptt_windows < 1):
            raise ValueError(
                f"bptt_windows must be None (full backpropagation through time) or a positive integer, got "
                f"bptt_windows={self.bptt_windows!r}"
            )
        if self.recurrence_input not in RECURRENCE_INPUTS:
            raise ValueError(
                f"recurrence_input must be one of {RECURRENCE_INPUTS}, got recurrence_input={self.recurrence_input!r}"
            )
        position, limit = self.h_prev_rope_position, self.max_position_embeddings - self.window_size
        if position is not None and (not _is_int(position) or not -limit <= position <= 0):
            # Offsets from a window's queries (positions 0..window_size-1) back to the h_prev key must be ones a
            # causal model was trained on: 0..max_position_embeddings-1.
            raise ValueError(
                f"h_prev_rope_position must be None (unrotated h_prev key) or a position in [-{limit}, 0] "
                f"(max_position_embeddings - window_size = {limit} before the window at most), got "
                f"h_prev_rope_position={position!r}"
            )


__all__ = ["RecurrentLlamaConfig"]
