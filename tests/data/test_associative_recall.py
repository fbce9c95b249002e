"""The associative-recall task (`hf_recurrence.data.associative_recall`): the pairs sit only in the window before the
last, each key right before its value; the last window holds no pair, only the query key and, labelled, its value."""

import pytest
import torch

from hf_recurrence.data import (
    AssociativeVocab,
    among_row_values,
    make_associative_batch,
    make_bare_associative_batch,
    swap_earlier_windows,
)


VOCAB = AssociativeVocab(num_filler=32, num_keys=16, num_values=16)


def batch(batch_size=512, window_size=32, num_windows=2, num_pairs=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return make_associative_batch(batch_size, window_size, VOCAB, num_windows, generator, num_pairs=num_pairs)


def kinds(ids):
    """0 filler, 1 key, 2 value, per token."""
    return (ids >= VOCAB.key_offset).long() + (ids >= VOCAB.value_offset).long()


@pytest.mark.parametrize("num_windows", [2, 3])
def test_shapes_and_only_the_answer_is_labelled(num_windows):
    ids, labels, answers = batch(batch_size=64, window_size=16, num_windows=num_windows)
    assert ids.shape == labels.shape == (64, num_windows * 16)
    assert answers.shape == (64,)
    assert ids.dtype == labels.dtype == torch.long
    assert ((ids >= 0) & (ids < VOCAB.size)).all()
    assert (labels[:, :-1] == -100).all()
    assert torch.equal(labels[:, -1], answers)
    assert torch.equal(ids[:, -1], answers)
    assert ((answers >= VOCAB.value_offset) & (answers < VOCAB.size)).all()


@pytest.mark.parametrize("num_windows", [2, 3])
def test_the_pairs_are_only_in_the_window_before_the_last_each_key_before_its_value(num_windows):
    window_size, num_pairs = 16, 4
    ids, _, answers = batch(window_size=window_size, num_windows=num_windows, num_pairs=num_pairs)
    kind = kinds(ids)
    windows = kind.reshape(ids.shape[0], num_windows, window_size)
    # Windows before the pairs' window are filler only.
    assert (windows[:, : num_windows - 2] == 0).all()
    pairs_window = ids[:, (num_windows - 2) * window_size : (num_windows - 1) * window_size]
    pairs_kind = windows[:, num_windows - 2]
    assert ((pairs_kind == 1).sum(-1) == num_pairs).all()
    assert ((pairs_kind == 2).sum(-1) == num_pairs).all()
    # Every key is followed by a value, every value preceded by a key.
    assert (pairs_kind[:, 1:][pairs_kind[:, :-1] == 1] == 2).all()
    assert (pairs_kind[:, :-1][pairs_kind[:, 1:] == 2] == 1).all()
    assert (pairs_kind[:, -1] != 1).all()
    for row in range(ids.shape[0]):
        keys = pairs_window[row][pairs_kind[row] == 1]
        values = pairs_window[row][pairs_kind[row] == 2]
        assert len(set(keys.tolist())) == num_pairs and len(set(values.tolist())) == num_pairs
        # The answer is the value paired with the query key.
        query = ids[row, -2].item()
        assert query in keys.tolist()
        assert answers[row].item() == values[keys.tolist().index(query)].item()


def test_the_last_window_holds_no_pair_only_the_query_and_its_answer():
    window_size = 16
    ids, _, answers = batch(window_size=window_size)
    last = kinds(ids[:, -window_size:])
    assert (last[:, :-2] == 0).all()
    assert (last[:, -2] == 1).all() and (last[:, -1] == 2).all()
    # So neither the query key nor its value occurs in the last window before the query.
    assert not (ids[:, -window_size:-2] == ids[:, -2:-1]).any()
    assert not (ids[:, -window_size:-1] == answers[:, None]).any()


def test_positions_keys_values_and_queries_cover_their_ranges():
    window_size, num_pairs = 16, 4
    ids, _, answers = batch(batch_size=2048, window_size=window_size, num_pairs=num_pairs)
    kind = kinds(ids[:, :window_size])
    # A pair can start at the first position and end at the last one.
    assert (kind == 1).any(0)[: window_size - 1].all() and (kind == 2).any(0)[1:].all()
    assert set(ids[:, -2].tolist()) == set(range(VOCAB.key_offset, VOCAB.value_offset))
    assert set(answers.tolist()) == set(range(VOCAB.value_offset, VOCAB.size))
    # The query is each of the row's pairs equally often (by order of position): about 1/4 each.
    first_key_column = (kind == 1).float().argmax(-1)
    asked_first = ids[torch.arange(ids.shape[0]), first_key_column] == ids[:, -2]
    assert 0.2 < asked_first.float().mean().item() < 0.3


def test_a_generator_makes_it_reproducible_and_seeds_differ():
    first, second, other = batch(seed=3), batch(seed=3), batch(seed=4)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


def test_swapping_earlier_windows_keeps_the_question_and_replaces_the_pairs():
    window_size = 16
    ids, _, _ = batch(batch_size=8, window_size=window_size)
    swapped = swap_earlier_windows(ids, window_size)
    assert torch.equal(swapped[:, -window_size:], ids[:, -window_size:])
    assert torch.equal(swapped[:, :window_size], ids.roll(-1, dims=0)[:, :window_size])


@pytest.mark.parametrize("num_windows", [2, 3])
def test_among_row_values_finds_the_stored_values_and_nothing_else(num_windows):
    window_size = 16
    ids, _, answers = batch(batch_size=256, window_size=window_size, num_windows=num_windows)
    pair_window = ids[:, -2 * window_size : -window_size]
    # The answer is always stored; so is any other stored value, right or not.
    assert among_row_values(answers, ids, window_size, VOCAB).all()
    first_value = torch.where(pair_window >= VOCAB.value_offset, pair_window, VOCAB.size).min(-1).values
    assert among_row_values(first_value, ids, window_size, VOCAB).all()
    # A value the row does not store, its query key (stored as a key, not a value) and a filler token are not.
    absent = torch.tensor(
        [next(v for v in range(VOCAB.value_offset, VOCAB.size) if v not in row) for row in pair_window]
    )
    assert not among_row_values(absent, ids, window_size, VOCAB).any()
    assert not among_row_values(ids[:, -2], ids, window_size, VOCAB).any()
    fillers = pair_window[:, 0].where(pair_window[:, 0] < VOCAB.num_filler, torch.zeros_like(pair_window[:, 0]))
    assert not among_row_values(fillers, ids, window_size, VOCAB).any()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_windows": 1}, "num_windows must be at least 2"),
        ({"num_pairs": 0}, "num_pairs must be at least 1"),
        ({"window_size": 7, "num_pairs": 4}, "window_size must be at least 3 and hold 4 pairs"),
        ({"window_size": 64, "num_pairs": 17}, "num_pairs=17 needs as many distinct keys and values"),
    ],
)
def test_bad_sizes_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        batch(**arguments)


