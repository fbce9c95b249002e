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

Two choices of the authors' code (github hwnam831/ibert) that the paper's text leaves open are options, both off by
default: the random-offset layout (`width=`: each sequence at a random offset of a fixed-width window of `[PAD]`
tokens, all of them attended to) and labels at every position (`label_every_position=True`). A data set can also be
drawn afresh every epoch (`regenerate_every_epoch=True`, with `set_epoch`).
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


def max_sequence_length(task: str, difficulty: int) -> int:
    """The longest encoded sequence of `difficulty`: `3d + 5` tokens for add (a d-digit `a1` and a (d+1)-digit
    answer), `2d + 3` for copy and reverse. The authors' code sizes its fixed-width window the same way."""
    _check_task(task)
    return 3 * difficulty + 5 if task == "add" else 2 * difficulty + 3


def place_at_random_offset(example: dict[str, list[int]], width: int, rng: random.Random) -> dict[str, list[int]]:
    """The authors' layout: `example` at an offset drawn uniformly from `0 .. width - len`, `[PAD]` before and after
    it up to `width` tokens, and no padding mask (the model attends to, and its LSTM reads, the `[PAD]` tokens too).
    Labels of the `[PAD]` tokens are -100; `labelled_at_every_position` labels them as `[PAD]`."""
    length = len(example["input_ids"])
    if length > width:
        raise ValueError(f"a sequence of {length} tokens does not fit a window of width={width}")
    before = rng.randint(0, width - length)
    after = width - length - before
    return {
        "input_ids": [PAD_ID] * before + example["input_ids"] + [PAD_ID] * after,
        "attention_mask": [1] * width,
        "labels": [-100] * before + example["labels"] + [-100] * after,
    }


def labelled_at_every_position(example: dict[str, list[int]]) -> dict[str, list[int]]:
    """The authors' loss: every position labelled, with its own token where it is not masked (`[CLS]`, the given
    digits, delimiters, `[SEP]` and any `[PAD]` of the random-offset layout) and the answer digit under the masks."""
    labels = [
        token if label == -100 else label for token, label in zip(example["input_ids"], example["labels"], strict=True)
    ]
    return {**example, "labels": labels}


def generate_number_sequences(
    task: str,
    difficulties: Iterable[int],
    examples_per_difficulty: int,
    seed: int = 0,
    *,
    epoch: int = 0,
    width: int | None = None,
    label_every_position: bool = False,
) -> Iterator[dict[str, list[int]]]:
    """Yield `examples_per_difficulty` examples of each difficulty, difficulties interleaved round-robin.

    Example `i` of difficulty `d` comes from its own generator seeded by `(task, seed, d, i)`, so it is the same
    whichever other difficulties or sizes are asked for, and the output is identical from run to run. An `epoch`
    above 0 adds itself to that seed: a fresh draw of the same size, with epoch 0 the set drawn without it.

    width: place every sequence at a random offset of a window this wide (`place_at_random_offset`; the offset is
    drawn from the example's own generator after its numbers, so the numbers are those of the default layout).
    None (default) leaves sequences as they are, to be padded per batch on the right.
    label_every_position: label every position (`labelled_at_every_position`), not only the masked answer digits.
    """
    _check_task(task)
    difficulties = list(difficulties)
    if examples_per_difficulty < 1:
        raise ValueError(f"examples_per_difficulty must be at least 1, got {examples_per_difficulty}")
    if epoch < 0:
        raise ValueError(f"epoch must be at least 0, got epoch={epoch}")
    for index in range(examples_per_difficulty):
        for difficulty in difficulties:
            key = f"{task}:{seed}:{difficulty}:{index}" + (f":epoch{epoch}" if epoch else "")
            rng = random.Random(key)
            example = encode_number_sequence(*sample_number_sequence(task, difficulty, rng))
            if width is not None:
                example = place_at_random_offset(example, width, rng)
            yield labelled_at_every_position(example) if label_every_position else example


