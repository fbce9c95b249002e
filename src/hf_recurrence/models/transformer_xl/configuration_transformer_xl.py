# SPDX-License-Identifier: Apache-2.0
"""Configuration of Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context")."""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig


AUTO_MAP = {
    "AutoConfig": "configuration_transformer_xl.TransformerXLConfig",
    "AutoModel": "modeling_transformer_xl.TransformerXLModel",
    "AutoModelForCausalLM": "modeling_transformer_xl.TransformerXLLMHeadModel",
}


@strict
class TransformerXLConfig(PreTrainedConfig):
    r"""
    Configuration of a [`TransformerXLModel`] / [`TransformerXLLMHeadModel`].

    The input is read in segments of `segment_length` tokens. Every layer of a segment attends to its own causal
    context and to a memory: the hidden states that entered the same layer at the last `mem_len` earlier positions,
    kept without gradient. Positions are relative (sinusoidal distances with the learned biases u and v of the
    paper's §3.3), so the model has no maximum length; deliberately there is no `max_position_embeddings`.

    The output layer is a plain softmax tied to the input embeddings unless `cutoffs` is set: then the input is
    the adaptive input embedding and the output the adaptive softmax of transformers 4.x's TransfoXL (what its
    checkpoints, e.g. transfo-xl-wt103, need; see `hf_recurrence.transfo_xl_conversion`).

    Args:
        vocab_size (`int`, *optional*, defaults to 32000):
            Size of the vocabulary.
        d_model (`int`, *optional*, defaults to 410):
            Width of the hidden states (`hidden_size`).
        n_head (`int`, *optional*, defaults to 10):
            Attention heads per layer (`num_attention_heads`).
        d_head (`int`, *optional*, defaults to 41):
            Width of one attention head (`head_dim`); `n_head * d_head` need not equal `d_model`.
        d_inner (`int`, *optional*, defaults to 2100):
            Hidden width of the position-wise feed-forward network (`intermediate_size`).
        n_layer (`int`, *optional*, defaults to 16):
            Number of layers (`num_hidden_layers`).
        segment_length (`int`, *optional*, defaults to 150):
            Tokens per segment (the paper's L). A longer input is processed segment by segment inside `forward`.
        mem_len (`int`, *optional*, defaults to 150):
            Positions of memory per layer (the paper's M). 0 disables the recurrence. May differ from the value
            used in training: the paper evaluates with longer memories than it trains with.
        clamp_len (`int`, *optional*):
            Relative distances larger than this use the encoding of `clamp_len`. `None` never clamps.
        same_length (`bool`, *optional*, defaults to `False`):
            If `True`, every query attends to at most `mem_len` positions, itself included (as the original code
            counts them), so every position of a segment sees a context of the same length once the memory is full.
        dropout (`float`, *optional*, defaults to 0.1):
            Dropout on embeddings, position encodings, the attention output and the feed-forward network.
        dropatt (`float`, *optional*, defaults to 0.0):
            Dropout on the attention probabilities.
        pre_lnorm (`bool`, *optional*, defaults to `False`):
            Layer norm before each sub-layer (and once after the last layer) instead of after the residual sum.
        untie_r (`bool`, *optional*, defaults to `True`):
            If `True`, every layer has its own position biases u and v; if `False`, all layers share one pair.
        layer_norm_epsilon (`float`, *optional*, defaults to 1e-5):
            Epsilon of the layer norms.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the normal weight initialisation.
        cutoffs (`list[int]`, *optional*):
            Adaptive input and softmax: token ids below `cutoffs[0]` form the frequent head of the vocabulary, the
            ranges between consecutive cutoffs the tail clusters. `None`: one plain embedding and softmax.
        div_val (`int`, *optional*, defaults to 1):
            With `cutoffs`: cluster `i` embeds in `d_embed // div_val**i` dimensions (1: every token in `d_embed`).
        d_embed (`int`, *optional*):
            With `cutoffs`: width of the head cluster's embeddings, projected to `d_model` (default: `d_model`).
        tie_projs (`list[bool]`, *optional*):
            With `cutoffs`: per cluster, whether the output projection is the input projection (default: none).

    Example:

    ```python
    >>> from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel

    >>> config = TransformerXLConfig(vocab_size=100, d_model=32, n_head=2, d_head=16, d_inner=64, n_layer=2,
    ...     segment_length=8, mem_len=8)
    >>> model = TransformerXLLMHeadModel(config)
    >>> model.config.hidden_size
    32

    ```"""

    model_type = "transformer_xl"
    # The segment-recurrence settings, in the order model cards list them.
    family_settings = ("segment_length", "mem_len", "clamp_len", "same_length")
    # Trainer leaves the state out of evaluation outputs; transformers 5.24 calls it cache.
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "intermediate_size": "d_inner",
        "head_dim": "d_head",
    }

    vocab_size: int = 32000
    d_model: int = 410
    n_head: int = 10
    d_head: int = 41
    d_inner: int = 2100
    n_layer: int = 16
    segment_length: int = 150
    mem_len: int = 150
    clamp_len: int | None = None
    same_length: bool = False
    dropout: float | int = 0.1
    dropatt: float | int = 0.0
    pre_lnorm: bool = False
    untie_r: bool = True
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    tie_word_embeddings: bool = True
    cutoffs: list[int] | None = None
    div_val: int = 1
    d_embed: int | None = None
    tie_projs: list[bool] | None = None

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)
        self.check_transformer_xl_settings()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        # Here, before transformers warns about the model type mismatch, when the source is known.
        _refuse_legacy_checkpoint(config_dict, source=str(pretrained_model_name_or_path))
        return config_dict, kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs) -> "TransformerXLConfig":
        # AutoConfig (and through it the Auto model classes) reads the dict itself and arrives here directly.
        _refuse_legacy_checkpoint(config_dict)
        return super().from_dict(config_dict, **kwargs)

    def validate_transformer_xl_settings(self):
        """Part of `@strict` validation, so a config changed after construction is checked again when saved."""
        self.check_transformer_xl_settings()

    def check_transformer_xl_settings(self) -> None:
        """Raise `ValueError` naming the first invalid field and its value."""
        for name in ("vocab_size", "d_model", "n_head", "d_head", "d_inner", "n_layer"):
            _check_int(name, getattr(self, name), minimum=1)
        self.check_segment_schedule()
        for name in ("dropout", "dropatt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name} must be a probability in [0, 1), got {name}={value!r}")
        if self.d_model % 2:
            raise ValueError(f"d_model must be even for the sinusoidal position encoding, got d_model={self.d_model}")
        self.check_adaptive_settings()

    def check_adaptive_settings(self) -> None:
        """Raise `ValueError` naming an invalid `cutoffs`, `div_val`, `d_embed` or `tie_projs`."""
        if self.cutoffs is None:
            return
        cutoffs = self.cutoffs
        if not isinstance(cutoffs, list) or any(isinstance(c, bool) or not isinstance(c, int) for c in cutoffs):
            raise ValueError(f"cutoffs must be a list of token ids, got cutoffs={cutoffs!r}")
        if any(b <= a for a, b in zip([0, *cutoffs], [*cutoffs, self.vocab_size], strict=True)):
            raise ValueError(
                f"cutoffs must increase strictly between 0 and vocab_size={self.vocab_size}, got cutoffs={cutoffs!r}"
            )
        _check_int("div_val", self.div_val, minimum=1)
        _check_int("d_embed", self.embedding_width, minimum=1)
        if self.embedding_width // self.div_val ** len(cutoffs) < 1:
            raise ValueError(
                f"d_embed={self.embedding_width} with div_val={self.div_val} leaves the last of {len(cutoffs) + 1} "
                "clusters no embedding dimension"
            )
        if self.tie_projs is not None and (
            not isinstance(self.tie_projs, list) or len(self.tie_projs) != len(cutoffs) + 1
        ):
            raise ValueError(
                f"tie_projs must hold one bool per cluster ({len(cutoffs) + 1}), got tie_projs={self.tie_projs!r}"
            )

    @property
    def embedding_width(self) -> int:
        """`d_embed`, or `d_model` when it is not set."""
        return self.d_model if self.d_embed is None else self.d_embed

    def cluster_ranges(self) -> list[tuple[int, int]]:
        """The `[start, end)` token ids of every cluster of the adaptive embedding and softmax, head first."""
        ends = [0, *self.cutoffs, self.vocab_size]
        return list(zip(ends[:-1], ends[1:], strict=True))

    def cluster_widths(self) -> list[int]:
        """The embedding width of every cluster: `d_embed // div_val**i`."""
        return [self.embedding_width // self.div_val**i for i in range(len(self.cutoffs) + 1)]

    def check_segment_schedule(self) -> None:
        """Raise `ValueError` naming an invalid `segment_length`, `mem_len` or `clamp_len`: the fields every forward
        reads, checked again there since the config may have been changed after the model was built."""
        _check_int("segment_length", self.segment_length, minimum=1)
        _check_int("mem_len", self.mem_len, minimum=0)
        if self.clamp_len is not None:
            _check_int("clamp_len", self.clamp_len, minimum=0)


# The model type of transformers 4.x's TransfoXL, which transformers 5 no longer has.
LEGACY_MODEL_TYPE = "transfo-xl"


def _refuse_legacy_checkpoint(config_dict: dict[str, Any], source: str | None = None) -> None:
    """An old checkpoint would otherwise load with every weight left random, under warnings only."""
    if config_dict.get("model_type") != LEGACY_MODEL_TYPE:
        return
    raise ValueError(
        f"{source or 'This config'} is a transformers 4.x TransfoXLLMHeadModel checkpoint (model_type "
        "'transfo-xl'). Its layout, adaptive input embeddings and an adaptive softmax (weights "
        "transformer.word_emb.emb_layers.* and crit.out_layers.*), cannot be loaded as it is: every weight would "
        "be left random. Convert it first: `hf-recurrence convert FOLDER OUTPUT_DIR` (or "
        "hf_recurrence.transfo_xl_conversion.convert_transfo_xl(FOLDER)), then load OUTPUT_DIR."
    )


class LegacyTransfoXLConfig(TransformerXLConfig):
    """Registered with `AutoConfig` under the old model type only so that Auto loading of such a checkpoint reaches
    [`TransformerXLConfig.from_dict`]'s explanation instead of "Transformers does not recognize this architecture"."""

    model_type = LEGACY_MODEL_TYPE


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")


__all__ = ["TransformerXLConfig"]
