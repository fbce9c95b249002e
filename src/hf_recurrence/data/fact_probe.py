"""A long-range probe on real text: a fact planted in one window and asked for in the next.

Every example is two windows of `window_size` tokens of real running text (consecutive stretches of a token stream,
no overlap). Window 1 has one planted sentence at a random token position, naming an invented person ("The
stranger's name was Velmora."); window 2 ends by asking for it ("... The stranger's name was Velmora"). Only the
name's tokens in window 2 are labelled, so the loss (and the recall) is scored on the fact alone. The name is made of
random syllables, so no pretrained model knows it: a model reading window 2 alone is at chance, and one that carries
context across the window boundary (the recurrence's `h_prev`) can recall it. The swap control reads window 2 with
another example's carried state and should fall back to chance.

`FactProbe` is the probe as scored (a fixed set, the plant anywhere in window 1); `FactProbeCurriculum` is the same
task as a training set, with the plant moved from the end of window 1 towards its start as training goes on, and
mixed with plain language-model blocks; it can also serve longer blocks (e.g. the book runs' 4 windows), the name
planted in the second-to-last window and asked for at the end of the last. Both build their examples with one
`NamePlanter`.
"""

import math
import random
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase

from ..evaluation import RECURRENT_MODEL_TYPES
from .blocks import WindowedBlocksCollator


SYLLABLES = ("ka", "lo", "mer", "vin", "dra", "sol", "qui", "ten", "bar", "zel", "ron", "fi", "gus", "hal", "nor")
PLANT = " The stranger's name was"

# The curriculum's stages (`FactProbeCurriculum`): in stage s the planted sentence ends at most
# `ceil(CURRICULUM_REACHES[s] * text tokens of window 1)` text tokens before window 1's end; each stage takes an equal
# share of the training examples, in order, and the last reaches the whole window (as `FactProbe` plants).
CURRICULUM_REACHES = (0.125, 0.25, 0.5, 1.0)


def invented_name(rng: random.Random, syllables: int = 3) -> str:
    """A capitalised name of random syllables, e.g. "Velmora"-like; no pretrained model has seen it as a name."""
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


