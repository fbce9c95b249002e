"""GenerationTesterMixin's cache and attention checks for our causal families.

The mixin asks models whose `past_key_values` is not a transformers `Cache` to override `_check_past_key_values_for_
generate` and `_check_caches_are_equal` ("The cache is not standard! Please overwrite ..."). Our state is the
model's recurrent state, and our attention weights have a fixed number of columns in every call (window positions
plus `h_prev`, or distances), so the attention check takes that width instead of the cache length.
"""

from collections.abc import Callable

import torch


def retain_grad_skip(unit: str, weights_checked_in: str = "tests/test_families.py") -> str:
    """Why test_retain_grad_hidden_states_attentions cannot pass for a model read in `unit`s (windows, segments);
    `weights_checked_in`: the test file that checks the family's attention weights instead."""
    return (
        f"the attention weights of a call that spans several {unit}s are each {unit}'s weights concatenated (one "
        f"attention per {unit}, in the same columns every time), so the returned tensor is built after the outputs "
        f"and is not upstream of them: it can get no .grad. The test's 7-token input crosses the spec's 4-token "
        f"{unit} on purpose; the hidden-states half of the test passes, and {weights_checked_in} checks the weights"
    )


def _state_tensors(value, skip: tuple[str, ...]) -> list[torch.Tensor]:
    """Every tensor a state holds, in attribute order, through lists, tuples and plain objects."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _state_tensors(item, skip)]
    if hasattr(value, "__dict__"):
        return [t for name, item in vars(value).items() if name not in skip for t in _state_tensors(item, skip)]
    return []


def generation_checks(
    state_class: type, attention_columns: Callable, derived_attributes: tuple[str, ...] = ()
) -> dict[str, Callable]:
    """The three overrides, for `test_class_attrs`. `derived_attributes`: state attributes that only cache values
    computed from the config (and may be present in one state and not in another)."""

    def _check_attentions_for_generate(
        self, batch_size, attentions, prompt_length, output_length, config, decoder_past_key_values
    ):
        self.assertIsInstance(attentions, tuple)
        self.assertEqual(len(attentions), output_length - prompt_length)
        use_cache = decoder_past_key_values is not None
        for generated, step in enumerate(attentions):
            queries = 1 if use_cache and generated > 0 else prompt_length + generated
            expected = (batch_size, config.num_attention_heads, queries, attention_columns(config))
            self.assertEqual([tuple(layer.shape) for layer in step], [expected] * config.num_hidden_layers)

    def _check_past_key_values_for_generate(self, batch_size, past_key_values, seq_length, config):
        self.assertIsInstance(past_key_values, state_class)
        self.assertEqual(past_key_values.batch_size, batch_size)
        self.assertEqual(past_key_values.get_seq_length(), seq_length)

    def _check_caches_are_equal(self, cache1, cache2):
        self.assertIsInstance(cache1, state_class)
        self.assertIsInstance(cache2, state_class)
        self.assertEqual(cache1.get_seq_length(), cache2.get_seq_length())
        tensors1 = _state_tensors(cache1, derived_attributes)
        tensors2 = _state_tensors(cache2, derived_attributes)
        self.assertEqual([t.shape for t in tensors1], [t.shape for t in tensors2])
        for tensor1, tensor2 in zip(tensors1, tensors2, strict=True):
            torch.testing.assert_close(tensor1, tensor2)

    return {
        "_check_attentions_for_generate": _check_attentions_for_generate,
        "_check_past_key_values_for_generate": _check_past_key_values_for_generate,
        "_check_caches_are_equal": _check_caches_are_equal,
    }


def unbounded_char_tokenizer(config):
    """A character-level tokenizer (the harness's default kind) that declares no length limit, as the tokenizer of a
    model that reads any length should: the text-generation pipeline test then skips its "input longer than the
    position table must fail" checks, as it does for the models upstream lists as handling long inputs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    tokens = [
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
        "<mask>",
        *" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()",
    ]
    vocab = {token: index for index, token in enumerate(tokens[: config.get_text_config().vocab_size])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        mask_token="<mask>",
        model_max_length=VERY_LARGE_INTEGER,
    )
