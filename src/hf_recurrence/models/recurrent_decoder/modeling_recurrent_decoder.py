# SPDX-License-Identifier: Apache-2.0
"""PyTorch recurrence over any stock transformers decoder, after Yoshida, Ettinger and Gimpel (2020), "Adding
Recurrence to Pretrained Transformers for Improved Efficiency and Context Size".

The model holds the stock `XForCausalLM` of its backbone, built by transformers itself (`self.backbone`), and the
recurrence (`self.recurrence`). It reads text window by window; each window step calls the stock forward once, with
the window's embeddings and position ids, under the registered attention name `recurrent_<sdpa|eager>`. That name
has no mask function, so the backbone builds no mask, and every layer's attention call reaches `recurrent_attention`
with the step context (`recurrence=` keyword), which joins the window's cached keys/values and, at the insertion
layer, the key/value of `h_prev` (computed by the layer's own attention code) and applies the step's per-row masks.
The family's rotary embedding, embedding scaling, norms, biases and head post-processing are therefore its own.
"""

import copy
import functools
import inspect
import json
import os
import sys
import tempfile
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    GenerationConfig,
    GenerationMixin,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming, apply_renamings
from transformers.generation import CompileConfig, MaxLengthCriteria, StoppingCriteriaList
from transformers.modeling_layers import (
    GenericForSequenceClassification,
    GenericForTokenClassification,
    GradientCheckpointingLayer,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.utils import ModelOutput, logging

from .configuration_recurrent_decoder import (
    PRE_ATTENTION_NORMS,
    RecurrentDecoderConfig,
    RecurrentGPT2Config,
    RecurrentLlamaConfig,
    check_backbone,
)


logger = logging.get_logger(__name__)

# transformers 5.24 renamed `past_key_values` to `cache`: the forward argument, the output field and what generate()
# passes back (its ModelOutput answers the old name through a property). The state travels under the installed
# version's name, and forward accepts both.
STATE_NAME = "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) else "past_key_values"
# The attention implementations the recurrence runs on: both accept a per-row mask over extra keys.
INNER_ATTENTIONS = ("sdpa", "eager")
RECURRENT_PREFIX = "recurrent_"


def _given_state(past_key_values: object | None, cache: object | None) -> object | None:
    """The state passed under either name."""
    if past_key_values is not None and cache is not None:
        raise ValueError(
            "Pass the state once: as cache or as past_key_values (its name before transformers 5.24), not both"
        )
    return past_key_values if cache is None else cache


def _right_packing_index(valid: torch.Tensor, width: int) -> torch.Tensor:
    """For each row, the indices of its slots with the valid ones last (in their original order), keeping `width`.

    valid: (batch, slots) bool. Returns (batch, width) long.
    """
    order = torch.argsort(valid.to(torch.int8), dim=1, stable=True)
    return order[:, order.shape[1] - width :]


def _gather_slots(tensor: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """Gather `index` (batch, width) along `dim` of a tensor whose first dimension is the batch."""
    shape = [1] * tensor.dim()
    shape[0], shape[dim] = index.shape
    expanded = index.view(shape).expand(*tensor.shape[:dim], index.shape[1], *tensor.shape[dim + 1 :])
    return tensor.gather(dim, expanded)


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
        insertion_layer: int,
        eager: bool,
        past: list[tuple[torch.Tensor, torch.Tensor] | None],
        plain_mask: torch.Tensor | None,
        inserted_mask: torch.Tensor,
        h_prev: torch.Tensor | None,
        h_prev_norm: Callable[[torch.Tensor], torch.Tensor],
        h_prev_rotation: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool,
        h_prev_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
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


def _decoder_layers(backbone: PreTrainedModel) -> nn.ModuleList:
    base = backbone.base_model
    return base.layers if hasattr(base, "layers") else base.h


def _attention_module(layer: nn.Module) -> nn.Module:
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attn


def _cache_geometry(text_config: PreTrainedConfig) -> dict[str, int]:
    """The sizes of the per-layer key/value cache a state holds for a backbone with `text_config`."""
    heads = text_config.num_attention_heads
    return {
        "layers": text_config.num_hidden_layers,
        "key_value_heads": getattr(text_config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text_config, "head_dim", None) or text_config.hidden_size // heads,
        "hidden_size": text_config.hidden_size,
    }


def _activation_name(text_config: PreTrainedConfig) -> str:
    """The backbone's feed-forward activation, which the recurrence network uses too."""
    for name in ("hidden_activation", "hidden_act", "activation_function"):
        value = getattr(text_config, name, None)
        if isinstance(value, str):
            return value
    return "gelu"


# Bumped whenever the tensors or the header of a saved state change meaning; a reader refuses other versions.
STATE_FILE_FORMAT_VERSION = 1
# The safetensors metadata key whose JSON value describes a saved state.
_STATE_HEADER_KEY = "hf_recurrence_state"


def _write_state_file(
    path: str | os.PathLike, tensors: dict[str, torch.Tensor], header: dict, overwrite: bool
) -> None:
    """Write `tensors` and the JSON `header` to a safetensors file, readable by its owner only (it holds what the
    model read). The file is written under a temporary name beside `path` and put in place in one step, so a failed
    write never leaves half a state or a temporary file behind. Without `overwrite` the final name is created
    exclusively (a hard link fails if the name exists), so of two writers of one path only one succeeds."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    header = {**header, "format_version": STATE_FILE_FORMAT_VERSION}
    # safetensors refuses tensors that share memory (a fresh state repeats one empty cache tensor per layer).
    owned = {name: t.detach().contiguous().clone() for name, t in tensors.items()}
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(descriptor)
    try:
        save_file(owned, partial, metadata={_STATE_HEADER_KEY: json.dumps(header, sort_keys=True)})
        if overwrite:
            os.replace(partial, path)
        else:
            try:
                os.link(partial, path)
            except FileExistsError:
                raise FileExistsError(
                    f"{path} was created by another writer meanwhile; pass overwrite=True to replace it"
                ) from None
    finally:
        Path(partial).unlink(missing_ok=True)


def _read_state_file(
    path: str | os.PathLike, family: str, device: torch.device | str | None
) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors (on `device`) and the header of a state file written by `_write_state_file` for `family`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No state file at {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu" if device is None else str(device)) as file:
            raw = (file.metadata() or {}).get(_STATE_HEADER_KEY)
            if raw is None:
                # Refused before reading any tensor: a weights file may be large.
                raise ValueError(
                    f"{path} is not a saved recurrent state: its safetensors header has no {_STATE_HEADER_KEY!r}"
                )
            tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (no __iter__)
    except SafetensorError as error:
        raise ValueError(f"{path} is not a safetensors file: {error}") from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{path} has a malformed state header ({_STATE_HEADER_KEY!r}): {error}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} has a malformed state header: a JSON {type(header).__name__}, not an object")
    if header.get("family") != family:
        raise ValueError(
            f"{path} holds a state of the {header.get('family')!r} family; this model family is {family!r}"
        )
    if header.get("format_version") != STATE_FILE_FORMAT_VERSION:
        raise ValueError(
            f"{path} was written in state file format version {header.get('format_version')!r}; this version of "
            f"hf_recurrence reads version {STATE_FILE_FORMAT_VERSION} only"
        )
    return tensors, header


def _header_int(header: dict, name: str, source: object, minimum: int = 0) -> int:
    """The whole number `header[name]`, refused unless it is one (not a bool, float or string) and >= `minimum`."""
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{source} has a malformed {name!r} in its header: {value!r}, expected an integer >= {minimum}"
        )
    return value


def _check_finite(tensors: dict[str, torch.Tensor], source: object) -> None:
    """Refuse NaN or infinite values, which no run of the model leaves in a state and which would reach the logits."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{source} has non-finite values (NaN or inf) in {name!r}")


def _check_state_model_shape(found: dict, expected: dict, source: object) -> None:
    """Refuse a state of another model shape (backbone, layers, heads, sizes), batch size or dtype than `expected`,
    naming every difference in one error."""
    found = found if isinstance(found, dict) else {}
    differences = [
        f"{key}={found.get(key)!r} ({'the input' if key == 'batch_size' else 'this model'}: {value!r})"
        for key, value in expected.items()
        if found.get(key) != value
    ]
    if differences:
        cast = "dtype" in expected and found.get("dtype") != expected["dtype"]
        raise ValueError(
            f"{source} does not fit this model: "
            + ", ".join(differences)
            + ("; cast the state with state.to(dtype=...) or load the model in the state's dtype" if cast else "")
        )


def _refuse_export(model: nn.Module) -> None:
    """Raise when `model` runs under torch.export (and the dynamo ONNX exporter), TorchScript tracing or the
    TorchScript ONNX exporter; torch.compile is not refused (it guards and recompiles where a trace would not)."""
    if torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        # The window/segment plan (lengths, padding, packed documents, the state's fill) is made in Python from the
        # input's values: an export fails on it, and a TorchScript trace fixes one input's plan into the graph,
        # silently wrong for any other length.
        raise RuntimeError(
            f"{type(model).__name__} cannot be exported or traced (torch.export, torch.onnx.export, "
            "torch.jit.trace): it plans its windows and the state it carries from the input's length, padding and "
            "positions in Python, so a graph would hold one input's plan. Run it eagerly or under torch.compile"
        )


def _document_starts(position_ids: torch.Tensor | None, real: torch.Tensor, continuing: bool) -> torch.Tensor | None:
    """Where packed documents begin, read from `position_ids` (batch, length) as TRL's and transformers' packing
    collators write them: positions count up by one inside a document and restart at 0 where the next one begins.

    real: (batch, length) bool, True at real tokens (the positions of padding are not read). continuing: whether the
    rows already hold text from earlier calls (a state was passed); then a row's first position may be anything
    (the row's text goes on) or 0 (a new document). Returns (batch, length) bool, True at the real tokens that start
    a document after earlier text of their row, or None when there is no such token (plain positions 0, 1, ...).
    """
    if position_ids is None:
        return None
    batch, length = real.shape
    if position_ids.dim() != 2 or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != length:
        raise ValueError(
            f"position_ids must be (batch, length) like the input, or (1, length); got shape "
            f"{tuple(position_ids.shape)} for input of shape {(batch, length)}"
        )
    positions = position_ids.to(real.device).expand(batch, length)
    columns = torch.arange(length, device=real.device)
    # The latest real column before each column, -1 where there is none: padding is skipped, not counted.
    latest = torch.where(real, columns, -1).cummax(1).values  # (batch, length)
    previous = nn.functional.pad(latest[:, :-1], (1, 0), value=-1)
    has_previous = previous >= 0
    follows = has_previous & (positions == positions.gather(1, previous.clamp(min=0)) + 1)
    restarts = positions == 0
    bad = real & ~restarts & ~follows & (has_previous | (not continuing))
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        if has_previous[row, column]:
            problem = f"position {int(positions[row, column])} follows {int(positions[row, previous[row, column]])}"
        else:
            problem = f"the row's first position is {int(positions[row, column])} but no state passed as {STATE_NAME} continues it"
        raise ValueError(
            "position_ids must count up by one within each packed document and restart at 0 where the next one "
            f"begins; at row {row}, column {column}, {problem}"
        )
    starts = real & restarts & (has_previous | continuing)
    return starts if bool(starts.any()) else None


def _drop_cross_document_targets(targets: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """(batch, length) shifted targets without those of the positions followed by a document start (position 0): the
    last token of a packed document does not predict the first token of the next."""
    if position_ids is None or position_ids.shape[-1] != targets.shape[-1]:
        # A misshapen position_ids is reported by `_document_starts`.
        return targets
    next_starts = nn.functional.pad(position_ids[..., 1:] == 0, (0, 1), value=False)  # ([batch,] length)
    return targets.masked_fill(next_starts.to(targets.device), -100)


class RecurrentDecoderWindowStep(GradientCheckpointingLayer):
    """The unit that gradient checkpointing recomputes: the whole backbone over one stretch of a window (`run`, the
    model's `_step`). It holds no weights, so the backbone keeps its checkpoint names. Checkpointing whole window
    steps keeps only each window's inputs (its embeddings and the cached keys/values) for the backward pass."""

    def forward(self, run: Callable, settings: "_StepSettings", *tensors: torch.Tensor) -> tuple:
        # Everything positional and a flat tuple out: the reentrant checkpoint connects only the tensors of a tuple
        # output to the graph, and its recompute must see this call's arguments.
        return run(settings, *tensors).flat()


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

    def forward(self, window_summary: torch.Tensor) -> torch.Tensor:
        return self.ffn(window_summary)  # (batch, hidden)


class RecurrentDecoderState:
    """Everything the recurrence carries from one call to the next, passed as `past_key_values` (`cache` from
    transformers 5.24 on).

    The model reads its input in windows of `window_size` tokens that repeat the last `window_overlap` tokens of the
    previous window; the schedule belongs to the state (the config's by default) and is fixed for its life. Per row:

    - `keys[i]`, `values[i]`: `(batch, kv_heads, slots, head_dim)` key/value cache of layer `i` for the current
      window, as the layer's attention received them (rotated, normed); padding slots are marked in `slot_valid`,
    - `fill`: `(batch,)` real tokens in the current window, and `window_index`: `(batch,)` windows completed,
    - `pooled_sum`: `(batch, hidden)` float32 running sum of the layer-weighted hidden states of the current window,
    - `h_prev`: `(batch, hidden)` the summary of the previous window that the current one sees,
    - `overlap_embeds`: `(batch, window_overlap, hidden)` token embeddings of the last `window_overlap` real tokens,
      which the next window re-reads, with `overlap_valid`: `(batch, window_overlap)`.

    What users call: `save`, `load`, `reset`, `detach`, `to`, `reorder_cache`, `get_seq_length`. What the model calls,
    once per step and in this order: `next_step` (plan the step), `start_windows` (rows whose window is full begin the
    next one, with its `h_prev`), `with_overlap` (the columns re-read), then `append_step` (record the step); and
    `begin_documents` where a packed document starts. Rows advance independently, so a left-padded batch gives every
    row what it gets alone. Tensors keep their autograd history; `detach()` between calls truncates it.

    A state holds what the model read: treat it (and a file written by `save()`, readable by its owner only) as you
    would the text itself. A state is not thread-safe: every call updates it in place, so two threads must not run
    the model on one state at once (give each thread its own state).
    """

    # generate() asks every cache whether it can be compiled.
    is_compileable = False
    # transformers >= 5.24's generate() slices a prompt by get_seq_length() only for a cache with some layer that is
    # not linear attention (a linear layer has no length); the state has a length.
    is_linear = (False,)
    # The model_type this state belongs to: what a saved state's header names, and how copies of this class (the
    # installed one and one loaded as Hub remote code) recognise each other's states.
    _family = "recurrent_decoder"

    _BATCH_TENSORS = (
        "slot_valid",
        "fill",
        "window_index",
        "pooled_sum",
        "h_prev",
        "overlap_embeds",
        "overlap_valid",
    )

    def __init__(
        self,
        config: RecurrentDecoderConfig,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        window_size: int | None = None,
        window_overlap: int | None = None,
    ):
        window_size = config.window_size if window_size is None else window_size
        window_overlap = config.window_overlap if window_overlap is None else window_overlap
        config.check_window_schedule(window_size, window_overlap)
        self._window_size, self._window_overlap = window_size, window_overlap
        geometry = _cache_geometry(config.text_config)
        hidden = geometry["hidden_size"]
        empty_cache = torch.zeros(
            batch_size, geometry["key_value_heads"], 0, geometry["head_dim"], device=device, dtype=dtype
        )
        self.keys = [empty_cache] * geometry["layers"]
        self.values = [empty_cache] * geometry["layers"]
        self.slot_valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.fill = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.window_index = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.pooled_sum = torch.zeros(batch_size, hidden, device=device, dtype=torch.float32)
        self.h_prev = torch.zeros(batch_size, hidden, device=device, dtype=dtype)
        self.overlap_embeds = torch.zeros(batch_size, window_overlap, hidden, device=device, dtype=dtype)
        self.overlap_valid = torch.zeros(batch_size, window_overlap, dtype=torch.bool, device=device)
        self.seen_tokens = 0
        # (fill, window_index) shared by every row, known on the host, while no row has read padding: the schedule
        # is then planned without reading the device. None once rows may differ.
        self._lockstep: tuple[int, int] | None = (0, 0)
        self._backbone = config.text_config.model_type

    @property
    def batch_size(self) -> int:
        return self.fill.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model this state runs with (its float tensors but the float32 pooled sum)."""
        return self.h_prev.dtype

    @property
    def window_size(self) -> int:
        """Tokens per window of this state's run (read-only: the rows' fill counts are relative to it)."""
        return self._window_size

    @property
    def window_overlap(self) -> int:
        """Tokens each window re-reads from the one before (read-only: `overlap_embeds` is sized by it)."""
        return self._window_overlap

    @property
    def has_h_prev(self) -> torch.Tensor:
        """(batch,) bool: whether the current window of each row has an `h_prev` (every window but the first)."""
        return self.window_index > 0

    @property
    def lockstep(self) -> tuple[int, int] | None:
        """`(fill, window_index)` of every row while all rows have read the same number of tokens and no padding;
        None otherwise."""
        return self._lockstep

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of input positions (padding included) consumed so far; what `generate` slices new tokens by."""
        return self.seen_tokens

    def detach(self) -> "RecurrentDecoderState":
        """Cut the autograd history of every tensor (truncated BPTT between calls). Returns `self`."""
        return self._map(torch.Tensor.detach)

    def reset(self) -> "RecurrentDecoderState":
        """Forget everything: the next token starts a fresh first window. Returns `self`."""
        self._empty_cache()
        for name in ("fill", "window_index", "pooled_sum", "h_prev", "overlap_embeds", "overlap_valid"):
            setattr(self, name, torch.zeros_like(getattr(self, name)))
        self.seen_tokens = 0
        self._lockstep = (0, 0)
        return self

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> "RecurrentDecoderState":
        """Move to `device`; floating tensors other than the float32 pooled sum are cast to `dtype`. Returns `self`."""

        def move(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if dtype is not None and t.is_floating_point() and t is not self.pooled_sum else None
            return t.to(device=device, dtype=cast)

        return self._map(move)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row `i` becomes old row `beam_idx[i]`."""
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Write the state to a safetensors file (its tensors plus a JSON header: family, format version, model shape,
        the state's settings), to continue the text later, elsewhere, or with the model loaded as remote code.
        Autograd history is not saved. Refuses to replace an existing file unless `overwrite=True`."""
        tensors, header = self._file_contents()
        _write_state_file(path, tensors, header, overwrite)

    @classmethod
    def load(
        cls, path: str | os.PathLike, config: RecurrentDecoderConfig, device: torch.device | str | None = None
    ) -> "RecurrentDecoderState":
        """Read a state written by `save()` for a model with `config`, onto `device` (default: CPU).

        Refuses, naming the difference, a file of another model family, of another backbone or model shape, of
        another state file format version, or with settings this config cannot run. The state is only meaningful
        with the weights that produced it; that is not checked.
        """
        tensors, header = _read_state_file(path, cls._family, device)
        _check_state_model_shape(header.get("model_shape"), cls._config_model_shape(config), path)
        return cls._from_file_contents(config, tensors, header, path)

    @classmethod
    def adopt(
        cls, state: object, config: RecurrentDecoderConfig, batch_size: int, dtype: torch.dtype
    ) -> "RecurrentDecoderState":
        """`state` as an instance of this class, checked to fit a model with `config` reading `batch_size` rows in
        `dtype` (every difference in one error): itself, or a state of the same family built by another copy of this
        class (the installed package's vs the one loaded as Hub remote code), rebuilt from its tensors (not copied)
        and checked as a file is."""
        if not isinstance(state, cls):
            state = cls._adopt_other_copy(state, config)
        found = {**state._model_shape(), "batch_size": state.batch_size, "dtype": state.dtype}
        expected = {**cls._config_model_shape(config), "batch_size": batch_size, "dtype": dtype}
        _check_state_model_shape(found, expected, STATE_NAME)
        return state

    @classmethod
    def _adopt_other_copy(cls, state: object, config: RecurrentDecoderConfig) -> "RecurrentDecoderState":
        if type(state).__name__ != cls.__name__ or getattr(state, "_family", None) != cls._family:
            # PEFT prefix tuning is the usual source of a transformers Cache here: it pre-fills one with its
            # virtual tokens, which a state bounded by one window has no place for.
            raise TypeError(
                f"{STATE_NAME} must be a {cls.__name__} returned by this model (or saved by one and read with "
                f"{cls.__name__}.load), got {type(state).__name__}. A transformers Cache cannot carry this model's "
                "recurrent state, so PEFT prefix tuning (which passes one holding its virtual tokens) is not "
                "supported; LoRA and prompt tuning are"
            )
        tensors, header = state._file_contents()
        source = f"the {type(state).__module__} state"
        _check_state_model_shape(header.get("model_shape"), cls._config_model_shape(config), source)
        return cls._from_file_contents(config, tensors, header, source)

    def next_step(self, real: torch.Tensor) -> tuple[torch.Tensor | None, int, int]:
        """Plan the next step over the input columns still to read, `real` ((batch, remaining) bool, True at real
        tokens). Returns the rows that begin a new window first ((batch,) bool: a full window and a real token to
        come; None if no row does), how many tokens those rows re-read (`window_overlap`, or 0 when none begins), and
        how many columns the step takes: as many as fit in the window of every row that has a real token to come.
        """
        if self._lockstep is not None:
            # Every row begins a window when one does, and nothing is read from the device (`real` is all True).
            fill, _ = self._lockstep
            if fill < self.window_size:
                return None, 0, min(real.shape[1], self.window_size - fill)
            starting = torch.ones(self.batch_size, dtype=torch.bool, device=self.fill.device)
            return starting, self.window_overlap, min(real.shape[1], self.window_size - self.window_overlap)
        pending = real.any(1)
        starting = (self.fill == self.window_size) & pending
        if not bool(starting.any()):
            starting = None
        reread = self.window_overlap if starting is not None else 0
        fill = self.fill if starting is None else torch.where(starting, reread, self.fill)  # once the windows begin
        room = self.window_size - fill
        width = int(room[pending].min()) if bool(pending.any()) else real.shape[1]
        return starting, reread, min(real.shape[1], width)

    def leave_lockstep(self) -> None:
        """The rows may differ from now on (an input with padding): plan every step from the per-row tensors."""
        self._lockstep = None

    def start_windows(self, starting: torch.Tensor, h_prev: torch.Tensor) -> None:
        """Begin a new window in the `starting` rows ((batch,) bool): it sees `h_prev` ((batch, hidden), the summary
        of the window they close; other rows' values are ignored) and starts with an empty cache."""
        if self._lockstep is not None:
            # Every row starts: no per-row selection, and the cache empties without being read.
            self.h_prev = h_prev.to(torch.promote_types(h_prev.dtype, self.h_prev.dtype))  # as torch.where would
            self.pooled_sum = torch.zeros_like(self.pooled_sum)
            self.window_index = self.window_index + 1
            self.fill = torch.zeros_like(self.fill)
            self._empty_cache()
            self._lockstep = (0, self._lockstep[1] + 1)
            return
        rows = starting[:, None]
        self.h_prev = torch.where(rows, h_prev, self.h_prev)
        self.pooled_sum = torch.where(rows, torch.zeros_like(self.pooled_sum), self.pooled_sum)
        self.window_index = self.window_index + starting.long()
        self.fill = torch.where(starting, torch.zeros_like(self.fill), self.fill)
        self.slot_valid = self.slot_valid & ~rows
        self._compact()

    def begin_documents(self, rows: torch.Tensor) -> None:
        """Forget the text of the `rows` ((batch,) bool): their next token starts a new document in a first window
        without `h_prev` or overlap to re-read, as in a new state (a boundary of packed sequences)."""
        self.leave_lockstep()
        self.start_windows(rows, torch.zeros_like(self.h_prev))
        self.window_index = self.window_index.masked_fill(rows, 0)
        self.overlap_valid = self.overlap_valid & ~rows[:, None]

    def with_overlap(
        self, embeds: torch.Tensor, real: torch.Tensor, starting: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's columns when windows begin: the overlap the `starting` rows re-read (padding in the other rows),
        then the new columns; (batch, overlap + new, hidden) embeddings and (batch, overlap + new) real mask."""
        embeds = torch.cat([self.overlap_embeds, embeds], dim=1)
        real = torch.cat([self.overlap_valid & starting[:, None], real], dim=1)
        return embeds, real

    def append_step(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        step_real: torch.Tensor,
        pooled: torch.Tensor,
        new_embeds: torch.Tensor,
        new_real: torch.Tensor,
    ) -> None:
        """Record a step: every layer's cache of the current window, the step's real-token mask `step_real`
        (batch, cols) (any re-read overlap, then the new columns), the layer-weighted sum of its hidden states
        `pooled` (batch, hidden), and the new columns' embeddings (batch, new, hidden) and mask (batch, new)."""
        self._record_cache(keys, values, step_real)
        self.fill = self.fill + step_real.sum(1)
        if self._lockstep is not None:
            self._lockstep = (self._lockstep[0] + step_real.shape[1], self._lockstep[1])
        self.pooled_sum = self.pooled_sum + pooled
        self._remember_overlap(new_embeds, new_real)
        self.seen_tokens += new_real.shape[1]

    def _record_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor], step_real: torch.Tensor) -> None:
        """Keep a step's per-layer keys/values (cached slots then the step's columns) and mark its real columns; runs
        before `fill` counts them."""
        self.keys, self.values = keys, values
        self.slot_valid = torch.cat([self.slot_valid, step_real], dim=1)
        if self.slot_valid.shape[1] > self.window_size:
            # Padding columns occupy slots without filling windows; drop them so memory stays one window.
            self._compact()

    def window_summary(self) -> torch.Tensor:
        """(batch, hidden) float32: each row's layer-weighted hidden states averaged over its current window."""
        return self.pooled_sum / self.fill.clamp(min=1)[:, None]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "RecurrentDecoderState":
        self.keys = [fn(k) for k in self.keys]
        self.values = [fn(v) for v in self.values]
        for name in self._BATCH_TENSORS:
            setattr(self, name, fn(getattr(self, name)))
        return self

    def _compact(self) -> None:
        """Drop cache slots that no row needs, moving each row's valid slots to the right."""
        slots = self.slot_valid.shape[1]
        width = int(self.slot_valid.sum(1).max()) if slots else 0
        if width == slots:
            return
        if width == 0:
            self._empty_cache()
            return
        index = _right_packing_index(self.slot_valid, width)
        self.keys = [_gather_slots(k, index, 2) for k in self.keys]
        self.values = [_gather_slots(v, index, 2) for v in self.values]
        self.slot_valid = self.slot_valid.gather(1, index)

    def _empty_cache(self) -> None:
        # Fresh empty tensors: a gather or a slice would keep the dropped keys' storage alive in the autograd graph.
        self.keys = [k.new_zeros(*k.shape[:2], 0, k.shape[3]) for k in self.keys]
        self.values = [v.new_zeros(*v.shape[:2], 0, v.shape[3]) for v in self.values]
        self.slot_valid = self.slot_valid.new_zeros(self.batch_size, 0)

    def _remember_overlap(self, embeds: torch.Tensor, real: torch.Tensor) -> None:
        """Keep the embeddings of the last `window_overlap` real tokens: (batch, new, hidden), (batch, new)."""
        if self.window_overlap == 0:
            return
        embeds = torch.cat([self.overlap_embeds, embeds], dim=1)
        real = torch.cat([self.overlap_valid, real], dim=1)
        index = _right_packing_index(real, self.window_overlap)
        self.overlap_embeds = _gather_slots(embeds, index, 1)
        self.overlap_valid = real.gather(1, index)

    @classmethod
    def _config_model_shape(cls, config: RecurrentDecoderConfig) -> dict:
        """The backbone and sizes of a model that a state belongs to, as a saved state records them (a named
        family's states, saved before the core, do not record their one backbone)."""
        backbone = {"backbone": config.text_config.model_type} if cls._family == RecurrentDecoderState._family else {}
        return {**backbone, **_cache_geometry(config.text_config)}

    def _file_contents(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Every tensor by name and the header that lets `_from_file_contents` rebuild the state."""
        tensors = {name: getattr(self, name) for name in self._BATCH_TENSORS}
        for i, (key, value) in enumerate(zip(self.keys, self.values, strict=True)):
            tensors[f"keys.{i}"], tensors[f"values.{i}"] = key, value
        header = {
            "family": self._family,
            "window_size": self.window_size,
            "window_overlap": self.window_overlap,
            "seen_tokens": self.seen_tokens,
            "lockstep": self._lockstep,
            "model_shape": self._model_shape(),
        }
        return tensors, header

    def _model_shape(self) -> dict:
        """The backbone and sizes of the model this state's tensors come from, as `_config_model_shape` gives them."""
        key = self.keys[0]  # (batch, kv_heads, slots, head_dim)
        return {
            "backbone": self._backbone,
            "layers": len(self.keys),
            "key_value_heads": key.shape[1],
            "head_dim": key.shape[3],
            "hidden_size": self.h_prev.shape[1],
        }

    @classmethod
    def _from_file_contents(
        cls, config: RecurrentDecoderConfig, tensors: dict[str, torch.Tensor], header: dict, source: object
    ) -> "RecurrentDecoderState":
        """The state that `_file_contents` described, checked tensor by tensor against a fresh one's shapes."""
        window_size = _header_int(header, "window_size", source, minimum=1)
        window_overlap = _header_int(header, "window_overlap", source)
        seen_tokens = _header_int(header, "seen_tokens", source)
        try:
            batch = tensors["fill"].shape[0]
            layers = config.text_config.num_hidden_layers
            keys = [tensors[f"keys.{i}"] for i in range(layers)]
            values = [tensors[f"values.{i}"] for i in range(layers)]
        except KeyError as error:
            raise ValueError(f"{source} is not a complete recurrent state: it lacks {error}") from None
        fill = tensors["fill"]
        try:
            state = cls(
                config, batch, fill.device, keys[0].dtype, window_size=window_size, window_overlap=window_overlap
            )
        except ValueError as error:
            raise ValueError(f"{source} cannot run with this model: {error}") from None
        slots = tensors["slot_valid"].shape[1] if "slot_valid" in tensors else 0
        for name in cls._BATCH_TENSORS:
            fresh = getattr(state, name)
            given = tensors.get(name)
            expected = (batch, slots) if name == "slot_valid" else fresh.shape
            if given is None or given.shape != expected or given.dtype != fresh.dtype:
                raise ValueError(
                    f"{source} has a malformed {name!r}: expected {tuple(expected)} {fresh.dtype}, got "
                    f"{None if given is None else (tuple(given.shape), given.dtype)}"
                )
            setattr(state, name, given)
        expected_cache = (batch, state.keys[0].shape[1], slots, state.keys[0].shape[3])
        for name, cache in (("keys", keys), ("values", values)):
            if any(t.shape != expected_cache or t.dtype != state.dtype for t in cache):
                raise ValueError(
                    f"{source} has {name} of shapes {[tuple(t.shape) for t in cache]} and dtypes "
                    f"{sorted({str(t.dtype) for t in cache})}, expected {expected_cache} {state.dtype}"
                )
        state.keys, state.values = keys, values
        state.seen_tokens = seen_tokens
        state._check_values(source)
        lockstep = header.get("lockstep")
        if lockstep is not None:
            if not (
                isinstance(lockstep, list | tuple)
                and len(lockstep) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) for n in lockstep)
            ):
                raise ValueError(f"{source} has a malformed 'lockstep' in its header: {lockstep!r}")
            fill, window_index = lockstep
            if not (bool((state.fill == fill).all()) and bool((state.window_index == window_index).all())):
                raise ValueError(
                    f"{source} claims every row at fill {fill} of window {window_index}, which its rows are not"
                )
            state._lockstep = (fill, window_index)
        else:
            state._lockstep = None
        return state

    def _check_values(self, source: object) -> None:
        """Refuse what no run of the model leaves in a state: non-finite tensors, window counters outside the window
        or inconsistent with the cache and with `seen_tokens`."""
        tensors, _ = self._file_contents()
        _check_finite(tensors, source)
        size, overlap = self.window_size, self.window_overlap
        if bool(((self.fill < 0) | (self.fill > size)).any()) or bool((self.window_index < 0).any()):
            raise ValueError(
                f"{source} has 'fill' {self.fill.tolist()} or 'window_index' {self.window_index.tolist()} outside "
                f"the window (0 <= fill <= window_size={size}, window_index >= 0)"
            )
        if not torch.equal(self.slot_valid.sum(1), self.fill):
            raise ValueError(
                f"{source} has 'fill' {self.fill.tolist()} but {self.slot_valid.sum(1).tolist()} valid cache slots "
                "('slot_valid')"
            )
        # Tokens each row has read at least: its first window, then window_size - window_overlap new ones per window.
        read = torch.where(
            self.window_index > 0, size + (self.window_index - 1) * (size - overlap) + self.fill - overlap, self.fill
        )
        if bool((read > self.seen_tokens).any()):
            raise ValueError(
                f"{source} has 'seen_tokens'={self.seen_tokens}, fewer than its rows have read ({read.tolist()}, from "
                "'window_index' and 'fill')"
            )

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(backbone={self._backbone!r}, batch_size={self.batch_size}, "
            f"seen_tokens={self.seen_tokens}, window_size={self.window_size}, window_overlap={self.window_overlap}, "
            f"fill={self.fill.tolist()}, window_index={self.window_index.tolist()}, "
            f"cache_slots={self.slot_valid.shape[1]})"
        )


