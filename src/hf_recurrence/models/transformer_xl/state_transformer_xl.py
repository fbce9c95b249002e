# SPDX-License-Identifier: Apache-2.0
"""The memories Transformer-XL carries from one call to the next ([`TransformerXLState`]) and the state file format
(`TransformerXLState.save` / `load`), the same as the recurrence core's (`state_recurrent_decoder.py`): its helpers are
copies, since a model folder is uploaded alone as remote code."""

import glob
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers.utils import ModelOutput

from .configuration_transformer_xl import TransformerXLConfig


# transformers 5.24 renamed `past_key_values` to `cache`: the forward argument, the output field and what generate()
# passes back (its ModelOutput answers the old name through a property). The state travels under the installed
# version's name, and forward accepts both.
STATE_NAME = "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) else "past_key_values"


# Bumped whenever the tensors or the header of a saved state change meaning; a reader refuses other versions.
STATE_FILE_FORMAT_VERSION = 1
READABLE_STATE_FILE_VERSIONS = (1,)
# The safetensors metadata key whose JSON value describes a saved state.
_STATE_HEADER_KEY = "hf_recurrence_state"


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._partial_prefix
def _partial_prefix(path: Path, pid: int) -> str:
    """The hidden name a writer's temporary file of `path` begins with: it names the writing process."""
    return f".{path.name}.{pid}-"


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._remove_abandoned_partials
def _remove_abandoned_partials(path: Path) -> None:
    """Remove the temporary files of `path` whose writer no longer runs: a writer killed outright (SIGKILL, a machine
    stopped) cannot remove its own, and nothing else would."""
    for partial in path.parent.glob(f".{glob.escape(path.name)}.*-*.partial"):
        pid = partial.name[len(path.name) + 2 :].split("-", 1)[0]
        if pid.isdigit() and not _process_runs(int(pid)):
            partial.unlink(missing_ok=True)


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._process_runs
def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._write_state_file
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


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._read_state_file
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


# The largest count a state holds: positions and counters become int64 tensors.
_LARGEST_COUNT = torch.iinfo(torch.int64).max


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._header_int
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


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._check_finite
def _check_finite(tensors: dict[str, torch.Tensor], source: object) -> None:
    """Refuse NaN or infinite values, which no run of the model leaves in a state and which would reach the logits."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{source} has non-finite values (NaN or inf) in {name!r}")


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._recorded_model_shape
def _recorded_model_shape(header: dict) -> object:
    """The model shape a state's header records; a state from before memory slots had one."""
    shape = header.get("model_shape")
    return {"memory_slots": 1, **shape} if isinstance(shape, dict) else shape


# Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder._check_state_model_shape
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


@dataclass
class _Memory:
    """Per-layer memory of some batch rows: hidden states entering each layer and their keys/values."""

    mems: list[torch.Tensor]  # n_layer x (rows, slots, d_model)
    keys: list[torch.Tensor]  # n_layer x (rows, head, slots, d_head)
    values: list[torch.Tensor]
    valid: torch.Tensor  # (rows, slots) bool; the valid slots are always a suffix

    def select(self, rows: torch.Tensor) -> "_Memory":
        return self.map(lambda t: t.index_select(0, rows.to(t.device)))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "_Memory":
        return _Memory(
            [fn(m) for m in self.mems], [fn(k) for k in self.keys], [fn(v) for v in self.values], fn(self.valid)
        )

    def slots(self) -> int:
        return self.valid.shape[1]

    def keep_last(self, keep: int) -> "_Memory":
        """The last `keep` slots of every tensor."""
        return self.map(lambda t: _last_slots(t, keep, _slot_dim(t)))

    def forget(self, rows: torch.Tensor) -> "_Memory":
        """The same memory with no valid slot in the `rows` ((rows,) bool), which then read as if from a new state."""
        return _Memory(self.mems, self.keys, self.values, self.valid & ~rows[:, None].to(self.valid.device))


