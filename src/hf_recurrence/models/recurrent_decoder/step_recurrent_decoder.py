# SPDX-License-Identifier: Apache-2.0
"""One window step inside a stock transformers decoder: the registered attention function (`recurrent_sdpa`,
`recurrent_eager`) through which every layer's attention joins the window's cached keys/values and, at the insertion
layer, the key/value of `h_prev`; the step's masks and its context (`_StepContext`); and the recurrence module, which
pools a step's hidden states across layers and maps a window's summary to the next `h_prev`.

The backbone runs under `recurrent_<sdpa|eager>`. That name has no mask function, so the backbone builds no mask, and
every layer's attention call reaches `recurrent_attention` with the step context (`recurrence=` keyword), which the
stock decoders pass from their forward through their layers to the attention interface.

Example: a backbone run under the recurrent attention outside the window step is refused, not silently wrong.

```python
>>> import torch
>>> from transformers import LlamaConfig, LlamaModel
>>> from hf_recurrence.models.recurrent_decoder import step_recurrent_decoder

>>> config = LlamaConfig(
...     vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
...     num_key_value_heads=2, attn_implementation="recurrent_sdpa",
... )
>>> LlamaModel(config)(torch.randint(0, 100, (1, 4)))
Traceback (most recent call last):
...
RuntimeError: LlamaAttention ran under the attention implementation of the recurrence core without its window step; ...

```
"""

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .configuration_recurrent_decoder import PRE_ATTENTION_NORMS, RecurrentDecoderConfig


# The attention implementations the recurrence runs on: both accept a per-row mask over extra keys.
INNER_ATTENTIONS = ("sdpa", "eager")
RECURRENT_PREFIX = "recurrent_"


def _decoder_layers(backbone: PreTrainedModel) -> nn.ModuleList:
    base = backbone.base_model
    return base.layers if hasattr(base, "layers") else base.h


def _attention_module(layer: nn.Module) -> nn.Module:
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attn


def _window_attentions(
    weights: torch.Tensor, key_valid: torch.Tensor, with_h_prev: bool, window_size: int, query_real: torch.Tensor
) -> torch.Tensor:
    """One step's attention weights laid out by window position, so that every step and every call has the same
    columns: (batch, head, queries, 1 + window_size), column 0 for `h_prev`, column 1 + j for position j of the
    query's current window. Rows of padding queries are zero.

    weights: (batch, head, queries, [1 +] keys) as the attention computed them (a leading `h_prev` column when
    `with_h_prev`); key_valid: (batch, keys) bool over the cached slots then the step's columns; query_real:
    (batch, queries) bool.
    """
    token_weights = weights[..., 1:] if with_h_prev else weights
    # The valid keys of a row are exactly its current window, in order; the rest go to a column that is dropped.
    index = torch.where(key_valid, key_valid.cumsum(1) - 1, window_size)  # (batch, keys)
    index = index[:, None, None, :].expand_as(token_weights)
    by_position = token_weights.new_zeros(*token_weights.shape[:-1], window_size + 1)
    by_position = by_position.scatter_add(-1, index, token_weights)[..., :window_size]
    h_prev_weight = weights[..., :1] if with_h_prev else weights.new_zeros(*weights.shape[:-1], 1)
    layout = torch.cat([h_prev_weight, by_position], dim=-1)
    return layout * query_real[:, None, :, None].to(layout.dtype)


