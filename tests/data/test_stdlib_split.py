"""The standard library split by file and the fixed-length token blocks cut from it."""

import pytest
import torch

from hf_recurrence.data import (
    STDLIB_SPLITS,
    TokenBlocks,
    WindowedBlocksCollator,
    python_stdlib_files,
    read_documents,
    stdlib_split,
    token_stream,
)

from ..common import stdlib_tokenizer


def test_splits_partition_the_modules_and_hold_out_a_few():
    names = {split: {name for name, _ in stdlib_split(split)} for split in STDLIB_SPLITS}
    assert not names["train"] & names["validation"]
    assert not names["train"] & names["test"]
    assert not names["validation"] & names["test"]
    assert set().union(*names.values()) == {p.name for p in python_stdlib_files()}
    assert len(names["test"]) >= 3 and len(names["validation"]) >= 3
    assert len(names["train"]) > 5 * (len(names["test"]) + len(names["validation"]))


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="'dev'"):
        stdlib_split("dev")


def test_blocks_keep_the_stream_in_order_and_count_what_they_drop():
    tokenizer = stdlib_tokenizer()
    texts = ["def f(x):\n    return x\n", "class A:\n    pass\n"]
    stream = token_stream(texts, tokenizer)
    assert stream.count(tokenizer.eos_token_id) == 2 and stream[-1] == tokenizer.eos_token_id
    blocks = TokenBlocks(stream, block_size=4)
    assert blocks.blocks.flatten().tolist() + stream[len(stream) - blocks.num_dropped_tokens :] == stream
    assert blocks[1]["input_ids"].tolist() == blocks[1]["labels"].tolist() == stream[4:8]
    with pytest.raises(ValueError, match="shorter than one block"):
        TokenBlocks(stream, block_size=len(stream) + 1)


def test_baseline_collator_cuts_blocks_into_windows_in_order():
    blocks = [{"input_ids": torch.arange(12)}, {"input_ids": torch.arange(12, 24)}]
    batch = WindowedBlocksCollator(window_size=4)(blocks)
    assert batch["input_ids"].tolist() == torch.arange(24).view(6, 4).tolist()
    assert torch.equal(batch["labels"], batch["input_ids"])


def test_read_documents_prefers_files(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("real text")
    assert read_documents([path], "test") == [("notes.txt", "real text")]
    assert read_documents(None, "test") == stdlib_split("test")
