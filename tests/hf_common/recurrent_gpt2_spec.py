"""transformers' common tests on the recurrent GPT-2 (sizes as transformers' CausalLMModelTester, 2 heads;
4-token windows so that the 7-token inputs cross a window boundary)."""

from spec_builder import SPECIAL_TOKENS, VOCAB, WINDOW, causal_spec
from stateful_checks import retain_grad_skip

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel, RecurrentGPT2Model, RecurrentGPT2State


def tiny_config():
    sizes = {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": 37, "n_positions": 512}
    return RecurrentGPT2Config(vocab_size=VOCAB, **sizes, window_size=WINDOW, insertion_layer=1, **SPECIAL_TOKENS)


globals().update(
    causal_spec(
        (RecurrentGPT2Model, RecurrentGPT2LMHeadModel),
        RecurrentGPT2State,
        tiny_config,
        lambda config: 1 + config.window_size,  # h_prev, then the window
        config_tester_kwargs={"n_embd": 37},
        skip_tests={"test_retain_grad_hidden_states_attentions": retain_grad_skip("window")},
    )
)
