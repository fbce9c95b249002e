# SPDX-License-Identifier: Apache-2.0
"""PyTorch recurrent GPT-2: a stock GPT-2 that reads text window by window and carries a one-vector summary of the
past, after Yoshida, Ettinger and Gimpel (2020), "Adding Recurrence to Pretrained Transformers for Improved
Efficiency and Context Size". Submodule names follow transformers' GPT-2 so that GPT-2 checkpoints load unchanged;
the only new parameters live under `transformer.recurrence`."""

import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import (
    GenericForSequenceClassification,
    GenericForTokenClassification,
    GradientCheckpointingLayer,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.pytorch_utils import Conv1D
from transformers.utils import ModelOutput, logging

from .configuration_recurrent_gpt2 import RecurrentGPT2Config


logger = logging.get_logger(__name__)

# transformers 5.24 renamed `past_key_values` to `cache`: the forward argument, the output field and what generate()
# passes back (its ModelOutput answers the old name through a property). The state travels under the installed
# version's name, and forward accepts both.
STATE_NAME = "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) else "past_key_values"


def _given_state(past_key_values: object | None, cache: object | None) -> object | None:
    """The state passed under either name."""
    if past_key_values is not None and cache is not None:
        raise ValueError(
            "Pass the state once: as cache or as past_key_values (its name before transformers 5.24), not both"
        )
    return past_key_values if cache is None else cache


def _model_output_class(name: str, doc: str, fields: dict[str, object]) -> type[ModelOutput]:
    """A ModelOutput dataclass with `fields` (name -> annotation, each defaulting to None), in which the field named
    `past_key_values` takes the installed transformers' name for the state (a dataclass's field names are fixed when
    the class is made, and transformers 5.24's generate() reads `outputs.cache`)."""
    return make_dataclass(
        name,
        [(STATE_NAME if key == "past_key_values" else key, kind, field(default=None)) for key, kind in fields.items()],
        bases=(ModelOutput,),
        namespace={"__doc__": doc, "__module__": __name__},
    )


def eager_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    # Adapted from transformers.models.gpt2.modeling_gpt2.eager_attention_forward (v5.23)
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (batch, head, q, k)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1).type(value.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2)  # (batch, q, head, head_dim)
    return attn_output, attn_weights


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
    query's current window (a re-read overlap token keeps its position in the new window). Rows of padding queries
    are zero.

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


def _check_state_fits(found: dict, expected: dict, source: object) -> None:
    """Refuse a state of another model shape (layers, heads, sizes), batch size or dtype than `expected`, naming every
    difference in one error."""
    found = found if isinstance(found, dict) else {}
    differences = [
        f"{key}={found.get(key)!r} ({'the input' if key == 'batch_size' else 'this model'}: {value!r})"
        for key, value in expected.items()
        if found.get(key) != value
    ]
    if differences:
        cast = found.get("dtype") != expected.get("dtype") and "dtype" in expected
        raise ValueError(
            f"{source} does not fit this model: "
            + ", ".join(differences)
            + ("; cast the state with state.to(dtype=...) or load the model in the state's dtype" if cast else "")
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
            problem = f"the row's first position is {int(positions[row, column])} but no past_key_values continue it"
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
        # A misshapen position_ids is reported by the backbone's input checks.
        return targets
    next_starts = nn.functional.pad(position_ids[..., 1:] == 0, (0, 1), value=False)  # ([batch,] length)
    return targets.masked_fill(next_starts.to(targets.device), -100)


class RecurrentGPT2Attention(nn.Module):
    """GPT-2 self-attention whose keys/values are `[h_prev] + cached window + new tokens`."""

    # Adapted from transformers.models.gpt2.modeling_gpt2.GPT2Attention (v5.23), without cross-attention.
    def __init__(self, config: RecurrentGPT2Config, layer_idx: int):
        super().__init__()
        self.config = config
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        if self.head_dim * self.num_heads != self.embed_dim:
            raise ValueError(f"n_embd={self.embed_dim} is not divisible by n_head={self.num_heads}")
        self.layer_idx = layer_idx
        self.scaling = self.head_dim**-0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scaling /= float(layer_idx + 1)
        self.is_causal = True
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)  # (batch, head, seq, head_dim)

    def key_value(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of already layer-normed inputs (batch, seq, hidden), as (batch, head, seq, head_dim)."""
        _, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        return self._heads(key), self._heads(value)

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key: torch.Tensor | None,
        past_value: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        h_prev_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        query, key, value = (self._heads(t) for t in self.c_attn(hidden_states).split(self.embed_dim, dim=2))
        if past_key is not None:
            key = torch.cat([past_key, key], dim=2)  # (batch, head, slots + seq, head_dim)
            value = torch.cat([past_value, value], dim=2)
        attn_key, attn_value = key, value
        if h_prev_key_value is not None:
            # h_prev is one extra key/value only: it never becomes a query, so the outputs stay one per token.
            attn_key = torch.cat([h_prev_key_value[0], key], dim=2)
            attn_value = torch.cat([h_prev_key_value[1], value], dim=2)

        # Only eager attention materialises the weights, as in transformers' GPT-2.
        attention_interface: Callable = eager_attention_forward
        if not output_attentions:
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            attn_key,
            attn_value,
            attention_mask,
            dropout=self.attn_dropout.p if self.training else 0.0,
            scaling=self.scaling,
        )
        attn_output = attn_output.reshape(*attn_output.shape[:-2], -1).contiguous()  # (batch, seq, hidden)
        attn_output = self.resid_dropout(self.c_proj(attn_output))
        return attn_output, key, value, attn_weights if output_attentions else None


class RecurrentGPT2MLP(nn.Module):
    # Adapted from transformers.models.gpt2.modeling_gpt2.GPT2MLP (v5.23)
    def __init__(self, intermediate_size: int, config: RecurrentGPT2Config):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, config.hidden_size)
        self.c_proj = Conv1D(config.hidden_size, intermediate_size)
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class RecurrentGPT2Block(nn.Module):
    # Adapted from transformers.models.gpt2.modeling_gpt2.GPT2Block (v5.23), without cross-attention.
    def __init__(self, config: RecurrentGPT2Config, layer_idx: int):
        super().__init__()
        hidden_size = config.hidden_size
        inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size
        self.ln_1 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.attn = RecurrentGPT2Attention(config, layer_idx=layer_idx)
        self.ln_2 = nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = RecurrentGPT2MLP(inner_dim, config)

    def h_prev_key_value(self, h_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`h_prev` (batch, hidden) enters this block like a token: through `ln_1` and the key/value projection."""
        return self.attn.key_value(self.ln_1(h_prev[:, None]))  # 2 x (batch, head, 1, head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key: torch.Tensor | None,
        past_value: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        h_prev: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        # h_prev's key/value are computed here, inside the block's forward, where FSDP2 has gathered its weights.
        h_prev_key_value = self.h_prev_key_value(h_prev) if h_prev is not None else None
        attn_output, key, value, attn_weights = self.attn(
            self.ln_1(hidden_states), past_key, past_value, attention_mask, h_prev_key_value, output_attentions
        )
        hidden_states = hidden_states + attn_output
        hidden_states = hidden_states + self.mlp(self.ln_2(hidden_states))
        return hidden_states, key, value, attn_weights


class RecurrentGPT2WindowStep(GradientCheckpointingLayer):
    """The unit that gradient checkpointing recomputes: every layer over one stretch of a window (`run`, the model's
    `_step`). It holds no weights, so the layers keep the names pretrained checkpoints give them. Checkpointing
    whole window steps keeps only each window's inputs (its embeddings and the cached keys/values) for the backward
    pass, the memory that backpropagation through several windows needs. `activation_checkpointing_enable()` flags it
    like any transformers layer."""

    def forward(self, run: Callable, settings: "_StepSettings", *tensors: torch.Tensor) -> tuple:
        # Everything positional and a flat tuple out: the reentrant checkpoint connects only the tensors of a tuple
        # output to the graph, and its recompute must see this call's arguments.
        return run(settings, *tensors).flat()


class RecurrentGPT2Recurrence(nn.Module):
    """The paper's recurrence module: softmax-normalised layer weights and the feed-forward network to `h_prev`."""

    def __init__(self, config: RecurrentGPT2Config):
        super().__init__()
        # alpha of paper Eq. 1, one logit per block output
        self.layer_weight_logits = nn.Parameter(torch.zeros(config.n_layer))
        sizes = [config.hidden_size, *config.recurrence_hidden_sizes]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(fan_in, fan_out), ACT2FN[config.activation_function]]
        layers.append(nn.Linear(sizes[-1], config.hidden_size))
        self.ffn = nn.Sequential(*layers)

    def layer_weights(self) -> torch.Tensor:
        return torch.softmax(self.layer_weight_logits.float(), dim=0)  # (n_layer,)

    def forward(self, window_summary: torch.Tensor) -> torch.Tensor:
        return self.ffn(window_summary)  # (batch, hidden)