def _attention_masks(
    real: torch.Tensor,
    slot_valid: torch.Tensor,
    has_h_prev: torch.Tensor,
    dtype: torch.dtype,
    eager: bool,
    all_real: bool | None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Masks for the ordinary layers and for the insertion layer, (batch, 1, cols, [1 +] slots + cols).

    A query sees the valid cached slots, the real step columns up to itself, and itself (so padding queries never
    see an empty row); at the insertion layer also `h_prev` where the row has one. The plain mask is None where the
    attention's own causal mask is the same (no cached slots, every column real). Additive float masks for eager
    attention, boolean ones otherwise. `all_real`: whether every column is real, when known on the host.
    """
    batch, cols = real.shape
    slots = slot_valid.shape[1]
    causal = torch.ones(cols, cols, dtype=torch.bool, device=real.device).tril()
    plain = None
    if eager or slots or not (all_real if all_real is not None else bool(real.all())):
        own = torch.eye(cols, dtype=torch.bool, device=real.device)
        new_part = (causal & real[:, None, :]) | own  # (batch, cols, cols)
        plain = torch.cat([slot_valid[:, None, :].expand(batch, cols, slots), new_part], dim=-1)[:, None]
    h_prev_part = has_h_prev[:, None, None, None].expand(batch, 1, cols, 1)
    token_part = causal.expand(batch, 1, cols, cols) if plain is None else plain
    inserted = torch.cat([h_prev_part, token_part], dim=-1)
    if eager:
        plain, inserted = (
            torch.zeros_like(m, dtype=dtype).masked_fill(~m, torch.finfo(dtype).min) for m in (plain, inserted)
        )
    return plain, inserted


class _StepContext:
    """What one window step hands every layer's attention, as the `recurrence=` keyword that stock decoders pass
    from their forward through their layers to the attention interface.

    A plain object on purpose, not a dataclass or dict: FSDP2's pre-forward rebuilds those when they hold tensors
    that require grad, and the keys/values recorded here would then land in per-layer copies.
    """

    def __init__(
        self,
        *,
        insertion_layer: int,
        h_prev: torch.Tensor | None,
        h_prev_norm: Callable[[torch.Tensor], torch.Tensor],
        h_prev_rotation: tuple[torch.Tensor, torch.Tensor] | None,
        h_prev_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        eager: bool = False,
        past: list[tuple[torch.Tensor, torch.Tensor] | None] = (),
        plain_mask: torch.Tensor | None = None,
        inserted_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ):
        self.insertion_layer = insertion_layer
        self.eager = eager
        self.past = past
        self.plain_mask, self.inserted_mask = plain_mask, inserted_mask
        self.h_prev, self.h_prev_norm = h_prev, h_prev_norm
        # (cos, sin) of the h_prev key, (batch, 1, rotary_dim) each; None: unrotated (`h_prev_rope_position`).
        self.h_prev_rotation = h_prev_rotation
        # h_prev's key/value at the insertion layer when already known (a fixed-shape state keeps them for the whole
        # window, see `FixedShapeWindowCache.h_prev_key_value`); None: computed from `h_prev` in the step.
        self.h_prev_kv = h_prev_kv
        self.output_attentions = output_attentions
        # Filled by the layers: their keys/values (cache + step, per kv head) and attention weights.
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.weights: dict[int, tuple[torch.Tensor, bool]] = {}
        # While the attention runs on h_prev only to read its key/value (see `_h_prev_key_value`).
        self.probing = False
        self.probed: tuple[torch.Tensor, torch.Tensor] | None = None


def _inner_attention(module: nn.Module, eager: bool) -> Callable:
    if eager:
        # The family's own eager attention (Gemma2's attention soft-cap lives there); the backbone check ensures it.
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def _h_prev_key_value(module: nn.Module, ctx: _StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    """`h_prev`'s key and value at this attention module, (batch, kv_head, 1, head_dim) each, through the module's
    own code (biases, fused qkv, per-head or full-width key norms, partial rotary): it runs on the normed `h_prev` as
    a one-token input with the step's `h_prev` rotation, or an identity one (cos 1, sin 0), and what reaches the
    attention interface is kept."""
    normed = ctx.h_prev_norm(ctx.h_prev[:, None])  # (batch, 1, hidden)
    if ctx.h_prev_rotation is not None:
        position_embeddings = ctx.h_prev_rotation
    else:
        cos = normed.new_ones(normed.shape[0], 1, module.head_dim)
        position_embeddings = (cos, torch.zeros_like(cos))
    ctx.probing = True
    try:
        # .forward, not __call__: no output-capture or FSDP hooks fire for the probe.
        module.forward(
            hidden_states=normed,
            position_embeddings=position_embeddings,
            attention_mask=None,
            recurrence=ctx,
        )
    finally:
        ctx.probing = False
    return ctx.probed


def h_prev_rotation(
    backbone: PreTrainedModel, config: RecurrentDecoderConfig, h_prev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rotation (cos, sin) of the `h_prev` key, (batch, 1, rotary_dim) each, per `h_prev_rope_position`: the
    backbone's own rotary embedding of the insertion layer at that window position. None leaves it unrotated."""
    position = config.h_prev_rope_position
    if position is None:
        return None
    rotary = backbone.base_model.rotary_emb
    positions = torch.full((h_prev.shape[0], 1), position, dtype=torch.long, device=h_prev.device)
    kwargs = {}
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        # One rotary module for several layer types, each with its own base (Gemma3: local and global layers).
        kwargs["layer_type"] = config.text_config.layer_types[config.insertion_layer]
    return rotary(h_prev, positions, **kwargs)


def step_context(
    backbone: PreTrainedModel,
    config: RecurrentDecoderConfig,
    h_prev: torch.Tensor | None,
    h_prev_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    **step,
) -> _StepContext:
    """The context of one step of `backbone` (the recurrent model's, with its `config`): `h_prev` (batch, hidden)
    joins the insertion layer through that layer's pre-attention norm, its key rotated per `h_prev_rope_position`,
    unless its key and value are given (`h_prev_kv`); None joins none. `step`: the other `_StepContext` fields."""
    layer = _decoder_layers(backbone)[config.insertion_layer]
    norm = PRE_ATTENTION_NORMS[config.text_config.model_type]
    return _StepContext(
        insertion_layer=config.insertion_layer,
        h_prev=h_prev,
        h_prev_norm=getattr(layer, norm) if norm is not None else nn.Identity(),
        h_prev_rotation=h_prev_rotation(backbone, config, h_prev)
        if h_prev is not None and h_prev_kv is None
        else None,
        h_prev_kv=h_prev_kv,
        **step,
    )


def h_prev_key_value(
    backbone: PreTrainedModel, config: RecurrentDecoderConfig, h_prev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`h_prev`'s key and value at the insertion layer of `backbone`, (batch, kv_head, 1, head_dim) each, as a step
    computes them (`_h_prev_key_value`): the same code on the same tensors, so the same values."""
    layer = _decoder_layers(backbone)[config.insertion_layer]
    return _h_prev_key_value(_attention_module(layer), step_context(backbone, config, h_prev))


def step_attentions(
    ctx: _StepContext, slot_valid: torch.Tensor, real: torch.Tensor, num_new: int, window_size: int
) -> tuple[torch.Tensor, ...]:
    """Every layer's attention weights of a step's `num_new` new columns, laid out by window position (see
    `_window_attentions`); `slot_valid` (batch, slots) and `real` (batch, cols) as the step's masks had them."""
    key_valid = torch.cat([slot_valid, real], dim=1)  # (batch, slots + cols)
    return tuple(
        _window_attentions(weights[:, :, -num_new:], key_valid, inserting, window_size, real[:, -num_new:])
        for weights, inserting in (ctx.weights[i] for i in range(len(ctx.weights)))
    )


def recurrent_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    recurrence: _StepContext | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention interface `recurrent_sdpa` / `recurrent_eager`: keys/values are `[h_prev] + cached window +
    step columns` (batch, kv_head, [1 +] slots + cols, head_dim); the backbone's own mask is ignored (it builds
    none under these names) for the step's per-row masks."""
    ctx = recurrence
    if ctx is None:
        raise RuntimeError(
            f"{type(module).__name__} ran under the attention implementation of the recurrence core without its "
            "window step; run the backbone through RecurrentDecoderModel or RecurrentDecoderForCausalLM, or give it "
            "attn_implementation='sdpa' or 'eager' to use it as a stock model"
        )
    if ctx.probing:
        ctx.probed = (key, value)
        batch, heads, length, head_dim = query.shape
        return query.new_zeros(batch, length, heads, head_dim), None
    i = module.layer_idx
    if ctx.past[i] is not None:
        key = torch.cat([ctx.past[i][0], key], dim=2)  # (batch, kv_head, slots + cols, head_dim)
        value = torch.cat([ctx.past[i][1], value], dim=2)
    ctx.keys[i], ctx.values[i] = key, value
    mask = ctx.plain_mask
    inserting = i == ctx.insertion_layer and ctx.h_prev is not None
    if inserting:
        # Inside the layer's forward, where FSDP2 has gathered the layer's weights. h_prev is one extra key/value
        # per kv head only: it never becomes a query, so the outputs stay one per token.
        h_key, h_value = ctx.h_prev_kv if ctx.h_prev_kv is not None else _h_prev_key_value(module, ctx)
        key, value, mask = torch.cat([h_key, key], dim=2), torch.cat([h_value, value], dim=2), ctx.inserted_mask
    output, weights = _inner_attention(module, ctx.eager)(module, query, key, value, mask, **kwargs)
    if ctx.output_attentions:
        ctx.weights[i] = (weights, inserting)
    return output, weights


for _inner in INNER_ATTENTIONS:
    # A name outside transformers' mask-function table: create_causal_mask then returns None and builds nothing.
    AttentionInterface.register(RECURRENT_PREFIX + _inner, recurrent_attention)


def _activation_name(text_config: PreTrainedConfig) -> str:
    """The backbone's feed-forward activation, which the recurrence network uses too."""
    for name in ("hidden_activation", "hidden_act", "activation_function"):
        value = getattr(text_config, name, None)
        if isinstance(value, str):
            return value
    return "gelu"


class RecurrentDecoderRecurrence(nn.Module):
    """The paper's recurrence module: softmax-normalised layer weights and the feed-forward network to `h_prev`."""

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__()
        text = config.text_config
        # alpha of paper Eq. 1, one logit per layer output
        self.layer_weight_logits = nn.Parameter(torch.zeros(text.num_hidden_layers))
        sizes = [text.hidden_size, *config.recurrence_hidden_sizes]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(fan_in, fan_out), ACT2FN[_activation_name(text)]]
        layers.append(nn.Linear(sizes[-1], text.hidden_size))
        self.ffn = nn.Sequential(*layers)

    def layer_weights(self) -> torch.Tensor:
        return torch.softmax(self.layer_weight_logits.float(), dim=0)  # (num_hidden_layers,)

    def pool(
        self, layer_states: tuple[torch.Tensor, ...], real: torch.Tensor, config: RecurrentDecoderConfig
    ) -> torch.Tensor:
        """(batch, hidden) float32: the layer-weighted sum of a step's hidden states over its real columns, which the
        state adds up over a window (`window_summary` divides by the window's tokens). layer_states: every layer's
        output, the last after the final norm, (batch, cols, hidden) each; real: (batch, cols) bool."""
        # Each layer's share is one batched product: (batch, 1, cols) weights of the real columns times (batch, cols,
        # hidden) states, accumulated into (batch, 1, hidden).
        real_weights = self.layer_weights()[:, None, None, None] * real.float()[None, :, None, :]
        batch, _, hidden = layer_states[0].shape
        pooled = torch.zeros(batch, 1, hidden, device=layer_states[0].device)
        eps = getattr(config.text_config, "rms_norm_eps", None) or 1e-6
        for i, layer in enumerate(layer_states):
            states = layer.float()
            if config.normalize_pooled_states:
                states = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps)
            pooled = torch.baddbmm(pooled, real_weights[i], states)
        return pooled[:, 0]

    def forward(self, window_summary: torch.Tensor) -> torch.Tensor:
        return self.ffn(window_summary)  # (batch, hidden)