# Fixed-shape window cache: generate(cache_implementation="static").
#
# transformers checks `cache_implementation` against its own list of names (GenerationConfig.validate), so a name of
# our own cannot reach the model; ours answers to "static", whose meaning it keeps: a cache preallocated at one shape
# for the whole run and written in place, so that the single-token decode step compiles once.

# The cache_implementation that selects the fixed-shape state.
FIXED_SHAPE_CACHE_IMPLEMENTATION = "static"


class FixedShapeWindowCache:
    """Mixin over a state class: each layer's window cache is a preallocated `(batch, kv_heads, 1 + window_size,
    head_dim)` buffer written in place, instead of a tensor that grows by one slot per token and is compacted.

    A row's token at window position `j` lives in slot `j`, so a row's valid slots are always its first `fill` ones;
    slot `window_size` receives the step's padding columns and is never valid. A new window only clears `slot_valid`:
    the stale keys are masked until overwritten. Every single-token step thus sees tensors of the same shapes, and the
    model runs it compiled when `compile_config` is set (see `_fixed_shape_decode`): the step, the cache write and the
    state's bookkeeping in one graph that updates the state's tensors in place. Meant for inference.
    """

    # How the model compiles the single-token step for this state (set by generate(), as for the stock static cache);
    # None runs it eagerly.
    compile_config: CompileConfig | None = None

    def __init__(
        self,
        config: RecurrentDecoderConfig,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        window_size: int | None = None,
        window_overlap: int | None = None,
    ):
        super().__init__(config, batch_size, device, dtype, window_size, window_overlap)
        slots = self.window_size + 1
        # One buffer per layer (the base class shares one empty tensor): (batch, kv_heads, 1 + window_size, head_dim).
        self.keys = [k.new_zeros(*k.shape[:2], slots, k.shape[3]) for k in self.keys]
        self.values = [v.new_zeros(*v.shape[:2], slots, v.shape[3]) for v in self.values]
        self.slot_valid = self.slot_valid.new_zeros(self.batch_size, slots)  # (batch, 1 + window_size)
        # A bound on every row's fill known on the host (None: not known), so that a compiled single-token step knows
        # without reading the device that no row begins a window in it; the compiled steps raise it by one each.
        self._fill_bound: int | None = None
        # (h_prev, the model, h_prev's key, its value) at the model's insertion layer: fixed for a whole window.
        self._h_prev_kv: tuple[torch.Tensor, weakref.ref, torch.Tensor, torch.Tensor] | None = None
        # The model whose eager call last checked this state (inputs, config, shapes): its compiled single-token
        # calls trust that check instead of repeating it per token (see `RecurrentDecoderForCausalLM.forward`).
        self._checked_by: weakref.ref | None = None

    def h_prev_key_value(self, model: "RecurrentDecoderWindowModel") -> tuple[torch.Tensor, torch.Tensor]:
        """`h_prev`'s key and value at `model`'s insertion layer, (batch, kv_heads, 1, head_dim) each: computed when
        `h_prev` changed (every change binds a new tensor: `start_windows`, `reset`, `to`, `reorder_cache`), else
        kept. They hold the weights of the call that computed them: meant for a text read with fixed weights."""
        cached = self._h_prev_kv
        if cached is None or cached[0] is not self.h_prev or cached[1]() is not model:
            cached = self._h_prev_kv = (self.h_prev, weakref.ref(model), *model._h_prev_key_value(self.h_prev))
        return cached[2], cached[3]

    def decodes_inside_windows(self) -> bool:
        """Whether the next single-token step begins no window in any row (every fill below `window_size`), known
        on the host: from the lockstep, from the bound the compiled steps keep, or else read from the device (once
        after each call that ran eagerly, so about once per window and row offset)."""
        if self._fill_bound is None:
            self._fill_bound = self.lockstep[0] if self.lockstep is not None else int(self.fill.max())
        return self._fill_bound < self.window_size

    def _record_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor], step_real: torch.Tensor) -> None:
        """Write the step's columns, the last `cols` of each layer's (batch, kv_heads, slots + cols, head_dim) keys
        and values, into the buffers: a real column at its window position, padding into the spare slot."""
        self._fill_bound = None  # an eager step: the next compiled one reads the fills again
        cols = step_real.shape[1]
        # (batch, cols): window position of each real column (steps stay inside every row's window), else the spare.
        slot = torch.where(step_real, self.fill[:, None] + step_real.cumsum(1) - 1, self.window_size)
        for buffer, step in zip(self.keys + self.values, keys + values, strict=True):
            index = slot[:, None, :, None].expand(step.shape[0], step.shape[1], cols, step.shape[3])
            buffer.scatter_(2, index, step[:, :, -cols:])
        self.slot_valid = self.slot_valid.scatter(1, slot, step_real)

    def _compact(self) -> None:
        """Nothing to move: each row's valid slots are already its first `fill` ones."""

    def _empty_cache(self) -> None:
        # The stale keys stay, masked, until the window's tokens overwrite them.
        self.slot_valid = torch.zeros_like(self.slot_valid)


