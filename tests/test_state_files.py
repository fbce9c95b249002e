"""The recurrent state as a file: `state.save(path)` / `model.load_state(path)` for every causal family, the checks
that refuse a file of another family, shape or format version, and the installed class and the Hub remote-code copy
of a family accepting each other's states."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from .families import STATEFUL_FAMILIES


SPLIT = 13  # inside the second window / segment of the tiny configs


def _padded_inputs(family) -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 30) ids and a mask that left-pads the first row, so the rows' windows are out of step."""
    ids = family.inputs()["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    return ids, mask


def _model_and_state(family):
    """A tiny model of the family and its state after reading 30 tokens."""
    model = family.head()
    with torch.no_grad():
        return model, model(family.inputs()["input_ids"]).past_key_values


def _read_header(path) -> dict:
    with safe_open(str(path), framework="pt") as file:
        return json.loads(file.metadata()["hf_recurrence_state"])


def _rewrite(path, target, header: dict | None = None, drop: str | None = None) -> None:
    """Copy a state file to `target` with another header and/or without one tensor."""
    with safe_open(str(path), framework="pt") as file:
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
        metadata = file.metadata()
    if drop is not None:
        del tensors[drop]
    if header is not None:
        metadata = {"hf_recurrence_state": json.dumps(header)}
    save_file(tensors, str(target), metadata=metadata)


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_continuing_from_a_loaded_state_equals_continuing_from_the_original(family, tmp_path):
    model = family.head()
    ids, mask = _padded_inputs(family)
    with torch.no_grad():
        first = model(ids[:, :SPLIT], attention_mask=mask[:, :SPLIT])
        first.past_key_values.save(tmp_path / "state.safetensors")
        loaded = model.load_state(tmp_path / "state.safetensors")
        assert type(loaded) is type(first.past_key_values)
        assert loaded.get_seq_length() == SPLIT
        from_file = model(ids[:, SPLIT:], attention_mask=mask, past_key_values=loaded)
        original = model(ids[:, SPLIT:], attention_mask=mask, past_key_values=first.past_key_values)
    # The same computation on the same tensors: bit-identical.
    assert torch.equal(from_file.logits, original.logits)
    header = _read_header(tmp_path / "state.safetensors")
    assert header["family"] == family.name
    assert header["format_version"] == 1
    assert header["seen_tokens"] == SPLIT


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_a_fresh_state_and_a_bfloat16_state_round_trip(family, tmp_path):
    model = family.head().to(torch.bfloat16)
    ids = family.inputs()["input_ids"]
    with torch.no_grad():
        state = model(ids[:, :5]).past_key_values
    state.save(tmp_path / "bf16.safetensors")
    loaded = model.load_state(tmp_path / "bf16.safetensors")
    assert getattr(loaded, "lockstep", None) == getattr(state, "lockstep", None)  # windows families: (5, 0)
    with torch.no_grad():
        assert torch.equal(
            model(ids[:, 5:], past_key_values=loaded).logits, model(ids[:, 5:], past_key_values=state).logits
        )
    # A state that has read nothing: every cache is empty (and the same tensor in every layer).
    fresh = type(state)(model.config, 3)
    fresh.save(tmp_path / "fresh.safetensors")
    assert type(state).load(tmp_path / "fresh.safetensors", model.config).batch_size == 3


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_an_existing_file_is_replaced_only_when_asked(family, tmp_path):
    model, state = _model_and_state(family)
    path = tmp_path / "state.safetensors"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        state.save(path)
    assert path.read_bytes() == b"precious"
    state.save(path, overwrite=True)
    assert model.load_state(path).get_seq_length() == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.safetensors"]  # no temporary file left


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_files_that_do_not_fit_the_model_are_refused(family, tmp_path):
    model, state = _model_and_state(family)
    good = tmp_path / "state.safetensors"
    state.save(good)
    header = _read_header(good)

    with pytest.raises(FileNotFoundError, match="No state file"):
        model.load_state(tmp_path / "missing.safetensors")

    save_file({"x": torch.zeros(1)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(ValueError, match="is not a saved recurrent state"):
        model.load_state(tmp_path / "weights.safetensors")

    _rewrite(good, tmp_path / "future.safetensors", header={**header, "format_version": 2})
    with pytest.raises(ValueError, match="format version 2.*reads version 1"):
        model.load_state(tmp_path / "future.safetensors")

    _rewrite(good, tmp_path / "incomplete.safetensors", drop="keys.0")
    with pytest.raises(ValueError, match="lacks 'keys.0'"):
        model.load_state(tmp_path / "incomplete.safetensors")

    for other in STATEFUL_FAMILIES:
        if other is not family:
            with pytest.raises(ValueError, match=rf"'{family.name}' family; this model family is '{other.name}'"):
                other.head().load_state(good)

    layers = header["model_shape"]["layers"]
    deeper = family.head_class(family.tiny_config(num_hidden_layers=layers + 1))
    with pytest.raises(ValueError, match=rf"another shape: layers={layers} \(this model: {layers + 1}\)"):
        deeper.load_state(good)


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_the_installed_class_and_the_remote_code_copy_accept_each_others_states(family, tmp_path):
    model = family.head()
    model.save_pretrained(tmp_path / "checkpoint")
    class_ref = model.config.auto_map["AutoModelForCausalLM"]
    remote_class = get_class_from_dynamic_module(class_ref, str(tmp_path / "checkpoint"))
    assert remote_class.__module__.startswith("transformers_modules.")
    remote = remote_class.from_pretrained(tmp_path / "checkpoint").eval()
    ids = family.inputs()["input_ids"]
    with torch.no_grad():
        expected = model(ids[:, SPLIT:], past_key_values=model(ids[:, :SPLIT]).past_key_values).logits
        installed_state = model(ids[:, :SPLIT]).past_key_values
        remote_state = remote(ids[:, :SPLIT]).past_key_values
        assert type(remote_state) is not type(installed_state)
        by_remote = remote(ids[:, SPLIT:], past_key_values=installed_state)
        by_installed = model(ids[:, SPLIT:], past_key_values=remote_state)
    assert type(by_remote.past_key_values).__module__ == remote_class.__module__
    assert type(by_installed.past_key_values) is type(installed_state)
    assert torch.equal(by_remote.logits, expected)
    assert torch.equal(by_installed.logits, expected)
    # A file written by either class reads into the other.
    remote_state.save(tmp_path / "remote.safetensors")
    assert type(model.load_state(tmp_path / "remote.safetensors")) is type(installed_state)

    with pytest.raises(TypeError, match=r"must be a \w+State returned by this model.*got DynamicCache"):
        from transformers import DynamicCache

        model(ids, past_key_values=DynamicCache())
