"""transformers' common tests on Transformer-XL (4-token segments and memories so that the 7-token inputs cross a
segment boundary)."""

import torch

from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel, TransformerXLModel


config_class = TransformerXLConfig
all_model_classes = (TransformerXLModel, TransformerXLLMHeadModel)
pipeline_model_mapping = {"feature-extraction": TransformerXLModel, "text-generation": TransformerXLLMHeadModel}
BATCH, SEQ, VOCAB = 13, 7, 99


def get_config_and_inputs():
    config = TransformerXLConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=37,
        n_layer=2,
        segment_length=4,
        mem_len=4,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 1,
    )
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    attention_mask = torch.tril(torch.ones_like(input_ids))
    return config, {"input_ids": input_ids, "attention_mask": attention_mask}


config_tester_kwargs = {"d_model": 32}
