"""The standard library split by file and the fixed-length token blocks cut from it."""

import pytest

from hf_recurrence.data import STDLIB_SPLITS, TokenBlocks, python_stdlib_files, stdlib_split, token_stream

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
