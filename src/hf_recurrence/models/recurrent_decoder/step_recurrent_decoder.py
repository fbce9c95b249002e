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
    weights: torch.Tensor,
    key_valid: torch.Tensor,
    with_h_prev: bool,
    window_size: int,
    query_real: torch.Tensor,
    memory_slots: int = 1,
) -> torch.Tensor:
    """One step's attention weights laid out by window position, so that every step and every call has the same
    columns: (batch, head, queries, k + window_size), columns 0..k-1 for the `memory_slots` = k slots of `h_prev`,
    column k + j for position j of the query's current window. Rows of padding queries are zero.

    weights: (batch, head, queries, [k +] keys) as the attention computed them (k leading `h_prev` columns when
    `with_h_prev`); key_valid: (batch, keys) bool over the cached slots then the step's columns; query_real:
    (batch, queries) bool.
    """
    k = memory_slots
    token_weights = weights[..., k:] if with_h_prev else weights
    # The valid keys of a row are exactly its current window, in order; the rest go to a column that is dropped.
    index = torch.where(key_valid, key_valid.cumsum(1) - 1, window_size)  # (batch, keys)
    index = index[:, None, None, :].expand_as(token_weights)
    by_position = token_weights.new_zeros(*token_weights.shape[:-1], window_size + 1)
    by_position = by_position.scatter_add(-1, index, token_weights)[..., :window_size]
    h_prev_weight = weights[..., :k] if with_h_prev else weights.new_zeros(*weights.shape[:-1], k)
    layout = torch.cat([h_prev_weight, by_position], dim=-1)
    return layout * query_real[:, None, :, None].to(layout.dtype)