def _slot_dim(tensor: torch.Tensor) -> int:
    """Slots are dim 2 of (batch, head, slots, d_head) keys/values, dim 1 of memories and validity masks."""
    return 2 if tensor.dim() == 4 else 1


def _last_slots(tensor: torch.Tensor, keep: int, dim: int) -> torch.Tensor:
    """The last `keep` slots along `dim` (works for keep == 0, unlike a negative slice)."""
    return tensor.narrow(dim, tensor.shape[dim] - keep, keep)


def _left_pad_slots(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Pad with zeros (False) in front along `dim` up to `width` slots."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class TransformerXLState:
    """The memories Transformer-XL carries from one call to the next, passed as `past_key_values`.

    For every layer `i`:

    - `mems[i]`: `(batch, slots, d_model)` the hidden states that entered layer `i` at the last `slots <= mem_len`
      positions, without autograd history (the paper's stop-gradient memory);
    - `keys[i]`, `values[i]`: `(batch, n_head, slots, d_head)` their attention keys and values, reused instead of
      recomputed when gradients are off (evaluation and `generate()`); with gradients on they are recomputed from
      `mems` so that the projections are trained through the memory, as in the paper;

    plus `mem_valid`: `(batch, slots)` bool, False for slots that hold no token (a row that has read fewer tokens
    than the others, or padding). Memory never grows past `mem_len` slots, whatever the length read.

    The cached keys/values and position keys belong to the weights they were computed with: after changing the
    weights, start from a new state.

    The state holds the text it read: `mems[0]` are the scaled token embeddings of the last `slots` tokens, so a
    nearest-neighbour search against the embedding table recovers them verbatim. Treat a state (and a file written by
    `save()`) as you would the text itself.

    A state is not thread-safe: every call replaces its memory, so two threads must not run the model on one state at
    once (a model is thread-safe in eval mode; give each thread its own state).

    Example:

    ```python
    >>> import torch
    >>> from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel

    >>> model = TransformerXLLMHeadModel(TransformerXLConfig(vocab_size=100, d_model=32, n_head=2, d_head=16,
    ...     d_inner=64, n_layer=2, segment_length=8, mem_len=6)).eval()
    >>> ids = torch.randint(0, 100, (1, 24))
    >>> out = model(ids[:, :16])
    >>> out = model(ids[:, 16:], past_key_values=out.past_key_values)
    >>> out.past_key_values.get_seq_length(), out.past_key_values.mems[0].shape
    (24, torch.Size([1, 6, 32]))

    ```
    """

    # generate() asks every cache whether it can be compiled.
    is_compileable = False
    # transformers >= 5.24's generate() slices a prompt by get_seq_length() only for a cache with some layer that is
    # not linear attention (a linear layer has no length); the state has a length.
    is_linear = (False,)
    # The model_type this state belongs to: what a saved state's header names, and how copies of this class (the
    # installed one and one loaded as Hub remote code) recognise each other's states.
    _family = "transformer_xl"

    def __init__(
        self,
        config: TransformerXLConfig,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        empty_mem = torch.zeros(batch_size, 0, config.d_model, device=device, dtype=dtype)
        empty_kv = torch.zeros(batch_size, config.n_head, 0, config.d_head, device=device, dtype=dtype)
        self.memory = _Memory(
            [empty_mem] * config.n_layer,
            [empty_kv] * config.n_layer,
            [empty_kv] * config.n_layer,
            torch.zeros(batch_size, 0, dtype=torch.bool, device=device),
        )
        self.seen_tokens = 0
        # Position keys of every layer for distances ..., 1, 0: (head, distances, d_head) each; kept only when
        # computed without gradients, since they depend on the weights alone.
        self.position_keys: list[torch.Tensor] | None = None

    @property
    def mems(self) -> list[torch.Tensor]:
        return self.memory.mems

    @property
    def keys(self) -> list[torch.Tensor]:
        return self.memory.keys

    @property
    def values(self) -> list[torch.Tensor]:
        return self.memory.values

    @property
    def mem_valid(self) -> torch.Tensor:
        return self.memory.valid

    @property
    def batch_size(self) -> int:
        return self.memory.valid.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model this state runs with (that of its memories)."""
        return self.mems[0].dtype

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of input positions (padding included) consumed so far; what `generate` slices new tokens by."""
        return self.seen_tokens

    def detach(self) -> "TransformerXLState":
        """Cut every autograd history (memories already have none; the cached projections may). Returns `self`."""
        self.memory = self.memory.map(torch.Tensor.detach)
        self.position_keys = None
        return self

    def reset(self) -> "TransformerXLState":
        """Forget everything: the next token starts without memory. Returns `self`."""
        self.memory = self.memory.keep_last(0)
        self.seen_tokens = 0
        self.position_keys = None
        return self

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "TransformerXLState":
        """Move to `device`; floating tensors are cast to `dtype`. Returns `self`."""
        self.memory = self.memory.map(lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else None))
        self.position_keys = None
        return self

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows (beam search): row `i` becomes old row `beam_idx[i]`."""
        self.memory = self.memory.select(beam_idx)

    def update_rows(self, rows: torch.Tensor | None, memory: _Memory) -> None:
        """Store the new memory of `rows` (None: every row), then drop slots that no row uses."""
        if rows is None:
            self.memory = memory
            return
        width = max(self.memory.slots(), memory.slots())

        def merge(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            merged = _left_pad_slots(old, width, _slot_dim(old)).clone()
            merged[rows.to(old.device)] = _left_pad_slots(new, width, _slot_dim(new))
            return merged

        self.memory = _Memory(
            [merge(o, n) for o, n in zip(self.memory.mems, memory.mems, strict=True)],
            [merge(o, n) for o, n in zip(self.memory.keys, memory.keys, strict=True)],
            [merge(o, n) for o, n in zip(self.memory.values, memory.values, strict=True)],
            merge(self.memory.valid, memory.valid),
        )
        used = int(self.memory.valid.sum(1).max())
        if used < width:
            self.memory = self.memory.keep_last(used)

    @staticmethod
    def _config_model_shape(config: TransformerXLConfig) -> dict[str, int]:
        """The sizes of a model that a state belongs to, as a saved state records them."""
        return {"layers": config.n_layer, "heads": config.n_head, "head_dim": config.d_head, "d_model": config.d_model}

    # Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder.RecurrentDecoderState.save
    def save(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Write the state to a safetensors file (its tensors plus a JSON header: family, format version, model shape,
        the state's settings), to continue the text later, elsewhere, or with the model loaded as remote code.
        Autograd history is not saved. Refuses to replace an existing file unless `overwrite=True`."""
        tensors, header = self._file_contents()
        _write_state_file(path, tensors, header, overwrite)

    # Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder.RecurrentDecoderState.load with RecurrentDecoderConfig->TransformerXLConfig, RecurrentDecoderState->TransformerXLState
    @classmethod
    def load(
        cls, path: str | os.PathLike, config: TransformerXLConfig, device: torch.device | str | None = None
    ) -> "TransformerXLState":
        """Read a state written by `save()` for a model with `config`, onto `device` (default: CPU).

        Refuses, naming the difference, a file of another model family, of another backbone or model shape, of
        another state file format version, or with settings this config cannot run. The state is only meaningful
        with the weights that produced it; that is not checked.
        """
        tensors, header = _read_state_file(path, cls._family, device)
        cls._check_recorded_model_shape(header, config, path)
        return cls._from_file_contents(config, tensors, header, path)

    def _file_contents(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Every tensor by name and the header that lets `_from_file_contents` rebuild the state (the position keys
        are not saved: they depend on the weights alone and are recomputed)."""
        tensors = {"mem_valid": self.mem_valid}
        for i, (mem, key, value) in enumerate(zip(self.mems, self.keys, self.values, strict=True)):
            tensors[f"mems.{i}"], tensors[f"keys.{i}"], tensors[f"values.{i}"] = mem, key, value
        header = {
            "family": self._family,
            "seen_tokens": self.seen_tokens,
            "model_shape": self._model_shape(),
        }
        return tensors, header

    def _model_shape(self) -> dict[str, int]:
        key = self.keys[0]  # (batch, head, slots, d_head)
        return {
            "layers": len(self.keys),
            "heads": key.shape[1],
            "head_dim": key.shape[3],
            "d_model": self.mems[0].shape[2],
        }

    @classmethod
    def _from_file_contents(
        cls, config: TransformerXLConfig, tensors: dict[str, torch.Tensor], header: dict, source: object
    ) -> "TransformerXLState":
        """The state that `_file_contents` described, checked tensor by tensor."""
        seen_tokens = _header_int(header, "seen_tokens", source)
        try:
            valid = tensors["mem_valid"]
            parts = [[tensors[f"{name}.{i}"] for i in range(config.n_layer)] for name in ("mems", "keys", "values")]
        except KeyError as error:
            raise ValueError(f"{source} is not a complete Transformer-XL state: it lacks {error}") from None
        batch, slots = valid.shape
        expected = {
            "mems": (batch, slots, config.d_model),
            "keys": (batch, config.n_head, slots, config.d_head),
            "values": (batch, config.n_head, slots, config.d_head),
        }
        for (name, shape), tensors_of_layers in zip(expected.items(), parts, strict=True):
            if valid.dtype != torch.bool or any(t.shape != shape for t in tensors_of_layers):
                raise ValueError(
                    f"{source} has {name} of shapes {[tuple(t.shape) for t in tensors_of_layers]} and mem_valid "
                    f"{tuple(valid.shape)} {valid.dtype}; expected {shape} and torch.bool"
                )
        state = cls(config, batch, valid.device, parts[0][0].dtype)
        if any(t.dtype != parts[0][0].dtype for part in parts for t in part):
            raise ValueError(f"{source} mixes dtypes: {sorted({str(t.dtype) for part in parts for t in part})}")
        state.memory = _Memory(*parts, valid)
        state.seen_tokens = seen_tokens
        state._check_values(source)
        return state

    def _check_values(self, source: object) -> None:
        """Refuse what no run of the model leaves in a state: non-finite tensors, more valid memory slots in a row than
        `seen_tokens`."""
        tensors, _ = self._file_contents()
        _check_finite(tensors, source)
        valid = self.mem_valid.sum(1)
        if bool((valid > self.seen_tokens).any()):
            raise ValueError(
                f"{source} has 'seen_tokens'={self.seen_tokens}, fewer than its rows' valid memory slots "
                f"({valid.tolist()}, 'mem_valid')"
            )

    # Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder.RecurrentDecoderState.adopt with RecurrentDecoderConfig->TransformerXLConfig, RecurrentDecoderState->TransformerXLState
    @classmethod
    def adopt(
        cls, state: object, config: TransformerXLConfig, batch_size: int, dtype: torch.dtype
    ) -> "TransformerXLState":
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

    # Copied from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder.RecurrentDecoderState._adopt_other_copy with RecurrentDecoderConfig->TransformerXLConfig, RecurrentDecoderState->TransformerXLState
    @classmethod
    def _adopt_other_copy(cls, state: object, config: TransformerXLConfig) -> "TransformerXLState":
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
    def _check_recorded_model_shape(cls, header: dict, config: TransformerXLConfig, source: object) -> None:
        """Refuse a state whose header records another model shape than `config`'s."""
        _check_state_model_shape(_recorded_model_shape(header), cls._config_model_shape(config), source)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(batch_size={self.batch_size}, seen_tokens={self.seen_tokens}, "
            f"memory_slots={self.memory.slots()}, valid_slots={self.mem_valid.sum(1).tolist()})"
        )


__all__ = ["TransformerXLState"]
