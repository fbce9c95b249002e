"""transformers' common tests on the recurrent Llama (GQA; 4-token windows so that the 7-token inputs cross a window
boundary)."""

import torch
from stateful_checks import generation_checks, retain_grad_skip, unbounded_char_tokenizer

from hf_recurrence import RecurrentLlamaConfig, RecurrentLlamaForCausalLM, RecurrentLlamaModel, RecurrentLlamaState


config_class = RecurrentLlamaConfig
all_model_classes = (RecurrentLlamaModel, RecurrentLlamaForCausalLM)
pipeline_model_mapping = {"feature-extraction": RecurrentLlamaModel, "text-generation": RecurrentLlamaForCausalLM}
BATCH, SEQ, VOCAB = 13, 7, 99


def get_config_and_inputs():
    config = RecurrentLlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
        window_size=4,
        insertion_layer=1,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    attention_mask = torch.tril(torch.ones_like(input_ids))
    return config, {"input_ids": input_ids, "attention_mask": attention_mask}


config_tester_kwargs = {"hidden_size": 64, "num_attention_heads": 4}
test_class_attrs = generation_checks(RecurrentLlamaState, lambda config: 1 + config.window_size)
model_tester_attrs = {"key_length": 1 + get_config_and_inputs()[0].window_size}  # h_prev, then the window
skip_tests = {
    "test_retain_grad_hidden_states_attentions": retain_grad_skip("window"),
    "test_model_rope_scaling_from_config_1_dynamic": (
        "dynamic RoPE scaling changes the frequencies only for positions past max_position_embeddings, and positions "
        "restart in every window (window_size <= max_position_embeddings), so it never takes effect: the test's "
        "'long input differs' check cannot hold. linear and yarn scaling, which act at every position, pass"
    ),
}
get_tokenizer = unbounded_char_tokenizer
