"""Number sequence prediction (NSP) tasks of Nam et al. 2020, §5.1, as masked-LM examples.

A sequence holds two or three numbers; the last one follows from the others by the task's rule and all its digits
are replaced by `[MASK]`. Every number is written in little-endian decimal digits (least significant first), one token
per digit, and numbers are separated by a delimiter token:

    [CLS] a1 _ a2 _ [MASK] ... [MASK] [SEP]         (add: the answer is a1 + a2)
    [CLS] a1 _ [MASK] ... [MASK] [SEP]              (copy: a1; reverse: a1's digits in reverse order)

The difficulty `d` bounds the digits: every given number has at most `d` digits and the last given number (the
"second to last" number of the sequence) has exactly `d` digits, so `d` is readable from any input. Labels are -100
everywhere except under the masks, where they hold the answer's digit tokens. The inductive split trains on small `d`
and validates on larger ones, which the model has never seen, with every difficulty equally represented.
"""

import random
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import EvalPrediction, PreTrainedTokenizerFast


NSP_TASKS = ("add", "copy", "reverse")
DELIMITER = "_"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
NUMBER_VOCAB = {token: i for i, token in enumerate([*SPECIAL_TOKENS, DELIMITER, *"0123456789"])}
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = (NUMBER_VOCAB[t] for t in SPECIAL_TOKENS)
DELIMITER_ID = NUMBER_VOCAB[DELIMITER]
DIGIT_IDS = [NUMBER_VOCAB[str(digit)] for digit in range(10)]
TRAIN_DIFFICULTIES = range(2, 13)
VALIDATION_DIFFICULTIES = range(13, 17)


