"""Token streams cut into fixed-length training blocks."""

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase


def token_stream(texts: Iterable[str], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Tokenise `texts` and join them into one stream, each document followed by the tokenizer's EOS token."""
    if tokenizer.eos_token_id is None:
        raise ValueError(f"The tokenizer {type(tokenizer).__name__} has no eos_token to separate documents")
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"]
        stream.append(tokenizer.eos_token_id)
    return stream


class TokenBlocks(Dataset):
    """Consecutive `block_size`-token blocks of one token stream, as causal-LM examples (labels = inputs).

    The stream's last partial block is left out, as in transformers' `run_clm.py`; `num_dropped_tokens` says how many
    tokens that was.
    """

    def __init__(self, stream: list[int], block_size: int):
        if block_size < 2:
            raise ValueError(f"block_size must be at least 2, got block_size={block_size}")
        if len(stream) < block_size:
            raise ValueError(f"The token stream ({len(stream)} tokens) is shorter than one block ({block_size})")
        num_blocks = len(stream) // block_size
        self.num_dropped_tokens = len(stream) - num_blocks * block_size
        self.blocks = torch.tensor(stream[: num_blocks * block_size]).view(num_blocks, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


@dataclass
class WindowedBlocksCollator:
    """Collates blocks for a plain (non-recurrent) baseline: each block is cut into its windows, read independently.

    Window k covers tokens `[k * stride, k * stride + window_size)` of its block, `stride = window_size -
    window_overlap`; the overlap it re-reads is context only (label -100), so the baseline predicts the same tokens a
    recurrent model reading the block predicts, on the same tokens in the same order, but without any context across
    window boundaries.

    `window_start_ids` (e.g. Gemma's `<bos>`, which its model always reads before text) are read before every
    window and predict nothing; the window's first token stays unpredicted, as without them. With
    `independent_windows=False` each block stays one row, every window begun by those ids, for a recurrent model
    whose windows are `window_size + len(window_start_ids)` positions long: each window's first token is then the
    target of the previous window's last, as it is without start ids.
    """

    window_size: int
    window_overlap: int = 0
    window_start_ids: tuple[int, ...] = ()
    independent_windows: bool = True

    def __post_init__(self):
        if not self.independent_windows and not self.window_start_ids:
            raise ValueError(
                "independent_windows=False only serves window_start_ids: without them, pass the blocks as they are"
            )
        if not self.independent_windows and self.window_overlap:
            # A recurrent model re-reads its overlap itself, from its own input: start ids cannot go before it there.
            raise ValueError(
                f"independent_windows=False needs window_overlap=0, got window_overlap={self.window_overlap}"
            )

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        blocks = torch.stack([example["input_ids"] for example in examples])  # (batch, block_size)
        # The examples' own labels where they have them (some tokens may be left out with -100), else the ids.
        targets = torch.stack([example.get("labels", example["input_ids"]) for example in examples])
        stride = self.window_size - self.window_overlap
        windows = blocks.unfold(1, self.window_size, stride)  # (batch, windows_per_block, window_size)
        labels = targets.unfold(1, self.window_size, stride).clone()
        labels[:, 1:, : self.window_overlap] = -100
        if self.window_start_ids:
            windows, labels = begin_windows(windows, labels, self.window_start_ids)
        # (batch * windows_per_block, starts + window_size), or (batch, windows_per_block * (starts + window_size))
        shape = (-1, windows.shape[-1]) if self.independent_windows else (len(examples), -1)
        return {"input_ids": windows.reshape(shape), "labels": labels.reshape(shape)}


def begin_windows(
    windows: torch.Tensor, labels: torch.Tensor, start_ids: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, windows, window_size) ids and labels -> (batch, windows, starts + window_size), every window begun by
    `start_ids`. A label at position i is the target of position i - 1: the window's first label moves onto its
    first start id (the target of the position before the window), the start ids and the window's first token
    predict nothing."""
    batch, num_windows, _ = windows.shape
    starts = torch.tensor(start_ids, dtype=windows.dtype).expand(batch, num_windows, -1)  # (batch, windows, starts)
    ignored = torch.full_like(starts, -100)
    ids = torch.cat([starts, windows], dim=-1)
    labels = torch.cat([labels[..., :1], ignored, labels[..., 1:]], dim=-1)
    return ids, labels
