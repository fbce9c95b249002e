"""Our model types never collide with transformers' built-ins, and importing the package registers them."""

import pytest
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

import hf_recurrence

from .families import BACKBONES, FAMILIES


# Every model type: the families' and the recurrence core's (the backbone rows').
MODEL_TYPES = sorted({row.model_type for row in (*FAMILIES, *BACKBONES)})


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_model_type_is_not_a_transformers_builtin(model_type):
    assert model_type not in CONFIG_MAPPING_NAMES


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_registered_on_import(model_type):
    assert AutoConfig.for_model(model_type).model_type == model_type
    assert hf_recurrence.__version__
