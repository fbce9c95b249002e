"""The real-text inductive MLM split: sentence splitting, the length split and whole-word masking."""

import pytest

from hf_recurrence.data import (
    WholeWordMaskedSentences,
    minilm_tokenizer,
    pydoc_sentences,
    split_by_length,
    split_sentences,
)

from ..common import installed_or_skip


TEXT = """Heading
*******

The first sentence is here.  A second one follows, e.g. this clause
   continues on an indented line.  Is this a third?

   >>> print("code is not prose.")

   x ::= y | z.

Lower-case starts are dropped. Too short.
"""


def test_split_sentences():
    assert split_sentences(TEXT) == [
        "The first sentence is here.",
        "A second one follows, e.g. this clause continues on an indented line.",
        "Is this a third?",
        "Lower-case starts are dropped.",
    ]


@pytest.fixture(scope="module")
def tokenizer():
    return installed_or_skip(minilm_tokenizer)


def test_pydoc_length_split(tokenizer):
    sentences = pydoc_sentences()
    assert len(sentences) > 1000 and len(set(sentences)) == len(sentences)
    train, validation = split_by_length(sentences, tokenizer)
    train_lengths = [len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in train]
    validation_lengths = [len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in validation]
    assert min(train_lengths) >= 8 and max(train_lengths) <= 32
    assert min(validation_lengths) >= 33 and max(validation_lengths) <= 64
    assert 2 <= len(train) / len(validation) <= 5  # about the paper's 4:1


def test_overlapping_lengths_are_refused(tokenizer):
    with pytest.raises(ValueError, match="overlap"):
        split_by_length(["A b c."], tokenizer, range(2, 10), range(9, 20))


def test_whole_word_masking(tokenizer):
    sentences = ["Unbelievably, the interpreter tokenizes everything.", "A second sentence is here."]
    first = WholeWordMaskedSentences(sentences, tokenizer, seed=1)
    assert [e["labels"] for e in first] == [
        e["labels"] for e in WholeWordMaskedSentences(sentences, tokenizer, seed=1)
    ]
    for example, sentence in zip(first, sentences, strict=True):
        original = tokenizer(sentence)
        word_ids = original.word_ids()
        masked = [i for i, token in enumerate(example["input_ids"]) if token == tokenizer.mask_token_id]
        assert masked and len({word_ids[i] for i in masked}) == 1  # one word, all of its pieces
        assert [i for i, w in enumerate(word_ids) if w == word_ids[masked[0]]] == masked
        assert [example["labels"][i] for i in masked] == [original["input_ids"][i] for i in masked]
        assert all(label == -100 for i, label in enumerate(example["labels"]) if i not in masked)
