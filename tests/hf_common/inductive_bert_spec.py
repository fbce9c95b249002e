"""transformers' common tests on I-BERT (sizes as transformers' BertModelTester; no position embeddings)."""

import torch

from hf_recurrence import IBertForMaskedLM, IBertModel, InductiveBertConfig


config_class = InductiveBertConfig
all_model_classes = (IBertModel, IBertForMaskedLM)
pipeline_model_mapping = {"feature-extraction": IBertModel, "fill-mask": IBertForMaskedLM}
BATCH, SEQ, VOCAB = 13, 7, 99


def get_config_and_inputs():
    config = InductiveBertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        type_vocab_size=16,
        pad_token_id=0,
    )
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    token_type_ids = torch.randint(0, 16, (BATCH, SEQ))
    attention_mask = torch.randint(0, 2, (BATCH, SEQ))
    attention_mask[:, -1] = 1
    return config, {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


config_tester_kwargs = {"hidden_size": 48}
