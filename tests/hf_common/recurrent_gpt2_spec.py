"""transformers' common tests on the recurrent GPT-2 (sizes as transformers' CausalLMModelTester, 2 heads;
4-token windows so that the 7-token inputs cross a window boundary)."""

from spec_builder import SPECIAL_TOKENS, VOCAB, WINDOW, causal_spec, recurrence_core_skips
from stateful_checks import retain_grad_skip

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel, RecurrentGPT2Model, RecurrentGPT2State


def tiny_config():
    sizes = {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": 37, "n_positions": 512}
    return RecurrentGPT2Config(vocab_size=VOCAB, **sizes, window_size=WINDOW, insertion_layer=1, **SPECIAL_TOKENS)


# The core's skips, whose reasons hold for the family's models, which are the core's over a stock gpt2 backbone.
_CORE_SKIPS = recurrence_core_skips(
    "the stock backbone, a GPT2Model or GPT2LMHeadModel",
    "the causal LM reads checkpoints with the core causal LM's renamings, which list every family's stock prefixes "
    "(model., transformer., lm_head.); a gpt2 backbone has no model.* weights, which the test reads as an "
    "unused pattern",
)


globals().update(
    causal_spec(
        (RecurrentGPT2Model, RecurrentGPT2LMHeadModel),
        RecurrentGPT2State,
        tiny_config,
        # The generation mixin hands the attention check the text config: the spec's window, as the core's spec.
        lambda config: 1 + WINDOW,  # h_prev, then the window
        config_tester_kwargs={"n_embd": 37},
        skip_tests={"test_retain_grad_hidden_states_attentions": retain_grad_skip("window"), **_CORE_SKIPS},
    )
)
