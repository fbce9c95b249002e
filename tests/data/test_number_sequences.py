"""The NSP tasks: the masked answer follows the rule, the split is inductive, and the metric scores whole sequences."""

import random

import numpy as np
import pytest
from transformers import DataCollatorForTokenClassification, EvalPrediction

from hf_recurrence.data import (
    NSP_TASKS,
    NumberSequenceDataset,
    compute_number_sequence_metrics,
    difficulty_of,
    generate_number_sequences,
    inductive_split,
    little_endian_digits,
    number_sequence_tokenizer,
    sample_number_sequence,
    sequence_accuracy_by_length,
)


TOKENIZER = number_sequence_tokenizer()


def decode_numbers(example: dict) -> tuple[list[int], int]:
    """The given numbers and the answer of an encoded example, read little-endian from its tokens and labels."""
    tokens = TOKENIZER.convert_ids_to_tokens(example["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    pieces = " ".join(tokens[1:-1]).split(" _ ")
    given = [int("".join(reversed(piece.split()))) for piece in pieces[:-1]]
    answer_tokens = [TOKENIZER.convert_ids_to_tokens(label) for label in example["labels"] if label != -100]
    assert pieces[-1].split() == ["[MASK]"] * len(answer_tokens)
    return given, int("".join(reversed(answer_tokens)))


def test_little_endian_digits():
    assert little_endian_digits(120) == [0, 2, 1]
    assert little_endian_digits(7) == [7]


@pytest.mark.parametrize("task", NSP_TASKS)
def test_masked_answer_follows_the_rule(task):
    for example in generate_number_sequences(task, range(1, 17), examples_per_difficulty=20, seed=3):
        given, answer = decode_numbers(example)
        if task == "add":
            assert answer == given[0] + given[1]
        elif task == "copy":
            assert answer == given[0]
        else:
            digits = [TOKENIZER.convert_ids_to_tokens(label) for label in example["labels"] if label != -100]
            given_digits = TOKENIZER.convert_ids_to_tokens(example["input_ids"][1 : 1 + len(digits)])
            assert digits == given_digits[::-1]


def test_labels_only_under_masks():
    for example in generate_number_sequences("add", [5], examples_per_difficulty=10):
        masked = [token == TOKENIZER.mask_token_id for token in example["input_ids"]]
        labelled = [label != -100 for label in example["labels"]]
        assert masked == labelled


@pytest.mark.parametrize("task", NSP_TASKS)
def test_difficulty_bounds_the_digits(task):
    rng = random.Random(0)
    for difficulty in (1, 2, 9, 16):
        for _ in range(50):
            given, answer = sample_number_sequence(task, difficulty, rng)
            assert all(len(number) <= difficulty for number in given)
            assert len(given[-1]) == difficulty and given[-1][-1] != 0 or difficulty == 1
            assert len(answer) in (difficulty, difficulty + 1)


def test_difficulty_is_readable_from_the_input():
    for task in NSP_TASKS:
        for difficulty in (2, 7, 16):
            for example in generate_number_sequences(task, [difficulty], examples_per_difficulty=5):
                assert difficulty_of(example["input_ids"]) == difficulty


def test_inductive_split_never_shows_validation_lengths():
    train, validation = inductive_split("add", train_examples_per_difficulty=30, validation_examples_per_difficulty=12)
    train_d = [difficulty_of(e["input_ids"]) for e in train]
    validation_d = [difficulty_of(e["input_ids"]) for e in validation]
    assert set(train_d) == set(range(2, 13)) and set(validation_d) == set(range(13, 17))
    assert all(train_d.count(d) == 30 for d in range(2, 13))
    assert all(validation_d.count(d) == 12 for d in range(13, 17))


def test_copy_split_separates_token_lengths():
    # Copy's given number has exactly d digits, so its sequence lengths are disjoint too (add's short a1 overlaps).
    train, validation = inductive_split("copy", train_examples_per_difficulty=3, validation_examples_per_difficulty=3)
    assert max(len(e["input_ids"]) for e in train) < min(len(e["input_ids"]) for e in validation)


def test_overlapping_split_is_refused():
    with pytest.raises(ValueError, match=r"\[12\]"):
        inductive_split("add", range(2, 13), range(12, 17), 1, 1)


def test_bad_task_is_refused():
    with pytest.raises(ValueError, match="'multiply'"):
        NumberSequenceDataset("multiply", [3], 1)


def test_deterministic_under_a_seed():
    first = NumberSequenceDataset("add", range(2, 6), 10, seed=7).examples
    assert first == NumberSequenceDataset("add", range(2, 6), 10, seed=7).examples
    assert first != NumberSequenceDataset("add", range(2, 6), 10, seed=8).examples
    # An example does not depend on which other difficulties were asked for.
    alone = NumberSequenceDataset("add", [4], 10, seed=7).examples
    assert alone == [e for e in first if difficulty_of(e["input_ids"]) == 4]


def test_collator_pads_inputs_and_labels():
    batch = DataCollatorForTokenClassification(TOKENIZER)(list(NumberSequenceDataset("copy", [2, 9], 1)))
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 1 + 9 + 1 + 9 + 1)
    assert batch["input_ids"][0, -1] == TOKENIZER.pad_token_id and batch["labels"][0, -1] == -100
    assert batch["attention_mask"][0].sum() == 1 + 2 + 1 + 2 + 1


def test_metric_on_hand_made_predictions():
    examples = list(NumberSequenceDataset("add", [3, 4], 2))  # difficulties 3, 4, 3, 4
    batch = DataCollatorForTokenClassification(TOKENIZER, return_tensors="np")(examples)
    labels, inputs = batch["labels"], batch["input_ids"]
    predictions = np.where(labels == -100, inputs, labels)  # all right
    first_answer_digit = np.argmax(labels[1] != -100)
    predictions[1, first_answer_digit] = (predictions[1, first_answer_digit] + 1) % 16  # one digit wrong in a d=4 row
    predictions[2, 0] = 0  # an unlabelled position wrong: does not count
    assert sequence_accuracy_by_length(predictions, labels, [3, 4, 3, 4]) == {3: 1.0, 4: 0.5}
    metrics = compute_number_sequence_metrics(EvalPrediction(predictions, labels, inputs=inputs))
    assert metrics == {"sequence_accuracy": 0.75, "sequence_accuracy_d3": 1.0, "sequence_accuracy_d4": 0.5}
    logits = np.eye(16)[predictions]  # (N, L, V) logits give the same result
    assert compute_number_sequence_metrics(EvalPrediction(logits, labels)) == {"sequence_accuracy": 0.75}
