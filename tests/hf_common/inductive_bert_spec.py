"""transformers' common tests on I-BERT (sizes as transformers' BertModelTester; no position embeddings)."""

from spec_builder import TINY_SIZES, random_ids

from hf_recurrence import IBertForMaskedLM, IBertModel, InductiveBertConfig


config_class = InductiveBertConfig
all_model_classes = (IBertModel, IBertForMaskedLM)
pipeline_model_mapping = {"feature-extraction": IBertModel, "fill-mask": IBertForMaskedLM}


def get_config_and_inputs():
    config = InductiveBertConfig(**TINY_SIZES, type_vocab_size=16, pad_token_id=0)
    input_ids = random_ids()
    token_type_ids = random_ids(16)
    attention_mask = random_ids(2)
    attention_mask[:, -1] = 1
    return config, {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


config_tester_kwargs = {"hidden_size": 48}