def number_sequence_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the 16 NSP tokens: five BERT specials, the delimiter `_` and the ten digits.

    Tokens are separated by spaces (`"[CLS] 3 2 _ 1 [MASK] [SEP]"`); it adds no special tokens of its own, since the
    examples are built id by id. Padding is on the right, as BERT expects.
    """
    tokenizer = Tokenizer(models.WordLevel(NUMBER_VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        padding_side="right",
        model_max_length=int(1e30),
    )


def little_endian_digits(number: int) -> list[int]:
    """Decimal digits of a non-negative `number`, least significant first (`120 -> [0, 2, 1]`)."""
    return [int(c) for c in reversed(str(number))]


def _random_number(rng: random.Random, num_digits: int) -> int:
    """A uniformly drawn number with exactly `num_digits` digits (one digit: 0..9)."""
    low = 0 if num_digits == 1 else 10 ** (num_digits - 1)
    return rng.randrange(low, 10**num_digits)


def sample_number_sequence(task: str, difficulty: int, rng: random.Random) -> tuple[list[list[int]], list[int]]:
    """Draw one sequence: the given numbers and the answer, each as little-endian digit lists.

    add: a1 has 1..d digits (count drawn uniformly), a2 exactly d digits, the answer is a1 + a2.
    copy / reverse: a1 has exactly d digits; the answer is its digit list, as is or reversed (a digit-string
    palindrome task, so an a1 ending in 0 keeps its zeros).
    """
    _check_task(task)
    if difficulty < 1:
        raise ValueError(f"difficulty must be at least 1, got difficulty={difficulty}")
    if task == "add":
        first = _random_number(rng, rng.randint(1, difficulty))
        second = _random_number(rng, difficulty)
        return [little_endian_digits(first), little_endian_digits(second)], little_endian_digits(first + second)
    digits = little_endian_digits(_random_number(rng, difficulty))
    return [digits], digits if task == "copy" else digits[::-1]


def encode_number_sequence(given: Sequence[Sequence[int]], answer: Sequence[int]) -> dict[str, list[int]]:
    """Token ids of `[CLS] n1 _ n2 _ [MASK]*len(answer) [SEP]`, with labels only under the masks."""
    input_ids = [CLS_ID]
    for number in given:
        input_ids += [DIGIT_IDS[digit] for digit in number] + [DELIMITER_ID]
    labels = [-100] * len(input_ids) + [DIGIT_IDS[digit] for digit in answer] + [-100]
    input_ids += [MASK_ID] * len(answer) + [SEP_ID]
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def generate_number_sequences(
    task: str, difficulties: Iterable[int], examples_per_difficulty: int, seed: int = 0
) -> Iterator[dict[str, list[int]]]:
    """Yield `examples_per_difficulty` examples of each difficulty, difficulties interleaved round-robin.

    Example `i` of difficulty `d` comes from its own generator seeded by `(task, seed, d, i)`, so it is the same
    whichever other difficulties or sizes are asked for, and the output is identical from run to run.
    """
    _check_task(task)
    difficulties = list(difficulties)
    if examples_per_difficulty < 1:
        raise ValueError(f"examples_per_difficulty must be at least 1, got {examples_per_difficulty}")
    for index in range(examples_per_difficulty):
        for difficulty in difficulties:
            rng = random.Random(f"{task}:{seed}:{difficulty}:{index}")
            yield encode_number_sequence(*sample_number_sequence(task, difficulty, rng))


class NumberSequenceDataset(torch.utils.data.Dataset):
    """The examples of `generate_number_sequences`, held in memory for `Trainer` (pad them with
    `DataCollatorForTokenClassification(number_sequence_tokenizer())`)."""

    def __init__(self, task: str, difficulties: Iterable[int], examples_per_difficulty: int, seed: int = 0):
        self.task = task
        self.difficulties = list(difficulties)
        self.examples = list(generate_number_sequences(task, self.difficulties, examples_per_difficulty, seed))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.examples[index]


def inductive_split(
    task: str,
    train_difficulties: Iterable[int] = TRAIN_DIFFICULTIES,
    validation_difficulties: Iterable[int] = VALIDATION_DIFFICULTIES,
    train_examples_per_difficulty: int = 2327,
    validation_examples_per_difficulty: int = 384,
    seed: int = 0,
) -> tuple[NumberSequenceDataset, NumberSequenceDataset]:
    """Training and validation sets whose difficulties do not overlap (paper: d = 2..12 and 13..16).

    The defaults give the paper's sizes: 11 x 2327 = 25597 training sequences (the paper's 25600 does not divide
    into 11 equal parts) and 4 x 384 = 1536 validation sequences.
    """
    train_difficulties, validation_difficulties = list(train_difficulties), list(validation_difficulties)
    shared = sorted(set(train_difficulties) & set(validation_difficulties))
    if shared:
        raise ValueError(f"training and validation difficulties must not overlap, both contain {shared}")
    return (
        NumberSequenceDataset(task, train_difficulties, train_examples_per_difficulty, seed),
        NumberSequenceDataset(task, validation_difficulties, validation_examples_per_difficulty, seed),
    )


def difficulty_of(input_ids: Sequence[int]) -> int:
    """Read `d` back from an encoded input: the digit count of the number just before the masks."""
    delimiters = [i for i, token in enumerate(input_ids) if token == DELIMITER_ID]
    if not delimiters:
        raise ValueError(f"no delimiter token ({DELIMITER_ID}) in input_ids={list(input_ids)}")
    start = delimiters[-2] if len(delimiters) > 1 else list(input_ids).index(CLS_ID)
    return delimiters[-1] - start - 1


def sequence_correct(predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per row: True when every labelled position is predicted exactly (predicted ids (N, L) or logits (N, L, V))."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim == labels.ndim + 1:
        predictions = predictions.argmax(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions of shape {predictions.shape} do not match labels of shape {labels.shape}")
    scored = labels != -100
    return ((predictions == labels) | ~scored).all(axis=1)


def sequence_accuracy_by_length(
    predictions: np.ndarray, labels: np.ndarray, lengths: Sequence[int]
) -> dict[int, float]:
    """Sequence accuracy per length (difficulty): the share of rows of that length with every answer digit right."""
    correct = sequence_correct(predictions, labels)
    row_lengths = np.asarray(lengths)
    if row_lengths.shape != correct.shape:
        raise ValueError(f"got {row_lengths.shape[0]} lengths for {correct.shape[0]} rows")
    return {int(length): float(correct[row_lengths == length].mean()) for length in np.unique(row_lengths)}


def compute_number_sequence_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """`Trainer(compute_metrics=...)`: overall sequence accuracy, and per difficulty when inputs are available.

    Run the Trainer with `TrainingArguments(include_for_metrics=["inputs"])` to get `sequence_accuracy_d{d}` for every
    difficulty `d`, and with `preprocess_logits_for_metrics=logits_to_predictions` to keep ids instead of logits.
    """
    predictions, labels = np.asarray(eval_pred.predictions), np.asarray(eval_pred.label_ids)
    correct = sequence_correct(predictions, labels)
    metrics = {"sequence_accuracy": float(correct.mean())}
    if eval_pred.inputs is not None:
        lengths = [difficulty_of(row) for row in np.asarray(eval_pred.inputs)]
        per_length = sequence_accuracy_by_length(predictions, labels, lengths)
        metrics.update({f"sequence_accuracy_d{d}": accuracy for d, accuracy in per_length.items()})
    return metrics


def logits_to_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`Trainer(preprocess_logits_for_metrics=...)`: keep argmax ids, not (N, L, V) logits, across evaluation."""
    return logits.argmax(-1)


def _check_task(task: str) -> None:
    if task not in NSP_TASKS:
        raise ValueError(f"task must be one of {NSP_TASKS}, got task={task!r}")
