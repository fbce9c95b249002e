"""Analytic forward FLOPs per predicted token of windowed evaluation (the FLOPs/token column of the paper's tables)."""

from transformers import PreTrainedConfig

from ..families import model_types_reading
from ..models.recurrent_decoder.configuration_recurrent_decoder import (
    PRE_ATTENTION_NORMS,
    check_schedule,
    sliding_window_size,
)


# Model types that read a long input in their own windows and carry a state across them: the recurrence core over a
# stock decoder (its `text_config`), and its named families.
RECURRENT_MODEL_TYPES = model_types_reading("windows")
# The decoders counted: every backbone the recurrence core runs over (its table of backbones), stock or as a recurrent
# model's backbone. Their blocks are GPT-2 blocks (attention with 4 d x d projections, a two-matrix MLP) or Llama-shaped
# ones (grouped-query attention: q and o d x heads*head_dim, k and v d x kv heads*head_dim, fused or not; a gated MLP of
# three matrices, fused or not), told apart by the config (`_is_gpt2_block`). Extra norms (Gemma's, OLMo2's) are left
# out like every norm; layers that attend within a sliding window are counted by `_attended_keys`.
FLOPS_MODEL_TYPES = tuple(PRE_ATTENTION_NORMS)


def _is_gpt2_block(config: PreTrainedConfig) -> bool:
    """Whether the decoder's blocks are GPT-2's: an ungated MLP sized by `n_inner`, not a gated one by
    `intermediate_size`."""
    return getattr(config, "intermediate_size", None) is None


def _block_shape(config: PreTrainedConfig) -> tuple[int, int, int, int]:
    """(layers, hidden size d, weights per block, attention width) of a GPT-2- or Llama-shaped decoder; the attention
    width is what each query dots with each key (query heads x head dim), d for GPT-2 and for most Llamas."""
    if _is_gpt2_block(config):
        hidden = config.n_embd
        inner = config.n_inner if config.n_inner is not None else 4 * hidden
        return config.n_layer, hidden, 4 * hidden**2 + 2 * hidden * inner, hidden
    hidden, query = config.hidden_size, config.num_attention_heads * _head_dim(config)
    # q, o: d x (heads x head dim), which Gemma 3 makes wider than d; k, v: d x (key-value heads x head dim).
    attention = 2 * hidden * query + 2 * hidden * _key_value_width(config)
    return config.num_hidden_layers, hidden, attention + 3 * hidden * config.intermediate_size, query  # gate, up, down


def _head_dim(config: PreTrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _key_value_width(config: PreTrainedConfig) -> int:
    """Width of a Llama block's key (and value) projection: key-value heads x head dimension."""
    return config.num_key_value_heads * _head_dim(config)


def _attended_keys(config: PreTrainedConfig, window_size: int) -> int:
    """Keys attended per position, summed over the layers: the window on a full-attention layer, at most
    `sliding_window` on a sliding-window one (Gemma 2 and 3: some layers; Mistral with a sliding window: every one)."""
    layers = _block_shape(config)[0]
    sliding = sliding_window_size(config)
    every = "sliding_attention" if sliding is not None else "full_attention"
    types = getattr(config, "layer_types", None) or [every] * layers
    return sum(min(window_size, sliding) if kind == "sliding_attention" and sliding else window_size for kind in types)


def _counted_backbone(config: PreTrainedConfig) -> PreTrainedConfig:
    """The config whose blocks are counted: a recurrent model's backbone, else the model's own."""
    return config.text_config if config.model_type in RECURRENT_MODEL_TYPES else config


def has_flops_count(config: PreTrainedConfig) -> bool:
    """Whether `flops_per_token` has a count for this model."""
    return _counted_backbone(config).model_type in FLOPS_MODEL_TYPES


def flops_per_token(config: PreTrainedConfig, window_size: int, overlap: int = 0) -> float:
    """Forward FLOPs per predicted token when reading a long document in windows of `window_size` tokens that repeat
    `overlap` tokens.

    Per position the transformer costs `2·N + 2·n_layer·T·d_attn` (Kaplan et al. 2020's count, the one behind the
    paper's 1.75e8 for GPT-2 small at T = 300): `N` non-embedding weights (GPT-2: `n_layer·(4·d² + 2·d·d_inner)`;
    the Llama-shaped backbones (every other one the recurrence runs over): `n_layer·(2·d·d_attn + 2·d·d_kv +
    3·d·d_inner)` with query/output width `d_attn` = heads x head dim, grouped-query k/v of width `d_kv` and the gated
    MLP's three matrices), two FLOPs per multiply-add, plus attention over a context of `T = window_size`
    (`min(T, sliding_window)` on sliding-window layers). A
    window of `T` positions predicts only its `T - overlap` new tokens, so the recomputation multiplies this by
    `T / (T - overlap)`.

    A recurrent model adds, per position, the layer-weighted pooling (`2·n_layer·d`; `2·d` pooling the last layer
    alone) and attention to the extra keys of `h_prev`, its `k = memory_slots` slots at each of its `R` reading layers
    (`2·k·R·d_attn`; the paper: one key at the insertion block), plus `4·k·d` for softmax pooling (each slot's score
    and weighted sum); per window, the feed-forward network on each slot and the slots' key/value projections
    (`k·R·2·2·d·d_kv`), spread over the window's new tokens. At the paper's settings that is under 1% of the total
    for GPT-2 small and SmolLM2-135M. Embeddings, the LM head, biases and norms are left out, as in the paper.

    Raises `ValueError` for a model (or a recurrent model's backbone) type with no count here, or for a bad window /
    overlap.
    """
    backbone = _counted_backbone(config)
    if not has_flops_count(config):
        raise ValueError(
            f"No analytic FLOPs count for model_type={backbone.model_type!r}; supported: "
            f"{', '.join(FLOPS_MODEL_TYPES)} and recurrent models over them"
        )
    check_schedule(window_size, overlap)
    layers, hidden, block_weights, attention_width = _block_shape(backbone)
    per_position = 2 * layers * block_weights + 2 * _attended_keys(backbone, window_size) * attention_width
    per_window = 0
    if backbone is not config:  # recurrent
        key_value = hidden if _is_gpt2_block(backbone) else _key_value_width(backbone)
        slots, reads = config.memory_slots, len(config.read_layers)
        pooled_layers = 1 if config.memory_source == "last_layer" else layers
        per_position += 2 * pooled_layers * hidden + 2 * slots * reads * attention_width
        if config.pools_by_softmax:
            per_position += 4 * slots * hidden
        if config.selects_tokens:
            # A token's score and its share of the softmax-weighted sum that teaches the scores.
            per_position += 4 * hidden
        sizes = [hidden, *config.recurrence_hidden_sizes, hidden]
        network = 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        per_window += slots * (network + reads * 2 * 2 * hidden * key_value)
    return (per_position * window_size + per_window) / (window_size - overlap)
