"""Carried tokens: the predicted tokens that a memory of the previous window can help with and the window itself cannot.

A token is carried when it belongs to a word whose type (its letters, lowercased) the previous window read and the
current window has not read before it: a name, or any word, met again just after a window boundary. A recurrent
model's gain on these tokens over its zero-input control is the part of its gain that needs the previous window's
words (issue 39's gate 3: "NLL on carried tokens").
"""

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch


# A word: a run of letters (no digits, no underscore); "Velmora's" is the words "Velmora" and "s".
WORD = re.compile(r"[^\W\d_]+")


@dataclass
class TokenWords:
    """The word each token of a text overlaps.

    Args:
        occurrence (`torch.Tensor` of shape `(num_tokens,)`, int64): the index of the word occurrence (`WORD` match)
            the token's characters overlap (its first, where several), -1 for a token without letters.
        word_type (`torch.Tensor` of shape `(num_tokens,)`, int64): that word's type (equal for equal lowercased
            words), -1 for a token without letters.
    """

    occurrence: torch.Tensor
    word_type: torch.Tensor

    def split(self, sections: int) -> list["TokenWords"]:
        """Cut into `sections` consecutive pieces, as `torch.tensor_split` cuts the token ids."""
        pieces = zip(self.occurrence.tensor_split(sections), self.word_type.tensor_split(sections), strict=True)
        return [TokenWords(occurrence, word_type) for occurrence, word_type in pieces]


def token_words(text: str, offsets: Sequence[tuple[int, int]]) -> TokenWords:
    """The word of each token of `text`, given the tokens' character spans (a fast tokenizer's `offset_mapping`)."""
    words = list(WORD.finditer(text))
    ends = [word.end() for word in words]
    types: dict[str, int] = {}
    word_types = [types.setdefault(word.group().lower(), len(types)) for word in words]
    occurrence = []
    for start, end in offsets:
        first = bisect.bisect_right(ends, start)  # the first word ending after the token starts
        overlaps = first < len(words) and words[first].start() < end
        occurrence.append(first if overlaps else -1)
    occurrences = torch.tensor(occurrence, dtype=torch.long)
    word_type = torch.tensor(word_types + [-1], dtype=torch.long)[occurrences]  # index -1: the appended -1
    return TokenWords(occurrences, word_type)


def carried_token_mask(words: TokenWords, window_position: torch.Tensor) -> torch.Tensor:
    """(num_tokens - 1,) bool over the predicted tokens of one document (as `TokenNLL.nll`: entry `p` is token
    `p + 1`, predicted at `window_position[p]` of its window): True where that token belongs to a word occurrence that
    begins in the predicting window, whose type the window before it read (any of its tokens from its start to the
    predicting window's) and no earlier occurrence in the predicting window has. Nothing is carried in a document's
    first window."""
    num_predicted = len(window_position)
    if len(words.occurrence) != num_predicted + 1:
        raise ValueError(
            f"words cover {len(words.occurrence)} tokens; a document with {num_predicted} predicted tokens has "
            f"{num_predicted + 1}"
        )
    window_start = (torch.arange(num_predicted) - window_position).tolist()  # per predicted token
    occurrence, word_type = words.occurrence.tolist(), words.word_type.tolist()
    first_token: dict[int, int] = {}
    for token, index in enumerate(occurrence):
        first_token.setdefault(index, token)
    mask = [False] * num_predicted
    starts = [*sorted(set(window_start)), num_predicted]  # the windows' first tokens, then the document's last
    for previous, start, following in zip(starts[:-2], starts[1:-1], starts[2:], strict=True):
        read_before = {kind for kind in word_type[previous:start] if kind >= 0}
        seen: set[int] = set()
        carried: dict[int, bool] = {}
        # The predicting window reads tokens start .. following - 1 and predicts start + 1 .. following.
        for token in range(start, following + 1):
            index, kind = occurrence[token], word_type[token]
            if index < 0 or first_token[index] < start:
                continue
            if first_token[index] == token:
                carried[index] = kind in read_before and kind not in seen
                seen.add(kind)
            if token > start:
                mask[token - 1] = carried[index]
    return torch.tensor(mask, dtype=torch.bool)
