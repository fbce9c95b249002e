"""accelerate's FSDP `TRANSFORMER_BASED_WRAP` wraps the classes a model names in `_no_split_modules`, and refuses a
name that no module of the model has: every family, head and configuration must name only classes it builds."""

import pytest
from accelerate.utils import FullyShardedDataParallelPlugin

from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM

from ..families import BACKBONES, FAMILIES


# Every class of every family; I-BERT also with its LSTM feed-forward layers, which change the layer class; the core
# over every backbone (its _no_split_modules are the backbone's decoder layers).
CASES = (
    [pytest.param(cls, family.tiny_config, id=cls.__name__) for family in FAMILIES for cls in family.model_classes]
    + [
        pytest.param(
            cls, lambda family=family: family.tiny_config(lstm_feed_forward=True), id=f"{cls.__name__}-lstm_ffn"
        )
        for family in FAMILIES
        if family.name == "inductive_bert"
        for cls in family.model_classes
    ]
    + [
        pytest.param(
            RecurrentDecoderForCausalLM,
            lambda backbone=backbone: RecurrentDecoderConfig(
                text_config=backbone.text_config(), window_size=8, insertion_layer=1, recurrence_hidden_sizes=[16]
            ),
            id=f"RecurrentDecoderForCausalLM-{backbone.name}",
        )
        for backbone in BACKBONES
    ]
)


@pytest.mark.parametrize(("model_class", "make_config"), CASES)
def test_transformer_based_wrap_finds_every_no_split_class(model_class, make_config, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    model = model_class(make_config())
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(model)  # raises ValueError for a class name the model lacks
    wrapped = plugin.auto_wrap_policy.keywords["transformer_layer_cls"]
    assert {cls.__name__ for cls in wrapped} == set(model._no_split_modules)
    assert all(any(isinstance(module, cls) for module in model.modules()) for cls in wrapped)
