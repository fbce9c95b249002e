# SPDX-License-Identifier: Apache-2.0
"""The key-recall task: does a recurrence carry information from one window to the next?

Every sequence is `num_windows` windows of `window_size` tokens, without overlap (an overlap could re-read the key
into the last window). The window before the last holds one key token (one of `num_keys`) at a uniformly random
position among random filler tokens. The last window is fresh filler, then a query token, then the key as the
sequence's final token. Only that final token is labelled (every other label is -100), so the one prediction trained
and scored is the key, made at the query position. Within its own window the query position never sees the key: only
what the model carries across windows can. `hf_recurrence.experiments.key_recall` trains models on it.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecallVocab:
    """Token ids of the task: fillers `[0, num_filler)`, keys `[num_filler, num_filler + num_keys)`, then the query."""

    num_filler: int
    num_keys: int

    @property
    def key_offset(self) -> int:
        return self.num_filler

    @property
    def query(self) -> int:
        return self.num_filler + self.num_keys

    @property
    def size(self) -> int:
        return self.num_filler + self.num_keys + 1


def make_recall_batch(
    batch_size: int,
    window_size: int,
    vocab: RecallVocab,
    num_windows: int = 2,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch of the recall task.

    Returns `input_ids` and `labels`, both `(batch_size, num_windows * window_size)`, and the keys `(batch_size,)`.
    The key sits at a uniformly random position of window `num_windows - 2`; the last window is filler, then the
    query token at its position `window_size - 2`, then the key at `window_size - 1`. `labels` is -100 everywhere
    except that last position, which holds the key (predicted, after the usual shift, at the query position).
    """
    if num_windows < 2:
        raise ValueError(f"num_windows must be at least 2, got {num_windows}")
    if window_size < 3:
        raise ValueError(f"window_size must be at least 3 (filler, query, answer), got {window_size}")
    length = num_windows * window_size
    ids = torch.randint(0, vocab.num_filler, (batch_size, length), generator=generator)
    keys = vocab.key_offset + torch.randint(0, vocab.num_keys, (batch_size,), generator=generator)
    key_pos = (num_windows - 2) * window_size + torch.randint(0, window_size, (batch_size,), generator=generator)
    ids[torch.arange(batch_size), key_pos] = keys
    ids[:, -2] = vocab.query
    ids[:, -1] = keys
    labels = torch.full_like(ids, -100)
    labels[:, -1] = keys
    return ids, labels, keys


def to_independent_windows(tensor: torch.Tensor, window_size: int) -> torch.Tensor:
    """(batch, num_windows * window_size) -> (batch * num_windows, window_size): every window its own sequence."""
    return tensor.reshape(-1, window_size)


def swap_earlier_windows(ids: torch.Tensor, window_size: int) -> torch.Tensor:
    """Row `i` keeps its last window but takes every earlier window from row `i + 1` (cyclically)."""
    swapped = ids.clone()
    swapped[:, :-window_size] = ids.roll(-1, dims=0)[:, :-window_size]
    return swapped
