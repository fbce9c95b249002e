# SPDX-License-Identifier: Apache-2.0
"""Configuration of the recurrent GPT-2 of Yoshida, Ettinger and Gimpel (2020), "Adding Recurrence to Pretrained
Transformers for Improved Efficiency and Context Size"."""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import GPT2Config
from transformers.utils import logging


logger = logging.get_logger(__name__)


AUTO_MAP = {
    "AutoConfig": "configuration_recurrent_gpt2.RecurrentGPT2Config",
    "AutoModel": "modeling_recurrent_gpt2.RecurrentGPT2Model",
    "AutoModelForCausalLM": "modeling_recurrent_gpt2.RecurrentGPT2LMHeadModel",
    "AutoModelForSequenceClassification": "modeling_recurrent_gpt2.RecurrentGPT2ForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_recurrent_gpt2.RecurrentGPT2ForTokenClassification",
}


@strict
class RecurrentGPT2Config(GPT2Config):
    r"""
    Configuration of a [`RecurrentGPT2LMHeadModel`]: every field of [`~transformers.GPT2Config`] (so any GPT-2
    checkpoint's config loads into it) plus the recurrence settings below.

    The input is read in windows of `window_size` tokens, each window repeating the last `window_overlap` tokens of
    the one before. A window's hidden states, weighted across layers and mean-pooled, pass through a small
    feed-forward network to `h_prev`, which the next window sees as one extra key/value at block `insertion_layer`.
    Position ids restart at 0 in every window, so the model reads inputs of any length.

    `max_position_embeddings` is deliberately not an alias of `n_positions` here: `n_positions` is the size of the
    per-window position table, and the model itself has no maximum length.

    Args:
        window_size (`int`, *optional*, defaults to 300):
            Tokens per window (the paper's T). At most `n_positions`. A GPT-2 config converted without one gets
            `min(300, n_positions)`.
        window_overlap (`int`, *optional*, defaults to 0):
            Tokens each window repeats from the previous one (the paper's overlap, §4.2). Must be smaller than
            `window_size`. A model must be evaluated with the overlap it was trained with.
        insertion_layer (`int`, *optional*, defaults to 2):
            0-based index of the block whose self-attention receives `h_prev` as an extra key/value. The paper
            fixes l_ins = 2 for GPT-2 small: low enough that most of the network can use the summary, high
            enough that the window's own tokens already carry some context when they attend to it.
        recurrence_hidden_sizes (`list[int]`, *optional*, defaults to `[200, 200, 200]`):
            Hidden layer widths of the feed-forward network mapping the pooled summary to `h_prev` (paper §5: three
            hidden layers of 200).
        bptt_windows (`int`, *optional*):
            Truncation of backpropagation through time. `None` backpropagates through every window of an input.
            `k` lets gradient flow back through at most `k` earlier windows: the windows after the first are
            grouped into runs of `k + 1` (windows 1..k+1, k+2..2k+2, ...) and gradient crosses window boundaries
            only inside a run.

    Example:

    ```python
    >>> from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel

    >>> config = RecurrentGPT2Config(
    ...     n_layer=2, n_embd=32, n_head=2, n_positions=64, window_size=16, window_overlap=4, insertion_layer=1
    ... )
    >>> model = RecurrentGPT2LMHeadModel(config)
    >>> model.config.window_size
    16

    ```"""

    model_type = "recurrent_gpt2"
    # The config fields this family adds to its base architecture, in the order model cards list them;
    # from_pretrained(..., field=value) applies them before validation, and tools read the list from here.
    family_settings = ("window_size", "window_overlap", "insertion_layer", "recurrence_hidden_sizes", "bptt_windows")
    attribute_map = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }

    window_size: int = 300
    window_overlap: int = 0
    insertion_layer: int = 2
    recurrence_hidden_sizes: list[int] | None = None
    bptt_windows: int | None = None

    def __post_init__(self, **kwargs):
        if self.recurrence_hidden_sizes is None:
            self.recurrence_hidden_sizes = [200, 200, 200]
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)
        self.check_recurrence_settings()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == GPT2Config.model_type:
            # Converting a stock GPT-2 checkpoint is the intended use, not a type mismatch worth a warning.
            logger.info(
                f"Converting the GPT-2 config of {pretrained_model_name_or_path} into a recurrent GPT-2 config"
            )
            config_dict = {**config_dict, "model_type": cls.model_type}
            # It has no window yet: the family's defaults (or from_pretrained's settings) are meant, unlike in a
            # recurrent checkpoint whose config lacks them (see `from_dict`).
            config_dict.setdefault("window_overlap", cls.window_overlap)
            if "n_positions" in config_dict:
                config_dict.setdefault("window_size", min(cls.window_size, config_dict["n_positions"]))
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> "RecurrentGPT2Config":
        # Recurrence settings given to from_pretrained must be in place when the config is validated, not set after:
        # a GPT-2 config plus window_size=... is only valid as a whole.
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
        if "window_size" not in config_dict and "n_positions" in config_dict:
            # A GPT-2 config converted without a window: the paper's 300 tokens, or the whole position table if that
            # is shorter (PEFT and AutoConfig reload a converted model's base config exactly this way).
            config_dict["window_size"] = min(cls.window_size, config_dict["n_positions"])
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
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"window_size must be a positive integer, got window_size={window_size!r}")
        if window_size > self.n_positions:
            raise ValueError(
                f"window_size={window_size} exceeds n_positions={self.n_positions}: a window must fit the position "
                "table"
            )
        if (
            isinstance(window_overlap, bool)
            or not isinstance(window_overlap, int)
            or not 0 <= window_overlap < window_size
        ):
            raise ValueError(
                f"window_overlap must satisfy 0 <= window_overlap < window_size={window_size}, got "
                f"window_overlap={window_overlap!r}"
            )

    def check_model_settings(self) -> None:
        """Raise `ValueError` naming the first invalid field other than the window schedule; checked on every forward,
        since the config may have been changed after the model was built."""
        if not isinstance(self.insertion_layer, int) or not 0 <= self.insertion_layer < self.n_layer:
            raise ValueError(
                f"insertion_layer must be a block index in [0, n_layer={self.n_layer}), got "
                f"insertion_layer={self.insertion_layer!r}"
            )
        sizes = self.recurrence_hidden_sizes
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(
                f"recurrence_hidden_sizes must be a non-empty list of positive integers, got "
                f"recurrence_hidden_sizes={sizes!r}"
            )
        if self.bptt_windows is not None and (
            isinstance(self.bptt_windows, bool) or not isinstance(self.bptt_windows, int) or self.bptt_windows < 1
        ):
            raise ValueError(
                f"bptt_windows must be None (full backpropagation through time) or a positive integer, got "
                f"bptt_windows={self.bptt_windows!r}"
            )
        if self.add_cross_attention:
            raise ValueError("add_cross_attention=True is not supported by the recurrent GPT-2")
        if self.reorder_and_upcast_attn:
            raise ValueError("reorder_and_upcast_attn=True is not supported by the recurrent GPT-2")


__all__ = ["RecurrentGPT2Config"]
