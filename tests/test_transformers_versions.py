"""One code base for every supported transformers: 5.23 calls the state `past_key_values`, 5.24 `cache` (the forward
argument, the output field, and what generate() and Trainer look for).

CI runs the whole suite on the newest supported transformers and the state, generate, pipeline, Trainer, PEFT and TRL
tests on the oldest too (`.ci/run`); `HF_RECURRENCE_OTHER_PYTHON` then names the other environment's interpreter, in
which a checkpoint saved here must load as remote code and generate exactly.
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import Trainer

from .common import run_isolated_python, tiny_training_arguments
from .families import GENERATES_PAST_THE_WINDOW, STATEFUL_FAMILIES


# What the installed transformers calls the state.
STATE_NAME = "cache" if Version(transformers.__version__) >= Version("5.24.0.dev0") else "past_key_values"
OTHER_PYTHON = os.environ.get("HF_RECURRENCE_OTHER_PYTHON")


def test_declared_transformers_range_is_the_installed_one():
    from importlib.metadata import requires

    (requirement,) = [r for r in requires("hf-recurrence") if r.startswith("transformers")]
    assert requirement.replace(" ", "") == "transformers<5.25,>=5.23", requirement
    assert Version("5.23") <= Version(transformers.__version__) < Version("5.25")


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_state_travels_under_the_installed_name_and_forward_takes_either(family):
    model = family.head()
    ids = family.inputs(batch=2, length=24)["input_ids"]
    first = model(ids[:, :16])
    assert STATE_NAME in list(first.keys()), list(first.keys())
    state = first[STATE_NAME]
    assert type(state).__name__.endswith("State")
    assert first.past_key_values is state  # the old name still reads it on 5.24 (a property there)

    # Each name continues the same text (a state advances in place, so each call gets its own, read afresh).
    by_old_name = model(ids[:, 16:], past_key_values=model(ids[:, :16])[STATE_NAME]).logits
    by_new_name = model(ids[:, 16:], cache=model(ids[:, :16])[STATE_NAME]).logits
    torch.testing.assert_close(by_old_name, by_new_name, rtol=0, atol=0)  # the same computation on the same tensors
    torch.testing.assert_close(by_new_name, model(ids).logits[:, 16:], rtol=1e-5, atol=1e-5)

    with pytest.raises(ValueError, match="not both"):
        model(ids[:, 16:], past_key_values=state, cache=state)


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_trainer_evaluation_leaves_the_state_out(family, tmp_path):
    """Trainer drops the keys named in `keys_to_ignore_at_inference` (else `["cache"]` on 5.24) from what it
    gathers; a state among the predictions would be concatenated across batches as if it were logits."""
    model = family.head()
    ids = family.inputs(batch=2, length=20)["input_ids"]
    trainer = Trainer(model=model, args=tiny_training_arguments(tmp_path))
    loss, logits, labels = trainer.prediction_step(
        model, {"input_ids": ids, "labels": ids}, prediction_loss_only=False
    )
    assert loss is not None
    leaves = logits if isinstance(logits, tuple) else (logits,)
    assert all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves), [type(leaf) for leaf in leaves]


# The tests that load a checkpoint saved here under the other supported transformers.
under_the_other_transformers = pytest.mark.skipif(
    OTHER_PYTHON is None,
    reason="HF_RECURRENCE_OTHER_PYTHON names no second environment with the other supported transformers "
    "(.ci/run makes one)",
)


@pytest.mark.remote_code
@under_the_other_transformers
@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_checkpoint_saved_here_loads_and_generates_under_the_other_transformers(family, tmp_path):
    assert_loads_and_generates_under_the_other_transformers(family.head(), family.inputs(length=40), tmp_path)


def assert_loads_and_generates_under_the_other_transformers(model, inputs: dict, tmp_path: Path) -> None:
    """Save the causal `model`; in the other environment (another transformers, no `hf_recurrence`), it loads as
    remote code with the same logits on `inputs` and generates past the window as the argmax loop does."""
    other_version = subprocess.run(
        [OTHER_PYTHON, "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert other_version != transformers.__version__, "the other environment has the same transformers"

    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    with torch.no_grad():
        torch.save({"inputs": inputs, "logits": model(**inputs).logits}, tmp_path / "reference.pt")
    code = f"""
import torch
import transformers
reference = torch.load({str(tmp_path / "reference.pt")!r})
model = transformers.AutoModelForCausalLM.from_pretrained({str(checkpoint)!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
torch.testing.assert_close(model(**reference["inputs"]).logits, reference["logits"], rtol=1e-6, atol=1e-6)
{GENERATES_PAST_THE_WINDOW}
print("OTHER_OK", transformers.__version__)
"""
    result = run_isolated_python(code, cwd=tmp_path, hf_home=tmp_path / "hf_home", python=Path(OTHER_PYTHON))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"OTHER_OK {other_version}" in result.stdout
