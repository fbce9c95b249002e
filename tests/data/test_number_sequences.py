"""The NSP tasks: the masked answer follows the rule, the split is inductive, and the metric scores whole sequences."""

import random

import numpy as np
import pytest
from transformers import DataCollatorForTokenClassification, EvalPrediction, Trainer, TrainingArguments

from hf_recurrence import IBertForMaskedLM, InductiveBertConfig
from hf_recurrence.data import (
    NSP_TASKS,
    NumberSequenceDataset,
    compute_number_sequence_metrics,
    difficulty_of,
    generate_number_sequences,
    inductive_split,
    little_endian_digits,
    max_sequence_length,
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


def without_window(example: dict) -> dict:
    """A random-offset row cut back to its sequence: the span from [CLS] to [SEP]."""
    start, end = example["input_ids"].index(TOKENIZER.cls_token_id), example["input_ids"].index(TOKENIZER.sep_token_id)
    return {key: values[start : end + 1] for key, values in example.items()}


def test_every_epoch_draws_fresh_sequences_and_epoch_zero_is_the_fixed_set():
    fixed = list(generate_number_sequences("add", range(2, 6), 10, seed=7))
    assert list(generate_number_sequences("add", range(2, 6), 10, seed=7, epoch=0)) == fixed
    first = list(generate_number_sequences("add", range(2, 6), 10, seed=7, epoch=1))
    assert first == list(generate_number_sequences("add", range(2, 6), 10, seed=7, epoch=1))
    second = list(generate_number_sequences("add", range(2, 6), 10, seed=7, epoch=2))
    # Same difficulties in the same order, other numbers: almost every example differs from the other epochs'.
    for draw in (first, second):
        assert [difficulty_of(e["input_ids"]) for e in draw] == [difficulty_of(e["input_ids"]) for e in fixed]
    assert sum(a != b for a, b in zip(fixed, first, strict=True)) >= 35
    assert sum(a != b for a, b in zip(first, second, strict=True)) >= 35

    dataset = NumberSequenceDataset("add", range(2, 6), 10, seed=7, regenerate_every_epoch=True)
    assert dataset.examples == fixed
    dataset.set_epoch(2)
    assert dataset.examples == second and len(dataset) == 40
    kept = NumberSequenceDataset("add", range(2, 6), 10, seed=7)
    kept.set_epoch(2)
    assert kept.examples == fixed


def test_trainer_trains_each_epoch_on_that_epochs_draw(tmp_path):
    served = []

    class Recorded(NumberSequenceDataset):
        def __getitem__(self, index):
            served.append((self.epoch, tuple(self.examples[index]["input_ids"])))
            return super().__getitem__(index)

    dataset = Recorded("copy", [2, 3], 4, regenerate_every_epoch=True)
    config = InductiveBertConfig(
        vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, pad_token_id=0
    )
    arguments = TrainingArguments(
        tmp_path, num_train_epochs=3, per_device_train_batch_size=4, use_cpu=True, report_to="none", save_strategy="no"
    )
    collator = DataCollatorForTokenClassification(TOKENIZER)
    Trainer(model=IBertForMaskedLM(config), args=arguments, train_dataset=dataset, data_collator=collator).train()
    for epoch in range(3):
        drawn = generate_number_sequences("copy", [2, 3], 4, epoch=epoch)
        assert sorted(ids for e, ids in served if e == epoch) == sorted(tuple(e["input_ids"]) for e in drawn)
    assert {e for e, _ in served} == {0, 1, 2}


@pytest.mark.parametrize("task", NSP_TASKS)
def test_max_sequence_length_is_the_longest_sequence_of_a_difficulty(task):
    for difficulty in (1, 3, 6):
        lengths = [len(e["input_ids"]) for e in generate_number_sequences(task, [difficulty], 400)]
        assert max(lengths) == max_sequence_length(task, difficulty)


def test_random_offset_layout_keeps_the_sequence_in_a_fixed_window_without_padding_mask():
    plain = list(generate_number_sequences("add", [2, 5], 30, seed=1))
    dataset = NumberSequenceDataset("add", [2, 5], 30, seed=1, random_offset=True)
    assert dataset.width == max_sequence_length("add", 5) == 20
    offsets = set()
    for example, reference in zip(dataset, plain, strict=True):
        assert len(example["input_ids"]) == len(example["labels"]) == 20
        assert example["attention_mask"] == [1] * 20
        # The numbers are the default layout's; only [PAD] (unlabelled) surrounds them.
        assert without_window(example) == reference
        offset = example["input_ids"].index(TOKENIZER.cls_token_id)
        outside = example["input_ids"][:offset] + example["input_ids"][offset + len(reference["input_ids"]) :]
        assert set(outside) <= {TOKENIZER.pad_token_id}
        assert difficulty_of(example["input_ids"]) == difficulty_of(reference["input_ids"])
        offsets.add(offset)
    assert len(offsets) > 5
    # Each set's window fits its own highest difficulty, as in the authors' code; a batch of them needs no padding.
    train, validation = inductive_split("copy", [2, 3], [4, 6], 2, 2, random_offset=True)
    assert {len(e["input_ids"]) for e in train} == {9} and {len(e["input_ids"]) for e in validation} == {15}
    batch = DataCollatorForTokenClassification(TOKENIZER)(list(train))
    assert batch["attention_mask"].all()
    with pytest.raises(ValueError, match="width=3"):
        list(generate_number_sequences("copy", [2], 1, width=3))


@pytest.mark.parametrize("random_offset", [False, True])
def test_labels_at_every_position(random_offset):
    masked = NumberSequenceDataset("add", [3, 4], 5, random_offset=random_offset)
    everywhere = NumberSequenceDataset("add", [3, 4], 5, random_offset=random_offset, label_every_position=True)
    for example, reference in zip(everywhere, masked, strict=True):
        assert example["input_ids"] == reference["input_ids"]
        for token, label, masked_label in zip(
            example["input_ids"], example["labels"], reference["labels"], strict=True
        ):
            # Under the masks the answer digit, as before; anywhere else the token itself ([PAD] included).
            assert label == (masked_label if token == TOKENIZER.mask_token_id else token)
    if random_offset:
        assert any(TOKENIZER.pad_token_id in example["labels"] for example in everywhere)


def test_metric_scores_only_the_answer_digits_when_every_position_is_labelled():
    examples = list(NumberSequenceDataset("add", [3, 4], 2, label_every_position=True))
    batch = DataCollatorForTokenClassification(TOKENIZER, return_tensors="np")(examples)
    labels, inputs = batch["labels"], batch["input_ids"]
    predictions = np.where(labels == -100, 0, labels)  # every labelled position right
    predictions[0, 0] = TOKENIZER.mask_token_id  # a visible position wrong: not an answer digit, does not count
    first_answer_digit = np.argmax(inputs[1] == TOKENIZER.mask_token_id)
    predictions[1, first_answer_digit] = (labels[1, first_answer_digit] + 1) % 16  # one answer digit wrong (d = 4)
    metrics = compute_number_sequence_metrics(EvalPrediction(predictions, labels, inputs=inputs))
    assert metrics == {"sequence_accuracy": 0.75, "sequence_accuracy_d3": 1.0, "sequence_accuracy_d4": 0.5}
