"""transformers' common tests on the recurrent Llama (sizes as transformers' CausalLMModelTester, GQA; 4-token
windows so that the 7-token inputs cross a window boundary)."""

from spec_builder import CAUSAL_LM_SIZES, SPECIAL_TOKENS, WINDOW, causal_spec, recurrence_core_skips
from stateful_checks import retain_grad_skip

from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM, RecurrentLlamaModel, RecurrentLlamaState


def tiny_config():
    return RecurrentLlamaConfig(**CAUSAL_LM_SIZES, window_size=WINDOW, insertion_layer=1, **SPECIAL_TOKENS)


# The core's skips, whose reasons hold for the family's models, which are the core's over a stock llama backbone.
_CORE_SKIPS = recurrence_core_skips(
    "the stock backbone, a LlamaModel or LlamaForCausalLM",
    "the causal LM reads checkpoints with the core causal LM's renamings, which list every family's stock prefixes "
    "(model., transformer., lm_head.); a llama backbone has no transformer.* weights, which the test reads as an "
    "unused pattern",
)


globals().update(
    causal_spec(
        (RecurrentLlamaModel, RecurrentLlamaForCausalLM),
        RecurrentLlamaState,
        tiny_config,
        # The generation mixin hands the attention check the text config: the spec's window, as the core's spec.
        lambda config: 1 + WINDOW,  # h_prev, then the window
        config_tester_kwargs={"hidden_size": 64, "num_attention_heads": 4},
        skip_tests={
            "test_retain_grad_hidden_states_attentions": retain_grad_skip("window"),
            **_CORE_SKIPS,
            "test_model_rope_scaling_from_config_1_dynamic": (
                "dynamic RoPE scaling changes the frequencies only for positions past max_position_embeddings, and "
                "positions restart in every window (window_size <= max_position_embeddings), so it never takes "
                "effect: the test's 'long input differs' check cannot hold. linear and yarn scaling, which act at "
                "every position, pass"
            ),
        },
    )
)
