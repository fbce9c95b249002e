"""The recurrence core refuses torch.export, both ONNX exporters and TorchScript tracing with the old families' message
(its window plan is made in Python from the input's values, so a graph would hold one input's plan), and still runs
under torch.compile."""

import torch

from ...families import BACKBONES
from ...test_export import assert_export_is_refused_and_compile_is_not


def test_export_and_tracing_are_refused_with_the_reason_and_compile_is_not(tmp_path):
    (backbone,) = [b for b in BACKBONES if b.name == "qwen3"]
    model, _ = backbone.models()
    ids = torch.randint(1, 99, (1, 16), generator=torch.Generator().manual_seed(1))
    assert_export_is_refused_and_compile_is_not(model, ids, tmp_path)
