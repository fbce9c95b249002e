"""Tokenizers trained offline with the `tokenizers` library, for when no Hub tokenizer can be downloaded."""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


END_OF_TEXT = "<|endoftext|>"


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int = 1000) -> PreTrainedTokenizerFast:
    """Train a GPT-2-style byte-level BPE tokenizer on `texts`.

    `<|endoftext|>` is id 0 and serves as BOS, EOS and padding token, as in GPT-2 pipelines; padding is on the left so
    batched generation works out of the box. Byte-level, so any text round-trips through it.
    """
    if vocab_size < 257:
        raise ValueError(
            f"vocab_size must be at least 257 (256 bytes plus {END_OF_TEXT}), got vocab_size={vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        padding_side="left",
        model_max_length=int(1e30),
    )
