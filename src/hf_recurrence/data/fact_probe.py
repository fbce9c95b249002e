"""A long-range probe on real text: a fact planted in one window and asked for in the next.

Every example is two windows of `window_size` tokens of real running text (consecutive stretches of a token stream,
no overlap). Window 1 has one planted sentence at a random token position, naming an invented person ("The
stranger's name was Velmora."); window 2 ends by asking for it ("... The stranger's name was Velmora"). Only the
name's tokens in window 2 are labelled, so the loss (and the recall) is scored on the fact alone. The name is made of
random syllables, so no pretrained model knows it: a model reading window 2 alone is at chance, and one that carries
context across the window boundary (the recurrence's `h_prev`) can recall it. The swap control reads window 2 with
another example's carried state and should fall back to chance.
"""

import random

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from ..evaluation import RECURRENT_MODEL_TYPES


SYLLABLES = ("ka", "lo", "mer", "vin", "dra", "sol", "qui", "ten", "bar", "zel", "ron", "fi", "gus", "hal", "nor")
PLANT = " The stranger's name was"


def invented_name(rng: random.Random, syllables: int = 3) -> str:
    """A capitalised name of random syllables, e.g. "Velmora"-like; no pretrained model has seen it as a name."""
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


class FactProbe(Dataset):
    """Two-window examples `{"input_ids": (2 * window_size,), "labels": (2 * window_size,)}` cut from `stream`
    (consecutive stretches, each used once), labels -100 except the name's tokens in window 2.

    Args:
        stream: token ids of running text (e.g. `token_stream(books, tokenizer)`).
        tokenizer: the model's tokenizer, for the planted sentence and the names.
        window_size: tokens per window.
        num_examples: how many; `ValueError` naming the counts when the stream is too short.
        seed: the names and plant positions.
    """

    def __init__(
        self, stream: list[int], tokenizer: PreTrainedTokenizerBase, window_size: int, num_examples: int, seed: int = 0
    ):
        rng = random.Random(seed)
        ask = tokenizer(PLANT, add_special_tokens=False)["input_ids"]
        period = tokenizer(".", add_special_tokens=False)["input_ids"]
        self.examples: list[dict[str, torch.Tensor]] = []
        self.names: list[str] = []
        start = 0
        for _ in range(num_examples):
            name = invented_name(rng)
            name_ids = tokenizer(" " + name, add_special_tokens=False)["input_ids"]
            planted = ask + name_ids + period
            question = ask + name_ids
            if len(planted) >= window_size or len(question) >= window_size:
                raise ValueError(
                    f"window_size={window_size} leaves no room for the planted sentence ({len(planted)} tokens)"
                )
            first_text = window_size - len(planted)
            second_text = window_size - len(question)
            if start + first_text + second_text > len(stream):
                raise ValueError(
                    f"The stream ({len(stream):,} tokens) holds {len(self.examples)} examples of window_size="
                    f"{window_size}, fewer than num_examples={num_examples}"
                )
            text = stream[start : start + first_text]
            position = rng.randrange(first_text + 1)
            first = text[:position] + planted + text[position:]
            second = stream[start + first_text : start + first_text + second_text] + question
            start += first_text + second_text
            ids = torch.tensor(first + second)  # (2 * window_size,)
            labels = torch.full_like(ids, -100)
            labels[-len(name_ids) :] = ids[-len(name_ids) :]  # the causal LM shifts: predicted from the token before
            self.examples.append({"input_ids": ids, "labels": labels})
            self.names.append(name)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.examples[i]


def fact_nll(model, probe: FactProbe, window_size: int, batch_size: int = 8) -> tuple[float, float]:
    """Mean NLL per name token (nats) and the share of examples whose every name token is the argmax, reading each
    example as the model reads text: a recurrent model both windows with its state carried, a stock model window 2
    alone (`model.config.model_type` decides, as in `windowed_perplexity`)."""
    recurrent = model.config.model_type in RECURRENT_MODEL_TYPES
    total, count, recalled = 0.0, 0, 0
    with torch.no_grad():
        for first in range(0, len(probe), batch_size):
            batch = probe.examples[first : first + batch_size]
            ids = torch.stack([e["input_ids"] for e in batch]).to(model.device)  # (batch, 2 * window)
            labels = torch.stack([e["labels"] for e in batch]).to(model.device)
            if not recurrent:
                ids, labels = ids[:, window_size:], labels[:, window_size:]  # window 2 alone
            logits = model(ids).logits[:, :-1].float()  # (batch, length - 1, vocab)
            targets = labels[:, 1:]
            scored = targets != -100
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets.clamp(min=0), reduction="none")
            total += float(nll[scored].sum())
            count += int(scored.sum())
            correct = (logits.argmax(-1) == targets) | ~scored
            recalled += int(correct.all(dim=1).sum())
    return total / count, recalled / len(probe)