def test_the_bare_task_asks_every_pair_of_each_block_right_after_it():
    ids, labels, answers = make_bare_associative_batch(64, 48, VOCAB, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (64, 48) and torch.equal(answers, ids[:, -1])
    assert (ids >= VOCAB.num_filler).all()  # no filler
    for block in ids.reshape(64 * 3, 16):  # 3 blocks of 4 pairs, then their 4 questions
        pairs, questions = block[:8].reshape(4, 2), block[8:].reshape(4, 2)
        assert (kinds(pairs[:, 0]) == 1).all() and (kinds(pairs[:, 1]) == 2).all()
        assert len(set(pairs[:, 0].tolist())) == 4 and len(set(pairs[:, 1].tolist())) == 4
        # Every key asked once, each followed by its own value.
        assert sorted(map(tuple, questions.tolist())) == sorted(map(tuple, pairs.tolist()))
    # Labelled: the value after each question, nothing else.
    labelled = labels.reshape(-1, 16) != -100
    assert labelled[:, [9, 11, 13, 15]].all() and labelled.sum() == 64 * 3 * 4
    assert torch.equal(labels[labels != -100], ids[labels != -100])
    # The question order is random: each pair is asked first about as often.
    first = ids.reshape(-1, 16)[:, 8:9] == ids.reshape(-1, 16)[:, 0:8:2]  # (blocks, 4)
    assert (first.float().mean(0) > 0.1).all()


@pytest.mark.parametrize(
    ("length", "num_pairs", "message"),
    [(40, 4, "length must be a positive multiple of 4 \\* num_pairs = 16 tokens"), (68, 17, "num_pairs=17 needs")],
)
def test_the_bare_task_refuses_a_cut_block_or_too_many_pairs(length, num_pairs, message):
    with pytest.raises(ValueError, match=message):
        make_bare_associative_batch(2, length, VOCAB, num_pairs=num_pairs)
