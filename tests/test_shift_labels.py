"""Every causal head trains on pre-shifted targets (`shift_labels`) when given: Trainer passes them under context
parallelism and sequence packing, where shifting `labels` inside the model would pick the wrong targets."""

import pytest
import torch
from torch import nn

from hf_recurrence import RecurrentGPT2LMHeadModel, RecurrentLlamaForCausalLM, TransformerXLLMHeadModel

from .common import tiny_recurrent_config, tiny_recurrent_llama_config, tiny_transformer_xl_config


CAUSAL_HEADS = {
    "recurrent_gpt2": lambda: RecurrentGPT2LMHeadModel(tiny_recurrent_config()),
    "recurrent_llama": lambda: RecurrentLlamaForCausalLM(tiny_recurrent_llama_config()),
    "transformer_xl": lambda: TransformerXLLMHeadModel(tiny_transformer_xl_config()),
}


@pytest.fixture(params=sorted(CAUSAL_HEADS))
def model(request):
    return CAUSAL_HEADS[request.param]().eval()


def test_shift_labels_are_the_targets_labels_are_ignored(model):
    ids = torch.randint(1, 90, (2, 21))  # several windows / segments
    shifted = nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    other = torch.randint(1, 90, ids.shape)
    with torch.no_grad():
        from_labels = model(ids, labels=ids).loss
        from_shift_labels = model(ids, shift_labels=shifted).loss
        labels_ignored = model(ids, labels=other, shift_labels=shifted).loss
        other_targets = model(ids, labels=ids, shift_labels=nn.functional.pad(other[:, 1:], (0, 1), value=-100)).loss
    torch.testing.assert_close(from_shift_labels, from_labels)
    torch.testing.assert_close(labels_ignored, from_labels)
    assert not torch.isclose(other_targets, from_labels)


def test_shift_labels_of_another_shape_are_refused(model):
    ids = torch.randint(1, 90, (2, 9))
    with pytest.raises(ValueError, match=r"shift_labels must have the input's shape \(2, 9\), got \(2, 8\)"):
        model(ids, shift_labels=ids[:, 1:])
