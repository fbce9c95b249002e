"""accelerate's FSDP `TRANSFORMER_BASED_WRAP` wraps the classes a model names in `_no_split_modules`, and refuses a
name that no module of the model has: every family, head and configuration must name only classes it builds."""

import pytest
from accelerate.utils import FullyShardedDataParallelPlugin

from hf_recurrence import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaModel,
    TransformerXLLMHeadModel,
    TransformerXLModel,
)

from .common import (
    tiny_inductive_bert_config,
    tiny_recurrent_config,
    tiny_recurrent_llama_config,
    tiny_transformer_xl_config,
)


CASES = [
    *(
        pytest.param(cls, tiny_recurrent_config, id=cls.__name__)
        for cls in (RecurrentGPT2Model, RecurrentGPT2LMHeadModel)
    ),
    *(
        pytest.param(cls, tiny_recurrent_llama_config, id=cls.__name__)
        for cls in (RecurrentLlamaModel, RecurrentLlamaForCausalLM)
    ),
    *(
        pytest.param(cls, tiny_transformer_xl_config, id=cls.__name__)
        for cls in (TransformerXLModel, TransformerXLLMHeadModel)
    ),
    *(
        pytest.param(
            cls,
            lambda lstm=lstm: tiny_inductive_bert_config(lstm_feed_forward=lstm),
            id=f"{cls.__name__}-lstm_ffn={lstm}",
        )
        for cls in (IBertModel, IBertForMaskedLM, IBertForSequenceClassification, IBertForTokenClassification)
        for lstm in (False, True)
    ),
]


@pytest.mark.parametrize(("model_class", "make_config"), CASES)
def test_transformer_based_wrap_finds_every_no_split_class(model_class, make_config, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    model = model_class(make_config())
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(model)  # raises ValueError for a class name the model lacks
    wrapped = plugin.auto_wrap_policy.keywords["transformer_layer_cls"]
    assert {cls.__name__ for cls in wrapped} == set(model._no_split_modules)
    assert all(any(isinstance(module, cls) for module in model.modules()) for cls in wrapped)