@functools.cache
def fixed_shape_state_class(state_class: type[RecurrentDecoderState]) -> type[RecurrentDecoderState]:
    """`state_class` with the fixed-shape window cache: still an instance of `state_class` (same family, same files),
    so the models of that family take it as their state."""
    return type(f"FixedShape{state_class.__name__}", (FixedShapeWindowCache, state_class), {"__module__": __name__})


def _fixed_shape_step(state: RecurrentDecoderState, settings: "_StepSettings") -> "_StepSettings":
    """A step's settings over `state`: over a fixed-shape state the step always joins `h_prev` (masked in rows whose
    window has none) and reads whether columns are real from the mask, as the compiled single-token step does."""
    if not isinstance(state, FixedShapeWindowCache):
        return settings
    return replace(settings, uses_h_prev=True, all_real=None)


def _fixed_shape_decode(
    model: "RecurrentDecoderWindowModel", state: RecurrentDecoderState, embeds: torch.Tensor, real: torch.Tensor
) -> torch.Tensor | None:
    """The (batch, 1, vocab) logits of one new column (`embeds` (batch, 1, hidden), `real` (batch, 1)) over a
    fixed-shape state with a `compile_config`, from one compiled step that also writes the cache and advances the
    state in place; None where the state is not such a state, gradients are on, or some row may begin a window in
    this step (that step runs eagerly: it re-reads the overlap and computes the new `h_prev`). The caller checks that
    the call asks for nothing else (logits of its one column, no loss, hidden states or attentions, no document start).

    Reads nothing from the device but once after each eager step (`decodes_inside_windows`); leaves the lockstep,
    since whether the column is real is not read.
    """
    if (
        not isinstance(state, FixedShapeWindowCache)
        or state.compile_config is None
        or torch.is_grad_enabled()
        or not state.decodes_inside_windows()
    ):
        return None
    h_key, h_value = state.h_prev_key_value(model)
    state.leave_lockstep()
    step = _compiled_decode(model, state.compile_config)
    logits = step(
        _decode_settings(state.window_size),
        embeds,
        real,
        state.fill,
        state.slot_valid,
        state.window_index,
        state.h_prev,
        h_key,
        h_value,
        state.pooled_sum,
        state.overlap_embeds,
        state.overlap_valid,
        *state.keys,
        *state.values,
    )
    state._fill_bound += 1
    state.seen_tokens += 1
    return logits


