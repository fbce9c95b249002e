"""Corpora read from the machine, offline tokenizers, training blocks, and the inductive-generalization tasks."""

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
from .number_sequences import (
    NSP_TASKS,
    NumberSequenceDataset,
    compute_number_sequence_metrics,
    difficulty_of,
    encode_number_sequence,
    generate_number_sequences,
    inductive_split,
    little_endian_digits,
    logits_to_predictions,
    number_sequence_tokenizer,
    sample_number_sequence,
    sequence_accuracy_by_length,
    sequence_correct,
)
from .sentences import (
    WholeWordMaskedSentences,
    minilm_tokenizer,
    pydoc_sentences,
    split_by_length,
    split_sentences,
)
from .tokenization import END_OF_TEXT, train_byte_level_bpe


__all__ = [
    "END_OF_TEXT",
    "NSP_TASKS",
    "STDLIB_SPLITS",
    "NumberSequenceDataset",
    "TokenBlocks",
    "WholeWordMaskedSentences",
    "WindowedBlocksCollator",
    "compute_number_sequence_metrics",
    "difficulty_of",
    "encode_number_sequence",
    "generate_number_sequences",
    "inductive_split",
    "little_endian_digits",
    "logits_to_predictions",
    "minilm_tokenizer",
    "number_sequence_tokenizer",
    "pydoc_sentences",
    "python_stdlib_documents",
    "python_stdlib_files",
    "python_stdlib_root",
    "read_documents",
    "sample_number_sequence",
    "sequence_accuracy_by_length",
    "sequence_correct",
    "split_by_length",
    "split_sentences",
    "stdlib_split",
    "stdlib_split_of",
    "token_stream",
    "train_byte_level_bpe",
]
