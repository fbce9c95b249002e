"""transformers' common tests on the recurrent Llama (sizes as transformers' CausalLMModelTester, GQA; 4-token
windows so that the 7-token inputs cross a window boundary)."""

from spec_builder import CAUSAL_LM_SIZES, SPECIAL_TOKENS, WINDOW, causal_spec
from stateful_checks import retain_grad_skip

from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM, RecurrentLlamaModel, RecurrentLlamaState


def tiny_config():
    return RecurrentLlamaConfig(**CAUSAL_LM_SIZES, window_size=WINDOW, insertion_layer=1, **SPECIAL_TOKENS)


globals().update(
    causal_spec(
        (RecurrentLlamaModel, RecurrentLlamaForCausalLM),
        RecurrentLlamaState,
        tiny_config,
        lambda config: 1 + config.window_size,  # h_prev, then the window
        config_tester_kwargs={"hidden_size": 64, "num_attention_heads": 4},
        skip_tests={
            "test_retain_grad_hidden_states_attentions": retain_grad_skip("window"),
            "test_model_rope_scaling_from_config_1_dynamic": (
                "dynamic RoPE scaling changes the frequencies only for positions past max_position_embeddings, and "
                "positions restart in every window (window_size <= max_position_embeddings), so it never takes "
                "effect: the test's 'long input differs' check cannot hold. linear and yarn scaling, which act at "
                "every position, pass"
            ),
        },
    )
)
