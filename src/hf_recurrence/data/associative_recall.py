# SPDX-License-Identifier: Apache-2.0
"""The associative-recall task: can a recurrence carry several facts, each bound to its key, to the next window?

Every sequence is `num_windows` windows of `window_size` tokens, without overlap. The window before the last holds
`num_pairs` key-value pairs (a key token immediately followed by its value token) at uniformly random, non-overlapping
positions among random filler tokens; within a row the keys are distinct and so are the values. The last window is
fresh filler, then one of those keys (the query, chosen uniformly among the row's pairs) at its position
`window_size - 2`, then that key's value as the sequence's final token. Only that final token is labelled, so the one
prediction trained and scored is the value, made at the query key. Within its own window the query never sees the
pairs: only what the model carries across windows can. Chance is `1 / num_values`; a memory that carries which values
occurred but not which key each belongs to reaches about `1 / num_pairs`.

`hf_recurrence.experiments.key_recall` trains models on it (`task="associative"`); the swap control of the key-recall
task (`swap_earlier_windows`) applies unchanged.

`make_bare_associative_batch` is the same lookup within a window and without filler, every question labelled: the
task a toy backbone can first learn to bind on (a pretraining stage of the experiments), before it reads pairs
among filler in another window.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AssociativeVocab:
    """Token ids of the task: fillers `[0, num_filler)`, then `num_keys` keys, then `num_values` values."""

    num_filler: int
    num_keys: int
    num_values: int

    @property
    def key_offset(self) -> int:
        return self.num_filler

    @property
    def value_offset(self) -> int:
        return self.num_filler + self.num_keys

    @property
    def size(self) -> int:
        return self.num_filler + self.num_keys + self.num_values


def _check_distinct_pairs(num_pairs: int, vocab: AssociativeVocab) -> None:
    """Refuses more pairs a row than the vocab has distinct keys or values."""
    if num_pairs > min(vocab.num_keys, vocab.num_values):
        raise ValueError(
            f"num_pairs={num_pairs} needs as many distinct keys and values; the vocab has {vocab.num_keys} keys and "
            f"{vocab.num_values} values"
        )


def make_associative_batch(
    batch_size: int,
    window_size: int,
    vocab: AssociativeVocab,
    num_windows: int = 2,
    generator: torch.Generator | None = None,
    num_pairs: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch of the associative-recall task.

    Returns `input_ids` and `labels`, both `(batch_size, num_windows * window_size)`, and the answers `(batch_size,)`
    (the value of each row's query key). The pairs sit in window `num_windows - 2`; the last window is filler, then
    the query key at its position `window_size - 2`, then the answer at `window_size - 1`. `labels` is -100 everywhere
    except that last position, which holds the answer (predicted, after the usual shift, at the query key). The
    arguments are `make_recall_batch`'s, `num_pairs` added last.
    """
    if num_windows < 2:
        raise ValueError(f"num_windows must be at least 2, got {num_windows}")
    if num_pairs < 1:
        raise ValueError(f"num_pairs must be at least 1, got {num_pairs}")
    if window_size < max(3, 2 * num_pairs):
        raise ValueError(
            f"window_size must be at least 3 and hold {num_pairs} pairs (2 tokens each), got {window_size}"
        )
    _check_distinct_pairs(num_pairs, vocab)
    length = num_windows * window_size
    rows = torch.arange(batch_size)[:, None]
    ids = torch.randint(0, vocab.num_filler, (batch_size, length), generator=generator)
    # Distinct keys and values per row: the first `num_pairs` of a random permutation of each.
    keys = vocab.key_offset + torch.rand(batch_size, vocab.num_keys, generator=generator).argsort(-1)[:, :num_pairs]
    values = (
        vocab.value_offset + torch.rand(batch_size, vocab.num_values, generator=generator).argsort(-1)[:, :num_pairs]
    )
    # Non-overlapping pair starts, uniform over all arrangements: `num_pairs` sorted distinct numbers from
    # `[0, window_size - num_pairs)`, the i-th moved right by i (each pair before it takes one more token).
    starts = torch.rand(batch_size, window_size - num_pairs, generator=generator).argsort(-1)[:, :num_pairs]
    starts = starts.sort(-1).values + torch.arange(num_pairs) + (num_windows - 2) * window_size
    ids[rows, starts] = keys
    ids[rows, starts + 1] = values
    query = torch.randint(0, num_pairs, (batch_size,), generator=generator)
    answers = values[torch.arange(batch_size), query]
    ids[:, -2] = keys[torch.arange(batch_size), query]
    ids[:, -1] = answers
    labels = torch.full_like(ids, -100)
    labels[:, -1] = answers
    return ids, labels, answers


def make_bare_associative_batch(
    batch_size: int,
    length: int,
    vocab: AssociativeVocab,
    generator: torch.Generator | None = None,
    num_pairs: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of back-to-back blocks of `4 * num_pairs` tokens: `num_pairs` key-value pairs (each key followed by its
    value; distinct keys, distinct values), then every one of those keys again in a random order, each followed by its
    value. Only the values after the questions are labelled, so each is predicted at its question key, from the pairs
    earlier in the same block. No filler.

    Returns `input_ids` and `labels`, both `(batch_size, length)`, and the answers `(batch_size,)` (each row's last
    value). `length` must be a multiple of the block's `4 * num_pairs` tokens, so that no block is cut.
    """
    block = 4 * num_pairs
    if num_pairs < 1 or length < block or length % block:
        raise ValueError(
            f"length must be a positive multiple of 4 * num_pairs = {block} tokens (one block), got length={length}, "
            f"num_pairs={num_pairs}"
        )
    _check_distinct_pairs(num_pairs, vocab)
    rows = batch_size * (length // block)  # one block a row, until the reshape at the end
    row = torch.arange(rows)[:, None]
    keys = vocab.key_offset + torch.rand(rows, vocab.num_keys, generator=generator).argsort(-1)[:, :num_pairs]
    values = vocab.value_offset + torch.rand(rows, vocab.num_values, generator=generator).argsort(-1)[:, :num_pairs]
    asked = torch.rand(rows, num_pairs, generator=generator).argsort(-1)  # (rows, num_pairs): the questions' order
    pairs = torch.stack([keys, values], -1).reshape(rows, 2 * num_pairs)
    questions = torch.stack([keys[row, asked], values[row, asked]], -1).reshape(rows, 2 * num_pairs)
    ids = torch.cat([pairs, questions], 1)  # (rows, block): one block a row
    labels = torch.full_like(ids, -100)
    labels[:, 2 * num_pairs + 1 :: 2] = ids[:, 2 * num_pairs + 1 :: 2]
    ids, labels = ids.reshape(batch_size, length), labels.reshape(batch_size, length)
    return ids, labels, ids[:, -1]


def among_row_values(
    predictions: torch.Tensor, ids: torch.Tensor, window_size: int, vocab: AssociativeVocab
) -> torch.Tensor:
    """(batch,) bool: whether each row's prediction is one of the values stored in its pair window (the window before
    the last of `ids`, (batch, num_windows * window_size)).

    A memory that carries which values occurred but not which key each belongs to answers with one of them almost
    always while right about `1 / num_pairs` of the time; one that carries nothing hits them at the rate of a guess
    (`num_pairs / num_values` among the values).
    """
    pair_window = ids[:, -2 * window_size : -window_size]  # (batch, window_size)
    stored = (pair_window == predictions[:, None]) & (pair_window >= vocab.value_offset)
    return stored.any(-1)