class NumberSequenceDataset(torch.utils.data.Dataset):
    """The examples of `generate_number_sequences`, held in memory for `Trainer` (pad them with
    `DataCollatorForTokenClassification(number_sequence_tokenizer())`).

    random_offset: the authors' fixed-width layout, in a window as wide as the longest sequence of the highest
    difficulty (`max_sequence_length`), so every row of the set has that width (`self.width`; None otherwise).
    label_every_position: labels at every position, not only under the masks.
    regenerate_every_epoch: `set_epoch(e)` draws the set of epoch `e` (`generate_number_sequences(epoch=e)`); without
    it `set_epoch` keeps the examples. `Trainer` and accelerate call `set_epoch` on a data set that has it.
    """

    def __init__(
        self,
        task: str,
        difficulties: Iterable[int],
        examples_per_difficulty: int,
        seed: int = 0,
        *,
        random_offset: bool = False,
        label_every_position: bool = False,
        regenerate_every_epoch: bool = False,
    ):
        self.task = task
        self.difficulties = list(difficulties)
        self.examples_per_difficulty = examples_per_difficulty
        self.seed = seed
        self.width = max_sequence_length(task, max(self.difficulties)) if random_offset else None
        self.label_every_position = label_every_position
        self.regenerate_every_epoch = regenerate_every_epoch
        self.epoch = 0
        self.examples = self._draw(0)

    def set_epoch(self, epoch: int) -> None:
        """With `regenerate_every_epoch`, replace the examples by epoch `epoch`'s draw; otherwise do nothing."""
        if self.regenerate_every_epoch and epoch != self.epoch:
            self.examples = self._draw(epoch)
            self.epoch = epoch

    def _draw(self, epoch: int) -> list[dict[str, list[int]]]:
        return list(
            generate_number_sequences(
                self.task,
                self.difficulties,
                self.examples_per_difficulty,
                self.seed,
                epoch=epoch,
                width=self.width,
                label_every_position=self.label_every_position,
            )
        )

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
    *,
    random_offset: bool = False,
    label_every_position: bool = False,
    regenerate_every_epoch: bool = False,
) -> tuple[NumberSequenceDataset, NumberSequenceDataset]:
    """Training and validation sets whose difficulties do not overlap (paper: d = 2..12 and 13..16).

    The defaults give the paper's sizes: 11 x 2327 = 25597 training sequences (the paper's 25600 does not divide
    into 11 equal parts) and 4 x 384 = 1536 validation sequences. `random_offset` and `label_every_position` apply
    to both sets (each set's window fits its own highest difficulty, as in the authors' code),
    `regenerate_every_epoch` to the training set only: the validation set stays fixed.
    """
    train_difficulties, validation_difficulties = list(train_difficulties), list(validation_difficulties)
    shared = sorted(set(train_difficulties) & set(validation_difficulties))
    if shared:
        raise ValueError(f"training and validation difficulties must not overlap, both contain {shared}")
    layout = {"random_offset": random_offset, "label_every_position": label_every_position}
    return (
        NumberSequenceDataset(
            task,
            train_difficulties,
            train_examples_per_difficulty,
            seed,
            regenerate_every_epoch=regenerate_every_epoch,
            **layout,
        ),
        NumberSequenceDataset(task, validation_difficulties, validation_examples_per_difficulty, seed, **layout),
    )


def difficulty_of(input_ids: Sequence[int]) -> int:
    """Read `d` back from an encoded input: the digit count of the number just before the masks."""
    delimiters = [i for i, token in enumerate(input_ids) if token == DELIMITER_ID]
    if not delimiters:
        raise ValueError(f"no delimiter token ({DELIMITER_ID}) in input_ids={list(input_ids)}")
    start = delimiters[-2] if len(delimiters) > 1 else list(input_ids).index(CLS_ID)
    return delimiters[-1] - start - 1


def sequence_correct(predictions: np.ndarray, labels: np.ndarray, scored: np.ndarray | None = None) -> np.ndarray:
    """Per row: True when every scored position is predicted exactly (predicted ids (N, L) or logits (N, L, V)).

    scored: (N, L) booleans, the positions that count; by default the labelled ones (`labels != -100`).
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim == labels.ndim + 1:
        predictions = predictions.argmax(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions of shape {predictions.shape} do not match labels of shape {labels.shape}")
    scored = labels != -100 if scored is None else np.asarray(scored, dtype=bool)
    return ((predictions == labels) | ~scored).all(axis=1)


def sequence_accuracy_by_length(
    predictions: np.ndarray, labels: np.ndarray, lengths: Sequence[int], scored: np.ndarray | None = None
) -> dict[int, float]:
    """Sequence accuracy per length (difficulty): the share of rows of that length with every scored position (by
    default every labelled one: the answer digits) right."""
    correct = sequence_correct(predictions, labels, scored)
    row_lengths = np.asarray(lengths)
    if row_lengths.shape != correct.shape:
        raise ValueError(f"got {row_lengths.shape[0]} lengths for {correct.shape[0]} rows")
    return {int(length): float(correct[row_lengths == length].mean()) for length in np.unique(row_lengths)}


def compute_number_sequence_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """`Trainer(compute_metrics=...)`: overall sequence accuracy, and per difficulty when inputs are available.

    Run the Trainer with `TrainingArguments(include_for_metrics=["inputs"])` to get `sequence_accuracy_d{d}` for every
    difficulty `d`, and with `preprocess_logits_for_metrics=logits_to_predictions` to keep ids instead of logits.

    Only the answer digits count: with inputs, the `[MASK]` positions, so labels at every position
    (`label_every_position`) score the same as labels under the masks only; without inputs, the labelled positions.
    """
    predictions, labels = np.asarray(eval_pred.predictions), np.asarray(eval_pred.label_ids)
    inputs = None if eval_pred.inputs is None else np.asarray(eval_pred.inputs)
    scored = None if inputs is None else inputs == MASK_ID
    correct = sequence_correct(predictions, labels, scored)
    metrics = {"sequence_accuracy": float(correct.mean())}
    if inputs is not None:
        lengths = [difficulty_of(row) for row in inputs]
        per_length = sequence_accuracy_by_length(predictions, labels, lengths, scored)
        metrics.update({f"sequence_accuracy_d{d}": accuracy for d, accuracy in per_length.items()})
    return metrics


def logits_to_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`Trainer(preprocess_logits_for_metrics=...)`: keep argmax ids, not (N, L, V) logits, across evaluation."""
    return logits.argmax(-1)


def _check_task(task: str) -> None:
    if task not in NSP_TASKS:
        raise ValueError(f"task must be one of {NSP_TASKS}, got task={task!r}")
