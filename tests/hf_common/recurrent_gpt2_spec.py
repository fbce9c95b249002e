"""transformers' common tests on the recurrent GPT-2 (sizes as transformers' CausalLMModelTester; 4-token windows so
that the 7-token inputs cross a window boundary)."""

import torch
from stateful_checks import generation_checks, retain_grad_skip, unbounded_char_tokenizer

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel, RecurrentGPT2Model, RecurrentGPT2State


config_class = RecurrentGPT2Config
all_model_classes = (RecurrentGPT2Model, RecurrentGPT2LMHeadModel)
pipeline_model_mapping = {"feature-extraction": RecurrentGPT2Model, "text-generation": RecurrentGPT2LMHeadModel}
BATCH, SEQ, VOCAB = 13, 7, 99


def get_config_and_inputs():
    config = RecurrentGPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=37,
        n_positions=512,
        window_size=4,
        insertion_layer=1,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    attention_mask = torch.tril(torch.ones_like(input_ids))
    return config, {"input_ids": input_ids, "attention_mask": attention_mask}


config_tester_kwargs = {"n_embd": 37}
test_class_attrs = generation_checks(RecurrentGPT2State, lambda config: 1 + config.window_size)
model_tester_attrs = {"key_length": 1 + get_config_and_inputs()[0].window_size}  # h_prev, then the window
skip_tests = {"test_retain_grad_hidden_states_attentions": retain_grad_skip("window")}
get_tokenizer = unbounded_char_tokenizer