def _attention_masks(
    real: torch.Tensor,
    slot_valid: torch.Tensor,
    has_h_prev: torch.Tensor,
    dtype: torch.dtype,
    eager: bool,
    all_real: bool | None,
    memory_slots: int = 1,
    uses_h_prev: bool = True,
    write_slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Masks for the ordinary layers and for the layers that read the memory, (batch, 1, cols, [k +] slots + cols).

    A query sees the valid cached slots, the real step columns up to itself, and itself (so padding queries never
    see an empty row); at a reading layer also the `memory_slots` = k slots of `h_prev` where the row has them. The plain mask is None where the
    attention's own causal mask is the same (no cached slots, every column real). Additive float masks for eager
    attention and for a step that writes its keys in place, boolean ones otherwise. `all_real`: whether every column
    is real, when known on the host.
    `uses_h_prev`: whether the step joins `h_prev` at all; the reading layers' mask is None where it does not (no
    layer reads that mask then). `write_slots` (batch,): where a one-column step's keys are written in place (see
    `_StepContext.write_slots`); the masks then cover the slots alone, (batch, 1, 1, [k +] slots), the column's own
    slot visible to it.
    """
    if write_slots is not None:
        return _in_place_step_masks(slot_valid, has_h_prev, dtype, memory_slots, uses_h_prev, write_slots)
    batch, cols = real.shape
    slots = slot_valid.shape[1]
    causal = torch.ones(cols, cols, dtype=torch.bool, device=real.device).tril()
    plain = None
    if eager or slots or not (all_real if all_real is not None else bool(real.all())):
        own = torch.eye(cols, dtype=torch.bool, device=real.device)
        new_part = (causal & real[:, None, :]) | own  # (batch, cols, cols)
        plain = torch.cat([slot_valid[:, None, :].expand(batch, cols, slots), new_part], dim=-1)[:, None]
    inserted = None
    if uses_h_prev:
        h_prev_part = has_h_prev[:, None, None, None].expand(batch, 1, cols, memory_slots)
        token_part = causal.expand(batch, 1, cols, cols) if plain is None else plain
        inserted = torch.cat([h_prev_part, token_part], dim=-1)
    if eager:
        plain, inserted = (None if m is None else _additive(m, dtype) for m in (plain, inserted))
    return plain, inserted


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as an additive one of `dtype`: 0 where True, the dtype's lowest value where False."""
    return torch.zeros_like(mask, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def _in_place_step_masks(
    slot_valid: torch.Tensor,
    has_h_prev: torch.Tensor,
    dtype: torch.dtype,
    memory_slots: int,
    uses_h_prev: bool,
    write_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_attention_masks` of a one-column step that writes its keys in place: additive, (batch, 1, 1, [k +] slots),
    the valid slots and the column's own visible.

    Additive for every attention, and made by a scatter: compiled, each mask is then one buffer that every layer's
    attention reads. From a boolean mask torch's sdpa makes its additive mask in every layer, which inductor fuses
    into the layers' kernels unevenly, so that it builds and compiles more distinct kernels (a slower cold start)."""
    plain = _additive(slot_valid, dtype).scatter(1, write_slots[:, None], 0.0)  # (batch, slots), own slot visible
    plain = plain[:, None, None, :]  # (batch, 1, 1, slots)
    if not uses_h_prev:
        return plain, None
    h_prev_part = _additive(has_h_prev, dtype)[:, None, None, None].expand(-1, 1, 1, memory_slots)
    return plain, torch.cat([h_prev_part, plain], dim=-1)


class _LockstepTensors:
    """The position ids and masks of one call's steps over rows in lockstep, made once per step shape instead of
    once per window. In lockstep every column is real, every cached slot is valid (a row's fill is its slot count)
    and either every row has `h_prev` or none has: these tensors then depend only on sizes known on the host (the
    batch, dtype and attention of a call are fixed). None of them requires grad, so a step recomputed under gradient
    checkpointing reuses them as they were."""

    def __init__(self):
        self._made: dict[tuple, tuple[torch.Tensor | None, ...]] = {}

    def get(self, key: tuple, make: Callable[[], tuple[torch.Tensor | None, ...]]) -> tuple[torch.Tensor | None, ...]:
        """What `make()` returns, made at the first call with `key`."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]


def step_positions_and_masks(
    settings: "_StepSettings",
    real: torch.Tensor,
    fill: torch.Tensor,
    slot_valid: torch.Tensor,
    has_h_prev: torch.Tensor,
    dtype: torch.dtype,
    eager: bool,
    uses_h_prev: bool,
    memory_slots: int,
    write_slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A step's position ids, (batch, cols), which restart in every window, and its plain and reading-layer masks
    (see `_attention_masks`); over rows in lockstep, those an earlier step of the call with the same shape made
    (`settings.lockstep_tensors`), and no masks for a single column outside eager attention. real: (batch, cols)
    bool; fill: (batch,) tokens already in each row's window."""

    def make_positions() -> torch.Tensor:
        return (fill[:, None] + real.cumsum(1) - 1).clamp(min=0)  # (batch, cols)

    def make() -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        masks = _attention_masks(
            real, slot_valid, has_h_prev, dtype, eager, settings.all_real, memory_slots, uses_h_prev, write_slots
        )
        return make_positions(), *masks

    made = settings.lockstep_tensors
    if made is None:
        return make()
    key = (real.shape[1], slot_valid.shape[1], uses_h_prev)
    if real.shape[1] == 1 and not eager:
        # One query over rows in lockstep sees every key (every slot valid, h_prev in every row or in none): no
        # masks, so a decoded token builds none and sdpa groups the key/value heads itself (given a mask,
        # transformers reshapes the query and the mask around every layer's attention instead).
        return made.get(key, lambda: (make_positions(), None, None))
    return made.get(key, make)


class _StepContext:
    """What one window step hands every layer's attention, as the `recurrence=` keyword that stock decoders pass
    from their forward through their layers to the attention interface.

    A plain object on purpose, not a dataclass or dict: FSDP2's pre-forward rebuilds those when they hold tensors
    that require grad, and the keys/values recorded here would then land in per-layer copies.
    """

    def __init__(
        self,
        *,
        read_layers: list[int],
        h_prev: torch.Tensor | None,
        h_prev_norms: dict[int, Callable[[torch.Tensor], torch.Tensor]],
        h_prev_rotations: dict[int, tuple[torch.Tensor, torch.Tensor] | None],
        h_prev_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
        eager: bool = False,
        past: list[tuple[torch.Tensor, torch.Tensor] | None] = (),
        plain_mask: torch.Tensor | None = None,
        inserted_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        write_slots: torch.Tensor | None = None,
    ):
        self.read_layers = frozenset(read_layers)
        self.eager = eager
        self.past = past
        # (batch,) the slot of each layer's `past` buffer that a one-column step's key/value is written into, in
        # place, before the attention reads the whole buffer (a fixed-shape state's compiled single-token step, see
        # `FixedShapeWindowCache`): no copy of the window's cache per token and layer. None: the keys are `past`
        # followed by the step's columns.
        self.write_slots = write_slots
        self.plain_mask, self.inserted_mask = plain_mask, inserted_mask
        # h_prev: (batch, memory_slots, hidden); each reading layer's pre-attention norm, by layer.
        self.h_prev, self.h_prev_norms = h_prev, h_prev_norms
        # (cos, sin) of the h_prev keys at each reading layer, (batch, memory_slots, rotary_dim) each; None: unrotated
        # (`h_prev_rope_position`).
        self.h_prev_rotations = h_prev_rotations
        # h_prev's key/value by reading layer, kept for the whole window (`RecurrentDecoderState.h_prev_key_values`):
        # a layer missing from it computes its own from `h_prev` and adds them. None: computed in every step.
        self.h_prev_kv = h_prev_kv
        self.output_attentions = output_attentions
        # Filled by the layers: their keys/values (cache + step, per kv head) and attention weights.
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.weights: dict[int, tuple[torch.Tensor, bool]] = {}
        # While the attention runs on h_prev only to read its key/value (see `_h_prev_key_value`).
        self.probing = False
        self.probed: tuple[torch.Tensor, torch.Tensor] | None = None
        # This copy's attention, which the registered entry hands the call to (`dispatch_recurrent_attention`).
        self.attend = recurrent_attention


def _inner_attention(module: nn.Module, eager: bool) -> Callable:
    if eager:
        # The family's own eager attention (Gemma2's attention soft-cap lives there); the backbone check ensures it.
        return sys.modules[type(module).__module__].eager_attention_forward
    return _sdpa_attention


def _sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except in a compiled step on the CPU with grouped key/value heads and a mask.

    There transformers copies every key/value head to its query heads (`repeat_kv`: it groups them in torch's sdpa
    only without a mask, or uncompiled for a one-token query), while torch's CPU sdpa groups them itself with a mask
    too: a single-token step at SmolLM2's shape, batch 8, a 302-slot buffer, spent 454 us a layer copying and
    attending, 211 us grouped (compiled, one thread; benchmarks/real_size.py shows the whole step)."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1 and attention_mask is not None
    if not (grouped and query.device.type == "cpu" and torch.compiler.is_compiling()) or kwargs.get("softcap"):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=kwargs.get("dropout", 0.0),
        scale=kwargs.get("scaling"),
        enable_gqa=True,
    )  # (batch, head, cols, head_dim)
    return output.transpose(1, 2).contiguous(), None


def _h_prev_key_value(module: nn.Module, ctx: _StepContext, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`h_prev`'s key and value at this attention module of decoder layer `layer`, (batch, kv_head, memory_slots,
    head_dim) each, through the module's own code (biases, fused qkv, per-head or full-width key norms, partial
    rotary): it runs on the normed slots as a `memory_slots`-token input with the step's `h_prev` rotation, or an
    identity one (cos 1, sin 0), and what reaches the attention interface is kept."""
    normed = ctx.h_prev_norms[layer](ctx.h_prev)  # (batch, memory_slots, hidden)
    rotation = ctx.h_prev_rotations[layer]
    if rotation is not None:
        position_embeddings = rotation
    else:
        cos = normed.new_ones(*normed.shape[:2], module.head_dim)
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
    backbone: PreTrainedModel, config: RecurrentDecoderConfig, h_prev: torch.Tensor, layer: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rotation (cos, sin) of the `h_prev` keys at decoder layer `layer`, (batch, memory_slots, rotary_dim) each,
    per `h_prev_rope_position`: the backbone's own rotary embedding of that layer, slot i at window position
    `h_prev_rope_position - i` (the slots read like the tokens just before the window). None leaves them unrotated."""
    position = config.h_prev_rope_position
    if position is None:
        return None
    rotary = backbone.base_model.rotary_emb
    batch, slots = h_prev.shape[:2]
    offsets = torch.arange(slots, device=h_prev.device)
    positions = (position - offsets).expand(batch, slots)  # (batch, memory_slots)
    kwargs = {}
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        # One rotary module for several layer types, each with its own base (Gemma3: local and global layers).
        kwargs["layer_type"] = config.text_config.layer_types[layer]
    return rotary(h_prev, positions, **kwargs)


def step_context(
    backbone: PreTrainedModel,
    config: RecurrentDecoderConfig,
    h_prev: torch.Tensor | None,
    h_prev_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    **step,
) -> _StepContext:
    """The context of one step of `backbone` (the recurrent model's, with its `config`): the slots of `h_prev`
    (batch, memory_slots, hidden) join every reading layer (`config.read_layers`) through that layer's pre-attention
    norm, their keys rotated per `h_prev_rope_position`, unless their keys and values are kept (`h_prev_kv`, by
    layer, see `_StepContext.h_prev_kv`); None joins none. `step`: the other `_StepContext` fields."""
    layers = _decoder_layers(backbone)
    norm = PRE_ATTENTION_NORMS[config.text_config.model_type]
    read_layers = config.read_layers
    rotate = h_prev is not None and (h_prev_kv is None or len(h_prev_kv) < len(read_layers))
    return _StepContext(
        read_layers=read_layers,
        h_prev=h_prev,
        h_prev_norms={i: getattr(layers[i], norm) if norm is not None else nn.Identity() for i in read_layers},
        h_prev_rotations={i: h_prev_rotation(backbone, config, h_prev, i) if rotate else None for i in read_layers},
        h_prev_kv=h_prev_kv,
        **step,
    )


def h_prev_key_value(
    backbone: PreTrainedModel, config: RecurrentDecoderConfig, h_prev: torch.Tensor
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """`h_prev`'s key and value at every reading layer of `backbone`, by layer, (batch, kv_head, memory_slots,
    head_dim) each, as a step computes them (`_h_prev_key_value`): the same code on the same tensors, so the same
    values."""
    layers = _decoder_layers(backbone)
    ctx = step_context(backbone, config, h_prev)
    return {i: _h_prev_key_value(_attention_module(layers[i]), ctx, i) for i in config.read_layers}


def step_attentions(
    ctx: _StepContext, slot_valid: torch.Tensor, real: torch.Tensor, num_new: int, window_size: int, memory_slots: int
) -> tuple[torch.Tensor, ...]:
    """Every layer's attention weights of a step's `num_new` new columns, laid out by window position (see
    `_window_attentions`); `slot_valid` (batch, slots) and `real` (batch, cols) as the step's masks had them."""
    key_valid = torch.cat([slot_valid, real], dim=1)  # (batch, slots + cols)
    return tuple(
        _window_attentions(
            weights[:, :, -num_new:], key_valid, inserting, window_size, real[:, -num_new:], memory_slots
        )
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
    """The attention interface `recurrent_sdpa` / `recurrent_eager`: keys/values are `[h_prev slots] + cached window
    + step columns` (batch, kv_head, [memory_slots +] slots + cols, head_dim), the slots at the layers that read the
    memory; the backbone's own mask is ignored (it builds none under these names) for the step's per-row masks."""
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
    if ctx.write_slots is not None:
        # An index_put_, not a scatter_: compiled, inductor writes it into the buffer in place, where it computes a
        # scatter_ into a new copy of the whole buffer and copies that back (every layer, every token).
        rows = torch.arange(key.shape[0], device=key.device)
        key_buffer, value_buffer = ctx.past[i]  # (batch, kv_head, slots, head_dim)
        key_buffer[rows, :, ctx.write_slots] = key[:, :, 0]  # (batch, kv_head, head_dim) at each row's slot
        value_buffer[rows, :, ctx.write_slots] = value[:, :, 0]
        key, value = key_buffer, value_buffer
    elif ctx.past[i] is not None:
        key = torch.cat([ctx.past[i][0], key], dim=2)  # (batch, kv_head, slots + cols, head_dim)
        value = torch.cat([ctx.past[i][1], value], dim=2)
    ctx.keys[i], ctx.values[i] = key, value
    mask = ctx.plain_mask
    inserting = i in ctx.read_layers and ctx.h_prev is not None
    if inserting:
        # Inside the layer's forward, where FSDP2 has gathered the layer's weights. h_prev's slots are extra
        # keys/values per kv head only: they never become queries, so the outputs stay one per token.
        kept = ctx.h_prev_kv
        if kept is not None and i in kept:
            h_key, h_value = kept[i]
        else:
            h_key, h_value = _h_prev_key_value(module, ctx, i)
            if kept is not None:
                kept[i] = (h_key, h_value)
        key, value, mask = torch.cat([h_key, key], dim=2), torch.cat([h_value, value], dim=2), ctx.inserted_mask
    output, weights = _inner_attention(module, ctx.eager)(module, query, key, value, mask, **kwargs)
    if ctx.output_attentions:
        ctx.weights[i] = (weights, inserting)
    return output, weights


def dispatch_recurrent_attention(
    module: nn.Module, *args: torch.Tensor | None, recurrence: _StepContext | None = None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What transformers' global attention table holds under `recurrent_sdpa` / `recurrent_eager`: the attention of
    the copy of this file whose window step built `recurrence`.

    The table has one entry per name for the whole process, and every copy of this model folder (the installed
    package, each Hub checkpoint's remote code) registers its own on import, the last one winning; each step context
    names its own copy's `recurrent_attention`, so a model never runs another copy's code."""
    attend = getattr(recurrence, "attend", recurrent_attention)
    return attend(module, *args, recurrence=recurrence, **kwargs)


for _inner in INNER_ATTENTIONS:
    # A name outside transformers' mask-function table: create_causal_mask then returns None and builds nothing.
    AttentionInterface.register(RECURRENT_PREFIX + _inner, dispatch_recurrent_attention)


def _activation_name(text_config: PreTrainedConfig) -> str:
    """The backbone's feed-forward activation, which the recurrence network uses too."""
    for name in ("hidden_activation", "hidden_act", "activation_function"):
        value = getattr(text_config, name, None)
        if isinstance(value, str):
            return value
    return "gelu"


class RecurrentDecoderRecurrence(nn.Module):
    """The recurrence module: the paper's softmax-normalised layer weights and feed-forward network to `h_prev`, and
    the memory's writer beyond the paper (`memory_slots` slots, each pooling the window with a learned query and a
    learned bias over window positions), all of them absent or zero at the paper's settings."""

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__()
        text = config.text_config
        hidden = text.hidden_size
        # alpha of paper Eq. 1, one logit per layer output
        self.layer_weight_logits = nn.Parameter(torch.zeros(text.num_hidden_layers))
        sizes = [hidden, *config.recurrence_hidden_sizes]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(fan_in, fan_out), ACT2FN[_activation_name(text)]]
        layers.append(nn.Linear(sizes[-1], hidden))
        self.ffn = nn.Sequential(*layers)
        slots = config.memory_slots
        if config.memory_pooling == "attention":
            # One query per slot over the window's states; zero at first, so that each slot starts as the mean.
            self.memory_queries = nn.Parameter(torch.zeros(slots, hidden))
        if config.selects_tokens:
            # Two queries scoring every token, over its states and its predecessor's; zero at first: all tokens tie,
            # and the latest are kept.
            self.memory_selection_query = nn.Parameter(torch.zeros(2, hidden))
        if config.memory_position_bias:
            # A score per slot and window position, zero at first: a slot can learn to read "the last tokens".
            self.memory_position_bias = nn.Parameter(torch.zeros(slots, config.window_size))
        if slots > 1:
            # Added to each slot's pooled state before the network, so that slots pooled alike still differ (and
            # their queries get different gradients); random at first, unlike the zero queries and biases.
            self.slot_embeddings = nn.Parameter(torch.zeros(slots, hidden))

    def layer_weights(self) -> torch.Tensor:
        return torch.softmax(self.layer_weight_logits.float(), dim=0)  # (num_hidden_layers,)

    def pool(
        self,
        layer_states: tuple[torch.Tensor, ...],
        real: torch.Tensor,
        positions: torch.Tensor,
        config: RecurrentDecoderConfig,
        window_pooled: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One step's share of the window's pooled states, which the state merges over a window (`merge_pooled`) and
        `window_summary` normalises: `(total, weight, reference)`, float32 each.

        With the paper's mean (`config.pools_by_softmax` false): total (batch, 1, hidden) the sum of the source states
        over the step's real columns, weight (batch, 1) their count, reference None. With softmax pooling, per slot:
        total (batch, k, hidden) the states weighted by `exp(score - reference)`, weight (batch, k) those weights'
        sum, reference (batch, k) the step's highest score (0 in a row without real columns), so nothing overflows.
        With a selection (`config.selects_tokens`), k + 2 entries (`_select`).

        layer_states: every layer's output, the last after the final norm, (batch, cols, hidden) each; real:
        (batch, cols) bool; positions: (batch, cols) each column's position in its window; window_pooled: the
        window's merged totals before this step, (batch, p, hidden) (read by a selection only).
        """
        if config.selects_tokens:
            return self._select(layer_states, real, positions, config, window_pooled)
        if not config.pools_by_softmax:
            # One cast for both: a sum of ones is the exact count.
            real_weights = real.float()  # (batch, cols), 1 at the real columns
            return self._mean_total(layer_states, real_weights, config), real_weights.sum(1, keepdim=True), None
        states = self._source_states(layer_states, config)  # (batch, cols, hidden)
        batch, cols, hidden = states.shape
        scores = states.new_zeros(batch, cols, config.memory_slots)
        if config.memory_pooling == "attention":
            scores = scores + states @ self.memory_queries.float().T / hidden**0.5
        if config.memory_position_bias:
            scores = scores + self.memory_position_bias.float().T[positions]  # (batch, cols, k)
        return _softmax_share(states, scores, real)

    def _select(
        self,
        layer_states: tuple[torch.Tensor, ...],
        real: torch.Tensor,
        positions: torch.Tensor,
        config: RecurrentDecoderConfig,
        window_pooled: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`pool` for `memory_pooling="select"`. Each token's source states are summed with its predecessor's in the
        window (a token shift: a value token then holds its key; zeros before the window's first token) and scored
        over both by the two learned queries. k + 2 entries: the step's k best-scoring tokens (`keep_best`: total
        their shifted states, weight their window position + 1, 0 for none, reference their score); the softmax share
        of all its shifted tokens by the same scores (as `_softmax_share`), whose gradient teaches the scores
        (`selected_summary`); and its last real token's own states (weight its place, 0 for none), the predecessor
        of the next step's first token."""
        k = config.memory_slots
        states = self._source_states(layer_states, config)  # (batch, cols, hidden)
        batch, cols, hidden = states.shape
        places = torch.where(real, positions + 1, 0)  # (batch, cols)
        # Each column's predecessor: the latest real column before it in the step, else the window's last token
        # before the step (its entry is zero in a new window).
        latest = torch.where(real, torch.arange(cols, device=real.device), -1).cummax(1).values  # (batch, cols)
        before = torch.nn.functional.pad(latest, (1, 0), value=-1)[:, :-1]
        earlier = (
            window_pooled[:, -1:].to(states.dtype) if window_pooled is not None else states.new_zeros(batch, 1, hidden)
        )
        predecessors = torch.cat([earlier, states], 1).gather(1, (before + 1)[..., None].expand(-1, -1, hidden))
        query, predecessor_query = self.memory_selection_query.float()
        scores = (states @ query + predecessors @ predecessor_query) / hidden**0.5  # (batch, cols)
        shifted = states + predecessors
        # Padding keeps nothing: zero states and scores, no place, as an entry that was never filled.
        kept = keep_best(shifted.masked_fill(~real[..., None], 0), places.float(), scores.masked_fill(~real, 0), k)
        soft = _softmax_share(shifted, scores[..., None], real)
        last = latest[:, -1:]  # (batch, 1), -1 where the step has no real column
        last_states = states.gather(1, last.clamp(min=0)[..., None].expand(-1, -1, hidden)) * (last >= 0)[..., None]
        last_place = places.gather(1, last.clamp(min=0)).float()  # 0 where no real column
        entries = zip(kept, soft, (last_states, last_place, torch.zeros_like(last_place)), strict=True)
        return tuple(torch.cat(entry, 1) for entry in entries)  # type: ignore[return-value]

    def _mean_total(
        self, layer_states: tuple[torch.Tensor, ...], real: torch.Tensor, config: RecurrentDecoderConfig
    ) -> torch.Tensor:
        """(batch, 1, hidden) float32: the source states summed over the real columns, `real` (batch, cols) float32
        (1 at the real columns, else 0)."""
        if config.memory_source == "last_layer":
            return real[:, None, :] @ layer_states[-1].float()
        # Each layer's share is one batched product: (batch, 1, cols) weights of the real columns times (batch, cols,
        # hidden) states, accumulated into (batch, 1, hidden). Views and one unbind rather than indexing: fewer
        # operators per step, forward and backward.
        batch, cols = real.shape
        if cols == 1 and torch.compiler.is_compiling():
            # The compiled single-token step: the layer-weighted mix of one column is pointwise, which the compiler
            # fuses into the layers' own kernels; a batched product would be a kernel of its own per layer, launched
            # at every token.
            return self._source_states(layer_states, config) * real[..., None]  # (batch, 1, hidden)
        if cols == 1:
            # An eager single-token step: the layers' columns side by side and one product over them, rather than
            # a product per layer (a decoded token's operators are its cost at small sizes).
            columns = self._normalized(torch.cat(layer_states, dim=1).float(), config)  # (batch, layers, hidden)
            return torch.bmm((self.layer_weights() * real)[:, None, :], columns)  # (batch, 1, hidden)
        real_weights = self.layer_weights().view(-1, 1, 1, 1) * real.view(1, batch, 1, cols)
        first, *rest = real_weights.unbind(0)  # (batch, 1, cols) each
        pooled = torch.bmm(first, self._normalized(layer_states[0].float(), config))
        for weights, states in zip(rest, layer_states[1:], strict=True):
            pooled = torch.baddbmm(pooled, weights, self._normalized(states.float(), config))
        return pooled

    def _source_states(self, layer_states: tuple[torch.Tensor, ...], config: RecurrentDecoderConfig) -> torch.Tensor:
        """(batch, cols, hidden) float32: what the memory pools, the layer-weighted mix or the final layer."""
        if config.memory_source == "last_layer":
            return layer_states[-1].float()
        weights = self.layer_weights()
        mixed = weights[0] * self._normalized(layer_states[0].float(), config)
        for weight, states in zip(weights[1:], layer_states[1:], strict=True):
            mixed = mixed + weight * self._normalized(states.float(), config)
        return mixed

    @staticmethod
    def _normalized(states: torch.Tensor, config: RecurrentDecoderConfig) -> torch.Tensor:
        """Each token's states at unit RMS where `normalize_pooled_states` asks for it, else as they are."""
        if not config.normalize_pooled_states:
            return states
        eps = getattr(config.text_config, "rms_norm_eps", None) or 1e-6
        return states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps)

    def forward(self, window_summary: torch.Tensor) -> torch.Tensor:
        """(batch, memory_slots, hidden) `h_prev` from the window's (batch, 1 or memory_slots, hidden) summary."""
        slots = self.slot_embeddings.shape[0] if hasattr(self, "slot_embeddings") else 1
        if slots > 1:
            window_summary = window_summary.expand(-1, slots, -1) + self.slot_embeddings.to(window_summary.dtype)
        batch, _, hidden = window_summary.shape
        # As (rows, hidden): the paper's one slot runs the network exactly as on a (batch, hidden) summary.
        return self.ffn(window_summary.reshape(batch * slots, hidden)).view(batch, slots, hidden)


def _softmax_share(
    states: torch.Tensor, scores: torch.Tensor, real: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's share of softmax pooling, per query: `(total, weight, reference)` as `RecurrentDecoderRecurrence.pool`
    describes. states: (batch, cols, hidden); scores: (batch, cols, queries); real: (batch, cols) bool."""
    scores = scores.masked_fill(~real[:, :, None], float("-inf"))
    # Softmax pooling does not depend on the reference, so no gradient flows through it.
    reference = scores.detach().amax(1)  # (batch, queries)
    reference = torch.where(torch.isfinite(reference), reference, torch.zeros_like(reference))
    weights = torch.exp(scores - reference[:, None])  # (batch, cols, queries), 0 at padding
    return weights.transpose(1, 2) @ states, weights.sum(1), reference


def keep_best(
    states: torch.Tensor, places: torch.Tensor, scores: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k best-scoring of a row's candidate tokens, in window order: `(states, places, scores)` of them,
    (batch, k, hidden), (batch, k), (batch, k). A candidate's place is its window position + 1, 0 for an empty entry
    (zero states and score), which ranks below every token; equal scores rank the later token first. The order is
    total, so keeping the best of the best of each part gives the best of the whole: a window read in steps keeps what
    it keeps read at once. states: (batch, candidates, hidden); places, scores: (batch, candidates) float32."""
    missing = k - places.shape[1]
    if missing > 0:
        states = torch.nn.functional.pad(states, (0, 0, 0, missing))
        places, scores = (torch.nn.functional.pad(t, (0, missing)) for t in (places, scores))
    # Two stable sorts rank by score, then by place: latest first, then best first keeping that order among ties.
    by_place = places.argsort(dim=1, descending=True, stable=True)
    ranked = scores.gather(1, by_place).masked_fill(places.gather(1, by_place) == 0, float("-inf"))
    best = by_place.gather(1, ranked.argsort(dim=1, descending=True, stable=True)[:, :k])  # (batch, k)
    best = best.gather(1, places.gather(1, best).argsort(dim=1, stable=True))  # in window order, empty entries first
    return (
        states.gather(1, best[..., None].expand(-1, -1, states.shape[2])),
        places.gather(1, best),
        scores.gather(1, best),
    )


def selected_summary(pooled_sum: torch.Tensor, pooled_weight: torch.Tensor, kept_slots: int) -> torch.Tensor:
    """(batch, k, hidden) float32: a selecting memory's window summary, its kept tokens' states, plus the softmax
    share of all its tokens less the same detached: nothing in the forward, but every token's score gets the gradient
    of moving the slots towards its states (the choice itself has none). pooled_sum (batch, k + 2, hidden),
    pooled_weight (batch, k + 2) as `RecurrentDecoderRecurrence.pool` returns them merged."""
    share = slice(kept_slots, kept_slots + 1)
    # A weight is at least 1 once a token is pooled: the best token's own exp(0).
    soft = pooled_sum[:, share] / pooled_weight[:, share].clamp(min=1)[..., None]  # (batch, 1, hidden)
    return pooled_sum[:, :kept_slots] + (soft - soft.detach())


def kept_token_slots(config: RecurrentDecoderConfig) -> int:
    """How many of a window's pooled entries are kept tokens (`memory_pooling="select"`: the memory's slots, then one
    softmax share and the last token read), 0 where every entry is a pooled sum."""
    return config.memory_slots if config.selects_tokens else 0


def merge_pooled(
    pooled: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    step: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    kept_slots: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A window's pooled `(total, weight, reference)` so far (see `RecurrentDecoderRecurrence.pool`) with one more
    step's: softmax pooling rescales both to the higher reference, as streaming softmax does; the mean adds up; the
    first `kept_slots` entries of a selecting memory keep the best of both (`keep_best`)."""
    if kept_slots:
        k = kept_slots
        candidates = [torch.cat([old[:, :k], new[:, :k]], 1) for old, new in zip(pooled, step, strict=True)]
        kept = keep_best(*candidates, k)
        soft = merge_pooled(tuple(t[:, k : k + 1] for t in pooled), tuple(t[:, k : k + 1] for t in step))
        # The last token read: the step's, where it read one.
        stepped = step[1][:, k + 1 :] > 0  # (batch, 1)
        last = [
            torch.where(stepped[..., None] if old.dim() == 3 else stepped, new[:, k + 1 :], old[:, k + 1 :])
            for old, new in zip(pooled, step, strict=True)
        ]
        return tuple(torch.cat(entry, 1) for entry in zip(kept, soft, last, strict=True))  # type: ignore[return-value]
    total, weight, reference = pooled
    step_total, step_weight, step_reference = step
    if step_reference is None:
        return total + step_total, weight + step_weight, reference
    # A row that has pooled nothing yet (weight 0) has no reference: the step's is taken.
    merged = torch.where(weight > 0, torch.maximum(reference, step_reference), step_reference)  # (batch, k)
    # At most 1 each (clamped where the row had pooled nothing, whose total and weight are 0 anyway).
    old, new = torch.exp((reference - merged).clamp(max=0)), torch.exp(step_reference - merged)
    return total * old[..., None] + step_total * new[..., None], weight * old + step_weight * new, merged


@dataclass
class _StepOutput:
    # The causal LM's scores of the step's kept columns, (batch, kept, vocab), or the bare model's final hidden
    # states of its new columns, (batch, new, hidden); None where a step head consumed it.
    result: torch.Tensor | None
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    # The step's share of the window's pooled states, (total, weight, reference) (see
    # `RecurrentDecoderRecurrence.pool`); None once the state has merged it
    pooled: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None
    all_hidden: tuple[torch.Tensor, ...] | None  # embedding output and every layer's, (batch, new, hidden) each
    head: torch.Tensor | None  # what step_head returned (the window's loss)
    attentions: tuple[torch.Tensor, ...] | None  # per layer, (batch, head, new, 1 + window_size)

    def flat(self) -> tuple[torch.Tensor | None, ...]:
        return (
            self.result,
            *(self.pooled or (None, None, None)),
            self.head,
            *self.keys,
            *self.values,
            *(self.all_hidden or ()),
            *(self.attentions or ()),
        )

    @classmethod
    def from_flat(cls, flat: tuple[torch.Tensor | None, ...], num_layers: int, settings: "_StepSettings"):
        result, *pooled, head = flat[:5]
        keys, values = list(flat[5 : 5 + num_layers]), list(flat[5 + num_layers : 5 + 2 * num_layers])
        rest = flat[5 + 2 * num_layers :]
        all_hidden = rest[: num_layers + 1] if settings.output_hidden_states else None
        attentions = rest[-num_layers:] if settings.output_attentions else None
        return cls(result, keys, values, tuple(pooled), all_hidden, head, attentions)

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
    # The call's position ids and masks by step shape, while the rows are in lockstep (None: made in every step).
    lockstep_tensors: _LockstepTensors | None = None
