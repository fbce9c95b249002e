"""Corpora read from the machine and offline tokenizers."""

from .corpora import python_stdlib_documents, python_stdlib_files, python_stdlib_root
from .tokenization import END_OF_TEXT, train_byte_level_bpe


__all__ = [
    "END_OF_TEXT",
    "python_stdlib_documents",
    "python_stdlib_files",
    "python_stdlib_root",
    "train_byte_level_bpe",
]