class RecurrentGPT2State:
    """Everything the recurrent GPT-2 carries from one call to the next, passed as `past_key_values`.

    The model reads its input in windows of `window_size` tokens that repeat the last `window_overlap` tokens of the
    previous window. The schedule belongs to the state, not to the model: it defaults to the config's and may be
    given explicitly (to evaluate with another window size without touching `model.config`); it is fixed for the
    state's life. The state holds, per batch row:

    - `keys[i]`, `values[i]`: `(batch, n_head, slots, head_dim)` key/value cache of block `i` for the current window
      (slots that are padding are marked in `slot_valid`, `(batch, slots)`),
    - `fill`: `(batch,)` real tokens in the current window, and `window_index`: `(batch,)` windows completed,
    - `pooled_sum`: `(batch, hidden)` float32 running sum of the layer-weighted hidden states of the current window,
    - `h_prev`: `(batch, hidden)` the summary of the previous window that the current one sees (unused while `window_index == 0`),
    - `overlap_embeds`: `(batch, window_overlap, hidden)` token embeddings of the last `window_overlap` real tokens,
      which the next window starts by re-reading, with `overlap_valid`: `(batch, window_overlap)`.

    Rows advance independently, so a left-padded batch gives every row what it gets alone. Memory is bounded by one
    window whatever the length read. Tensors keep their autograd history; call `detach()` between calls to truncate
    backpropagation through time.

    The state holds the text it read: `overlap_embeds` are rows of the embedding table, so a nearest-neighbour search
    against it recovers the last `window_overlap` tokens verbatim, and the key/value cache encodes the current window.
    Treat a state (and a file written by `save()`) as you would the text itself.

    A state is not thread-safe: every call updates it in place, so two threads must not run the model on one state at
    once (a model is thread-safe in eval mode; give each thread its own state).

    Example:

    ```python
    >>> import torch
    >>> from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel

    >>> model = RecurrentGPT2LMHeadModel(RecurrentGPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16,
    ...     window_size=8, insertion_layer=1, vocab_size=100, bos_token_id=0, eos_token_id=0)).eval()
    >>> ids = torch.randint(0, 100, (1, 20))
    >>> out = model(ids[:, :13])
    >>> out = model(ids[:, 13:], past_key_values=out.past_key_values)
    >>> out.past_key_values.get_seq_length()
    20

    ```
    """

    def __init__(
        self,
        config: RecurrentGPT2Config,
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
        heads, head_dim = config.n_head, config.hidden_size // config.n_head
        empty_cache = torch.zeros(batch_size, heads, 0, head_dim, device=device, dtype=dtype)
        self.keys = [empty_cache] * config.n_layer
        self.values = [empty_cache] * config.n_layer
        self.slot_valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.fill = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.window_index = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.pooled_sum = torch.zeros(batch_size, config.hidden_size, device=device, dtype=torch.float32)
        self.h_prev = torch.zeros(batch_size, config.hidden_size, device=device, dtype=dtype)
        self.overlap_embeds = torch.zeros(batch_size, window_overlap, config.hidden_size, device=device, dtype=dtype)
        self.overlap_valid = torch.zeros(batch_size, window_overlap, dtype=torch.bool, device=device)
        self.seen_tokens = 0
        # (fill, window_index) shared by every row, known on the host, while no row has read padding: the schedule
        # is then planned without reading the device. None once rows may differ.
        self._lockstep: tuple[int, int] | None = (0, 0)

    # generate() asks every cache whether it can be compiled.
    is_compileable = False
    # transformers >= 5.24's generate() slices a prompt by get_seq_length() only for a cache with some layer that is
    # not linear attention (a linear layer has no length); the state has a length.
    is_linear = (False,)
    # The model_type this state belongs to: what a saved state's header names, and how copies of this class (the
    # installed one and one loaded as Hub remote code) recognise each other's states.
    _family = "recurrent_gpt2"

    _BATCH_TENSORS = (
        "slot_valid",
        "fill",
        "window_index",
        "pooled_sum",
        "h_prev",
        "overlap_embeds",
        "overlap_valid",
    )

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

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of input positions (padding included) consumed so far; what `generate` slices new tokens by."""
        return self.seen_tokens

    @property
    def lockstep(self) -> tuple[int, int] | None:
        """`(fill, window_index)` of every row while all rows have read the same number of tokens and no padding
        (their windows then open and close together, and the schedule is known on the host); None otherwise."""
        return self._lockstep

    def leave_lockstep(self) -> None:
        """The rows may differ from now on (an input with padding): plan every step from the per-row tensors."""
        self._lockstep = None

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "RecurrentGPT2State":
        self.keys = [fn(k) for k in self.keys]
        self.values = [fn(v) for v in self.values]
        for name in self._BATCH_TENSORS:
            setattr(self, name, fn(getattr(self, name)))
        return self

    def detach(self) -> "RecurrentGPT2State":
        """Cut the autograd history of every tensor (truncated BPTT between calls). Returns `self`."""
        return self._map(torch.Tensor.detach)

    def reset(self) -> "RecurrentGPT2State":
        """Forget everything: the next token starts a fresh first window. Returns `self`."""
        self.slot_valid = torch.zeros_like(self.slot_valid)
        self.compact()
        for name in ("fill", "window_index", "pooled_sum", "h_prev"):
            setattr(self, name, torch.zeros_like(getattr(self, name)))
        self.overlap_embeds = torch.zeros_like(self.overlap_embeds)
        self.overlap_valid = torch.zeros_like(self.overlap_valid)
        self.seen_tokens = 0
        self._lockstep = (0, 0)
        return self

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "RecurrentGPT2State":
        """Move to `device`; floating tensors other than the float32 pooled sum are cast to `dtype`. Returns `self`."""

        def move(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if dtype is not None and t.is_floating_point() and t is not self.pooled_sum else None
            return t.to(device=device, dtype=cast)

        return self._map(move)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row `i` becomes old row `beam_idx[i]`."""
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def window_summary(self) -> torch.Tensor:
        """(batch, hidden) float32: each row's layer-weighted hidden states averaged over its current window."""
        return self.pooled_sum / self.fill.clamp(min=1)[:, None]

    def next_step(self, real: torch.Tensor) -> tuple[torch.Tensor | None, int, int]:
        """Plan the next step over the input columns still to read, `real` ((batch, remaining) bool, True at real
        tokens). Returns the rows that begin a new window first ((batch,) bool: a full window and a real token to
        come; None if no row does), how many tokens those rows re-read (`window_overlap`, or 0 when none begins), and
        how many columns the step takes: as many as fit in the window of every row that has a real token to come.
        """
        if self._lockstep is not None:
            return self._next_step_in_lockstep(real)
        pending = real.any(1)
        starting = (self.fill == self.window_size) & pending
        if not bool(starting.any()):
            starting = None
        reread = self.window_overlap if starting is not None else 0
        fill = self.fill if starting is None else torch.where(starting, reread, self.fill)  # once the windows begin
        room = self.window_size - fill
        width = int(room[pending].min()) if bool(pending.any()) else real.shape[1]
        return starting, reread, min(real.shape[1], width)

    def _next_step_in_lockstep(self, real: torch.Tensor) -> tuple[torch.Tensor | None, int, int]:
        """`next_step` from the host-known fill: every row begins a window when one does, and nothing is read from
        the device (`real` is all True in lockstep)."""
        fill, _ = self._lockstep
        if fill < self.window_size:
            return None, 0, min(real.shape[1], self.window_size - fill)
        starting = torch.ones(self.batch_size, dtype=torch.bool, device=self.fill.device)
        return starting, self.window_overlap, min(real.shape[1], self.window_size - self.window_overlap)

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
        self.compact()

    def begin_documents(self, rows: torch.Tensor) -> None:
        """Forget the text of the `rows` ((batch,) bool): their next token starts a new document in a first window
        without `h_prev` or overlap to re-read, as in a new state (a boundary of packed sequences)."""
        # These rows no longer read in step with the others.
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
        """Record a step: every block's cache of the current window (`(batch, n_head, slots, head_dim)` each), the
        step's real-token mask `step_real` (batch, cols) (any re-read overlap, then the new columns), the
        layer-weighted sum of its hidden states `pooled` (batch, hidden), and the new columns' embeddings
        (batch, new, hidden) and mask (batch, new), whose last `window_overlap` real tokens the next window re-reads.
        """
        self.keys, self.values = keys, values
        self.slot_valid = torch.cat([self.slot_valid, step_real], dim=1)
        if self.slot_valid.shape[1] > self.window_size:
            # Padding columns occupy slots without filling windows; drop them so memory stays one window.
            self.compact()
        self.fill = self.fill + step_real.sum(1)
        if self._lockstep is not None:
            self._lockstep = (self._lockstep[0] + step_real.shape[1], self._lockstep[1])
        self.pooled_sum = self.pooled_sum + pooled
        self.remember_overlap(new_embeds, new_real)
        self.seen_tokens += new_real.shape[1]

    def compact(self) -> None:
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

    def remember_overlap(self, embeds: torch.Tensor, real: torch.Tensor) -> None:
        """Keep the embeddings of the last `window_overlap` real tokens: (batch, new, hidden), (batch, new)."""
        if self.window_overlap == 0:
            return
        embeds = torch.cat([self.overlap_embeds, embeds], dim=1)
        real = torch.cat([self.overlap_valid, real], dim=1)
        index = _right_packing_index(real, self.window_overlap)
        self.overlap_embeds = _gather_slots(embeds, index, 1)
        self.overlap_valid = real.gather(1, index)

    @staticmethod
    def _config_model_shape(config: RecurrentGPT2Config) -> dict[str, int]:
        """The sizes of a model that a state belongs to, as a saved state records them."""
        return {
            "layers": config.n_layer,
            "key_value_heads": config.n_head,
            "head_dim": config.hidden_size // config.n_head,
            "hidden_size": config.hidden_size,
        }

    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Write the state to a safetensors file (its tensors plus a JSON header: family, format version, model shape,
        the state's settings), to continue the text later, elsewhere, or with the model loaded as remote code.

        Autograd history is not saved. Refuses to replace an existing file unless `overwrite=True`.
        """
        tensors, header = self._file_contents()
        _write_state_file(path, tensors, header, overwrite)

    @classmethod
    def load(
        cls, path: str | os.PathLike, config: RecurrentGPT2Config, device: torch.device | str | None = None
    ) -> "RecurrentGPT2State":
        """Read a state written by `save()` for a model with `config`, onto `device` (default: CPU).

        Refuses, naming the difference, a file of another model family, of another model shape, of another state
        file format version, or with settings this config cannot run. The state is only meaningful with the weights
        that produced it; that is not checked.
        """
        tensors, header = _read_state_file(path, config.model_type, device)
        _check_state_fits(header.get("model_shape"), cls._config_model_shape(config), path)
        return cls._from_file_contents(config, tensors, header, path)

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
            "model_shape": self._model_shape_of_tensors(),
        }
        return tensors, header

    def _model_shape_of_tensors(self) -> dict[str, int]:
        key = self.keys[0]  # (batch, key_value_heads, slots, head_dim)
        return {
            "layers": len(self.keys),
            "key_value_heads": key.shape[1],
            "head_dim": key.shape[3],
            "hidden_size": self.h_prev.shape[1],
        }

    @classmethod
    def _from_file_contents(
        cls, config: RecurrentGPT2Config, tensors: dict[str, torch.Tensor], header: dict, source: object
    ) -> "RecurrentGPT2State":
        """The state that `_file_contents` described, checked tensor by tensor against a fresh one's shapes."""
        window_size = _header_int(header, "window_size", source, minimum=1)
        window_overlap = _header_int(header, "window_overlap", source)
        seen_tokens = _header_int(header, "seen_tokens", source)
        try:
            batch = tensors["fill"].shape[0]
            layers = cls._config_model_shape(config)["layers"]
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

    @classmethod
    def adopt(
        cls, state: object, config: RecurrentGPT2Config, batch_size: int, dtype: torch.dtype
    ) -> "RecurrentGPT2State":
        """`state` as an instance of this class, checked to fit a model with `config` reading `batch_size` rows in
        `dtype`: itself, or a state of the same family built by another copy of this class (the installed package's
        vs the one loaded as Hub remote code), rebuilt from its tensors (not copied) and checked as a file is."""
        if not isinstance(state, cls):
            state = cls._adopt_other_copy(state, config)
        found = {**state._model_shape_of_tensors(), "batch_size": state.batch_size, "dtype": state.dtype}
        expected = {**cls._config_model_shape(config), "batch_size": batch_size, "dtype": dtype}
        _check_state_fits(found, expected, "past_key_values")
        return state

    @classmethod
    def _adopt_other_copy(cls, state: object, config: RecurrentGPT2Config) -> "RecurrentGPT2State":
        if type(state).__name__ != cls.__name__ or getattr(state, "_family", None) != cls._family:
            # PEFT prefix tuning is the usual source of a transformers Cache here: it pre-fills one with its
            # virtual tokens, which a state bounded by one window has no place for.
            raise TypeError(
                f"past_key_values must be a {cls.__name__} returned by this model (or saved by one and read with "
                f"{cls.__name__}.load), got {type(state).__name__}. A transformers Cache cannot carry this model's "
                "recurrent state, so PEFT prefix tuning (which passes one holding its virtual tokens) is not "
                "supported; LoRA and prompt tuning are"
            )
        tensors, header = state._file_contents()
        source = f"the {type(state).__module__} state"
        _check_state_fits(header.get("model_shape"), cls._config_model_shape(config), source)
        return cls._from_file_contents(config, tensors, header, source)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(batch_size={self.batch_size}, seen_tokens={self.seen_tokens}, "
            f"window_size={self.window_size}, window_overlap={self.window_overlap}, "
            f"fill={self.fill.tolist()}, window_index={self.window_index.tolist()}, "
            f"cache_slots={self.slot_valid.shape[1]})"
        )


RecurrentGPT2ModelOutput = _model_output_class(
    "RecurrentGPT2ModelOutput",
    """
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`):
            Final hidden state of every input position, taken from the window in which the position is new.
        past_key_values ([`RecurrentGPT2State`], *optional*):
            State to continue from, returned when `use_cache=True`; the field is named `cache` from transformers 5.24
            on (`past_key_values` still reads it there).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            Embedding output and every block's output, `(batch_size, sequence_length, hidden_size)` each.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Every block's attention weights, `(batch_size, num_heads, sequence_length, 1 + window_size)` each:
            column 0 is `h_prev` (zero outside the insertion block and in a row's first window), column `1 + j` is
            position `j` of the query's own window (the state's `window_size`; the overlap a window re-reads holds
            its first positions). Rows of padding positions are zero.
    """,
    {
        "last_hidden_state": torch.FloatTensor | None,
        "past_key_values": RecurrentGPT2State | None,
        "hidden_states": tuple[torch.FloatTensor, ...] | None,
        "attentions": tuple[torch.FloatTensor, ...] | None,
    },
)


RecurrentGPT2CausalLMOutput = _model_output_class(
    "RecurrentGPT2CausalLMOutput",
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Causal language-modelling loss over the whole input (each token predicted once), when `labels` is given.
        logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`, *optional*):
            Next-token scores. Omitted when `labels` is given, unless `return_logits=True`.
        past_key_values ([`RecurrentGPT2State`], *optional*):
            State to continue from, returned when `use_cache=True`; the field is named `cache` from transformers 5.24
            on (`past_key_values` still reads it there).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            Embedding output and every block's output, `(batch_size, sequence_length, hidden_size)` each.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Every block's attention weights, `(batch_size, num_heads, sequence_length, 1 + window_size)` each:
            column 0 is `h_prev` (zero outside the insertion block and in a row's first window), column `1 + j` is
            position `j` of the query's own window (the state's `window_size`; the overlap a window re-reads holds
            its first positions). Rows of padding positions are zero.
    """,
    {
        "loss": torch.FloatTensor | None,
        "logits": torch.FloatTensor | None,
        "past_key_values": RecurrentGPT2State | None,
        "hidden_states": tuple[torch.FloatTensor, ...] | None,
        "attentions": tuple[torch.FloatTensor, ...] | None,
    },
)


@dataclass
class _StepOutput:
    hidden: torch.Tensor  # (batch, new, hidden) final hidden states of the step's new positions
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pooled: torch.Tensor  # (batch, hidden) float32 layer-weighted sum over the step's real positions
    all_hidden: tuple[torch.Tensor, ...] | None
    head: torch.Tensor | None  # what step_head returned (the window's loss)
    attentions: tuple[torch.Tensor, ...] | None  # per block, (batch, head, new, 1 + window_size)

    def flat(self) -> tuple[torch.Tensor | None, ...]:
        return (
            self.hidden,
            self.pooled,
            self.head,
            *self.keys,
            *self.values,
            *(self.all_hidden or ()),
            *(self.attentions or ()),
        )

    @classmethod
    def from_flat(cls, flat: tuple[torch.Tensor | None, ...], num_layers: int, settings: "_StepSettings"):
        hidden, pooled, head = flat[:3]
        keys, values = list(flat[3 : 3 + num_layers]), list(flat[3 + num_layers : 3 + 2 * num_layers])
        rest = flat[3 + 2 * num_layers :]
        all_hidden = rest[: num_layers + 1] if settings.output_hidden_states else None
        attentions = rest[-num_layers:] if settings.output_attentions else None
        return cls(hidden, keys, values, pooled, all_hidden, head, attentions)


@dataclass(frozen=True)
class _StepSettings:
    """What a step needs besides tensors."""

    num_new: int  # the step's new columns (after any re-read overlap)
    window_size: int
    step_head: Callable | None  # run on the new positions' final hidden states and targets (a window's loss)
    output_hidden_states: bool
    output_attentions: bool
    # Known on the host when the rows are in lockstep (None: read from the step's tensors): whether the rows have
    # an h_prev, and whether every column of the step is a real token.
    uses_h_prev: bool | None = None
    all_real: bool | None = None


class RecurrentGPT2PreTrainedModel(PreTrainedModel):
    config_class = RecurrentGPT2Config
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RecurrentGPT2Block"]
    _supports_sdpa = True
    _is_stateful = True
    # Buffers that old GPT-2 checkpoints still carry.
    _keys_to_ignore_on_load_unexpected = [r"\.attn\.masked_bias$", r"\.attn\.bias$"]

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate() must not hand us a DynamicCache: the model creates and returns its own RecurrentGPT2State.
        return False

    def new_state(
        self, batch_size: int, window_size: int | None = None, window_overlap: int | None = None
    ) -> RecurrentGPT2State:
        """A fresh state for `batch_size` rows on the model's device and dtype, to pass as `past_key_values`.

        Its window schedule defaults to the config's; give `window_size` / `window_overlap` to read with another
        schedule without changing `model.config` (which other callers of the model may be using meanwhile).
        """
        weight = self.get_input_embeddings().weight
        return RecurrentGPT2State(
            self.config,
            batch_size,
            weight.device,
            weight.dtype,
            window_size=window_size,
            window_overlap=window_overlap,
        )

    def load_state(self, path: str | os.PathLike) -> RecurrentGPT2State:
        """A state written by `RecurrentGPT2State.save`, read onto the model's device, to pass as `past_key_values`
        and continue the text it read (see `RecurrentGPT2State.load` for what is checked)."""
        return RecurrentGPT2State.load(path, self.config, self.device)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, Conv1D):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        # GPT-2's scaled residual init, as transformers does it: "Scale the weights of residual layers at
        # initialization by a factor of 1/sqrt(N) where N is the # of residual layers" (GPT-2 paper).
        if isinstance(module, (RecurrentGPT2Attention, RecurrentGPT2MLP)):
            init.normal_(module.c_proj.weight, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))
        if isinstance(module, RecurrentGPT2Recurrence):
            # Equal layer weights to start with: the summary is the plain mean over layers.
            init.zeros_(module.layer_weight_logits)


class RecurrentGPT2Model(RecurrentGPT2PreTrainedModel):
    """GPT-2 transformer with window-level recurrence; returns the final hidden state of every input position."""

    def __init__(self, config: RecurrentGPT2Config):
        super().__init__(config)
        config.check_recurrence_settings()
        self.embed_dim = config.hidden_size
        self.wte = nn.Embedding(config.vocab_size, self.embed_dim)
        self.wpe = nn.Embedding(config.n_positions, self.embed_dim)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([RecurrentGPT2Block(config, layer_idx=i) for i in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(self.embed_dim, eps=config.layer_norm_epsilon)
        self.recurrence = RecurrentGPT2Recurrence(config)
        self.window_step = RecurrentGPT2WindowStep()
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, new_embeddings: nn.Embedding) -> None:
        self.wte = new_embeddings

    def _attention_masks(
        self,
        real: torch.Tensor,
        slot_valid: torch.Tensor,
        has_h_prev: torch.Tensor,
        dtype: torch.dtype,
        eager: bool,
        all_real: bool | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Masks for the ordinary blocks and for the insertion block, (batch, 1, new, [1 +] slots + new).

        A query sees the valid cached slots, the real new tokens up to itself, and itself (so padding queries never
        see an empty row); at the insertion block also `h_prev` where the row has one. `all_real`: whether every
        column is a real token, when known on the host (None: read from `real`).
        """
        batch, new = real.shape
        slots = slot_valid.shape[1]
        plain = None
        if eager or slots or not (all_real if all_real is not None else bool(real.all())):
            causal = torch.ones(new, new, dtype=torch.bool, device=real.device).tril()
            own = torch.eye(new, dtype=torch.bool, device=real.device)
            new_part = (causal & real[:, None, :]) | own  # (batch, new, new)
            plain = torch.cat([slot_valid[:, None, :].expand(batch, new, slots), new_part], dim=-1)[:, None]
        h_prev_part = has_h_prev[:, None, None, None].expand(batch, 1, new, 1)
        if plain is None:
            causal = torch.ones(new, new, dtype=torch.bool, device=real.device).tril()
            inserted = torch.cat([h_prev_part, causal.expand(batch, 1, new, new)], dim=-1)
        else:
            inserted = torch.cat([h_prev_part, plain], dim=-1)
        if eager:
            plain, inserted = (
                torch.zeros_like(m, dtype=dtype).masked_fill(~m, torch.finfo(dtype).min) for m in (plain, inserted)
            )
        return plain, inserted

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
    ) -> _StepOutput:
        """Run every block over one stretch of columns that stays inside each row's current window.

        embeds: (batch, cols, hidden) token embeddings (a re-read overlap prefix, then `num_new` new columns);
        real: (batch, cols) bool; fill: (batch,) tokens already in each row's window; `past` = the cached keys of
        every block, then their values. Pure in its tensor arguments, so it can be recomputed under checkpointing.
        """
        n_layer, num_new = self.config.n_layer, settings.num_new
        positions = (fill[:, None] + real.cumsum(1) - 1).clamp(min=0)  # (batch, cols): restart in every window
        hidden = self.drop(embeds + self.wpe(positions))
        output_attentions = settings.output_attentions
        eager = output_attentions or self.config._attn_implementation == "eager"
        plain_mask, inserted_mask = self._attention_masks(
            real, slot_valid, has_h_prev, hidden.dtype, eager, settings.all_real
        )
        use_h_prev = settings.uses_h_prev if settings.uses_h_prev is not None else bool(has_h_prev.any())
        # Each layer's share of the pooled sum is one batched product: (batch, 1, cols) weights of the real columns
        # times (batch, cols, hidden) states, accumulated into (batch, 1, hidden).
        real_weights = self.recurrence.layer_weights()[:, None, None, None] * real.float()[None, :, None, :]
        pooled = torch.zeros(hidden.shape[0], 1, hidden.shape[2], device=hidden.device)
        all_hidden = [hidden[:, -num_new:]] if settings.output_hidden_states else None
        attentions = [] if output_attentions else None
        key_valid = torch.cat([slot_valid, real], dim=1)  # (batch, slots + cols)
        keys, values = [], []
        for i, block in enumerate(self.h):
            past_key = past[i] if past[i].shape[2] else None
            past_value = past[n_layer + i] if past_key is not None else None
            inserting = use_h_prev and i == self.config.insertion_layer
            hidden, key, value, weights = block(
                hidden,
                past_key,
                past_value,
                inserted_mask if inserting else plain_mask,
                h_prev if inserting else None,
                output_attentions,
            )
            if attentions is not None:
                query_weights = weights[:, :, -num_new:]  # (batch, head, new, [1 +] slots + cols)
                attentions.append(
                    _window_attentions(query_weights, key_valid, inserting, settings.window_size, real[:, -num_new:])
                )
            keys.append(key)
            values.append(value)
            if i == n_layer - 1:
                hidden = self.ln_f(hidden)
            pooled = torch.baddbmm(pooled, real_weights[i], hidden.float())
            if all_hidden is not None:
                all_hidden.append(hidden[:, -num_new:])
        hidden = hidden[:, -num_new:]
        head = settings.step_head(hidden, targets) if settings.step_head is not None else None
        return _StepOutput(
            hidden,
            keys,
            values,
            pooled[:, 0],
            tuple(all_hidden) if all_hidden else None,
            head,
            tuple(attentions) if attentions is not None else None,
        )

    def _next_h_prev(self, state: RecurrentGPT2State) -> torch.Tensor:
        """(batch, hidden) the `h_prev` of each row's next window: its current window's summary through the FFN."""
        summary = state.window_summary()
        k = self.config.bptt_windows
        if k is not None and self.training:
            # Windows 1..k+1, k+2..2k+2, ... form the runs gradient may cross; cut at the window before each run.
            cut = (state.window_index % (k + 1) == 0)[:, None]
            summary = torch.where(cut, summary.detach(), summary)
        return self.recurrence(summary.to(state.h_prev.dtype))

    def _forward_windows(
        self,
        inputs_embeds: torch.Tensor,
        real: torch.Tensor,
        document_starts: torch.Tensor | None,
        state: RecurrentGPT2State,
        step_targets: torch.Tensor | None,
        step_head: Callable | None,
        output_hidden_states: bool,
        output_attentions: bool,
    ) -> list[_StepOutput]:
        """Feed (batch, length, hidden) embeddings through the state's window schedule, advancing it in place.

        Each step covers columns that stay inside every row's current window; a row whose window is full begins a
        new one (re-reading its overlap) just before its next real token. At the `document_starts` ((batch, length)
        bool, packed sequences) a row forgets its text, so each document is read as if alone from a new state.
        """
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
            step = _StepOutput.from_flat(self.window_step(self._step, settings, *args), len(state.keys), settings)
            state.append_step(step.keys, step.values, step_real, step.pooled, new_embeds, new_real)
            # The state owns the cache now; a reference left here would keep every window's cache alive until return.
            step.keys = step.values = []
            steps.append(step)
            start = stop
        return steps

    def _run(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        past_key_values: RecurrentGPT2State | None,
        inputs_embeds: torch.Tensor | None,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
        kwargs: dict,
        step_targets: torch.Tensor | None = None,
        step_head: Callable | None = None,
    ) -> "_WindowsRun":
        """The one entry of `forward` and of the heads: check the inputs, run the window schedule, keep the outputs.

        `step_head(hidden, targets)`, when given, runs inside every step on its final hidden states
        (batch, new, hidden) and its columns of `step_targets` (batch, length); its results are in
        `_WindowsRun.head_outputs()`. A head's loss computed this way never holds more than one window's
        (batch, new, vocab) logits where nothing keeps them for backward: under `torch.no_grad()` (evaluation with
        labels) and under gradient checkpointing, which recomputes them per window. With plain autograd every
        window's logits stay alive for backward either way.
        """
        inputs_embeds, real, document_starts, state = self._prepare(
            input_ids, attention_mask, past_key_values, inputs_embeds, kwargs
        )
        output_hidden_states, output_attentions = self._output_flags(output_hidden_states, output_attentions)
        steps = self._forward_windows(
            inputs_embeds,
            real,
            document_starts,
            state,
            step_targets,
            step_head,
            output_hidden_states,
            output_attentions,
        )
        return _WindowsRun(state, steps, output_hidden_states, output_attentions)

    def _prepare(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        past_key_values: RecurrentGPT2State | None,
        inputs_embeds: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, RecurrentGPT2State]:
        """Validate the inputs; return the new positions' embeddings, their real-token mask, where packed documents
        start (from `position_ids`, see `_document_starts`) and the state."""
        if kwargs.get("token_type_ids") is not None:
            raise ValueError("token_type_ids are not supported by the recurrent GPT-2")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
            inputs_embeds = self.wte(input_ids)
        batch, length = inputs_embeds.shape[:2]
        if length == 0:
            raise ValueError("The input is empty (length 0)")
        # The config may have been changed since the model was built; integer checks only, no device sync.
        self.config.check_model_settings()
        if past_key_values is None:
            past_key_values = RecurrentGPT2State(self.config, batch, inputs_embeds.device, inputs_embeds.dtype)
        else:
            past_key_values = RecurrentGPT2State.adopt(past_key_values, self.config, batch, inputs_embeds.dtype)
            self.config.check_window_schedule(past_key_values.window_size, past_key_values.window_overlap)
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
        continuing = past_key_values.get_seq_length() > 0
        # Positions themselves restart in every window and come from the window schedule (so forward() has no
        # position_ids parameter, and generate() builds none); given ones only mark where packed documents start.
        document_starts = _document_starts(kwargs.get("position_ids"), real, continuing)
        return inputs_embeds, real, document_starts, past_key_values

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentGPT2State | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        cache: RecurrentGPT2State | None = None,
        **kwargs,
    ) -> RecurrentGPT2ModelOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Token ids; with `past_key_values`, only the new tokens.
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
                1 for real tokens, 0 for padding (anywhere; padding never changes real tokens' outputs). May also
                cover the past tokens, as `generate()` passes it; then its last `sequence_length` columns are used.
            past_key_values or cache ([`RecurrentGPT2State`], *optional*):
                State returned by a previous call (either name on any supported transformers: `cache` is its name
                from transformers 5.24 on); the input continues that text exactly. A fresh
                `RecurrentGPT2State(config, batch_size, window_size=..., window_overlap=...)` runs the input with
                that window schedule instead of the config's; the schedule always comes from the state.
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`, *optional*):
                Token embeddings instead of `input_ids`.
            position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Only marks packed documents (the positions themselves restart in every window): positions count up by
                one within a document and restart at 0 where the next one begins, as TRL's `SFTTrainer(packing=True)`
                writes them. Each document is then read exactly as if alone from a new state (its windows start at its
                first token), and the returned state is that of each row's last document. With `past_key_values`, a row
                whose first position is not 0 continues the state's text. Plain `0, 1, ...` change nothing; positions
                at padding are not read; `(1, sequence_length)` applies to every row. Any other sequence raises a
                `ValueError`.
            use_cache (`bool`, *optional*, defaults to `True`):
                Whether to return the state. `config.use_cache` is not consulted: `Trainer` switches it off for
                training, and a recurrent model's state is part of its result.
            output_hidden_states (`bool`, *optional*):
                Whether to return the embedding output and every block's output.
            output_attentions (`bool`, *optional*):
                Whether to return every block's attention weights, laid out by window position (see
                [`RecurrentGPT2ModelOutput`]); computed with eager attention.
        """
        state = _given_state(past_key_values, cache)
        run = self._run(
            input_ids, attention_mask, state, inputs_embeds, output_hidden_states, output_attentions, kwargs
        )
        output = RecurrentGPT2ModelOutput(last_hidden_state=run.last_hidden_state(), **run.outputs(use_cache))
        return output if return_dict is not False else output.to_tuple()

    def _output_flags(self, output_hidden_states: bool | None, output_attentions: bool | None) -> tuple[bool, bool]:
        """The call's values, else the config's."""
        return (
            bool(output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states),
            bool(output_attentions if output_attentions is not None else self.config.output_attentions),
        )


def _concat_layers(per_step: list[tuple[torch.Tensor, ...]], dim: int) -> tuple[torch.Tensor, ...]:
    """Per-layer tensors of consecutive steps joined along their sequence dimension `dim`."""
    return tuple(torch.cat(layer, dim=dim) for layer in zip(*per_step, strict=True))


@dataclass
class _WindowsRun:
    """One call's window steps and the state they advanced; builds the outputs every forward of the family returns."""

    state: RecurrentGPT2State
    steps: list[_StepOutput]
    output_hidden_states: bool
    output_attentions: bool

    def last_hidden_state(self) -> torch.Tensor:
        """(batch, length, hidden) final hidden state of every input position."""
        return torch.cat([s.hidden for s in self.steps], dim=1)

    def head_outputs(self) -> list[torch.Tensor]:
        """What the step head returned, one per step."""
        return [s.head for s in self.steps]

    def outputs(self, use_cache: bool | None) -> dict:
        """The output fields every forward shares: the state (unless `use_cache=False`), hidden states, attentions."""
        return {
            STATE_NAME: self.state if use_cache is not False else None,
            "hidden_states": (
                _concat_layers([s.all_hidden for s in self.steps], dim=1) if self.output_hidden_states else None
            ),
            "attentions": _concat_layers([s.attentions for s in self.steps], dim=2)
            if self.output_attentions
            else None,
        }


class RecurrentGPT2LMHeadModel(RecurrentGPT2PreTrainedModel, GenerationMixin):
    """Recurrent GPT-2 with GPT-2's language-modelling head (tied to the input embeddings).

    Example:

    ```python
    >>> import torch
    >>> from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel

    >>> config = RecurrentGPT2Config(
    ...     n_layer=2, n_embd=32, n_head=2, n_positions=32, window_size=16, insertion_layer=1,
    ...     vocab_size=100, bos_token_id=0, eos_token_id=0,
    ... )
    >>> model = RecurrentGPT2LMHeadModel(config)
    >>> ids = torch.randint(0, 100, (2, 100))  # 7 windows, far past n_positions
    >>> model(ids, labels=ids).loss.shape
    torch.Size([])

    ```
    """

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: RecurrentGPT2Config):
        super().__init__(config)
        self.transformer = RecurrentGPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # transformers picks the loss from the class-name suffix, which "LMHeadModel" is not.
        self.loss_type = "ForCausalLM"
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def _targets(
        self,
        labels: torch.Tensor | None,
        shift_labels: torch.Tensor | None,
        inputs: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """(batch, length) target of every new position, -100 where none: `shift_labels` as given (Trainer passes
        pre-shifted targets under context parallelism and sequence packing), else `labels` shifted left by one; none
        at the last token of a packed document (`position_ids`). `inputs`: the input ids or embeddings, whose
        (batch, length) the targets must have."""
        targets = shift_labels
        if targets is None:
            if labels is None:
                return None
            targets = nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        if inputs is None:  # the backbone's input checks say what is missing
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
            logits, None, self.config.vocab_size, shift_labels=shift_labels, num_items_in_batch=num_items
        )

    def _prepare_cache_for_generation(self, generation_config: GenerationConfig, model_kwargs: dict, *args, **kwargs):
        # generate() would only warn that a cache_implementation "will be ignored" and run anyway.
        if generation_config.cache_implementation is not None:
            raise ValueError(
                f"cache_implementation={generation_config.cache_implementation!r} cannot be honoured by "
                f"{type(self).__name__}: the model carries its own recurrent state of bounded size (returned as "
                "past_key_values) instead of a transformers Cache, so there is no cache to choose. Remove "
                "cache_implementation from the generate() call or from the generation config (generation_config.json); "
                "a fixed-size cache for the recurrent state is future work"
            )
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def init_continuous_batching(self, *args, **kwargs):
        # generate(cache_implementation="paged") and generate_batch() come here, past _prepare_cache_for_generation.
        raise ValueError(
            f"Continuous batching (cache_implementation='paged', generate_batch()) cannot be used with "
            f"{type(self).__name__}: it needs a paged key/value cache, and the model carries its own recurrent state "
            "instead. Call generate() without cache_implementation; batched prompts may be left-padded"
        )

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentGPT2State | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        cache: RecurrentGPT2State | None = None,
        **kwargs,
    ) -> RecurrentGPT2CausalLMOutput:
        r"""
        Args:
            input_ids, attention_mask, past_key_values, cache, inputs_embeds, position_ids, use_cache, output_hidden_states, output_attentions:
                As in [`RecurrentGPT2Model.forward`].
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, usually `input_ids`; shifted inside the model (`-100` is ignored). The loss is computed
                window by window, so the `(tokens, vocab)` logits are never materialised for it. With packed
                `position_ids`, the last token of a document predicts nothing (not the next document's first token).
            return_logits (`bool`, *optional*):
                Whether to return the logits. Defaults to `True` without `labels` and `False` with them.
            logits_to_keep (`int` or `torch.Tensor`, *optional*, defaults to 0):
                An int: return the logits of the last `logits_to_keep` positions only (0: all), as `generate()` asks
                for when it reads a prompt, so that reading a long prompt never holds its `(length, vocab)` logits.
                A 1D tensor: the positions to keep. Not combinable with `labels`.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*):
                Passed by `Trainer` under gradient accumulation: the loss is summed and divided by it.
            shift_labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets already aligned with the positions that predict them (Trainer passes them under context
                parallelism and sequence packing); used as given instead of shifting `labels`.
        """
        keeps_some = not isinstance(logits_to_keep, int) or logits_to_keep != 0
        if keeps_some and (labels is not None or kwargs.get("shift_labels") is not None):
            raise ValueError(
                f"logits_to_keep={logits_to_keep} cannot be combined with labels: the loss needs every position"
            )
        shift_labels = self._targets(
            labels,
            kwargs.get("shift_labels"),
            input_ids if input_ids is not None else inputs_embeds,
            kwargs.get("position_ids"),
        )
        keep_logits = shift_labels is None if return_logits is None else return_logits
        num_items = None
        if shift_labels is not None:
            num_items = kwargs.get("num_items_in_batch")
            if num_items is None:
                num_items = (shift_labels != -100).sum()

        def window_loss(hidden: torch.Tensor, step_labels: torch.Tensor) -> torch.Tensor:
            return self._loss(self.lm_head(hidden), step_labels, num_items)  # one window's (batch, new, vocab) logits

        loss_per_window = shift_labels is not None and not keep_logits
        run = self.transformer._run(
            input_ids,
            attention_mask,
            _given_state(past_key_values, cache),
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            kwargs,
            step_targets=shift_labels if loss_per_window else None,
            step_head=window_loss if loss_per_window else None,
        )
        logits = loss = None
        if loss_per_window:
            loss = torch.stack(run.head_outputs()).sum()
        elif keep_logits:
            kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            # One head call over the kept positions: cheaper than concatenating per-window logits.
            logits = self.lm_head(run.last_hidden_state()[:, kept])
            loss = self._loss(logits, shift_labels, num_items) if shift_labels is not None else None
        output = RecurrentGPT2CausalLMOutput(loss=loss, logits=logits, **run.outputs(use_cache))
        return output if return_dict is not False else output.to_tuple()