@functools.cache
def _decode_settings(window_size: int) -> "_StepSettings":
    """The settings of a compiled single-token step: one object per window size, so its guards always pass."""
    return _StepSettings(
        num_new=1,
        window_size=window_size,
        logits_to_keep=1,
        step_head=None,
        output_hidden_states=False,
        output_attentions=False,
        uses_h_prev=True,
        all_real=None,
    )


def _decode_in_place(
    model: "RecurrentDecoderWindowModel",
    settings: "_StepSettings",
    embeds: torch.Tensor,
    real: torch.Tensor,
    fill: torch.Tensor,
    slot_valid: torch.Tensor,
    window_index: torch.Tensor,
    h_prev: torch.Tensor,
    h_key: torch.Tensor,
    h_value: torch.Tensor,
    pooled_sum: torch.Tensor,
    overlap_embeds: torch.Tensor,
    overlap_valid: torch.Tensor,
    *buffers: torch.Tensor,
) -> torch.Tensor:
    """One single-token step inside every row's window over a fixed-shape state's tensors, updated in place as
    `append_step` would: the step's key/value written into the buffers (a real column at its window position,
    padding into the spare slot), `slot_valid`, `fill`, `pooled_sum` and the overlap. Returns the step's logits."""
    step = model._step(
        settings, embeds, real, fill, slot_valid, window_index > 0, h_prev, None, *buffers, h_prev_kv=(h_key, h_value)
    )
    column = real[:, 0]  # (batch,)
    slot = torch.where(column, fill, settings.window_size)  # (batch,)
    for buffer, new in zip(buffers, step.keys + step.values, strict=True):
        buffer.scatter_(2, slot[:, None, None, None].expand(*buffer.shape[:2], 1, buffer.shape[3]), new[:, :, -1:])
    slot_valid.scatter_(1, slot[:, None], real)
    fill.add_(column.long())
    pooled_sum.add_(step.pooled)
    if overlap_embeds.shape[1]:
        kept_embeds = torch.cat([overlap_embeds, embeds], dim=1)
        kept_real = torch.cat([overlap_valid, real], dim=1)
        index = _right_packing_index(kept_real, overlap_embeds.shape[1])
        overlap_embeds.copy_(_gather_slots(kept_embeds, index, 1))
        overlap_valid.copy_(kept_real.gather(1, index))
    return step.result


def _compiled_decode(model: "RecurrentDecoderWindowModel", compile_config: CompileConfig) -> Callable:
    """`_decode_in_place` over `model` compiled with `compile_config`'s options; one per model and options."""
    # Looked up once per token: the last config object's step is kept, so its options are not read again.
    last = model.__dict__.get("_last_compiled_step")
    if last is not None and last[0] is compile_config:
        return last[1]
    options = compile_config.to_dict()
    key = json.dumps(options, sort_keys=True, default=repr)
    compiled = model.__dict__.setdefault("_compiled_steps", {})
    if key not in compiled:
        compiled[key] = torch.compile(functools.partial(_decode_in_place, model), **options)
    model.__dict__["_last_compiled_step"] = (compile_config, compiled[key])
    return compiled[key]


def _step_compile_config(model: PreTrainedModel, generation_config: GenerationConfig) -> CompileConfig | None:
    """How generate() compiles the single-token step: on the devices, and with the options, with which it compiles a
    stock model's forward over the stock static cache; None where it would not."""
    config = generation_config.compile_config or CompileConfig()
    compiles = model.device.type in ("cuda", "xpu", "neuron", "tpu") or bool(config._compile_all_devices)
    return config if compiles and not generation_config.disable_compile else None


# The fields every model of the core returns besides its own, as its output's docstring describes them.
_SHARED_OUTPUTS_DOC = """        past_key_values ([`RecurrentDecoderState`], *optional*):
            State to continue from, returned when `use_cache=True`; the field is named `cache` from transformers 5.24
            on (`past_key_values` still reads it there).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            Embedding output and every layer's output (the last after the final norm), `(batch_size,
            sequence_length, hidden_size)` each.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Every layer's attention weights, `(batch_size, num_heads, sequence_length, 1 + window_size)` each:
            column 0 is `h_prev` (zero outside the insertion layer and in a row's first window), column `1 + j` is
            position `j` of the query's own window. Rows of padding positions are zero.
    """


def _model_output_class(name: str, doc: str, fields: dict[str, object]) -> type[ModelOutput]:
    """A ModelOutput dataclass with `fields` (name -> annotation, each defaulting to None), then the state and
    `hidden_states` / `attentions`. The state's field takes the installed transformers' name: a dataclass's field
    names are fixed when the class is made, and transformers 5.24's generate() reads `outputs.cache`."""
    shared = {
        STATE_NAME: RecurrentDecoderState | None,
        "hidden_states": tuple[torch.FloatTensor, ...] | None,
        "attentions": tuple[torch.FloatTensor, ...] | None,
    }
    return make_dataclass(
        name,
        [(key, kind, field(default=None)) for key, kind in {**fields, **shared}.items()],
        bases=(ModelOutput,),
        namespace={"__doc__": doc + _SHARED_OUTPUTS_DOC, "__module__": __name__},
    )


