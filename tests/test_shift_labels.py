"""Every causal head trains on pre-shifted targets (`shift_labels`) when given: Trainer passes them under context
parallelism and sequence packing, where shifting `labels` inside the model would pick the wrong targets."""

import pytest
import torch
from torch import nn

from .families import STATEFUL_FAMILIES


# Every causal head: the stateful families'.
@pytest.fixture(params=STATEFUL_FAMILIES, ids=lambda family: family.name)
def model(request):
    family = request.param
    return family.head_class(family.tiny_config()).eval()


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
