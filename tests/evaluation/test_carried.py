"""Carried tokens: the words a window meets again after the previous window read them (issue 39's gate 3)."""

import pytest
import torch

from hf_recurrence.evaluation.carried import carried_token_mask, token_words


def words_of(pieces: list[str]):
    """`token_words` of the text the pieces make, each piece a token."""
    ends = torch.tensor([len(piece) for piece in pieces]).cumsum(0).tolist()
    return token_words("".join(pieces), list(zip([0, *ends[:-1]], ends, strict=True)))


def test_tokens_map_to_their_words_case_folded_and_tokens_without_letters_to_none():
    words = words_of(["Anne", " met", " Went", "worth", ".", " anne", "'s", " 1811"])
    assert words.occurrence.tolist() == [0, 1, 2, 2, -1, 3, 4, -1]
    # "'s" overlaps the word "s"; "Anne" and "anne" are one type.
    assert words.word_type.tolist() == [0, 1, 2, 2, -1, 0, 3, -1]


def test_a_word_the_previous_window_read_is_carried_until_the_current_window_reads_it():
    pieces = [
        "Anne", " met", " Went", "worth",  # window 0: nothing carried
        " and", " anne", " Went", "worth",  # window 1: "anne" and both pieces of "Wentworth" carried
        " and", " met", ".", " Anne",  # window 2: "Anne" carried (window 1 read it); "met" only window 0 read
    ]  # fmt: skip
    window_position = torch.arange(11) % 4  # overlap 0: token p + 1 predicted at position p % 4
    mask = carried_token_mask(words_of(pieces), window_position)
    # Token 8 (" and", window 2's first) is predicted by window 1, which read "and" at token 4.
    assert mask.nonzero().flatten().tolist() == [4, 5, 6, 10]


def test_a_word_read_earlier_in_the_current_window_is_not_carried():
    pieces = [" sea", " shore", " and", " sky", " cliff", " sea", " shore", " sea"]
    mask = carried_token_mask(words_of(pieces), torch.arange(7) % 4)
    # Window 1 reads "cliff", then "sea" and "shore" (carried), then "sea" again (not: the window read it).
    assert mask.tolist() == [False, False, False, False, True, True, False]


def test_words_and_predictions_of_different_documents_are_refused():
    with pytest.raises(ValueError, match="words cover 3 tokens; a document with 4 predicted tokens has 5"):
        carried_token_mask(words_of(["a", " b", " c"]), torch.arange(4) % 2)