@dataclass
class _StepOutput:
    # The causal LM's scores of the step's kept columns, (batch, kept, vocab), or the bare model's final hidden
    # states of its new columns, (batch, new, hidden); None where a step head consumed it.
    result: torch.Tensor | None
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    # (batch, hidden) float32 layer-weighted sum over the step's real positions; None once the state has added it
    pooled: torch.Tensor | None
    all_hidden: tuple[torch.Tensor, ...] | None  # embedding output and every layer's, (batch, new, hidden) each
    head: torch.Tensor | None  # what step_head returned (the window's loss)
    attentions: tuple[torch.Tensor, ...] | None  # per layer, (batch, head, new, 1 + window_size)

    def flat(self) -> tuple[torch.Tensor | None, ...]:
        return (
            self.result,
            self.pooled,
            self.head,
            *self.keys,
            *self.values,
            *(self.all_hidden or ()),
            *(self.attentions or ()),
        )

    @classmethod
    def from_flat(cls, flat: tuple[torch.Tensor | None, ...], num_layers: int, settings: "_StepSettings"):
        result, pooled, head = flat[:3]
        keys, values = list(flat[3 : 3 + num_layers]), list(flat[3 + num_layers : 3 + 2 * num_layers])
        rest = flat[3 + 2 * num_layers :]
        all_hidden = rest[: num_layers + 1] if settings.output_hidden_states else None
        attentions = rest[-num_layers:] if settings.output_attentions else None
        return cls(result, keys, values, pooled, all_hidden, head, attentions)

    @property
    def carries_nothing(self) -> bool:
        """Whether the step gives the call's outputs nothing: no kept logits (an empty result), no head output, no
        hidden states or attentions. A long prompt read for its last logits is such steps but the last."""
        empty = self.result is not None and self.result.shape[1] == 0
        return empty and self.head is None and self.all_hidden is None and self.attentions is None


@dataclass(frozen=True)
class _StepSettings:
    """What a step needs besides tensors."""

    num_new: int  # the step's new columns (after any re-read overlap)
    window_size: int
    # The step columns whose logits the backbone's head computes: an int keeps the last ones, a 1D tensor those
    # indices (empty: none); None computes no logits.
    logits_to_keep: int | torch.Tensor | None
    step_head: Callable | None  # run on the step's result and targets (a window's loss)
    output_hidden_states: bool
    output_attentions: bool
    # Known on the host when the rows are in lockstep (None: read from the step's tensors): whether the rows have
    # an h_prev, and whether every column of the step is a real token.
    uses_h_prev: bool | None = None
    all_real: bool | None = None
