"""A word-level tokenizer over the tiny I-BERT's 99 ids, built offline."""

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast


def word_level_tokenizer(vocab_size: int = 99) -> PreTrainedTokenizerFast:
    """Whitespace words `w3 .. w98` plus [PAD]=0, [MASK]=1, [UNK]=2: enough for the MLM collator."""
    vocab = {"[PAD]": 0, "[MASK]": 1, "[UNK]": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]"
    )
