# SPDX-License-Identifier: Apache-2.0
"""Configuration of the recurrence of Yoshida, Ettinger and Gimpel (2020), "Adding Recurrence to Pretrained
Transformers for Improved Efficiency and Context Size", over a stock transformers decoder (the backbone)."""

from dataclasses import dataclass
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, GPT2Config, LlamaConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec
from transformers.utils import logging


logger = logging.get_logger(__name__)


AUTO_MAP = {
    "AutoConfig": "configuration_recurrent_decoder.RecurrentDecoderConfig",
    "AutoModel": "modeling_recurrent_decoder.RecurrentDecoderModel",
    "AutoModelForCausalLM": "modeling_recurrent_decoder.RecurrentDecoderForCausalLM",
    "AutoModelForSequenceClassification": "modeling_recurrent_decoder.RecurrentDecoderForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_recurrent_decoder.RecurrentDecoderForTokenClassification",
}


def _named_auto_map(name: str, causal_lm: str) -> dict[str, str]:
    """The auto_map of a named family: the core over one backbone, under the names it had before the core."""
    modeling = "modeling_recurrent_decoder.Recurrent" + name
    return {
        "AutoConfig": f"configuration_recurrent_decoder.Recurrent{name}Config",
        "AutoModel": f"{modeling}Model",
        "AutoModelForCausalLM": f"{modeling}{causal_lm}",
        "AutoModelForSequenceClassification": f"{modeling}ForSequenceClassification",
        "AutoModelForTokenClassification": f"{modeling}ForTokenClassification",
    }


GPT2_AUTO_MAP = _named_auto_map("GPT2", "LMHeadModel")
LLAMA_AUTO_MAP = _named_auto_map("Llama", "ForCausalLM")

# The backbones the recurrence is checked on, by model_type, with the attribute of a decoder layer that norms the
# residual stream before self-attention: `h_prev` enters the insertion layer like a token, through that norm. None:
# the attention reads the residual stream itself (OLMo2 norms after attention).
PRE_ATTENTION_NORMS = {
    "gemma2": "input_layernorm",
    "gemma3_text": "input_layernorm",
    "gpt2": "ln_1",
    "llama": "input_layernorm",
    "mistral": "input_layernorm",
    "olmo2": None,
    "phi3": "input_layernorm",
    "qwen2": "input_layernorm",
    "qwen3": "input_layernorm",
    "smollm3": "input_layernorm",
}
# The layer types whose attention is softmax attention over keys/values, which an extra h_prev key/value extends.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# The settings of a classification head, read from a stock classifier's config.
CLASSIFIER_SETTINGS = ("id2label", "label2id", "problem_type")
# What the recurrence reads: the window's summary (the paper), or zeros (the control: a learned constant h_prev).
RECURRENCE_INPUTS = ("window", "zeros")
# How a window's states are pooled into the memory slots: the paper's mean, or learned queries attending over them.
MEMORY_POOLINGS = ("mean", "attention", "select")
# Which states the memory pools: the paper's softmax-weighted mix of every layer, or the final (normed) layer alone.
MEMORY_SOURCES = ("layer_mix", "last_layer")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refusal(model_type: str, reason: str) -> ValueError:
    supported = ", ".join(sorted(PRE_ATTENTION_NORMS))
    return ValueError(
        f"RecurrentDecoder cannot run over a {model_type!r} backbone: {reason}. It runs over decoder-only "
        f"softmax-attention backbones of these model types: {supported}"
    )


def check_backbone(text_config: PreTrainedConfig) -> None:
    """Raise `ValueError` naming the family and the reason unless the recurrence can run over `text_config`."""
    model_type = text_config.model_type
    layer_types = getattr(text_config, "layer_types", None) or ()
    others = sorted({t for t in layer_types if t not in ATTENTION_LAYER_TYPES})
    if getattr(text_config, "is_encoder_decoder", False):
        raise _refusal(model_type, "it is an encoder-decoder; h_prev extends a decoder's causal self-attention")
    if others:
        raise _refusal(
            model_type,
            f"its layer_types include {others} (hybrid linear attention or state-space layers), which have no "
            "keys/values for h_prev to join",
        )
    if getattr(text_config, "kv_lora_rank", None) is not None:
        raise _refusal(
            model_type,
            "it uses multi-head latent attention, whose compressed key/value cache the window cache cannot hold",
        )
    if getattr(text_config, "add_cross_attention", False):
        raise _refusal(model_type, "add_cross_attention=True adds cross-attention, which has no window to recur over")
    if getattr(text_config, "reorder_and_upcast_attn", False):
        raise _refusal(
            model_type, "reorder_and_upcast_attn=True computes attention outside transformers' attention interface"
        )
    if model_type not in PRE_ATTENTION_NORMS:
        reason = "it is not a causal decoder" if not getattr(text_config, "is_decoder", True) else "it is unchecked"
        raise _refusal(
            model_type,
            f"{reason}; every backbone needs a checked entry (the norm that h_prev passes before attention)",
        )