RecurrentDecoderCausalLMOutput = _model_output_class(
    "RecurrentDecoderCausalLMOutput",
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Causal language-modelling loss over the whole input (each token predicted once), when `labels` is given.
        logits (`torch.FloatTensor` of shape `(batch_size, kept_positions, vocab_size)`, *optional*):
            Next-token scores from the backbone's own head. Omitted when `labels` is given in training mode, unless
            `return_logits=True`.
""",
    {"loss": torch.FloatTensor | None, "logits": torch.FloatTensor | None},
)


RecurrentDecoderModelOutput = _model_output_class(
    "RecurrentDecoderModelOutput",
    """
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`):
            Every input position's output of the last layer, after the backbone's final norm (as the stock base
            model's), each from the window in which the position is new.
""",
    {"last_hidden_state": torch.FloatTensor | None},
)


class _WindowEmbeddings:
    """A call's token embeddings, looked up window by window (`embeddings[:, start:stop]`) from its (batch, length)
    `input_ids`, for a forward without gradient: the (batch, length, hidden) embeddings of a long prompt never exist
    at once, so what reading it keeps does not grow with its length. Has the `shape`, `dtype` and `device` of the
    tensor it stands for."""

    def __init__(self, embedding: nn.Module, input_ids: torch.Tensor):
        self.embedding, self.input_ids = embedding, input_ids
        first = embedding(input_ids[:, :1])
        self.shape = torch.Size([*input_ids.shape, first.shape[-1]])
        self.dtype, self.device = first.dtype, first.device

    def __getitem__(self, index: tuple) -> torch.Tensor:
        return self.embedding(self.input_ids[index])


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


def _concat_layers(per_step: list[tuple[torch.Tensor, ...]], dim: int) -> tuple[torch.Tensor, ...]:
    """Per-layer tensors of consecutive steps joined along their sequence dimension `dim`."""
    return tuple(torch.cat(layer, dim=dim) for layer in zip(*per_step, strict=True))


@dataclass
class _WindowsRun:
    """One call's window steps and the state they advanced; builds the outputs."""

    state: RecurrentDecoderState
    steps: list[_StepOutput]
    output_hidden_states: bool
    output_attentions: bool

    def results(self) -> torch.Tensor:
        """The steps' results joined in input order: (batch, kept, vocab) logits of the kept positions (causal LM),
        or (batch, length, hidden) final hidden states (bare model)."""
        return torch.cat([s.result for s in self.steps], dim=1)

    def head_outputs(self) -> list[torch.Tensor]:
        """What the step head returned, one per step."""
        return [s.head for s in self.steps]

    def outputs(self, use_cache: bool | None) -> dict:
        """The output fields besides loss and logits: the state (unless `use_cache=False`), hidden states,
        attentions."""
        return {
            STATE_NAME: self.state if use_cache is not False else None,
            "hidden_states": (
                _concat_layers([s.all_hidden for s in self.steps], dim=1) if self.output_hidden_states else None
            ),
            "attentions": (
                _concat_layers([s.attentions for s in self.steps], dim=2) if self.output_attentions else None
            ),
        }


class _KeptColumns:
    """Which input columns a call returns logits for (`logits_to_keep`), and each step's share of them."""

    def __init__(self, logits_to_keep: int | torch.Tensor, length: int, device: torch.device):
        self.order = None
        self.device = device
        if isinstance(logits_to_keep, int):
            if logits_to_keep < 0:
                raise ValueError(f"logits_to_keep must be >= 0 or a tensor of positions, got {logits_to_keep}")
            self.first = length - logits_to_keep if 0 < logits_to_keep < length else 0
            self.columns = None
            return
        if logits_to_keep.dim() != 1:
            raise ValueError(
                f"logits_to_keep must be an int or a 1D tensor of positions, got shape {tuple(logits_to_keep.shape)}"
            )
        # Absolute, sorted and unique (negative positions count from the end); `order` restores the caller's order.
        absolute = torch.arange(length, device=device)[logits_to_keep.to(device)]
        self.columns, self.order = torch.unique(absolute, sorted=True, return_inverse=True)

    def in_step(self, start: int, stop: int, reread: int) -> int | torch.Tensor:
        """The kept columns among the step's new columns `[start, stop)`, for the backbone's `logits_to_keep`: the
        step's last ones (an int), or indices into the step's columns (which begin with `reread` re-read ones)."""
        if self.columns is None:
            kept = stop - max(start, self.first)
            # 0 would mean "all" to the backbone.
            return kept if kept > 0 else torch.zeros(0, dtype=torch.long, device=self.device)
        inside = self.columns[(self.columns >= start) & (self.columns < stop)]
        return inside - start + reread


# What the stock base model is called in a stock checkpoint: `transformer` for GPT-2, `model` for the other families.
STOCK_BASE_PREFIXES = ("model", "transformer")
# The options of `from_pretrained` that say where a config is read from, which a GGUF file's config is read with too.
_CONFIG_LOADING_OPTIONS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "proxies",
    "revision",
    "subfolder",
    "token",
)


def _stock_layout_renamings(
    backbone_path: str,
    prefixes: tuple[str, ...] = STOCK_BASE_PREFIXES,
    recurrence_path: str = "recurrence",
    saved_recurrence: str = "recurrence",
) -> list[WeightRenaming]:
    """Renamings from the stock layout on disk (the base model under one of `prefixes`, plus `recurrence.*`) to a model
    whose stock base model sits at `backbone_path` and recurrence at `recurrence_path`; transformers reverses them on
    save, so checkpoints keep the stock layout. A key already naming the recurrence under a prefix is left alone."""
    renamings = [
        WeightRenaming(source_patterns=rf"^{prefix}\.(?!recurrence\.)", target_patterns=f"{backbone_path}.")
        for prefix in prefixes
    ]
    if recurrence_path != saved_recurrence:
        renamings.append(
            WeightRenaming(source_patterns=rf"^{saved_recurrence}\.", target_patterns=f"{recurrence_path}.")
        )
    return renamings


class RecurrentDecoderPreTrainedModel(PreTrainedModel):
    """What every model of the recurrence core shares: its config, the attention implementations the recurrence runs
    on, weight initialisation, gradient checkpointing of whole window steps, and its states."""

    config_class = RecurrentDecoderConfig
    state_class = RecurrentDecoderState
    # The named families' checkpoints keep the recurrence inside the stock base model (`model.recurrence.*`,
    # `transformer.recurrence.*`), where their hand-written models had it.
    recurrence_saved_in_base_model = False
    # Modules saved under another name than they have here (on disk -> in memory).
    saved_module_names: dict[str, str] = {}
    # The renamings a model saves with when they cannot be read from its class's (`_keep_stock_layout`).
    _stock_layout: list[WeightRenaming] | None = None
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _is_stateful = True
    # Buffers that old GPT-2 checkpoints still carry.
    _keys_to_ignore_on_load_unexpected = [r"\.attn\.masked_bias$", r"\.attn\.bias$"]

    @classmethod
    def is_custom_code(cls) -> bool:
        # transformers takes code outside it for code that may not initialise through `transformers.initialization`
        # (which leaves loaded tensors alone one by one), and when loading, skips every module whose own tensors are
        # all loaded, vacuously so a module with none. Ours and the stock backbones' `_init_weights` use those
        # functions only, and GPT-2's scaled init of `c_proj` is done at its attention and MLP modules, which hold
        # no tensors of their own: with the shortcut, a model loaded with missing weights initialises them otherwise
        # than one built from its config.
        return False

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate() must not hand us a DynamicCache: the model creates and returns its own RecurrentDecoderState.
        return False

    def _check_and_adjust_attn_implementation(
        self, attn_implementation: str | None, is_init_check: bool = False, allow_all_kernels: bool = False
    ) -> str | None:
        # Only attention that takes an arbitrary per-row mask over extra keys can carry h_prev and the window cache.
        if attn_implementation is None:
            return None
        name = attn_implementation.removeprefix(RECURRENT_PREFIX)
        self._check_inner_attention(name)
        return super()._check_and_adjust_attn_implementation(name, is_init_check, allow_all_kernels)

    def _check_inner_attention(self, name: str) -> None:
        """Raise `ValueError` unless the recurrence can run on the attention implementation `name`."""
        if name in INNER_ATTENTIONS:
            return
        # transformers' own implementations (flash, flex, paged) and Hub kernels ("org/repo") exist but cannot carry
        # it; anything else is no attention implementation at all, and saying why flash cannot would mislead.
        if name in ALL_ATTENTION_FUNCTIONS.valid_keys() or "/" in name:
            reason = "h_prev and the window cache need a custom per-row attention mask, which flash, flex and kernel "
            reason += "attention do not take"
        else:
            reason = "it is not an attention implementation transformers knows"
        raise ValueError(
            f"attn_implementation={name!r} cannot carry the recurrence of {type(self).__name__} over a "
            f"{self.config.text_config.model_type!r} backbone: {reason}; use one of {list(INNER_ATTENTIONS)}"
        )

    def set_attn_implementation(self, attn_implementation: str | dict, allow_all_kernels: bool = False) -> None:
        # transformers would also give the backbones the plain name: stock models without the recurrence.
        super().set_attn_implementation(attn_implementation, allow_all_kernels)
        for module in self.modules():
            if isinstance(module, RecurrentDecoderWindowModel):
                module._bind_attention()

    def _set_gradient_checkpointing(self, *args, **kwargs) -> None:
        super()._set_gradient_checkpointing(*args, **kwargs)
        # Whole window steps are recomputed (`RecurrentDecoderWindowStep`); the stock layers inside need not be.
        for module in self.modules():
            if hasattr(module, "gradient_checkpointing") and not isinstance(module, RecurrentDecoderWindowStep):
                module.gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, RecurrentDecoderRecurrence):
            # Equal layer weights to start with: the summary is the plain mean over layers.
            init.zeros_(module.layer_weight_logits)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """Also takes a state dict in the checkpoint's layout (its `model.safetensors` read as is: `Trainer` resumes a
        run so), renamed as `from_pretrained` renames it; keys already in this model's layout are kept."""
        own = set(self.state_dict())
        if any(key not in own for key in state_dict):
            renamings = get_checkpoint_conversion_mapping(type(self).__name__) or []
            state_dict = {
                key if key in own else apply_renamings(key, renamings): value for key, value in state_dict.items()
            }
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _keep_stock_layout(self, base_model: PreTrainedModel, backbone_path: str, recurrence_path: str) -> None:
        """Save in the stock layout of `base_model`'s family. transformers reverses the class's renamings on save,
        but two stock prefixes (`model`, `transformer`) map to the same name here, so the reverse would be ambiguous:
        the model records the renaming of its own backbone (from_pretrained replaces it with those the checkpoint
        used)."""
        prefix = base_model.base_model_prefix
        saved = f"{prefix}.recurrence" if self.recurrence_saved_in_base_model else "recurrence"
        self._stock_layout = _stock_layout_renamings(backbone_path, (prefix,), recurrence_path, saved)
        self._stock_layout += _module_renamings(self.saved_module_names)
        self._weight_conversions = list(self._stock_layout)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        if kwargs.get("gguf_file") is not None:
            return cls._from_gguf(*args, **kwargs)
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        # A checkpoint read without any renaming (an old named bare model's `h.*`, which transformers reads under the
        # base-model prefix) would be saved again under the names in memory (`backbone.h.*`), a layout no class
        # writes and the other heads do not read: save it in the family's layout instead.
        if not model._weight_conversions:
            # None: the class's registered renamings, which the causal LMs (no `_stock_layout`) save with.
            model._weight_conversions = list(model._stock_layout) if model._stock_layout is not None else None
        return loaded

    @classmethod
    def _from_gguf(
        cls, pretrained_model_name_or_path: str | os.PathLike, *, gguf_file: str, **kwargs
    ) -> "RecurrentDecoderPreTrainedModel":
        """A GGUF file holds a stock causal LM, which transformers reads (de-quantised to float32; transformers cannot
        map its tensors onto this model's names): this model is built around a copy of its weights, only the
        recurrence new, as `hf-recurrence convert` does. `kwargs`: the recurrence settings (`window_size`, ...), the
        `dtype` of the result, and transformers' loading options."""
        if not issubclass(cls, RecurrentDecoderForCausalLM):
            raise ValueError(
                f"{cls.__name__}.from_pretrained(..., gguf_file={gguf_file!r}) is not supported (a GGUF file holds a "
                "stock causal LM): load it with RecurrentDecoderForCausalLM.from_pretrained(..., gguf_file=...), or "
                "convert it with `hf-recurrence convert` and load the folder it writes"
            )
        settings = {name: kwargs.pop(name) for name in RecurrentDecoderConfig.family_settings if name in kwargs}
        config = kwargs.pop("config", None)
        dtype = kwargs.pop("dtype", None)
        # float32 gives plain de-quantised weights (another dtype keeps them packed).
        stock = AutoModelForCausalLM.from_pretrained(
            pretrained_model_name_or_path, gguf_file=gguf_file, dtype=torch.float32, **kwargs
        )
        if config is None:
            options = {key: kwargs[key] for key in _CONFIG_LOADING_OPTIONS if key in kwargs}
            config = cls.config_class.from_pretrained(
                pretrained_model_name_or_path, gguf_file=gguf_file, **options, **settings
            )
        model = cls(config)._with_stock_weights(stock)
        if dtype is not None and dtype != "auto":
            model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return model.eval()

    def _with_stock_weights(self, stock: PreTrainedModel) -> "RecurrentDecoderPreTrainedModel":
        """This causal LM on `stock`'s device and dtype, its backbone holding a copy of every weight of the loaded stock
        causal LM `stock` (the same stock class built from the same config, so every key must match both ways), and
        the stock model's generation defaults (its end of sequence, ...)."""
        model = self.to(device=stock.device, dtype=stock.dtype)
        missing, unexpected = model.backbone.load_state_dict(stock.state_dict(), strict=False)
        if missing or unexpected:
            raise ValueError(f"not a complete checkpoint: missing {missing}, unexpected {unexpected}")
        model.generation_config = copy.deepcopy(stock.generation_config)
        return model

    def new_state(
        self, batch_size: int, window_size: int | None = None, window_overlap: int | None = None
    ) -> RecurrentDecoderState:
        """A fresh state for `batch_size` rows on the model's device and dtype, to pass as `past_key_values`; its
        window schedule defaults to the config's."""
        weight = self.get_input_embeddings().weight
        return self.state_class(
            self.config,
            batch_size,
            weight.device,
            weight.dtype,
            window_size=window_size,
            window_overlap=window_overlap,
        )

    def load_state(self, path: str | os.PathLike) -> RecurrentDecoderState:
        """A state written by `RecurrentDecoderState.save`, read onto the model's device (see
        `RecurrentDecoderState.load` for what is checked)."""
        return self.state_class.load(path, self.config, self.device)


class RecurrentDecoderWindowModel(RecurrentDecoderPreTrainedModel):
    """The window loop over a stock backbone (`self.backbone`, which transformers builds from `config.text_config`
    with `backbone_auto_class`), shared by [`RecurrentDecoderModel`] (over the stock base model) and
    [`RecurrentDecoderForCausalLM`] (over the stock causal LM). They differ only in what the backbone returns for a
    window step (`_run_backbone`)."""

    backbone_auto_class: type

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__(config)
        check_backbone(config.text_config)
        config.check_recurrence_settings()
        # transformers' own class for the backbone; it shares `config.text_config`.
        self.backbone = self.backbone_auto_class.from_config(config.text_config)
        self._check_backbone_model()
        self.recurrence = RecurrentDecoderRecurrence(config)
        self.window_step = RecurrentDecoderWindowStep()
        # The attention the recurrence runs on: the one asked for, else the one transformers chose for the backbone.
        inner = self.config._attn_implementation or self.backbone.config._attn_implementation
        self.config._attn_implementation_internal = inner.removeprefix(RECURRENT_PREFIX)
        self._bind_attention()
        self.post_init()

    def _check_backbone_model(self) -> None:
        """Refuse, at construction, a backbone whose layers the recurrence cannot reach as it expects."""
        family = self.config.text_config.model_type
        stock = type(self.backbone)
        if not stock._can_set_attn_implementation():
            raise ValueError(
                f"RecurrentDecoder cannot run over a {family!r} backbone: {stock.__name__} does not call transformers' "
                "attention interface, which is where h_prev joins the keys/values"
            )
        norm = PRE_ATTENTION_NORMS[family]
        geometry = _cache_geometry(self.config.text_config)
        for i, layer in enumerate(_decoder_layers(self.backbone)):
            attention = _attention_module(layer)
            problems = []
            if getattr(attention, "layer_idx", None) != i:
                problems.append(f"its attention's layer_idx is {getattr(attention, 'layer_idx', None)!r}")
            if getattr(attention, "head_dim", None) != geometry["head_dim"]:
                problems.append(f"its attention's head_dim is {getattr(attention, 'head_dim', None)!r}")
            if norm is not None and not hasattr(layer, norm):
                problems.append(f"it has no pre-attention norm {norm!r}")
            if not hasattr(sys.modules[type(attention).__module__], "eager_attention_forward"):
                problems.append("its module has no eager_attention_forward")
            if problems:
                raise ValueError(
                    f"RecurrentDecoder cannot run over this {family!r} backbone: layer {i} ({type(layer).__name__}) "
                    f"does not have the expected layout: {'; '.join(problems)}"
                )

    def _bind_attention(self) -> None:
        """Run the backbone under `recurrent_<inner>`, `<inner>` being this model's attention implementation.

        Checked before every forward, because transformers (set_attn_implementation, a config's setter) may have
        given the backbone a plain name since; the backbone's own class validates the inner implementation.
        """
        inner = self.config._attn_implementation
        wanted = RECURRENT_PREFIX + inner
        backbone_config = self.backbone.config
        if backbone_config._attn_implementation != wanted:
            # The config setter reaches this model's config unchecked.
            self._check_inner_attention(inner)
            self.backbone.get_correct_attn_implementation(inner)
            backbone_config._attn_implementation_internal = wanted

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, new_embeddings: nn.Module) -> None:
        self.backbone.set_input_embeddings(new_embeddings)

    def _step(
        self,
        settings: _StepSettings,
        embeds: torch.Tensor,
        real: torch.Tensor,
        fill: torch.Tensor,
        slot_valid: torch.Tensor,
        has_h_prev: torch.Tensor,
        h_prev: torch.Tensor,
        targets: torch.Tensor | None,
        *past: torch.Tensor,
        h_prev_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> _StepOutput:
        """Run the backbone over one stretch of columns that stays inside each row's current window.

        embeds: (batch, cols, hidden) token embeddings (a re-read overlap prefix, then `num_new` new columns);
        real: (batch, cols) bool; fill: (batch,) tokens already in each row's window; `past` = the cached keys of
        every layer, then their values. Pure in its tensor arguments, so it can be recomputed under checkpointing.
        `h_prev_kv`: h_prev's key and value at the insertion layer, when known (else computed from `h_prev`).
        """
        layers = _decoder_layers(self.backbone)
        num_layers, num_new = len(layers), settings.num_new
        positions = (fill[:, None] + real.cumsum(1) - 1).clamp(min=0)  # (batch, cols): restart in every window
        eager = settings.output_attentions or self.config._attn_implementation == "eager"
        plain_mask, inserted_mask = _attention_masks(
            real, slot_valid, has_h_prev, embeds.dtype, eager, settings.all_real
        )
        use_h_prev = settings.uses_h_prev if settings.uses_h_prev is not None else bool(has_h_prev.any())
        insertion_layer = self.config.insertion_layer
        norm = PRE_ATTENTION_NORMS[self.config.text_config.model_type]
        ctx = _StepContext(
            insertion_layer,
            eager,
            [(past[i], past[num_layers + i]) if past[i].shape[2] else None for i in range(num_layers)],
            plain_mask,
            inserted_mask,
            h_prev if use_h_prev else None,
            getattr(layers[insertion_layer], norm) if norm is not None else nn.Identity(),
            self._h_prev_rotation(h_prev) if use_h_prev and h_prev_kv is None else None,
            settings.output_attentions,
            h_prev_kv,
        )
        result, hidden_states = self._run_backbone(
            settings,
            inputs_embeds=embeds,
            position_ids=positions,
            use_cache=False,
            output_hidden_states=True,
            recurrence=ctx,
            return_dict=True,
        )
        if len(ctx.keys) != num_layers:
            # A layer whose attention never reached `recurrent_attention` ran as a stock layer, without h_prev or
            # the window cache: the result would be silently wrong.
            raise RuntimeError(
                f"Only layers {sorted(ctx.keys)} of the {num_layers} layers of the "
                f"{self.config.text_config.model_type!r} backbone ran through the recurrent attention (backbone "
                f"attn_implementation={self.backbone.config._attn_implementation!r})"
            )
        # Each layer's share of the pooled sum is one batched product: (batch, 1, cols) weights of the real columns
        # times (batch, cols, hidden) states, accumulated into (batch, 1, hidden).
        real_weights = self.recurrence.layer_weights()[:, None, None, None] * real.float()[None, :, None, :]
        pooled = torch.zeros(embeds.shape[0], 1, embeds.shape[2], device=embeds.device)
        eps = getattr(self.config.text_config, "rms_norm_eps", None) or 1e-6
        for i, layer_states in enumerate(hidden_states[1:]):  # layer outputs, the last after the final norm
            states = layer_states.float()
            if self.config.normalize_pooled_states:
                states = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps)
            pooled = torch.baddbmm(pooled, real_weights[i], states)
        attentions = None
        if settings.output_attentions:
            key_valid = torch.cat([slot_valid, real], dim=1)  # (batch, slots + cols)
            attentions = tuple(
                _window_attentions(
                    weights[:, :, -num_new:], key_valid, inserting, settings.window_size, real[:, -num_new:]
                )
                for weights, inserting in (ctx.weights[i] for i in range(num_layers))
            )
        all_hidden = tuple(h[:, -num_new:] for h in hidden_states) if settings.output_hidden_states else None
        head = settings.step_head(result, targets) if settings.step_head is not None else None
        return _StepOutput(
            None if settings.step_head is not None else result,
            [ctx.keys[i] for i in range(num_layers)],
            [ctx.values[i] for i in range(num_layers)],
            pooled[:, 0],
            all_hidden,
            head,
            attentions,
        )

    def _run_backbone(self, settings: _StepSettings, **inputs) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """Run the backbone over one window step (`inputs`: its forward's keyword arguments); return the step's result
        (see `_StepOutput.result`) and every hidden state, (batch, cols, hidden) each."""
        raise NotImplementedError

    def _read_hidden_states(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        state: RecurrentDecoderState | None,
        inputs_embeds: torch.FloatTensor | None,
        use_cache: bool | None,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
        return_dict: bool | None,
        kwargs: dict,
    ) -> RecurrentDecoderModelOutput:
        """Read the input window by window and return every new position's final hidden state (after the final norm),
        with the state and, when asked, every layer's hidden states and attention weights."""
        embeds, real, document_starts, state = self._prepare(input_ids, attention_mask, state, inputs_embeds, kwargs)
        output_hidden_states, output_attentions = self._output_flags(output_hidden_states, output_attentions)
        steps = self._forward_windows(
            embeds, real, document_starts, state, None, None, None, output_hidden_states, output_attentions
        )
        run = _WindowsRun(state, steps, output_hidden_states, output_attentions)
        output = RecurrentDecoderModelOutput(last_hidden_state=run.results(), **run.outputs(use_cache))
        return output if return_dict is not False else output.to_tuple()

    def _h_prev_rotation(self, h_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotation (cos, sin) of the `h_prev` key, (batch, 1, rotary_dim) each, per `h_prev_rope_position`: the
        backbone's own rotary embedding of the insertion layer at that window position. None leaves it unrotated."""
        position = self.config.h_prev_rope_position
        if position is None:
            return None
        rotary = self.backbone.base_model.rotary_emb
        positions = torch.full((h_prev.shape[0], 1), position, dtype=torch.long, device=h_prev.device)
        kwargs = {}
        if "layer_type" in inspect.signature(rotary.forward).parameters:
            # One rotary module for several layer types, each with its own base (Gemma3: local and global layers).
            kwargs["layer_type"] = self.config.text_config.layer_types[self.config.insertion_layer]
        return rotary(h_prev, positions, **kwargs)

    def _h_prev_key_value(self, h_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`h_prev`'s key and value at the insertion layer, (batch, kv_head, 1, head_dim) each, as a step computes
        them (`_h_prev_key_value`): the same code on the same tensors, so the same values."""
        layer = _decoder_layers(self.backbone)[self.config.insertion_layer]
        norm = PRE_ATTENTION_NORMS[self.config.text_config.model_type]
        ctx = _StepContext(
            self.config.insertion_layer,
            False,
            [],
            None,
            h_prev.new_zeros(0),
            h_prev,
            getattr(layer, norm) if norm is not None else nn.Identity(),
            self._h_prev_rotation(h_prev),
            False,
        )
        return _h_prev_key_value(_attention_module(layer), ctx)

    def _next_h_prev(self, state: RecurrentDecoderState) -> torch.Tensor:
        """(batch, hidden) the `h_prev` of each row's next window: its current window's summary through the FFN
        (zeros instead of the summary for the control arm, `recurrence_input="zeros"`)."""
        summary = state.window_summary()
        if self.config.recurrence_input == "zeros":
            summary = torch.zeros_like(summary)
        k = self.config.bptt_windows
        if k is not None and self.training:
            # Windows 1..k+1, k+2..2k+2, ... form the runs gradient may cross; cut at the window before each run.
            cut = (state.window_index % (k + 1) == 0)[:, None]
            summary = torch.where(cut, summary.detach(), summary)
        return self.recurrence(summary.to(state.h_prev.dtype))

    def _forward_windows(
        self,
        inputs_embeds: torch.Tensor | _WindowEmbeddings,
        real: torch.Tensor,
        document_starts: torch.Tensor | None,
        state: RecurrentDecoderState,
        kept: _KeptColumns | None,
        step_targets: torch.Tensor | None,
        step_head: Callable | None,
        output_hidden_states: bool,
        output_attentions: bool,
    ) -> list[_StepOutput]:
        """Feed (batch, length, hidden) embeddings through the state's window schedule, advancing it in place.

        Each step covers columns that stay inside every row's current window; a row whose window is full begins a
        new one (re-reading its overlap) just before its next real token. At the `document_starts` ((batch, length)
        bool, packed sequences) a row forgets its text, so each document is read as if alone from a new state.
        `kept`: the columns to compute logits for (None: none).
        """
        if isinstance(state, FixedShapeWindowCache):
            state._checked_by = weakref.ref(self)  # `_prepare` checked the call and the state
            plain = kept is not None and kept.columns is None and step_head is None and document_starts is None
            if plain and inputs_embeds.shape[1] == 1 and not (output_hidden_states or output_attentions):
                logits = _fixed_shape_decode(self, state, inputs_embeds, real)
                if logits is not None:
                    return [_StepOutput(logits, [], [], None, None, None, None)]
        length = inputs_embeds.shape[1]
        if state.lockstep is not None and not bool(real.all()):  # the call's one read of the device
            state.leave_lockstep()
        # Steps also begin at every column where some row starts a document, so that no step spans two documents.
        boundaries = [] if document_starts is None else document_starts.any(0).nonzero()[:, 0].tolist()
        boundaries.append(length)
        steps = []
        start = 0
        while start < length:
            if start == boundaries[0]:
                boundaries.pop(0)
                state.begin_documents(document_starts[:, start])
            starting, reread, width = state.next_step(real[:, start:])
            if starting is not None:
                state.start_windows(starting, self._next_h_prev(state))
            width = min(width, boundaries[0] - start)
            stop = start + width
            new_embeds, new_real = inputs_embeds[:, start:stop], real[:, start:stop]
            embeds, step_real = (
                state.with_overlap(new_embeds, new_real, starting) if reread else (new_embeds, new_real)
            )
            lockstep = state.lockstep
            settings = _StepSettings(
                num_new=width,
                window_size=state.window_size,
                logits_to_keep=kept.in_step(start, stop, reread) if kept is not None else None,
                step_head=step_head,
                output_hidden_states=output_hidden_states,
                output_attentions=output_attentions,
                uses_h_prev=None if lockstep is None else lockstep[1] > 0,
                all_real=None if lockstep is None else True,
            )
            args = (
                embeds,
                step_real,
                state.fill,
                state.slot_valid,
                state.has_h_prev,
                state.h_prev,
                step_targets[:, start:stop].contiguous() if step_targets is not None else None,
                *state.keys,
                *state.values,
            )
            settings = _fixed_shape_step(state, settings)
            flat = self.window_step(self._step, settings, *args)
            step = _StepOutput.from_flat(flat, len(state.keys), settings)
            state.append_step(step.keys, step.values, step_real, step.pooled, new_embeds, new_real)
            # The state owns the cache and the pooled sum now; a reference left here would keep every window's cache
            # alive until return.
            step.keys, step.values, step.pooled = [], [], None
            if steps and steps[-1].carries_nothing:
                # Adds nothing to the outputs (the next step's result follows it, and an empty one joins as nothing):
                # dropped, so that what a call keeps does not grow with the windows it reads for no output.
                steps.pop()
            steps.append(step)
            start = stop
        return steps

    def _prepare(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        state: RecurrentDecoderState | None,
        inputs_embeds: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor | _WindowEmbeddings, torch.Tensor, torch.Tensor | None, RecurrentDecoderState]:
        """Validate the inputs; return the new positions' embeddings (looked up window by window from `input_ids`
        without gradient), their real-token mask, where packed documents start (from `position_ids`, see
        `_document_starts`) and the state."""
        _refuse_export(self)
        if kwargs.get("token_type_ids") is not None:
            raise ValueError(f"token_type_ids are not supported by {type(self).__name__}")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
            if torch.is_grad_enabled() or input_ids.shape[1] <= self.config.window_size:
                # One lookup: with gradient, each window's own would give the embedding's backward a (vocab, hidden)
                # gradient each; an input of one window or less (a decode step) is no longer than a window's.
                inputs_embeds = self.get_input_embeddings()(input_ids)
            else:
                inputs_embeds = _WindowEmbeddings(self.get_input_embeddings(), input_ids)
        batch, length = inputs_embeds.shape[:2]
        if length == 0:
            raise ValueError("The input is empty (length 0)")
        # The config may have been changed since the model was built; integer checks only, no device sync.
        self.config.check_model_settings()
        self._bind_attention()
        if state is None:
            state = self.state_class(self.config, batch, inputs_embeds.device, inputs_embeds.dtype)
        else:
            state = self.state_class.adopt(state, self.config, batch, inputs_embeds.dtype)
            self.config.check_window_schedule(state.window_size, state.window_overlap)
        if attention_mask is None:
            real = torch.ones(batch, length, dtype=torch.bool, device=inputs_embeds.device)
        else:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
                raise ValueError(
                    f"attention_mask must be (batch, length) for the new tokens or (batch, past + length) as "
                    f"generate() passes it; got shape {tuple(attention_mask.shape)} for input of shape "
                    f"{(batch, length)}"
                )
            real = attention_mask[:, -length:].to(device=inputs_embeds.device, dtype=torch.bool)
        continuing = state.get_seq_length() > 0
        # Positions themselves restart in every window and come from the window schedule (so forward() has no
        # position_ids parameter, and generate() builds none); given ones only mark where packed documents start.
        document_starts = _document_starts(kwargs.get("position_ids"), real, continuing)
        return inputs_embeds, real, document_starts, state

    def _output_flags(self, output_hidden_states: bool | None, output_attentions: bool | None) -> tuple[bool, bool]:
        """The call's values, else the config's."""
        return (
            bool(output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states),
            bool(output_attentions if output_attentions is not None else self.config.output_attentions),
        )


class RecurrentDecoderBaseModelView:
    """`RecurrentDecoderForCausalLM.base_model`: called with the inputs of `RecurrentDecoderModel.forward`, the causal
    LM's final hidden states (no logits); any attribute is the stock base model's (`layers`, `embed_tokens`, `h`,
    `wte`, ...), as a stock causal LM's `base_model` is its base model."""

    def __init__(self, model: "RecurrentDecoderForCausalLM"):
        self._model = model

    def __call__(self, *args, **kwargs) -> RecurrentDecoderModelOutput:
        # The bare model's forward, on the causal LM's backbone (whose steps then return final hidden states).
        return RecurrentDecoderModel.forward(self._model, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model.backbone.base_model, name)


class RecurrentDecoderForCausalLM(RecurrentDecoderWindowModel, GenerationMixin):
    """A stock transformers decoder (`backbone`) that reads text window by window with the paper's recurrence.

    `from_pretrained(<a stock checkpoint of a supported family>, window_size=..., window_overlap=...,
    insertion_layer=...)` loads every stock weight unchanged; only `recurrence.*` is new. Saved checkpoints keep the
    stock layout (`model.*`, `lm_head.*`) plus `recurrence.*`.

    Example:

    ```python
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM

    >>> backbone = LlamaConfig(
    ...     vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    ...     num_key_value_heads=2, max_position_embeddings=32,
    ... )
    >>> config = RecurrentDecoderConfig(text_config=backbone, window_size=16, insertion_layer=1)
    >>> model = RecurrentDecoderForCausalLM(config)
    >>> ids = torch.randint(0, 100, (2, 100))  # 7 windows, far past max_position_embeddings
    >>> model(ids, labels=ids).loss.shape
    torch.Size([])

    ```
    """

    backbone_auto_class = AutoModelForCausalLM

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__(config)
        # transformers picks the loss from the class-name suffix; set it so no lookup warns.
        self.loss_type = "ForCausalLM"

    def get_output_embeddings(self) -> nn.Module:
        return self.backbone.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.backbone.set_output_embeddings(new_embeddings)

    @property
    def base_model(self) -> "RecurrentDecoderBaseModelView":
        """The model without its language-modelling head, as tools that apply the head themselves call it (TRL's
        fused LM head, Liger kernels): the stock backbone's attributes, and called, the text read window by window
        with the recurrence, returning every position's final hidden state. (The stock backbone itself is
        `model.backbone`; run outside the window loop, it refuses to run.)"""
        return RecurrentDecoderBaseModelView(self)

    def _get_stopping_criteria(self, *args, **kwargs) -> StoppingCriteriaList:
        criteria = super()._get_stopping_criteria(*args, **kwargs)
        for criterion in criteria:
            if isinstance(criterion, MaxLengthCriteria):
                # Positions restart in every window, so a text longer than max_position_embeddings is what this model
                # is for: transformers' reminder that generation "exceeded the model's predefined maximum length"
                # would be wrong.
                criterion.max_position_embeddings = None
        return criteria

    def _prepare_cache_for_generation(
        self,
        generation_config: GenerationConfig,
        model_kwargs: dict,
        generation_mode: object,
        batch_size: int,
        *args,
        **kwargs,
    ):
        implementation = generation_config.cache_implementation
        if implementation == FIXED_SHAPE_CACHE_IMPLEMENTATION:
            if model_kwargs.get(STATE_NAME) is None and generation_config.use_cache is not False:
                weight = self.get_input_embeddings().weight
                state_class = fixed_shape_state_class(self.state_class)
                # generate() expands the rows for beams and returned sequences after this, as for the stock cache.
                rows = max(generation_config.num_beams, generation_config.num_return_sequences) * batch_size
                model_kwargs[STATE_NAME] = state_class(self.config, rows, weight.device, weight.dtype)
                return None
        elif implementation is not None:
            # generate() would only warn that a cache_implementation "will be ignored" and run anyway.
            raise ValueError(
                f"cache_implementation={implementation!r} cannot be honoured by {type(self).__name__}: the model "
                f"carries its own recurrent state of bounded size (returned as {STATE_NAME}) instead of a transformers "
                f"Cache; the only choice is {FIXED_SHAPE_CACHE_IMPLEMENTATION!r}, that state in fixed-shape buffers "
                "whose single-token step compiles. Remove cache_implementation from the generate() call or from the "
                "generation config (generation_config.json)"
            )
        return super()._prepare_cache_for_generation(
            generation_config, model_kwargs, generation_mode, batch_size, *args, **kwargs
        )

    def _valid_auto_compile_criteria(self, model_kwargs: dict, generation_config: GenerationConfig) -> bool:
        state = model_kwargs.get(STATE_NAME)
        if isinstance(state, FixedShapeWindowCache):
            # Compiling the whole forward would trace the window loop and its host-side schedule; only the
            # single-token step is compiled (see `_fixed_shape_decode`).
            state.compile_config = _step_compile_config(self, generation_config)
            return False
        return super()._valid_auto_compile_criteria(model_kwargs, generation_config)

    def init_continuous_batching(self, *args, **kwargs):
        # generate(cache_implementation="paged") and generate_batch() come here, past _prepare_cache_for_generation.
        raise ValueError(
            f"Continuous batching (cache_implementation='paged', generate_batch()) cannot be used with "
            f"{type(self).__name__}: it needs a paged key/value cache, and the model carries its own recurrent state "
            "instead. Call generate() without cache_implementation; batched prompts may be left-padded"
        )

    def _run_backbone(self, settings: _StepSettings, **inputs) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """The stock causal LM's logits of the step's kept columns, from its own head (Gemma2's final soft-cap
        included), (batch, kept, vocab), or None when none are asked for; and every hidden state."""
        keep = settings.logits_to_keep
        # An empty tensor of positions keeps none (0 would keep all), so the head computes nothing.
        out = self.backbone(**inputs, logits_to_keep=keep if keep is not None else torch.zeros(0, dtype=torch.long))
        if keep is None:  # no logits asked for: the final hidden states, as the bare model returns (`base_model`)
            return out.hidden_states[-1][:, -settings.num_new :], out.hidden_states
        return out.logits, out.hidden_states

    def _decode_token(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        state: "FixedShapeWindowCache",
        use_cache: bool | None,
        return_logits: bool | None,
        logits_to_keep: int | torch.Tensor,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
    ) -> torch.Tensor | None:
        """generate()'s single-token call over a fixed-shape state, the compiled step alone: the (batch, 1, vocab)
        logits, or None where the call is another (see `_fixed_shape_decode`) and takes the usual path.

        The state was checked against this model by the eager call that advanced it last (`_checked_by`); the
        single-token calls in between do not check it, the config or the inputs' device again, once per token, so
        change neither the config nor the attention implementation in the middle of a text read this way.
        """
        batch = state.batch_size
        if (
            input_ids is None
            or input_ids.shape != (batch, 1)
            or (attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.shape[0] != batch))
            or (attention_mask is not None and attention_mask.shape[1] < 1)
            or use_cache is False
            or return_logits is False
            or not isinstance(logits_to_keep, int)
            or logits_to_keep < 0
            or state._checked_by is None
            or state._checked_by() is not self
            or any(self._output_flags(output_hidden_states, output_attentions))
        ):
            return None
        embeds = self.get_input_embeddings()(input_ids)
        if attention_mask is None:
            real = torch.ones(batch, 1, dtype=torch.bool, device=embeds.device)
        else:
            real = attention_mask[:, -1:].to(device=embeds.device, dtype=torch.bool)
        return _fixed_shape_decode(self, state, embeds, real)

    def _targets(
        self,
        labels: torch.Tensor | None,
        shift_labels: torch.Tensor | None,
        inputs: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """(batch, length) target of every new position, -100 where none: `shift_labels` as given (Trainer passes
        pre-shifted targets under context parallelism and sequence packing), else `labels` shifted left by one; none
        at the last token of a packed document (`position_ids`)."""
        targets = shift_labels
        if targets is None:
            if labels is None:
                return None
            targets = nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        if inputs is None:  # _prepare says what is missing
            return targets
        if targets.shape != inputs.shape[:2]:
            given = "shift_labels" if shift_labels is not None else "labels"
            raise ValueError(
                f"{given} must have the input's shape {tuple(inputs.shape[:2])}, got {tuple(targets.shape)}"
            )
        return _drop_cross_document_targets(targets.to(inputs.device), position_ids)

    def _loss(self, logits: torch.Tensor, shift_labels: torch.Tensor, num_items: torch.Tensor | int) -> torch.Tensor:
        """Summed cross-entropy of already shifted labels, divided by the item count of the whole input."""
        return self.loss_function(
            logits, None, self.config.text_config.vocab_size, shift_labels=shift_labels, num_items_in_batch=num_items
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentDecoderState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        cache: RecurrentDecoderState | None = None,
        **kwargs,
    ) -> RecurrentDecoderCausalLMOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Token ids; with `past_key_values`, only the new tokens.
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
                1 for real tokens, 0 for padding (anywhere; padding never changes real tokens' outputs). May also
                cover the past tokens, as `generate()` passes it; then its last `sequence_length` columns are used.
            past_key_values or cache ([`RecurrentDecoderState`], *optional*):
                State returned by a previous call, or a fresh one with another window schedule (`new_state`); the
                input continues that text exactly. Either name on any supported transformers (`cache` is its name
                from transformers 5.24 on).
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`, *optional*):
                Token embeddings instead of `input_ids` (before any scaling the backbone applies to them).
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, usually `input_ids`; shifted inside the model (`-100` is ignored). The loss is computed
                window by window, so the `(tokens, vocab)` logits are never materialised for it.
            use_cache (`bool`, *optional*, defaults to `True`):
                Whether to return the state. `config.use_cache` is not consulted: `Trainer` switches it off for
                training, and a recurrent model's state is part of its result.
            output_hidden_states (`bool`, *optional*):
                Whether to return the embedding output and every layer's output.
            output_attentions (`bool`, *optional*):
                Whether to return every layer's attention weights, laid out by window position (see
                [`RecurrentDecoderCausalLMOutput`]); computed with the backbone's eager attention.
            return_logits (`bool`, *optional*):
                Whether to return the logits. Defaults to `True`, except with `labels` in training mode (`False`: the
                memory-lean window-by-window loss). `False` in eval mode gives the loss alone, window by window.
            logits_to_keep (`int` or `torch.Tensor`, *optional*, defaults to 0):
                An int: the logits of the last `logits_to_keep` positions only (0: all), as `generate()` asks for
                when it reads a prompt. A 1D tensor: the positions to keep. Not combinable with `labels`.
            position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Only marks packed documents (positions restart in every window): positions count up by one within a
                document and restart at 0 where the next one begins; each document is then read as if alone.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*):
                Passed by `Trainer` under gradient accumulation: the loss is summed and divided by it.
            shift_labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets already aligned with the positions that predict them; used as given instead of shifting
                `labels`.
        """
        state = _given_state(past_key_values, cache)
        if isinstance(state, FixedShapeWindowCache) and not kwargs and labels is None and inputs_embeds is None:
            outputs = (use_cache, return_logits, logits_to_keep, output_hidden_states, output_attentions)
            logits = self._decode_token(input_ids, attention_mask, state, *outputs)
            if logits is not None:
                output = RecurrentDecoderCausalLMOutput(logits=logits, **{STATE_NAME: state})
                return output if return_dict is not False else output.to_tuple()
        keeps_some = not isinstance(logits_to_keep, int) or logits_to_keep != 0
        if keeps_some and (labels is not None or kwargs.get("shift_labels") is not None):
            raise ValueError(
                f"logits_to_keep={logits_to_keep} cannot be combined with labels: the loss needs every position"
            )
        inputs = input_ids if input_ids is not None else inputs_embeds
        shift_labels = self._targets(labels, kwargs.get("shift_labels"), inputs, kwargs.get("position_ids"))
        # Evaluation (Trainer's prediction_step, compute_metrics) needs the logits; training keeps the memory-lean loss.
        keep_logits = (shift_labels is None or not self.training) if return_logits is None else return_logits
        num_items = None
        if shift_labels is not None:
            num_items = kwargs.get("num_items_in_batch")
            if num_items is None:
                num_items = (shift_labels != -100).sum()

        def window_loss(logits: torch.Tensor, step_labels: torch.Tensor) -> torch.Tensor:
            return self._loss(logits, step_labels, num_items)  # one window's (batch, new, vocab) logits

        loss_per_window = shift_labels is not None and not keep_logits
        embeds, real, document_starts, state = self._prepare(input_ids, attention_mask, state, inputs_embeds, kwargs)
        # Every column's logits for the loss; none where nothing is returned (then the steps keep nothing).
        columns = logits_to_keep if keep_logits else 0 if loss_per_window else torch.zeros(0, dtype=torch.long)
        kept = _KeptColumns(columns, embeds.shape[1], embeds.device)
        output_hidden_states, output_attentions = self._output_flags(output_hidden_states, output_attentions)
        steps = self._forward_windows(
            embeds,
            real,
            document_starts,
            state,
            kept,
            shift_labels if loss_per_window else None,
            window_loss if loss_per_window else None,
            output_hidden_states,
            output_attentions,
        )
        run = _WindowsRun(state, steps, output_hidden_states, output_attentions)
        logits = loss = None
        if loss_per_window:
            loss = torch.stack(run.head_outputs()).sum()
        elif keep_logits:
            logits = run.results()
            if kept.order is not None:
                logits = logits[:, kept.order]
            loss = self._loss(logits, shift_labels, num_items) if shift_labels is not None else None
        output = RecurrentDecoderCausalLMOutput(loss=loss, logits=logits, **run.outputs(use_cache))
        return output if return_dict is not False else output.to_tuple()


class RecurrentDecoderModel(RecurrentDecoderWindowModel):
    """The stock base model of a supported decoder family (`backbone`, e.g. `LlamaModel`) that reads text window by
    window with the paper's recurrence; returns every position's final hidden state (after the final norm), the state
    to continue from, and on request every layer's hidden states and attention weights.

    `from_pretrained(<a stock checkpoint>)` loads its `model.*` (GPT-2: `transformer.*`) weights into the backbone;
    only `recurrence.*` is new. Saved checkpoints keep that layout, so this model and [`RecurrentDecoderForCausalLM`]
    load each other's checkpoints.
    """

    backbone_auto_class = AutoModel

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__(config)
        self._keep_stock_layout(self.backbone, "backbone", "recurrence")

    def _run_backbone(self, settings: _StepSettings, **inputs) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """The stock base model's final hidden states of the step's new columns, (batch, new, hidden), and every
        hidden state."""
        out = self.backbone(**inputs)
        return out.last_hidden_state[:, -settings.num_new :], out.hidden_states

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentDecoderState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        cache: RecurrentDecoderState | None = None,
        **kwargs,
    ) -> RecurrentDecoderModelOutput:
        r"""
        The arguments of [`RecurrentDecoderForCausalLM.forward`] without the language-modelling ones (`labels`,
        `shift_labels`, `num_items_in_batch`, `return_logits`, `logits_to_keep`). The state (`past_key_values`, or
        `cache` from transformers 5.24 on) may come from either model with the same weights: the input continues its
        text exactly.
        """
        return self._read_hidden_states(
            input_ids,
            attention_mask,
            _given_state(past_key_values, cache),
            inputs_embeds,
            use_cache,
            output_hidden_states,
            output_attentions,
            return_dict,
            kwargs,
        )


class RecurrentDecoderForSequenceClassification(GenericForSequenceClassification, RecurrentDecoderPreTrainedModel):
    """[`RecurrentDecoderModel`] with a linear classifier on the last non-padding token (transformers' generic
    sequence-classification head, as the stock Llama's, Qwen's, GPT-2's), so a document of any length is classified
    after reading all of it window by window. A stock `XForSequenceClassification` checkpoint loads unchanged, only
    `recurrence.*` new.

    A long document may also be read in pieces: pass each call's state (`past_key_values`, `cache` from transformers
    5.24 on) to the next and take the logits of the last call. As with the stock heads, a batch of more than one row
    needs the backbone's `pad_token_id` (padding is found by it, on either side).
    """

    base_model_prefix = "model"
    base_model_class = RecurrentDecoderModel

    def __init__(self, config: RecurrentDecoderConfig):
        # The generic head builds its base model with AutoModel, which remote code cannot resolve: build ours here.
        RecurrentDecoderPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        self.score = nn.Linear(config.text_config.hidden_size, config.num_labels, bias=False)
        self._keep_stock_layout(self.model.backbone, "model.backbone", "model.recurrence")
        self.post_init()


class RecurrentDecoderForTokenClassification(GenericForTokenClassification, RecurrentDecoderPreTrainedModel):
    """[`RecurrentDecoderModel`] with a linear classifier on every token's final hidden state (transformers' generic
    token-classification head, as the stock Llama's and Qwen's, whose checkpoints load unchanged), for inputs of any
    length."""

    base_model_prefix = "model"
    base_model_class = RecurrentDecoderModel

    def __init__(self, config: RecurrentDecoderConfig):
        RecurrentDecoderPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        text = config.text_config
        # As the generic head reads its dropout and bias, from the backbone's config here.
        dropout = next(
            (
                p
                for p in (getattr(text, "classifier_dropout", None), getattr(text, "hidden_dropout", None))
                if p is not None
            ),
            0.1,
        )
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(
            text.hidden_size, config.num_labels, bias=getattr(text, "token_classification_bias", True)
        )
        self._keep_stock_layout(self.model.backbone, "model.backbone", "model.recurrence")
        self.post_init()


class RecurrentGPT2State(RecurrentDecoderState):
    """The state of the recurrent GPT-2 models: a [`RecurrentDecoderState`] (like it, not thread-safe) whose files
    name the `recurrent_gpt2` family as they always have."""

    _family = "recurrent_gpt2"


class RecurrentLlamaState(RecurrentDecoderState):
    """The state of the recurrent Llama models: a [`RecurrentDecoderState`] (like it, not thread-safe) whose files
    name the `recurrent_llama` family as they always have."""

    _family = "recurrent_llama"


class RecurrentGPT2LMHeadModel(RecurrentDecoderForCausalLM, GenerationMixin):
    """[`RecurrentDecoderForCausalLM`] over GPT-2, under the name and in the checkpoint layout (a flat
    [`RecurrentGPT2Config`], the recurrence saved as `transformer.recurrence.*`) that recurrent GPT-2 checkpoints and
    state files have always had; any GPT-2 checkpoint converts with `from_pretrained(..., window_size=...)`."""

    config_class = RecurrentGPT2Config
    state_class = RecurrentGPT2State
    recurrence_saved_in_base_model = True

    @property
    def transformer(self) -> nn.Module:
        """The stock `GPT2Model` inside the backbone, where this class kept it before the core (`model.transformer.h`,
        `model.transformer.wte`, ...)."""
        return self.backbone.transformer

    @property
    def lm_head(self) -> nn.Module:
        """The stock head inside the backbone, where `GPT2LMHeadModel` has it."""
        return self.backbone.lm_head


class RecurrentLlamaForCausalLM(RecurrentDecoderForCausalLM, GenerationMixin):
    """[`RecurrentDecoderForCausalLM`] over Llama, under the name and in the checkpoint layout (a flat
    [`RecurrentLlamaConfig`], the recurrence saved as `model.recurrence.*`) that recurrent Llama checkpoints and
    state files have always had; any Llama checkpoint converts with `from_pretrained(..., window_size=...)`."""

    config_class = RecurrentLlamaConfig
    state_class = RecurrentLlamaState
    recurrence_saved_in_base_model = True

    def __init__(self, config: RecurrentLlamaConfig):
        super().__init__(config)
        # As `LlamaForCausalLM` sets it (`resize_token_embeddings` updates it).
        self.vocab_size = config.vocab_size

    @property
    def model(self) -> nn.Module:
        """The stock `LlamaModel` inside the backbone, where this class kept it before the core (`model.model.layers`,
        `model.model.embed_tokens`, ...)."""
        return self.backbone.model

    @property
    def lm_head(self) -> nn.Module:
        """The stock head inside the backbone, where `LlamaForCausalLM` has it."""
        return self.backbone.lm_head


class RecurrentGPT2Model(RecurrentDecoderModel):
    """[`RecurrentDecoderModel`] over GPT-2 under the recurrent GPT-2's name and config."""

    # What the stock base model is called in the family's checkpoints.
    stock_base_prefix = "transformer"
    config_class = RecurrentGPT2Config
    state_class = RecurrentGPT2State
    recurrence_saved_in_base_model = True