class RecurrentGPT2ForSequenceClassification(GenericForSequenceClassification, RecurrentGPT2PreTrainedModel):
    """Recurrent GPT-2 with a linear classifier on the last non-padding token of the document (transformers' generic
    sequence-classification head, as stock GPT-2's), so a document of any length is classified after reading all of
    it window by window. `score` matches stock `GPT2ForSequenceClassification`, whose checkpoints load unchanged.

    A long document may also be read in pieces: pass each call's state (`past_key_values`, `cache` from transformers
    5.24 on) to the next and take the logits of the last call. As with stock GPT-2, a batch of more than one row needs
    `config.pad_token_id` (padding is found by it, on either side).
    """

    base_model_prefix = "transformer"

    def __init__(self, config: RecurrentGPT2Config):
        # The generic head builds its backbone with AutoModel, which remote code cannot resolve: build ours here.
        RecurrentGPT2PreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.transformer = RecurrentGPT2Model(config)
        self.score = nn.Linear(config.n_embd, config.num_labels, bias=False)
        self.post_init()


class RecurrentGPT2ForTokenClassification(GenericForTokenClassification, RecurrentGPT2PreTrainedModel):
    """Recurrent GPT-2 with a linear classifier on every token's final hidden state (transformers' generic
    token-classification head), for inputs of any length. Named `classifier` as in stock `GPT2ForTokenClassification`,
    whose checkpoints load unchanged."""

    base_model_prefix = "transformer"

    def __init__(self, config: RecurrentGPT2Config):
        RecurrentGPT2PreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.transformer = RecurrentGPT2Model(config)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(0.1 if dropout is None else dropout)
        self.classifier = nn.Linear(config.n_embd, config.num_labels)
        self.post_init()

    @property
    def score(self) -> nn.Linear:
        # The generic forward calls the classifier `score`.
        return self.classifier


__all__ = [
    "RecurrentGPT2ForSequenceClassification",
    "RecurrentGPT2ForTokenClassification",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2PreTrainedModel",
    "RecurrentGPT2State",
]
