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
    """

    window_size: int
    window_overlap: int = 0

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        blocks = torch.stack([example["input_ids"] for example in examples])  # (batch, block_size)
        # The examples' own labels where they have them (some tokens may be left out with -100), else the ids.
        targets = torch.stack([example.get("labels", example["input_ids"]) for example in examples])
        stride = self.window_size - self.window_overlap
        windows = blocks.unfold(1, self.window_size, stride)  # (batch, windows_per_block, window_size)
        labels = targets.unfold(1, self.window_size, stride).clone()
        labels[:, 1:, : self.window_overlap] = -100
        return {
            "input_ids": windows.reshape(-1, self.window_size),  # (batch * windows_per_block, window_size)
            "labels": labels.reshape(-1, self.window_size),
        }