class RecurrentLlamaModel(RecurrentDecoderModel):
    """[`RecurrentDecoderModel`] over Llama under the recurrent Llama's name and config."""

    stock_base_prefix = "model"
    config_class = RecurrentLlamaConfig
    state_class = RecurrentLlamaState
    recurrence_saved_in_base_model = True


class RecurrentGPT2ForSequenceClassification(RecurrentDecoderForSequenceClassification):
    """[`RecurrentDecoderForSequenceClassification`] over GPT-2, in the recurrent GPT-2's checkpoint layout."""

    config_class = RecurrentGPT2Config
    base_model_class = RecurrentGPT2Model
    recurrence_saved_in_base_model = True


class RecurrentGPT2ForTokenClassification(RecurrentDecoderForTokenClassification):
    """[`RecurrentDecoderForTokenClassification`] over GPT-2, in the recurrent GPT-2's checkpoint layout, whose
    scoring layer is `classifier` as in GPT-2's own token classifier."""

    config_class = RecurrentGPT2Config
    base_model_class = RecurrentGPT2Model
    recurrence_saved_in_base_model = True
    saved_module_names = {"classifier": "score"}

    @property
    def classifier(self) -> nn.Linear:
        return self.score


class RecurrentLlamaForSequenceClassification(RecurrentDecoderForSequenceClassification):
    """[`RecurrentDecoderForSequenceClassification`] over Llama, in the recurrent Llama's checkpoint layout."""

    config_class = RecurrentLlamaConfig
    base_model_class = RecurrentLlamaModel
    recurrence_saved_in_base_model = True