def _dict_positions(text_config: dict[str, Any]) -> int | None:
    """`position_table_size` of a backbone config not yet built (GPT-2 names it `n_positions`)."""
    return text_config.get("max_position_embeddings", text_config.get("n_positions"))


def position_table_size(text_config: PreTrainedConfig) -> int | None:
    """The positions the backbone was trained on (`max_position_embeddings`), which a window must fit."""
    return getattr(text_config, "max_position_embeddings", None)


def sliding_window_size(text_config: PreTrainedConfig) -> int | None:
    """The backbone's attention window when some of its layers slide, else None."""
    window = getattr(text_config, "sliding_window", None)
    layer_types = getattr(text_config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return window


def rotary_refusal_reason(text_config: PreTrainedConfig, layer: int) -> str | None:
    """Why the attention of decoder layer `layer` of a backbone with `text_config` rotates no keys, or None if it
    does: the `h_prev` key can only be rotated (`h_prev_rope_position`) where the window's keys are."""
    if getattr(text_config, "rope_parameters", None) is None:
        return "it has no rotary position embeddings (its positions are absolute)"
    no_rope_layers = getattr(text_config, "no_rope_layers", None)  # SmolLM3: 0 marks a layer without RoPE (NoPE)
    if no_rope_layers is not None and 0 <= layer < len(no_rope_layers) and not no_rope_layers[layer]:
        return f"its layer {layer} (a layer that reads h_prev) uses no rotary position embedding (a NoPE layer)"
    return None


def check_schedule(window_size: int, window_overlap: int, text_config: PreTrainedConfig | None = None) -> None:
    """Raise `ValueError` naming the value unless `window_size` is a positive integer and `window_overlap` an integer
    in `[0, window_size)`, and, given a recurrent model's backbone config (`text_config`), unless the backbone can run
    such windows: inside its position table and, where its layers slide, inside its sliding window. The one check of
    a window schedule, which the configs and the evaluation reuse."""
    if not _is_int(window_size) or window_size < 1:
        raise ValueError(f"window_size must be a positive integer, got window_size={window_size!r}")
    if text_config is not None:
        positions = position_table_size(text_config)
        if positions is not None and window_size > positions:
            raise ValueError(
                f"window_size={window_size} exceeds the {text_config.model_type!r} backbone's "
                f"max_position_embeddings={positions}: a window's positions must stay inside the range it was "
                "trained on"
            )
        sliding = sliding_window_size(text_config)
        if sliding is not None and window_size > sliding:
            raise _refusal(
                text_config.model_type,
                f"window_size={window_size} is larger than its sliding_window={sliding}, so a window's tokens would "
                f"not all see each other; use window_size <= {sliding}",
            )
    if not _is_int(window_overlap) or not 0 <= window_overlap < window_size:
        raise ValueError(
            f"window_overlap must satisfy 0 <= window_overlap < window_size={window_size}, got "
            f"window_overlap={window_overlap!r}"
        )


@dataclass
class RecurrenceSettings:
    """The recurrence's config fields and their checks, shared by `RecurrentDecoderConfig` (the backbone's config
    nested as `text_config`) and the named families' configs (a stock config's own fields and these, flat). Each
    field is described in `RecurrentDecoderConfig`'s docstring."""

    window_size: int = 300
    window_overlap: int = 0
    insertion_layer: int = 2
    recurrence_hidden_sizes: list[int] | None = None
    bptt_windows: int | None = None
    h_prev_rope_position: int | None = None
    normalize_pooled_states: bool = False
    recurrence_input: str = "window"
    memory_slots: int = 1
    memory_pooling: str = "mean"
    memory_position_bias: bool = False
    memory_source: str = "layer_mix"
    memory_read_layers: list[int] | None = None

    # The config fields the recurrence adds to its backbone; from_pretrained(..., field=value) applies them before
    # validation, and tools read the list from here.
    family_settings = (
        "window_size",
        "window_overlap",
        "insertion_layer",
        "recurrence_hidden_sizes",
        "bptt_windows",
        "h_prev_rope_position",
        "normalize_pooled_states",
        "recurrence_input",
        "memory_slots",
        "memory_pooling",
        "memory_position_bias",
        "memory_source",
        "memory_read_layers",
    )

    def _set_default_hidden_sizes(self) -> None:
        if self.recurrence_hidden_sizes is None:
            self.recurrence_hidden_sizes = [200, 200, 200]

    @classmethod
    def _with_family_settings(cls, config_dict: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """`config_dict` with the recurrence settings given to from_pretrained moved in from `kwargs` (in place):
        they must be there when the config is validated, not set after."""
        config_dict = dict(config_dict)
        for name in cls.family_settings:
            if name in kwargs:
                config_dict[name] = kwargs.pop(name)
        return config_dict

    @classmethod
    def _with_default_window(
        cls, config_dict: dict[str, Any], positions: int | None, converting: bool = False
    ) -> dict[str, Any]:
        """`config_dict` (a copy) with the default window where it names none: the paper's 300 tokens, or the whole
        position table (`positions`) if that is shorter, and no overlap. `converting` a stock checkpoint, that is
        intended; every recurrent checkpoint saved by this package records its window, so one that does not was edited
        or written elsewhere and the defaults may not be what it was trained with: that warns."""
        config_dict = dict(config_dict)
        missing = [name for name in ("window_size", "window_overlap") if name not in config_dict]
        if converting:
            config_dict.setdefault("window_overlap", cls.window_overlap)
        elif missing and config_dict.get("model_type") == cls.model_type:
            logger.warning(
                f"This {cls.model_type} config has no {' or '.join(missing)}: running with the defaults "
                f"(window_size={cls.window_size} or the position table if shorter, window_overlap="
                f"{cls.window_overlap}). Set them in config.json to the values the model was trained with"
            )
        if positions is not None:
            # PEFT and AutoConfig reload a converted model's base config through `from_dict` without a window too.
            config_dict.setdefault("window_size", min(cls.window_size, positions))
        return config_dict

    def validate_recurrence_settings(self):
        """Part of `@strict` validation, so a config changed after construction is checked again when saved."""
        self.check_recurrence_settings()

    def check_recurrence_settings(self) -> None:
        """Raise `ValueError` naming the first invalid recurrence field and its value."""
        self.check_window_schedule(self.window_size, self.window_overlap)
        self.check_model_settings()

    def check_window_schedule(self, window_size: int, window_overlap: int) -> None:
        """Raise `ValueError` unless `window_size` and `window_overlap` form a schedule the backbone can run; checked
        for the config's own schedule and for every state a forward runs (a state may carry another)."""
        check_schedule(window_size, window_overlap, self.text_config)
        if self.memory_position_bias and window_size > self.window_size:
            raise ValueError(
                f"window_size={window_size} is larger than the config's window_size={self.window_size}, which sizes "
                "the memory's learned bias over window positions (memory_position_bias=True)"
            )

    def check_model_settings(self) -> None:
        """Raise `ValueError` naming the first invalid field other than the window schedule; checked on every forward,
        since the config may have been changed after the model was built."""
        layers = self.text_config.num_hidden_layers
        if not _is_int(self.insertion_layer) or not 0 <= self.insertion_layer < layers:
            raise ValueError(
                f"insertion_layer must be a layer index in [0, num_hidden_layers={layers}), got "
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
        self.check_memory_settings()
        self.check_h_prev_rope_position()

    @property
    def read_layers(self) -> list[int]:
        """The layers whose attention reads the memory slots: `memory_read_layers`, or the insertion layer alone."""
        return [self.insertion_layer] if self.memory_read_layers is None else list(self.memory_read_layers)

    @property
    def pools_by_softmax(self) -> bool:
        """Whether the slots pool the window with softmax weights (learned queries or position biases), one pooled
        state per slot; otherwise every slot reads the one plain mean."""
        return self.memory_pooling == "attention" or self.memory_position_bias

    @property
    def selects_tokens(self) -> bool:
        """Whether each slot holds one token of the window, chosen by a learned score (`memory_pooling="select"`)."""
        return self.memory_pooling == "select"

    def check_memory_settings(self) -> None:
        """Raise `ValueError` naming the first invalid memory field (slots, pooling, source, read layers)."""
        slots = self.memory_slots
        if not _is_int(slots) or slots < 1:
            raise ValueError(f"memory_slots must be a positive integer, got memory_slots={slots!r}")
        if self.memory_pooling not in MEMORY_POOLINGS:
            raise ValueError(
                f"memory_pooling must be one of {MEMORY_POOLINGS}, got memory_pooling={self.memory_pooling!r}"
            )
        if self.memory_pooling == "attention" and slots > self.window_size:
            raise ValueError(
                f"memory_pooling='attention' with memory_slots={slots} > window_size={self.window_size}: more "
                "queries than a window has tokens to attend to"
            )
        if self.selects_tokens and slots > self.window_size:
            raise ValueError(
                f"memory_pooling='select' with memory_slots={slots} > window_size={self.window_size}: more slots "
                "than a window has tokens to keep"
            )
        if self.selects_tokens and self.memory_position_bias:
            raise ValueError(
                "memory_pooling='select' with memory_position_bias=True: a selecting memory scores tokens, not "
                "slots, so it has no per-slot bias over positions; set memory_position_bias=False"
            )
        if self.memory_source not in MEMORY_SOURCES:
            raise ValueError(
                f"memory_source must be one of {MEMORY_SOURCES}, got memory_source={self.memory_source!r}"
            )
        read = self.memory_read_layers
        layers = self.text_config.num_hidden_layers
        if read is not None and (
            not isinstance(read, list | tuple)
            or not read
            or any(not _is_int(i) or not 0 <= i < layers for i in read)
            or len(set(read)) != len(read)
        ):
            raise ValueError(
                f"memory_read_layers must be None (the insertion layer) or a non-empty list of distinct layer indices "
                f"in [0, num_hidden_layers={layers}), got memory_read_layers={read!r}"
            )

    def check_h_prev_rope_position(self) -> None:
        """Raise `ValueError` naming the value unless `h_prev_rope_position` is None or a position the backbone's
        insertion layer can rotate the `h_prev` key to."""
        position = self.h_prev_rope_position
        if position is None:
            return
        positions = position_table_size(self.text_config)
        limit = positions - self.window_size if positions is not None else None
        # Slot i sits at `position - i`: the last slot must stay inside the range too.
        lowest = position - self.memory_slots + 1 if _is_int(position) else position
        if not _is_int(position) or position > 0 or (limit is not None and lowest < -limit):
            # Offsets from a window's queries (positions 0..window_size-1) back to the h_prev key must be ones a
            # causal model was trained on: 0..max_position_embeddings-1.
            allowed = (
                f"[-{limit}, 0] (max_position_embeddings - window_size = {limit})" if limit is not None else "<= 0"
            )
            slots = (
                f" with memory_slots={self.memory_slots} (slot i at h_prev_rope_position - i)"
                if self.memory_slots > 1
                else ""
            )
            raise ValueError(
                f"h_prev_rope_position must be None (unrotated h_prev key) or a window position in {allowed}{slots}, "
                f"got h_prev_rope_position={position!r}"
            )
        for layer in self.read_layers:
            reason = rotary_refusal_reason(self.text_config, layer)
            if reason is not None:
                raise ValueError(
                    f"h_prev_rope_position={position} cannot be used over a {self.text_config.model_type!r} backbone: "
                    f"{reason}, so there is no rotation to give the h_prev key; leave h_prev_rope_position=None"
                )


def _backbone_setting(name: str) -> property:
    """A field of the backbone's config, read and written through `RecurrentDecoderConfig` (never saved there)."""

    def get(self: "RecurrentDecoderConfig") -> Any:
        return getattr(self.text_config, name)

    def set(self: "RecurrentDecoderConfig", value: Any) -> None:
        setattr(self.text_config, name, value)

    return property(get, set, doc=f"The backbone's `{name}` (`text_config.{name}`).")


@strict
class RecurrentDecoderConfig(RecurrenceSettings, PreTrainedConfig):
    r"""
    Configuration of the recurrence core's models ([`RecurrentDecoderModel`], [`RecurrentDecoderForCausalLM`] and the
    sequence and token classification heads): a stock transformers decoder's config (`text_config`) plus the
    recurrence settings below. Loaded from a stock checkpoint, its config becomes `text_config`, and a stock
    classifier's labels (`id2label`, `label2id`, `problem_type`) stay with the head.

    The input is read in windows of `window_size` tokens, each window repeating the last `window_overlap` tokens of
    the one before. A window's hidden states, weighted across layers and mean-pooled, pass through a small
    feed-forward network to `h_prev`, which the next window sees as one extra key/value at layer `insertion_layer`
    (the paper); the `memory_*` settings make it several slots, pooled by learned queries, read at several layers.
    Positions restart at 0 in every window, so the model reads inputs of any length.

    Args:
        text_config (`dict` or `PreTrainedConfig`, *optional*):
            The backbone's config, of one of the model types in `PRE_ATTENTION_NORMS` (defaults to a Llama config).
            A backbone that cannot carry the recurrence (encoder-decoder, bidirectional, hybrid linear attention,
            multi-head latent attention, an unchecked family) is refused with the reason.
        window_size (`int`, *optional*, defaults to 300):
            Tokens per window (the paper's T). At most the backbone's `max_position_embeddings` and, where its layers
            slide, its `sliding_window`. A stock config converted without one gets `min(300, max_position_embeddings)`.
        window_overlap (`int`, *optional*, defaults to 0):
            Tokens each window repeats from the previous one (paper §4.2); smaller than `window_size`.
        insertion_layer (`int`, *optional*, defaults to 2):
            0-based index of the decoder layer whose self-attention receives `h_prev` as an extra key/value (the
            paper's l_ins = 2).
        recurrence_hidden_sizes (`list[int]`, *optional*, defaults to `[200, 200, 200]`):
            Hidden layer widths of the feed-forward network mapping the pooled summary to `h_prev` (paper §5). Its
            activation is the backbone's.
        bptt_windows (`int`, *optional*):
            Truncation of backpropagation through time. `None` backpropagates through every window of an input; `k`
            lets gradient cross window boundaries only inside runs of `k + 1` windows.
        h_prev_rope_position (`int`, *optional*):
            RoPE policy of the `h_prev` key, as the recurrent Llama's. `None` (default) leaves it unrotated, so its
            attention score depends only on the query's content and position. An integer `p <= 0` rotates it, with
            the backbone's own rotary embedding of the insertion layer, as a token at window position `p` (`-1`: just
            before the window's first token); at most `max_position_embeddings - window_size` before the window. Only
            for backbones whose insertion layer is rotary (not GPT-2, not a SmolLM3 NoPE layer).
        normalize_pooled_states (`bool`, *optional*, defaults to `False`):
            Scale every layer's token states to unit RMS before the layer-weighted mean (decoders with attention-sink
            activations otherwise make the plain mean mostly a constant).
        recurrence_input (`str`, *optional*, defaults to `"window"`):
            `"window"`: `h_prev` comes from the previous window's summary (the paper). `"zeros"`: the network reads
            zeros, so `h_prev` is a learned constant (the control arm; `memory_slots` learned constants).
        memory_slots (`int`, *optional*, defaults to 1):
            The memory's slots k, beyond the paper's one vector: `h_prev` becomes `(batch, k, hidden)`, k extra
            keys/values at every reading layer. With k > 1 a learned slot embedding is added to each slot's pooled
            state before the feed-forward network (which runs on every slot), so the slots differ from the start.
        memory_pooling (`str`, *optional*, defaults to `"mean"`):
            How each slot pools its window: `"mean"` (the paper) or `"attention"`, a learned query per slot attending
            over the window's states (zero at first, so a slot starts as the mean). At most `window_size` slots.
            `"select"`: each slot holds one token's states; every token is scored against one learned query (zero at
            first, so every score ties and the latest tokens are kept), and the k best-scoring tokens of the window
            fill the slots in window order (equal scores: the later token). The choice itself has no gradient; the
            scores learn straight through a softmax over all the window's tokens, whose weighted states are added to
            every slot and subtracted again detached (zero in the forward). A learned query pools the same content
            in every row; a selection keeps pair i of a row in a slot of its own, which binding needs (MEMORY.md).
        memory_position_bias (`bool`, *optional*, defaults to `False`):
            Add a learned bias per slot and window position to the pooling scores (zero at first), so that a slot can
            learn to read, e.g., the last tokens of its window. Sized by `window_size`.
        memory_source (`str`, *optional*, defaults to `"layer_mix"`):
            What the memory pools: `"layer_mix"` (the paper's softmax-weighted mix of every layer's output) or
            `"last_layer"` (the final, normed layer only, as RMT and AutoCompressors read their memory).
        memory_read_layers (`list[int]`, *optional*):
            The decoder layers whose attention reads the slots as extra keys/values, each through that layer's own
            pre-attention norm and key/value projections. `None` (default): `[insertion_layer]`, the paper's one
            layer. With `h_prev_rope_position`, slot i is rotated to position `h_prev_rope_position - i` at each.

    The defaults are the paper's model exactly: a checkpoint or state file saved before these settings existed
    loads and computes as it did.

    Example:

    ```python
    >>> from transformers import Qwen2Config
    >>> from hf_recurrence import RecurrentDecoderConfig

    >>> backbone = Qwen2Config(
    ...     vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    ...     num_key_value_heads=2, max_position_embeddings=64,
    ... )
    >>> config = RecurrentDecoderConfig(text_config=backbone, window_size=16, insertion_layer=1)
    >>> config.text_config.model_type
    'qwen2'

    ```"""

    model_type = "recurrent_decoder"
    # Trainer leaves these output keys out of the predictions it gathers: the state is not a tensor to concatenate
    # across batches (`cache` is its name from transformers 5.24 on).
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="llama")}
    text_config: dict | PreTrainedConfig | None = None
    tie_word_embeddings: bool = True

    # The backbone's settings that a tokenizer dictates and code sets on a stock model's top-level config
    # (`config.pad_token_id = tokenizer.pad_token_id`): here they are the backbone's, which its embeddings, logits and
    # the classification head's padding read, so given or set at the top level they reach `text_config`.
    vocab_size = _backbone_setting("vocab_size")
    pad_token_id = _backbone_setting("pad_token_id")
    bos_token_id = _backbone_setting("bos_token_id")
    eos_token_id = _backbone_setting("eos_token_id")

    def __post_init__(self, **kwargs):
        self._set_default_hidden_sizes()
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        labels_given = self.id2label is not None or kwargs.get("num_labels") is not None
        super().__post_init__(**kwargs)
        if not labels_given:
            # A head's labels are the backbone config's unless given here, as a stock classifier's config holds them.
            self.id2label, self.label2id = self.text_config.id2label, self.text_config.label2id
        if self.problem_type is None:
            self.problem_type = self.text_config.problem_type
        # Ties are the backbone's: its own config decides them when it is built.
        self.tie_word_embeddings = self.text_config.tie_word_embeddings
        check_backbone(self.text_config)
        self.check_recurrence_settings()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") != cls.model_type:
            # A stock decoder's checkpoint: converting it is the intended use, its config becomes the backbone's.
            logger.info(
                f"Using the {config_dict.get('model_type')!r} config of {pretrained_model_name_or_path} as backbone"
            )
            # The labels of a stock classifier's checkpoint are the head's, so they stay at the top level.
            labels = {name: config_dict[name] for name in CLASSIFIER_SETTINGS if name in config_dict}
            wrapped = {"model_type": cls.model_type, "text_config": config_dict, **labels}
            config_dict = cls._with_default_window(wrapped, _dict_positions(config_dict), converting=True)
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> "RecurrentDecoderConfig":
        config_dict = cls._with_family_settings(config_dict, kwargs)
        text = config_dict.get("text_config")
        config_dict = cls._with_default_window(config_dict, _dict_positions(text) if isinstance(text, dict) else None)
        if config_dict.get("model_type") == cls.model_type and "id2label" not in config_dict:
            # transformers saves no `id2label` for the default two labels: a saved head has two, whatever the
            # backbone's config says (`__post_init__` takes those only when the labels are not given).
            config_dict.setdefault("num_labels", 2)
        return super().from_dict(config_dict, **kwargs)


# Where a named family's config keeps the stock config made from its fields; not a field, so never saved.
_STOCK_CONFIG_KEY = "_stock_text_config"


class NamedFamilyConfig(RecurrenceSettings):
    """A named family's config: the fields of its backbone's stock config (`stock_config_class`) and the recurrence's
    side by side, as `RecurrentGPT2Config` and `RecurrentLlamaConfig` checkpoints have always been saved, so every
    such checkpoint and every stock checkpoint of the backbone loads into it. `text_config` is the stock config made
    from those fields, which the backbone is built from."""

    stock_config_class: type[PreTrainedConfig]
    # The field holding the size of the backbone's position table, which bounds the default window.
    position_table_field: str

    @property
    def text_config(self) -> PreTrainedConfig:
        stock = self.__dict__.get(_STOCK_CONFIG_KEY)
        if stock is None:
            names = self.stock_config_class.__dataclass_fields__
            fields = {k: v for k, v in self.__dict__.items() if k in names and k != "model_type"}
            stock = self.stock_config_class(**fields)
            # The attention asked for is the backbone's too, as a composite config's setter passes it to text_config.
            stock._attn_implementation_internal = self._attn_implementation_internal
            self.__dict__[_STOCK_CONFIG_KEY] = stock
        return stock

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """The config itself, as for its stock config: it is flat, its own fields are the text model's. `text_config`
        is a copy made from them, which any change to the config replaces; a change made to that copy (transformers
        makes them to `get_text_config()`: rope_parameters, vocab_size when resizing embeddings, ...) would be lost
        at the next one and never saved."""
        return self

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, value)
        # Any field may be one of the stock config's: it is made again when next asked for.
        self.__dict__.pop(_STOCK_CONFIG_KEY, None)

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.pop(_STOCK_CONFIG_KEY, None)
        return output

    def _finish_post_init(self, auto_map: dict[str, str], kwargs: dict[str, Any]) -> None:
        self._set_default_hidden_sizes()
        # Always this code's map: a checkpoint saved before the core names modules that no longer exist.
        kwargs["auto_map"] = dict(auto_map)
        super().__post_init__(**kwargs)
        check_backbone(self.text_config)
        self.check_recurrence_settings()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") == cls.stock_config_class.model_type:
            # Converting a stock checkpoint is the intended use, not a type mismatch worth a warning.
            logger.info(f"Converting the {config_dict['model_type']!r} config of {pretrained_model_name_or_path}")
            # It has no window yet: the family's defaults (or from_pretrained's settings) are meant.
            config_dict = cls._with_default_window(
                {**config_dict, "model_type": cls.model_type},
                config_dict.get(cls.position_table_field),
                converting=True,
            )
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> PreTrainedConfig:
        config_dict = cls._with_family_settings(config_dict, kwargs)
        config_dict = cls._with_default_window(config_dict, config_dict.get(cls.position_table_field))
        return super().from_dict(config_dict, **kwargs)


