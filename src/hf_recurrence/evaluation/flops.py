"""Analytic forward FLOPs per predicted token of windowed evaluation (the FLOPs/token column of the paper's tables)."""

from transformers import PreTrainedConfig


# Families whose blocks are GPT-2 blocks: attention with 4 d x d projections and a two-matrix MLP.
GPT2_MODEL_TYPES = ("gpt2", "recurrent_gpt2")


def check_schedule(window_size: int, overlap: int) -> None:
    """Raise `ValueError` naming `window_size` or `overlap` unless `0 <= overlap < window_size`, integers."""
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be a positive integer, got window_size={window_size!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < window_size:
        raise ValueError(f"overlap must satisfy 0 <= overlap < window_size={window_size}, got overlap={overlap!r}")


def flops_per_token(config: PreTrainedConfig, window_size: int, overlap: int = 0) -> float:
    """Forward FLOPs per predicted token when reading a long document in windows of `window_size` tokens that repeat
    `overlap` tokens.

    Per position the transformer costs `2·N + 2·n_layer·T·d` (Kaplan et al. 2020's count, the one behind the paper's
    1.75e8 for GPT-2 small at T = 300): `N = n_layer·(4·d² + 2·d·d_inner)` non-embedding weights, two FLOPs per
    multiply-add, plus attention over a context of `T = window_size`. A window of `T` positions predicts only its
    `T - overlap` new tokens, so the recomputation multiplies this by `T / (T - overlap)`.

    A recurrent GPT-2 adds, per position, the layer-weighted pooling (`2·n_layer·d`) and attention to the one extra
    key `h_prev` at the insertion block (`2·d`); per window, the feed-forward network on the summary and the key/value
    projection of `h_prev` (`2·2·d²`), spread over the window's new tokens. That is under 1% of the total for GPT-2
    small. Embeddings, the LM head, biases and layer norms are left out, as in the paper.

    Raises `ValueError` for a model type other than GPT-2's, or for a bad window / overlap.
    """
    if config.model_type not in GPT2_MODEL_TYPES:
        raise ValueError(
            f"No analytic FLOPs count for model_type={config.model_type!r}; supported: {', '.join(GPT2_MODEL_TYPES)}"
        )
    check_schedule(window_size, overlap)
    layers, hidden = config.n_layer, config.n_embd
    inner = config.n_inner if config.n_inner is not None else 4 * hidden
    per_position = 2 * layers * (4 * hidden**2 + 2 * hidden * inner) + 2 * layers * window_size * hidden
    per_window = 0
    if config.model_type == "recurrent_gpt2":
        per_position += 2 * layers * hidden + 2 * hidden
        sizes = [hidden, *config.recurrence_hidden_sizes, hidden]
        per_window += 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True)) + 2 * 2 * hidden**2
    return (per_position * window_size + per_window) / (window_size - overlap)