class RecurrentLlamaForTokenClassification(RecurrentDecoderForTokenClassification):
    """[`RecurrentDecoderForTokenClassification`] over Llama, in the recurrent Llama's checkpoint layout."""

    config_class = RecurrentLlamaConfig
    base_model_class = RecurrentLlamaModel
    recurrence_saved_in_base_model = True


def _module_renamings(saved_module_names: dict[str, str]) -> list[WeightRenaming]:
    """Renamings of modules saved under another name (on disk -> in memory)."""
    return [
        WeightRenaming(source_patterns=rf"^{saved}\.", target_patterns=f"{name}.")
        for saved, name in saved_module_names.items()
    ]


def _causal_lm_renamings(saved_recurrence: str = "recurrence") -> list[WeightRenaming]:
    """From the stock causal-LM layout on disk (`model.*` / `transformer.*` / `lm_head.*`, the recurrence at
    `saved_recurrence.*`) to the backbone under `backbone.`; transformers reverses them on save."""
    renamings = []
    if saved_recurrence != "recurrence":
        renamings.append(WeightRenaming(source_patterns=rf"^{saved_recurrence}\.", target_patterns="recurrence."))
    for prefix in ("model", "transformer", "lm_head"):
        renamings.append(WeightRenaming(source_patterns=rf"^{prefix}\.", target_patterns=f"backbone.{prefix}."))
    return renamings


