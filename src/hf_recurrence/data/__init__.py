"""Corpora read from the machine and offline tokenizers."""

from .blocks import TokenBlocks, WindowedBlocksCollator, token_stream
from .corpora import (
    STDLIB_SPLITS,
    python_stdlib_documents,
    python_stdlib_files,
    python_stdlib_root,
    read_documents,
    stdlib_split,
    stdlib_split_of,
)
from .tokenization import END_OF_TEXT, train_byte_level_bpe


__all__ = [
    "END_OF_TEXT",
    "STDLIB_SPLITS",
    "TokenBlocks",
    "WindowedBlocksCollator",
    "python_stdlib_documents",
    "python_stdlib_files",
    "python_stdlib_root",
    "read_documents",
    "stdlib_split",
    "stdlib_split_of",
    "token_stream",
    "train_byte_level_bpe",
]