@strict
class RecurrentGPT2Config(NamedFamilyConfig, GPT2Config):
    r"""
    Configuration of a [`RecurrentGPT2LMHeadModel`]: every field of [`~transformers.GPT2Config`] (so any GPT-2
    checkpoint's config loads into it) plus the recurrence settings of [`RecurrentDecoderConfig`], side by side.

    `max_position_embeddings` is deliberately not an alias of `n_positions` here: `n_positions` is the size of the
    per-window position table (at least `window_size`), and the model itself has no maximum length.

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
    stock_config_class = GPT2Config
    position_table_field = "n_positions"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }

    def __post_init__(self, **kwargs):
        self._finish_post_init(GPT2_AUTO_MAP, kwargs)


@strict
class RecurrentLlamaConfig(NamedFamilyConfig, LlamaConfig):
    r"""
    Configuration of a [`RecurrentLlamaForCausalLM`]: every field of [`~transformers.LlamaConfig`] (so any Llama
    checkpoint's config loads into it) plus the recurrence settings of [`RecurrentDecoderConfig`], side by side.
    A window's RoPE positions restart at 0, so `window_size` is at most `max_position_embeddings`.

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
    stock_config_class = LlamaConfig
    position_table_field = "max_position_embeddings"

    def __post_init__(self, **kwargs):
        self._finish_post_init(LLAMA_AUTO_MAP, kwargs)


__all__ = ["RecurrentDecoderConfig", "RecurrentGPT2Config", "RecurrentLlamaConfig"]
