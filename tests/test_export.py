"""The stateful families refuse torch.export, both ONNX exporters and TorchScript tracing with one clear message
(their window/segment plan is made in Python from the input's values, so a graph would hold one input's plan), and
still run under torch.compile, which guards and recompiles instead."""

import pytest
import torch

from .families import STATEFUL_FAMILIES
from .test_families import by_family


pytest.importorskip("onnxscript")

REFUSAL = "cannot be exported or traced"


class Logits(torch.nn.Module):
    """The head as exporters take it: ids in, logits out."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, use_cache=False).logits


def causes(error: BaseException) -> str:
    """The messages of an error and of every error it was raised from (exporters wrap what the model raises)."""
    messages = []
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(messages)


EXPORTERS = {
    "torch.export": lambda module, ids, path: torch.export.export(module, (ids,)),
    "onnx_dynamo": lambda module, ids, path: torch.onnx.export(module, (ids,), path, dynamo=True),
    "onnx_torchscript": lambda module, ids, path: torch.onnx.export(module, (ids,), path, dynamo=False),
    "jit.trace": lambda module, ids, path: torch.jit.trace(module, (ids,)),
}


@by_family(STATEFUL_FAMILIES)
def test_export_and_tracing_are_refused_with_the_reason_and_compile_is_not(family, tmp_path):
    assert_export_is_refused_and_compile_is_not(
        family.head(), family.inputs(batch=1, length=16)["input_ids"], tmp_path
    )


def assert_export_is_refused_and_compile_is_not(model: torch.nn.Module, ids: torch.Tensor, tmp_path) -> None:
    """Every exporter fails on the causal `model` with the refusal and writes nothing; torch.compile runs it and gives
    the eager logits. Shared with the recurrence core's tests."""
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(ids).logits, model(ids).logits)
    for name, export in EXPORTERS.items():
        path = tmp_path / f"{name}.onnx"
        with pytest.raises(Exception) as raised:  # noqa: B017 - each exporter wraps the model's error its own way
            export(Logits(model), ids, path)
        assert REFUSAL in causes(raised.value), name
        assert not path.exists(), name
