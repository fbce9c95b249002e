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


def _shifted_pairs(ids: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, int]]:
    """(predicting token, target) of every predicted position of each row, as a causal LM's shifted loss pairs them."""
    pairs = []
    for row_ids, row_labels in zip(ids.tolist(), labels.tolist(), strict=True):
        pairs += [
            (token, target) for token, target in zip(row_ids[:-1], row_labels[1:], strict=True) if target != -100
        ]
    return pairs


@pytest.mark.parametrize("independent_windows", [True, False])
def test_window_start_ids_begin_every_window_and_leave_the_predicted_tokens_unchanged(independent_windows):
    blocks = [{"input_ids": torch.arange(100, 112)}, {"input_ids": torch.arange(112, 124)}]
    bare = WindowedBlocksCollator(window_size=4)(blocks)
    started = WindowedBlocksCollator(4, window_start_ids=(1, 2), independent_windows=independent_windows)(blocks)
    windows = started["input_ids"].reshape(6, 6)  # (blocks x windows, starts + window)
    assert windows[:, :2].tolist() == [[1, 2]] * 6
    assert windows[:, 2:].tolist() == bare["input_ids"].tolist()
    pairs = _shifted_pairs(started["input_ids"], started["labels"])
    if independent_windows:  # as the bare baseline: within each window, its first token unpredicted
        assert started["input_ids"].shape == (6, 6)
        assert pairs == _shifted_pairs(bare["input_ids"], bare["labels"])
    else:  # one row per block, the recurrent model's: every token but the block's first, each from the text token before
        assert started["input_ids"].shape == (2, 18)
        assert pairs == [(token, token + 1) for start in (100, 112) for token in range(start, start + 11)]


def test_window_start_ids_refuse_what_they_cannot_serve():
    with pytest.raises(ValueError, match="needs window_overlap=0, got window_overlap=1"):
        WindowedBlocksCollator(4, 1, window_start_ids=(1,), independent_windows=False)
    with pytest.raises(ValueError, match="only serves window_start_ids"):
        WindowedBlocksCollator(4, independent_windows=False)


def test_read_documents_prefers_files(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("real text")
    assert read_documents([path], "test") == [("notes.txt", "real text")]
    assert read_documents(None, "test") == stdlib_split("test")
