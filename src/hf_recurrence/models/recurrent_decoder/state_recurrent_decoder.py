# SPDX-License-Identifier: Apache-2.0
"""The state the recurrence carries from one call to the next ([`RecurrentDecoderState`]), its fixed-shape variant for
compiled decoding ([`FixedShapeWindowCache`], `generate(cache_implementation="static")`) and the state file format
(`RecurrentDecoderState.save` / `load`).

Example:

```python
>>> import tempfile
>>> from pathlib import Path
>>> import torch
>>> from transformers import LlamaConfig
>>> from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM, RecurrentDecoderState

>>> backbone = LlamaConfig(
...     vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
...     num_key_value_heads=2, max_position_embeddings=32,
... )
>>> model = RecurrentDecoderForCausalLM(RecurrentDecoderConfig(text_config=backbone, window_size=16, insertion_layer=1))
>>> state = model(torch.randint(0, 100, (2, 40))).past_key_values
>>> state.fill.tolist(), state.window_index.tolist()  # 40 tokens: two full windows, then 8 tokens of the third
([8, 8], [2, 2])
>>> path = Path(tempfile.mkdtemp()) / "state.safetensors"
>>> state.save(path)  # to continue the text later, or elsewhere
>>> RecurrentDecoderState.load(path, model.config).seen_tokens
40

```
"""

import functools
import glob
import json
import os
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import PreTrainedConfig
from transformers.generation import CompileConfig
from transformers.utils import ModelOutput

from .configuration_recurrent_decoder import RecurrentDecoderConfig
from .step_recurrent_decoder import _StepSettings, kept_token_slots, merge_pooled, selected_summary


# transformers 5.24 renamed `past_key_values` to `cache`: the forward argument, the output field and what generate()
# passes back (its ModelOutput answers the old name through a property). The state travels under the installed
# version's name, and forward accepts both.
STATE_NAME = "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) else "past_key_values"


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


def _pooled_slots(config: RecurrentDecoderConfig) -> int:
    """How many pooled states a window's summary has: one per memory slot with softmax pooling, one per slot, a softmax
    share and the last token with a selection, else the one mean."""
    if config.selects_tokens:
        return config.memory_slots + 2
    return config.memory_slots if config.pools_by_softmax else 1


