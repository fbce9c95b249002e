"""Analytic forward FLOPs per predicted token of windowed evaluation (the FLOPs/token column of the paper's tables)."""

from transformers import PreTrainedConfig


# Model types that read a long input in their own windows and carry a state across them: the recurrence core over a
# stock decoder (its `text_config`), and its named families.
RECURRENT_MODEL_TYPES = ("recurrent_decoder", "recurrent_gpt2", "recurrent_llama")
# Backbones whose blocks are GPT-2 blocks: attention with 4 d x d projections and a two-matrix MLP.
GPT2_MODEL_TYPES = ("gpt2",)
# Backbones whose blocks are Llama blocks: grouped-query attention (q and o d x d, k and v d x kv) and a SwiGLU MLP.
LLAMA_MODEL_TYPES = ("llama",)
FLOPS_MODEL_TYPES = GPT2_MODEL_TYPES + LLAMA_MODEL_TYPES


def check_schedule(window_size: int, overlap: int) -> None:
    """Raise `ValueError` naming `window_size` or `overlap` unless `0 <= overlap < window_size`, integers."""
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be a positive integer, got window_size={window_size!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < window_size:
        raise ValueError(f"overlap must satisfy 0 <= overlap < window_size={window_size}, got overlap={overlap!r}")


def _block_shape(config: PreTrainedConfig) -> tuple[int, int, int]:
    """(layers, hidden size d, weights per block) of a GPT-2- or Llama-shaped decoder."""
    if config.model_type in GPT2_MODEL_TYPES:
        hidden = config.n_embd
        inner = config.n_inner if config.n_inner is not None else 4 * hidden
        return config.n_layer, hidden, 4 * hidden**2 + 2 * hidden * inner
    hidden = config.hidden_size
    attention = 2 * hidden**2 + 2 * hidden * _key_value_width(config)  # q, o: d x d; k, v: d x (kv heads x head dim)
    return config.num_hidden_layers, hidden, attention + 3 * hidden * config.intermediate_size  # gate, up, down


def _key_value_width(config: PreTrainedConfig) -> int:
    """Width of a Llama block's key (and value) projection: key-value heads x head dimension."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_key_value_heads * head_dim


def _counted_backbone(config: PreTrainedConfig) -> PreTrainedConfig:
    """The config whose blocks are counted: a recurrent model's backbone, else the model's own."""
    return config.text_config if config.model_type in RECURRENT_MODEL_TYPES else config


def has_flops_count(config: PreTrainedConfig) -> bool:
    """Whether `flops_per_token` has a count for this model."""
    return _counted_backbone(config).model_type in FLOPS_MODEL_TYPES


def flops_per_token(config: PreTrainedConfig, window_size: int, overlap: int = 0) -> float:
    """Forward FLOPs per predicted token when reading a long document in windows of `window_size` tokens that repeat
    `overlap` tokens.

    Per position the transformer costs `2·N + 2·n_layer·T·d` (Kaplan et al. 2020's count, the one behind the paper's
    1.75e8 for GPT-2 small at T = 300): `N` non-embedding weights (GPT-2: `n_layer·(4·d² + 2·d·d_inner)`; Llama:
    `n_layer·(2·d² + 2·d·d_kv + 3·d·d_inner)` with grouped-query k/v of width `d_kv` and the SwiGLU MLP's three
    matrices), two FLOPs per multiply-add, plus attention over a context of `T = window_size`. A window of `T`
    positions predicts only its `T - overlap` new tokens, so the recomputation multiplies this by `T / (T - overlap)`.

    A recurrent model adds, per position, the layer-weighted pooling (`2·n_layer·d`) and attention to the one extra
    key `h_prev` at the insertion block (`2·d`); per window, the feed-forward network on the summary and the key/value
    projection of `h_prev` (`2·2·d·d_kv`), spread over the window's new tokens. That is under 1% of the total for GPT-2
    small and SmolLM2-135M. Embeddings, the LM head, biases and norms are left out, as in the paper.

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
    layers, hidden, block_weights = _block_shape(backbone)
    per_position = 2 * layers * block_weights + 2 * layers * window_size * hidden
    per_window = 0
    if backbone is not config:  # recurrent
        key_value = hidden if backbone.model_type in GPT2_MODEL_TYPES else _key_value_width(backbone)
        per_position += 2 * layers * hidden + 2 * hidden
        sizes = [hidden, *config.recurrence_hidden_sizes, hidden]
        per_window += 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True)) + 2 * 2 * hidden * key_value
    return (per_position * window_size + per_window) / (window_size - overlap)