# Checkpoints keep the stock layout: the backbone's `model.*` / `transformer.*` / `lm_head.*` on disk, under
# `backbone.` (`model.backbone.` in the classification heads) in memory, reversed on save, so a stock checkpoint
# loads directly. The named families keep their recurrence inside the base model, as before the core.
register_checkpoint_conversion_mapping(
    RecurrentDecoderModel.__name__, _stock_layout_renamings("backbone"), overwrite=True
)
for _model_class in (RecurrentGPT2Model, RecurrentLlamaModel):
    _prefix = _model_class.stock_base_prefix
    register_checkpoint_conversion_mapping(
        _model_class.__name__,
        _stock_layout_renamings("backbone", (_prefix,), "recurrence", f"{_prefix}.recurrence"),
        overwrite=True,
    )
for _head in (
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderForTokenClassification,
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentLlamaForSequenceClassification,
    RecurrentLlamaForTokenClassification,
):
    named = _head.recurrence_saved_in_base_model
    prefixes = (_head.base_model_class.stock_base_prefix,) if named else STOCK_BASE_PREFIXES
    register_checkpoint_conversion_mapping(
        _head.__name__,
        _stock_layout_renamings(
            "model.backbone", prefixes, "model.recurrence", f"{prefixes[0]}.recurrence" if named else "recurrence"
        )
        + _module_renamings(_head.saved_module_names),
        overwrite=True,
    )
for _model_class, _saved_recurrence in (
    (RecurrentDecoderForCausalLM, "recurrence"),
    (RecurrentGPT2LMHeadModel, "transformer.recurrence"),
    (RecurrentLlamaForCausalLM, "model.recurrence"),
):
    register_checkpoint_conversion_mapping(
        _model_class.__name__, _causal_lm_renamings(_saved_recurrence), overwrite=True
    )


__all__ = [
    "RecurrentDecoderForCausalLM",
    "RecurrentDecoderForSequenceClassification",
    "RecurrentDecoderForTokenClassification",
    "RecurrentDecoderModel",
    "RecurrentDecoderPreTrainedModel",
    "RecurrentDecoderState",
    "RecurrentGPT2ForSequenceClassification",
    "RecurrentGPT2ForTokenClassification",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2State",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaForSequenceClassification",
    "RecurrentLlamaForTokenClassification",
    "RecurrentLlamaModel",
    "RecurrentLlamaState",
]
