"""transformers' common tests on Transformer-XL (4-token segments and memories so that the 7-token inputs cross a
segment boundary)."""

import torch
from stateful_checks import generation_checks, retain_grad_skip, unbounded_char_tokenizer

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel, TransformerXLState


config_class = TransformerXLConfig
all_model_classes = (TransformerXLModel, TransformerXLLMHeadModel)
pipeline_model_mapping = {"feature-extraction": TransformerXLModel, "text-generation": TransformerXLLMHeadModel}
BATCH, SEQ, VOCAB = 13, 7, 99
SEGMENT = MEMORY = 4


def get_config_and_inputs():
    config = TransformerXLConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=37,
        n_layer=2,
        segment_length=SEGMENT,
        mem_len=MEMORY,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    attention_mask = torch.tril(torch.ones_like(input_ids))
    return config, {"input_ids": input_ids, "attention_mask": attention_mask}


config_tester_kwargs = {"d_model": 32}
test_class_attrs = generation_checks(
    TransformerXLState, lambda config: config.mem_len + config.segment_length, derived_attributes=("position_keys",)
)
model_tester_attrs = {"key_length": SEGMENT + MEMORY}  # by distance
skip_tests = {"test_retain_grad_hidden_states_attentions": retain_grad_skip("segment")}
get_tokenizer = unbounded_char_tokenizer