class NamePlanter:
    """Builds one probe example from a stretch of text and a name: the planted sentence put into window 1's text, the
    question ending window 2, labels on the name's tokens in window 2 only. Shared by `FactProbe` and
    `FactProbeCurriculum`.

    Args:
        tokenizer: the model's tokenizer, for the planted sentence and the names.
        window_size: tokens per window.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, window_size: int):
        self.tokenizer = tokenizer
        self.window_size = window_size
        self.ask = tokenizer(PLANT, add_special_tokens=False)["input_ids"]
        self.period = tokenizer(".", add_special_tokens=False)["input_ids"]

    def name_ids(self, name: str) -> list[int]:
        return self.tokenizer(" " + name, add_special_tokens=False)["input_ids"]

    def text_tokens(self, name_ids: list[int]) -> tuple[int, int]:
        """How many tokens of running text window 1 and window 2 hold beside the planted sentence and the question;
        `ValueError` when a window has no room for them."""
        planted = len(self.ask) + len(name_ids) + len(self.period)
        question = len(self.ask) + len(name_ids)
        if planted >= self.window_size or question >= self.window_size:
            raise ValueError(
                f"window_size={self.window_size} leaves no room for the planted sentence ({planted} tokens)"
            )
        return self.window_size - planted, self.window_size - question

    def example(self, text: Sequence[int], name_ids: list[int], position: int) -> dict[str, torch.Tensor]:
        """`{"input_ids", "labels"}`, (2 * window_size,) each, from `text` (the two windows' running text, as many
        tokens as `text_tokens` says) with the planted sentence after its first `position` tokens."""
        first_text, _ = self.text_tokens(name_ids)
        planted = self.ask + name_ids + self.period
        first = list(text[:position]) + planted + list(text[position:first_text])
        second = list(text[first_text:]) + self.ask + name_ids
        ids = torch.tensor(first + second)  # (2 * window_size,)
        labels = torch.full_like(ids, -100)
        labels[-len(name_ids) :] = ids[-len(name_ids) :]  # the causal LM shifts: predicted from the token before
        return {"input_ids": ids, "labels": labels}


class FactProbe(Dataset):
    """Two-window examples `{"input_ids": (2 * window_size,), "labels": (2 * window_size,)}` cut from `stream`
    (consecutive stretches, each used once), labels -100 except the name's tokens in window 2.

    Args:
        stream: token ids of running text (e.g. `token_stream(books, tokenizer)`).
        tokenizer: the model's tokenizer, for the planted sentence and the names.
        window_size: tokens per window.
        num_examples: how many; `ValueError` naming the counts when the stream is too short.
        seed: the names and plant positions.

    `names` and `distances` (text tokens between the planted sentence and window 1's end) describe each example.
    """

    def __init__(
        self, stream: list[int], tokenizer: PreTrainedTokenizerBase, window_size: int, num_examples: int, seed: int = 0
    ):
        rng = random.Random(seed)
        planter = NamePlanter(tokenizer, window_size)
        self.examples: list[dict[str, torch.Tensor]] = []
        self.names: list[str] = []
        self.distances: list[int] = []
        start = 0
        for _ in range(num_examples):
            name = invented_name(rng)
            name_ids = planter.name_ids(name)
            first_text, second_text = planter.text_tokens(name_ids)
            if start + first_text + second_text > len(stream):
                raise ValueError(
                    f"The stream ({len(stream):,} tokens) holds {len(self.examples)} examples of window_size="
                    f"{window_size}, fewer than num_examples={num_examples}"
                )
            position = rng.randrange(first_text + 1)
            self.examples.append(planter.example(stream[start : start + first_text + second_text], name_ids, position))
            self.names.append(name)
            self.distances.append(first_text - position)
            start += first_text + second_text

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.examples[i]


class FactProbeCurriculum(IterableDataset):
    """The probe as a training set: `num_examples` examples of `windows` windows, served in order, a share
    `probe_fraction` of them probe examples and the rest plain language-model blocks (`windows` windows of the same
    stream, every label on). A probe example of more than two windows is `windows - 2` windows of running text (no
    label on them) followed by the two-window probe: the name planted in the second-to-last window, asked for at the
    end of the last, so it is always carried across exactly one window boundary.

    Example i (training progress i / num_examples) is in curriculum stage `s = i * len(reaches) // num_examples`: its
    planted sentence ends `d` text tokens before window 1's end, `d` drawn uniformly from `0 .. ceil(reaches[s] *
    text tokens of window 1)`, so training starts with the plant next to the window boundary and ends with it
    anywhere in window 1 (with the default reaches' last stage 1.0, as `FactProbe` plants). Which examples are probe
    examples is fixed, not drawn, by groups of `group_size` consecutive examples: group g is all probe examples when
    `floor((g + 1) * f) > floor(g * f)` for `f = probe_fraction`, so every stretch of groups holds that share to within
    one. Give it the training batch size for batches each all probes or all language-model blocks: a causal LM's loss
    is the mean over a batch's labelled tokens, in which a probe's few name tokens beside language-model blocks' hundreds
    weigh next to nothing (at 0.5 and 512-token blocks, well under 1% of the loss). `group_size=1`: each example on
    its own (a batch of 8 at 0.5: 4 and 4).

    Each example is drawn from its own generator seeded by (`seed`, i): a fresh invented name and a stretch of
    `stream` at a random offset (the stream is read many times over in a long run). The same arguments give the same
    examples, in any order of access, so every arm of a comparison trains on the same examples in the same order.
    Evaluate on a `FactProbe` cut from another stream (another book), never from this one.

    An `IterableDataset`, so that the `Trainer` serves it in order (it shuffles a map-style dataset, which would
    scramble the curriculum); `len` and indexing work too.

    Args:
        stream: token ids of running text to cut the examples from.
        tokenizer: the model's tokenizer, for the planted sentence and the names.
        window_size: tokens per window.
        num_examples: examples in all (steps x batch size for one pass).
        probe_fraction: the share of probe examples, in [0, 1]; the rest are language-model blocks.
        reaches: the curriculum's stages, increasing fractions in (0, 1] (`CURRICULUM_REACHES`).
        seed: the names, offsets and plant positions.
        windows: windows per example, at least 2.
        group_size: consecutive examples that are all probes or all language-model blocks (the batch size).
    """

    def __init__(
        self,
        stream: list[int],
        tokenizer: PreTrainedTokenizerBase,
        window_size: int,
        num_examples: int,
        probe_fraction: float = 1.0,
        reaches: Sequence[float] = CURRICULUM_REACHES,
        seed: int = 0,
        windows: int = 2,
        group_size: int = 1,
    ):
        if not 0 <= probe_fraction <= 1:
            raise ValueError(f"probe_fraction must lie in [0, 1], got probe_fraction={probe_fraction!r}")
        reaches = tuple(reaches)
        if not reaches or any(not 0 < r <= 1 for r in reaches) or list(reaches) != sorted(reaches):
            raise ValueError(f"reaches must be increasing fractions in (0, 1], got reaches={list(reaches)}")
        if num_examples < 1:
            raise ValueError(f"num_examples must be positive, got num_examples={num_examples}")
        if isinstance(windows, bool) or not isinstance(windows, int) or windows < 2:
            raise ValueError(f"windows must be an integer of at least 2 (the plant and the question), got {windows!r}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got group_size={group_size!r}")
        self.stream = stream
        self.planter = NamePlanter(tokenizer, window_size)
        self.window_size = window_size
        self.num_examples = num_examples
        self.probe_fraction = probe_fraction
        self.reaches = reaches
        self.seed = seed
        self.windows = windows
        self.group_size = group_size
        if len(stream) < windows * window_size:
            raise ValueError(f"The stream ({len(stream):,} tokens) is shorter than {windows} windows of {window_size}")

    def __len__(self) -> int:
        return self.num_examples

    def is_probe(self, i: int) -> bool:
        group = i // self.group_size
        return math.floor((group + 1) * self.probe_fraction) > math.floor(group * self.probe_fraction)

    def reach(self, i: int) -> float:
        """The curriculum reach of example i: the fraction of window 1 the plant may end in, counted from its end."""
        return self.reaches[i * len(self.reaches) // self.num_examples]

    def draw(self, i: int) -> dict:
        """Example i with what describes it: `input_ids`, `labels`, `probe` (bool), and for a probe example its `name`
        and `distance` (text tokens between the planted sentence and window 1's end)."""
        if not 0 <= i < self.num_examples:
            raise IndexError(f"example {i} of {self.num_examples}")
        rng = random.Random(f"FactProbeCurriculum:{self.seed}:{i}")
        if not self.is_probe(i):
            start = rng.randrange(len(self.stream) - self.windows * self.window_size + 1)
            ids = torch.tensor(self.stream[start : start + self.windows * self.window_size])
            return {"input_ids": ids, "labels": ids.clone(), "probe": False}
        name = invented_name(rng)
        name_ids = self.planter.name_ids(name)
        first_text, second_text = self.planter.text_tokens(name_ids)  # fewer than the stream's two windows
        lead = (self.windows - 2) * self.window_size  # the windows before the plant's, running text only
        start = rng.randrange(len(self.stream) - lead - first_text - second_text + 1)
        distance = rng.randint(0, math.ceil(self.reach(i) * first_text))
        text = self.stream[start + lead : start + lead + first_text + second_text]
        example = self.planter.example(text, name_ids, first_text - distance)
        if lead:
            lead_ids = torch.tensor(self.stream[start : start + lead])
            example = {
                "input_ids": torch.cat([lead_ids, example["input_ids"]]),  # (windows * window_size,)
                "labels": torch.cat([torch.full_like(lead_ids, -100), example["labels"]]),
            }
        return {**example, "probe": True, "name": name, "distance": distance}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        example = self.draw(i)
        return {"input_ids": example["input_ids"], "labels": example["labels"]}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(self.num_examples))


def _read_as_text(
    examples: list[dict[str, torch.Tensor]], window_size: int, recurrent: bool, window_start_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids and labels a model reads `examples` as: a recurrent model both windows, a stock model window 2 alone;
    with `window_start_ids` (e.g. Gemma's `<bos>`) before every window, as the book runs read (`WindowedBlocksCollator`,
    whose start ids predict nothing)."""
    starts = tuple(window_start_ids)
    if recurrent and not starts:
        return torch.stack([e["input_ids"] for e in examples]), torch.stack([e["labels"] for e in examples])
    collate = WindowedBlocksCollator(window_size, window_start_ids=starts, independent_windows=not recurrent)
    batch = collate(examples)
    if recurrent:
        return batch["input_ids"], batch["labels"]  # (batch, 2 * (starts + window))
    # (batch * 2, starts + window): each example's windows read alone; window 2 of each
    return batch["input_ids"][1::2], batch["labels"][1::2]


def _scored_batches(
    model, probe: FactProbe, window_size: int, batch_size: int, window_start_ids: Sequence[int] = ()
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per batch of `probe`'s examples, read as the model reads text (a recurrent model both windows with its state
    carried, a stock model window 2 alone: `model.config.model_type` decides, as in `windowed_perplexity`; every window
    begun by `window_start_ids`): the NLL of every predicted token, which of them are name tokens, and which are the
    argmax, (batch, length - 1) each."""
    recurrent = model.config.model_type in RECURRENT_MODEL_TYPES
    with torch.no_grad():
        for first in range(0, len(probe), batch_size):
            batch = probe.examples[first : first + batch_size]
            ids, labels = _read_as_text(batch, window_size, recurrent, window_start_ids)
            ids, labels = ids.to(model.device), labels.to(model.device)
            logits = model(ids).logits[:, :-1].float()  # (batch, length - 1, vocab)
            targets = labels[:, 1:]
            scored = targets != -100
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets.clamp(min=0), reduction="none")
            yield nll, scored, logits.argmax(-1) == targets


def fact_nll(
    model, probe: FactProbe, window_size: int, batch_size: int = 8, window_start_ids: Sequence[int] = ()
) -> tuple[float, float]:
    """Mean NLL per name token (nats) and the share of examples whose every name token is the argmax, reading each
    example as the model reads text: a recurrent model both windows with its state carried, a stock model window 2
    alone (`model.config.model_type` decides, as in `windowed_perplexity`); every window begun by `window_start_ids`
    (none: bare windows)."""
    total, count, recalled = 0.0, 0, 0
    for nll, scored, argmax in _scored_batches(model, probe, window_size, batch_size, window_start_ids):
        total += float(nll[scored].sum())
        count += int(scored.sum())
        recalled += int((argmax | ~scored).all(dim=1).sum())
    return total / count, recalled / len(probe)


def fact_scores(model, probe: FactProbe, window_size: int, batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Per example, read as `fact_nll` reads it: `nll`, the summed NLL of its name tokens (float64), `tokens`, how
    many there are, and `recalled`, whether every one is the argmax; (examples,) each, for paired comparisons of two
    readers of the same examples."""
    nll_sums, tokens, recalled = [], [], []
    for nll, scored, argmax in _scored_batches(model, probe, window_size, batch_size):
        nll_sums.append((nll.double() * scored).sum(1).cpu())
        tokens.append(scored.sum(1).cpu())
        recalled.append((argmax | ~scored).all(dim=1).cpu())
    return {"nll": torch.cat(nll_sums), "tokens": torch.cat(tokens), "recalled": torch.cat(recalled)}
