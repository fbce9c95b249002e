"""The documented paths of the offline weights keep working after their move into `hf_recurrence.weights`:
`hf_recurrence.smollm2` and `hf_recurrence.gemma3` give the very objects `hf_recurrence.weights` does."""

import pytest

from hf_recurrence import gemma3, smollm2, weights
from hf_recurrence.weights import gguf


@pytest.mark.parametrize(("old", "new"), [(smollm2, weights.smollm2), (smollm2, gguf), (gemma3, weights.gemma3)])
def test_every_public_name_of_a_weights_module_is_at_its_old_path(old, new):
    for name in new.__all__:
        assert getattr(old, name) is getattr(new, name), name


def test_the_weights_package_exports_every_public_name_of_its_modules():
    for module in (weights.smollm2, gguf, weights.gemma3):
        for name in module.__all__:
            assert getattr(weights, name) is getattr(module, name), name
