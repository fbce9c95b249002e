"""transformers' common tests on Transformer-XL (4-token segments and memories so that the 7-token inputs cross a
segment boundary)."""

from spec_builder import SPECIAL_TOKENS, VOCAB, WINDOW, causal_spec
from stateful_checks import retain_grad_skip

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel, TransformerXLState


def tiny_config():
    sizes = {"d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 37, "n_layer": 2}
    return TransformerXLConfig(vocab_size=VOCAB, **sizes, segment_length=WINDOW, mem_len=WINDOW, **SPECIAL_TOKENS)


globals().update(
    causal_spec(
        (TransformerXLModel, TransformerXLLMHeadModel),
        TransformerXLState,
        tiny_config,
        lambda config: config.mem_len + config.segment_length,  # by distance
        derived_attributes=("position_keys",),
        config_tester_kwargs={"d_model": 32},
        skip_tests={"test_retain_grad_hidden_states_attentions": retain_grad_skip("segment")},
    )
)