def _cache_geometry(text_config: PreTrainedConfig) -> dict[str, int]:
    """The sizes of the per-layer key/value cache a state holds for a backbone with `text_config`."""
    heads = text_config.num_attention_heads
    return {
        "layers": text_config.num_hidden_layers,
        "key_value_heads": getattr(text_config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(text_config, "head_dim", None) or text_config.hidden_size // heads,
        "hidden_size": text_config.hidden_size,
    }


# Bumped whenever the tensors or the header of a saved state change meaning; a reader refuses versions it cannot read.
# Version 2: the memory's slots (`h_prev` (batch, memory_slots, hidden), the pooled weights and references); a
# version 1 file (one slot, the mean) is read as the same state in version 2's shapes.
STATE_FILE_FORMAT_VERSION = 2
READABLE_STATE_FILE_VERSIONS = (1, 2)
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
    _remove_abandoned_partials(path)
    descriptor, partial = tempfile.mkstemp(
        dir=path.parent, prefix=_partial_prefix(path, os.getpid()), suffix=".partial"
    )
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


def _partial_prefix(path: Path, pid: int) -> str:
    """The hidden name a writer's temporary file of `path` begins with: it names the writing process."""
    return f".{path.name}.{pid}-"


def _remove_abandoned_partials(path: Path) -> None:
    """Remove the temporary files of `path` whose writer no longer runs: a writer killed outright (SIGKILL, a machine
    stopped) cannot remove its own, and nothing else would."""
    for partial in path.parent.glob(f".{glob.escape(path.name)}.*-*.partial"):
        pid = partial.name[len(path.name) + 2 :].split("-", 1)[0]
        if pid.isdigit() and not _process_runs(int(pid)):
            partial.unlink(missing_ok=True)


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read_state_file(
    path: str | os.PathLike, family: str, device: torch.device | str | None
) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors (on `device`) and the header of a state file written by `_write_state_file` for `family`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No state file at {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a state file: it is not a regular file (a directory, device or pipe)")
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
    if header.get("format_version") not in READABLE_STATE_FILE_VERSIONS:
        raise ValueError(
            f"{path} was written in state file format version {header.get('format_version')!r}; this version of "
            f"hf_recurrence reads versions {READABLE_STATE_FILE_VERSIONS} only"
        )
    return tensors, header


def _with_memory_slots(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state's tensors in the layout of memory slots: those of a state written before them (file format version 1,
    or a copy of the class from then: one slot, `h_prev` and `pooled_sum` (batch, hidden), no pooled weights) as the
    same state with one slot, whose pooled weight is the window's token count; other tensors as they are."""
    h_prev, pooled_sum, fill = tensors.get("h_prev"), tensors.get("pooled_sum"), tensors.get("fill")
    if "pooled_weight" in tensors or h_prev is None or h_prev.dim() != 2 or pooled_sum is None or fill is None:
        return tensors
    count = fill.to(torch.float32)[:, None]  # (batch, 1)
    return {
        **tensors,
        "h_prev": h_prev[:, None],
        "pooled_sum": pooled_sum[:, None],
        "pooled_weight": count,
        "pooled_reference": torch.zeros_like(count),
    }


# The largest count a state holds: positions and counters become int64 tensors.
_LARGEST_COUNT = torch.iinfo(torch.int64).max


def _header_int(header: dict, name: str, source: object, minimum: int = 0) -> int:
    """The whole number `header[name]`, refused unless it is one (not a bool, float or string) from `minimum` to the
    largest int64."""
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _LARGEST_COUNT:
        raise ValueError(
            f"{source} has a malformed {name!r} in its header: {value!r}, expected an integer from {minimum} to "
            f"{_LARGEST_COUNT}"
        )
    return value


def _check_finite(tensors: dict[str, torch.Tensor], source: object) -> None:
    """Refuse NaN or infinite values, which no run of the model leaves in a state and which would reach the logits."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{source} has non-finite values (NaN or inf) in {name!r}")


def _recorded_model_shape(header: dict) -> object:
    """The model shape a state's header records; a state from before memory slots had one."""
    shape = header.get("model_shape")
    return {"memory_slots": 1, **shape} if isinstance(shape, dict) else shape


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


class RecurrentDecoderState:
    """Everything the recurrence carries from one call to the next, passed as `past_key_values` (`cache` from
    transformers 5.24 on).

    The model reads its input in windows of `window_size` tokens that repeat the last `window_overlap` tokens of the
    previous window; the schedule belongs to the state (the config's by default) and is fixed for its life. Per row:

    - `keys[i]`, `values[i]`: `(batch, kv_heads, slots, head_dim)` key/value cache of layer `i` for the current
      window, as the layer's attention received them (rotated, normed); padding slots are marked in `slot_valid`,
    - `fill`: `(batch,)` real tokens in the current window, and `window_index`: `(batch,)` windows completed,
    - `pooled_sum`, `pooled_weight`, `pooled_reference`: `(batch, p, hidden)`, `(batch, p)`, `(batch, p)` float32,
      the current window's states pooled so far (p = 1 for the mean, `memory_slots` with softmax pooling,
      `memory_slots + 2` with a selection; see `RecurrentDecoderRecurrence.pool`),
    - `h_prev`: `(batch, memory_slots, hidden)` the memory of the previous window that the current one sees,
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
    # Whether every single-token step over this state sees tensors of one shape (`FixedShapeWindowCache`), so that
    # generate() may compile it; then `compile_config` says how (None: eagerly).
    fixed_shape = False
    compile_config: CompileConfig | None = None

    # The float32 tensors of the current window's pooled states, which keep their dtype when the state is cast.
    _POOLED = ("pooled_sum", "pooled_weight", "pooled_reference")
    _BATCH_TENSORS = (
        "slot_valid",
        "fill",
        "window_index",
        "pooled_sum",
        "pooled_weight",
        "pooled_reference",
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
        pooled = _pooled_slots(config)
        self._kept_slots = kept_token_slots(config)
        self.pooled_sum = torch.zeros(batch_size, pooled, hidden, device=device, dtype=torch.float32)
        self.pooled_weight = torch.zeros(batch_size, pooled, device=device, dtype=torch.float32)
        self.pooled_reference = torch.zeros(batch_size, pooled, device=device, dtype=torch.float32)
        self.h_prev = torch.zeros(batch_size, config.memory_slots, hidden, device=device, dtype=dtype)
        self.overlap_embeds = torch.zeros(batch_size, window_overlap, hidden, device=device, dtype=dtype)
        self.overlap_valid = torch.zeros(batch_size, window_overlap, dtype=torch.bool, device=device)
        self.seen_tokens = 0
        # (fill, window_index) shared by every row, known on the host, while no row has read padding: the schedule
        # is then planned without reading the device. None once rows may differ.
        self._lockstep: tuple[int, int] | None = (0, 0)
        self._backbone = config.text_config.model_type
        self._memory_pooling = config.memory_pooling
        # (h_prev, the model, h_prev's key and value at the model's reading layers so far, by layer): see
        # `h_prev_key_values`.
        self._h_prev_kv: tuple[torch.Tensor, weakref.ref, dict[int, tuple[torch.Tensor, torch.Tensor]]] | None = None

    @property
    def batch_size(self) -> int:
        return self.fill.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model this state runs with (its float tensors but the float32 pooled ones)."""
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

    def h_prev_key_values(self, model: nn.Module) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Where `model` keeps `h_prev`'s key and value at its reading layers, by layer, (batch, kv_heads,
        memory_slots, head_dim) each, for a text it reads with fixed weights (generate(), see
        `RecurrentDecoderGenerationMixin.generate`): the layers add them as they compute them, so each window's are
        computed once rather than at every token. Empty again whenever `h_prev` changes (every change binds a new
        tensor: `start_windows`, `reset`, `detach`, `to`, `reorder_cache`) or another model reads the state. They
        hold the weights of the call that computed them."""
        kept = self._h_prev_kv
        if kept is None or kept[0] is not self.h_prev or kept[1]() is not model:
            kept = self._h_prev_kv = (self.h_prev, weakref.ref(model), {})
        return kept[2]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of input positions (padding included) consumed so far; what `generate` slices new tokens by."""
        return self.seen_tokens

    def detach(self) -> "RecurrentDecoderState":
        """Cut the autograd history of every tensor (truncated BPTT between calls). Returns `self`."""
        return self._map(torch.Tensor.detach)

    def reset(self) -> "RecurrentDecoderState":
        """Forget everything: the next token starts a fresh first window. Returns `self`."""
        self._empty_cache()
        for name in ("fill", "window_index", *self._POOLED, "h_prev", "overlap_embeds", "overlap_valid"):
            setattr(self, name, torch.zeros_like(getattr(self, name)))
        self.seen_tokens = 0
        self._lockstep = (0, 0)
        return self

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> "RecurrentDecoderState":
        """Move to `device`; floating tensors other than the float32 pooled ones are cast to `dtype`. Returns `self`."""
        pooled = [getattr(self, name) for name in self._POOLED]

        def move(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if dtype is not None and t.is_floating_point() and not any(t is p for p in pooled) else None
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
        cls._check_recorded_model_shape(header, config, path)
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
        cls._check_recorded_model_shape(header, config, source)
        return cls._from_file_contents(config, tensors, header, source)

    @classmethod
    def _check_recorded_model_shape(cls, header: dict, config: RecurrentDecoderConfig, source: object) -> None:
        """Refuse a state whose header records another model shape than `config`'s. A header written before the
        pooling was recorded (no `memory_pooling`) is checked by its pooled tensors' shapes (`_from_file_contents`),
        which tell every pooling apart but one slot's mean from one attention slot."""
        expected = cls._config_model_shape(config)
        recorded = _recorded_model_shape(header)
        if isinstance(recorded, dict):
            recorded = {"memory_pooling": expected["memory_pooling"], **recorded}
        _check_state_model_shape(recorded, expected, source)

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

    def step_settings(self, settings: _StepSettings) -> _StepSettings:
        """The settings of a step over this state: as planned."""
        return settings

    def mark_checked(self, model: nn.Module) -> None:
        """Called by `model`'s window loop once its call and this state passed its checks; nothing to remember here."""

    def leave_lockstep(self) -> None:
        """The rows may differ from now on (an input with padding): plan every step from the per-row tensors."""
        self._lockstep = None

    def start_windows(self, starting: torch.Tensor, h_prev: torch.Tensor) -> None:
        """Begin a new window in the `starting` rows ((batch,) bool): it sees `h_prev` ((batch, memory_slots, hidden),
        the memory of the window they close; other rows' values are ignored) and starts with an empty cache."""
        if self._lockstep is not None:
            # Every row starts: no per-row selection, and the cache empties without being read.
            self.h_prev = h_prev.to(torch.promote_types(h_prev.dtype, self.h_prev.dtype))  # as torch.where would
            self._clear_pooled()
            self.window_index = self.window_index + 1
            self.fill = torch.zeros_like(self.fill)
            self._empty_cache()
            self._lockstep = (0, self._lockstep[1] + 1)
            return
        rows = starting[:, None]
        self.h_prev = torch.where(rows[:, :, None], h_prev, self.h_prev)
        self._clear_pooled(starting)
        self.window_index = self.window_index + starting.long()
        self.fill = torch.where(starting, torch.zeros_like(self.fill), self.fill)
        self.slot_valid = self.slot_valid & ~rows
        self._compact()

    def _clear_pooled(self, rows: torch.Tensor | None = None) -> None:
        """Forget the pooled states of the `rows` ((batch,) bool; None: every row), whose new window begins."""
        for name in self._POOLED:
            pooled = getattr(self, name)
            if rows is None:
                setattr(self, name, torch.zeros_like(pooled))
            else:
                setattr(self, name, pooled.masked_fill(rows.view(-1, *[1] * (pooled.dim() - 1)), 0))

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
        pooled: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        new_embeds: torch.Tensor,
        new_real: torch.Tensor,
    ) -> None:
        """Record a step: every layer's cache of the current window, the step's real-token mask `step_real`
        (batch, cols) (any re-read overlap, then the new columns), its share of the window's pooled states `pooled`
        (see `RecurrentDecoderRecurrence.pool`), and the new columns' embeddings (batch, new, hidden) and mask
        (batch, new)."""
        self._record_cache(keys, values, step_real)
        self.fill = self.fill + step_real.sum(1)
        if self._lockstep is not None:
            self._lockstep = (self._lockstep[0] + step_real.shape[1], self._lockstep[1])
        self.pooled_sum, self.pooled_weight, self.pooled_reference = merge_pooled(
            (self.pooled_sum, self.pooled_weight, self.pooled_reference), pooled, self._kept_slots
        )
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
        """(batch, p, hidden) float32: each row's current window pooled, the mean (p = 1), per slot, or the tokens
        a selection keeps (`selected_summary`)."""
        if self._kept_slots:
            return selected_summary(self.pooled_sum, self.pooled_weight, self._kept_slots)
        # A weight is the count of the window's tokens (mean) or at least 1 once a token is pooled (softmax).
        return self.pooled_sum / self.pooled_weight.clamp(min=1)[..., None]

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
        # A fresh empty tensor: a gather or a slice would keep the dropped keys' storage alive in the autograd graph.
        # One for every layer's keys and values, as `__init__` shares it (they have one shape), so that a new window
        # costs one allocation, not two per layer.
        key = self.keys[0]
        empty = key.new_empty(*key.shape[:2], 0, key.shape[3])  # (batch, kv_heads, 0, head_dim)
        self.keys, self.values = [empty] * len(self.keys), [empty] * len(self.values)
        self.slot_valid = self.slot_valid.new_empty(self.batch_size, 0)  # nothing to zero

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
        memory = {"memory_slots": config.memory_slots, "memory_pooling": config.memory_pooling}
        return {**backbone, **_cache_geometry(config.text_config), **memory}

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
        """The backbone, sizes and memory of the model this state's tensors come from, as `_config_model_shape`
        gives them."""
        key = self.keys[0]  # (batch, kv_heads, slots, head_dim)
        return {
            "backbone": self._backbone,
            "layers": len(self.keys),
            "key_value_heads": key.shape[1],
            "head_dim": key.shape[3],
            "hidden_size": self.h_prev.shape[2],
            "memory_slots": self.h_prev.shape[1],
            # The pooled tensors' meaning: a state pooled one way cannot continue a window pooled another.
            "memory_pooling": self._memory_pooling,
        }

    @classmethod
    def _from_file_contents(
        cls, config: RecurrentDecoderConfig, tensors: dict[str, torch.Tensor], header: dict, source: object
    ) -> "RecurrentDecoderState":
        """The state that `_file_contents` described, checked tensor by tensor against a fresh one's shapes."""
        tensors = _with_memory_slots(tensors)
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
        # The state's dtype is h_prev's (`dtype`): a cache tensor of another dtype is then named as the odd one.
        dtype = tensors["h_prev"].dtype if "h_prev" in tensors else keys[0].dtype
        try:
            state = cls(config, batch, fill.device, dtype, window_size=window_size, window_overlap=window_overlap)
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
        state._adopt_lockstep(header.get("lockstep"), source)
        return state

    def _adopt_lockstep(self, lockstep: object, source: object) -> None:
        """Take a file's `lockstep` ([fill, window_index] every row shares, or None), refused unless the rows are
        there and, having read every column, have read exactly `seen_tokens` (else generate() would continue from a
        wrong place)."""
        if lockstep is None:
            self._lockstep = None
            return
        if not (
            isinstance(lockstep, list | tuple)
            and len(lockstep) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in lockstep)
        ):
            raise ValueError(f"{source} has a malformed 'lockstep' in its header: {lockstep!r}")
        fill, window_index = lockstep
        if not (bool((self.fill == fill).all()) and bool((self.window_index == window_index).all())):
            raise ValueError(
                f"{source} claims every row at fill {fill} of window {window_index}, which its rows are not"
            )
        read = self._tokens_read()
        if bool((read != self.seen_tokens).any()):
            raise ValueError(
                f"{source} has 'seen_tokens'={self.seen_tokens}, but its rows, in lockstep at fill {fill} of window "
                f"{window_index}, have read {read.tolist()}"
            )
        self._lockstep = (fill, window_index)

    def _check_values(self, source: object) -> None:
        """Refuse what no run of the model leaves in a state: non-finite tensors, window counters outside the window
        or inconsistent with the cache and with `seen_tokens`."""
        tensors, _ = self._file_contents()
        _check_finite(tensors, source)
        size = self.window_size
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
        read = self._tokens_read()
        if bool((read > self.seen_tokens).any()):
            raise ValueError(
                f"{source} has 'seen_tokens'={self.seen_tokens}, fewer than its rows have read ({read.tolist()}, from "
                "'window_index' and 'fill')"
            )

    def _tokens_read(self) -> torch.Tensor:
        """(batch,) the tokens each row has read since its text began: its first window, then window_size -
        window_overlap new ones per window. `seen_tokens` counts columns, padding included, so it is at least this."""
        size, overlap = self.window_size, self.window_overlap
        return torch.where(
            self.window_index > 0, size + (self.window_index - 1) * (size - overlap) + self.fill - overlap, self.fill
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

    fixed_shape = True
    # How the model compiles the single-token step for this state (set by generate(), as for the stock static cache);
    # None runs it eagerly.
    compile_config: CompileConfig | None = None

    def __init__(self, *args, **kwargs):
        """Takes the arguments of the state class it is mixed into (`fixed_shape_state_class`)."""
        super().__init__(*args, **kwargs)
        slots = self.window_size + 1
        # One buffer per layer (the base class shares one empty tensor): (batch, kv_heads, 1 + window_size, head_dim).
        self.keys = [k.new_zeros(*k.shape[:2], slots, k.shape[3]) for k in self.keys]
        self.values = [v.new_zeros(*v.shape[:2], slots, v.shape[3]) for v in self.values]
        self.slot_valid = self.slot_valid.new_zeros(self.batch_size, slots)  # (batch, 1 + window_size)
        # A bound on every row's fill known on the host (None: not known), so that a compiled single-token step knows
        # without reading the device that no row begins a window in it; the compiled steps raise it by one each.
        self._fill_bound: int | None = None
        # The model whose eager call last checked this state (inputs, config, shapes): its compiled single-token
        # calls trust that check instead of repeating it per token (see `RecurrentDecoderGenerationMixin._decode_token`
        # and `mark_checked`).
        self._checked_by: weakref.ref | None = None

    def h_prev_key_value(self, model: nn.Module) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """`h_prev`'s key and value at every one of `model`'s reading layers (`h_prev_key_values`, completed): what
        the compiled single-token step reads, since a graph cannot add to it."""
        kept = self.h_prev_key_values(model)
        if len(kept) < len(model.config.read_layers):
            kept.update(model._h_prev_key_value(self.h_prev))
        return kept

    def step_settings(self, settings: _StepSettings) -> _StepSettings:
        """Over a fixed-shape state a step always joins `h_prev` (masked in rows whose window has none) and reads
        whether columns are real from the mask, as the compiled single-token step does; its spare slot is never
        valid, so no step shares another's masks."""
        return replace(settings, uses_h_prev=True, all_real=None, lockstep_tensors=None)

    def mark_checked(self, model: nn.Module) -> None:
        """Remember that `model`'s eager call checked this state (inputs, config, shapes): its compiled single-token
        calls trust that check instead of repeating it per token."""
        self._checked_by = weakref.ref(model)

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


class RecurrentGPT2State(RecurrentDecoderState):
    """The state of the recurrent GPT-2 models: a [`RecurrentDecoderState`] (like it, not thread-safe) whose files
    name the `recurrent_gpt2` family as they always have."""

    _family = "recurrent_gpt2"


class RecurrentLlamaState(RecurrentDecoderState):
    """The state of the recurrent Llama models: a [`RecurrentDecoderState`] (like it, not thread-safe) whose files
    name the `recurrent_llama` family as they always have."""

    _family = "recurrent_llama"


__all__ = ["FixedShapeWindowCache", "RecurrentDecoderState", "RecurrentGPT2State", "RecurrentLlamaState"]
