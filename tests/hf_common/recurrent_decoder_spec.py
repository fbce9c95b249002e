"""transformers' common tests on the recurrence core, `RecurrentDecoderForCausalLM`, over a stock Llama backbone (GQA;
sizes as transformers' CausalLMModelTester; 4-token windows so that the 7-token inputs cross a window boundary).

`backbone_spec` builds the same spec over another stock backbone (`recurrent_decoder_qwen3_spec.py`,
`recurrent_decoder_gpt2_spec.py`).
"""

import transformers
from spec_builder import CAUSAL_LM_SIZES, SPECIAL_TOKENS, WINDOW, causal_spec, recurrence_core_skips
from stateful_checks import retain_grad_skip
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM, RecurrentDecoderState


def _skips(model_type: str) -> dict[str, str]:
    stock = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    prefix = getattr(transformers, stock).base_model_prefix  # model (Llama, Qwen3) or transformer (GPT-2)
    return {
        "test_retain_grad_hidden_states_attentions": retain_grad_skip(
            "window", "tests/models/recurrent_decoder/test_backbones_recurrent_decoder.py"
        ),
        "test_attention_outputs": (
            "it sets output_attentions=True on every sub-config, and text_config is the backbone's own config, which "
            "runs under the registered recurrent_eager / recurrent_sdpa attention: transformers' config setter accepts "
            "output_attentions only under the plain 'eager' name. The model's own output_attentions (argument or "
            "config.output_attentions) returns the weights, laid out by window position; "
            "tests/models/recurrent_decoder/test_backbones_recurrent_decoder.py checks them on every backbone"
        ),
        **recurrence_core_skips(
            f"the stock backbone, a {stock}",
            "one class serves every backbone family, so its checkpoint renaming lists every family's stock prefixes "
            f"(model., transformer., lm_head.); a {model_type} backbone's weights sit under {prefix}. only, and the "
            "test reads the other family's prefix as an unused pattern",
        ),
    }


def backbone_spec(model_type: str, sizes: dict = CAUSAL_LM_SIZES, **overrides) -> dict:
    """The spec's attributes for a tiny stock `model_type` backbone of `sizes` (`overrides`: its config fields
    besides those)."""

    def tiny_config():
        text_config = AutoConfig.for_model(model_type, **sizes, **SPECIAL_TOKENS, **overrides)
        return RecurrentDecoderConfig(
            text_config=text_config, window_size=WINDOW, insertion_layer=1, recurrence_hidden_sizes=[16]
        )

    return causal_spec(
        # The core has no bare model (yet): its one class is the causal LM.
        (None, RecurrentDecoderForCausalLM),
        RecurrentDecoderState,
        tiny_config,
        # The generation mixin hands the attention check the text config, which has no window_size: the spec's window.
        lambda config: 1 + WINDOW,  # h_prev, then the window
        # The sizes ConfigTester checks for (vocab_size, ...) live in text_config, as in transformers' own composite
        # configs, whose tests pass has_text_modality=False too.
        config_tester_kwargs={"has_text_modality": False},
        skip_tests=_skips(model_type),
    )


globals().update(backbone_spec("llama"))
