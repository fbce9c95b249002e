"""transformers' common tests on the recurrent GPT-2 (sizes as transformers' CausalLMModelTester; 4-token windows so
that the 7-token inputs cross a window boundary)."""

import torch

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel, RecurrentGPT2Model


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
