"""The recurrent state as a file: `state.save(path)` / `model.load_state(path)` for every causal family, the checks
that refuse a file of another family, shape or format version, and the installed class and the Hub remote-code copy
of a family accepting each other's states. The one home of these checks: the recurrent GPT-2 and Llama rows are the
recurrence core (`RecurrentDecoderState`) over those backbones; every backbone row saves and continues a state in
tests/models/recurrent_decoder/test_backbones_recurrent_decoder.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

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


def _read_tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as file:
        return {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118


def _rewrite(
    path, target, header: dict | None = None, drop: str | None = None, replace: dict[str, torch.Tensor] | None = None
) -> None:
    """Copy a state file to `target` with another header, without one tensor and/or with other values for some."""
    tensors = {**_read_tensors(path), **(replace or {})}
    metadata = {"hf_recurrence_state": json.dumps(_read_header(path) if header is None else header)}
    if drop is not None:
        del tensors[drop]
    save_file(tensors, str(target), metadata=metadata)


def _saved_state(family, tmp_path):
    """A tiny model of the family, its state after reading 30 tokens saved to a file, that file and its header."""
    model, state = _model_and_state(family)
    path = tmp_path / "state.safetensors"
    state.save(path)
    return model, state, path, _read_header(path)


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
    # The recurrence core's files are at version 2 since the memory slots; Transformer-XL's at 1.
    assert header["format_version"] == (1 if family.name == "transformer_xl" else 2)
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
    model, _, good, header = _saved_state(family, tmp_path)

    with pytest.raises(FileNotFoundError, match="No state file"):
        model.load_state(tmp_path / "missing.safetensors")

    save_file({"x": torch.zeros(1)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(ValueError, match="is not a saved recurrent state"):
        model.load_state(tmp_path / "weights.safetensors")

    _rewrite(good, tmp_path / "future.safetensors", header={**header, "format_version": 99})
    with pytest.raises(ValueError, match=r"format version 99.*reads versions \("):
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
    with pytest.raises(ValueError, match=rf"does not fit this model: layers={layers} \(this model: {layers + 1}\)"):
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
    # The remote copy's own state class, from its folder (a sibling module of the model's).
    assert type(by_remote.past_key_values).__module__.rpartition(".")[0] == remote_class.__module__.rpartition(".")[0]
    assert type(by_installed.past_key_values) is type(installed_state)
    assert torch.equal(by_remote.logits, expected)
    assert torch.equal(by_installed.logits, expected)
    # A file written by either class reads into the other.
    remote_state.save(tmp_path / "remote.safetensors")
    assert type(model.load_state(tmp_path / "remote.safetensors")) is type(installed_state)

    with pytest.raises(TypeError, match=r"must be a \w+State returned by this model.*got DynamicCache"):
        from transformers import DynamicCache

        model(ids, past_key_values=DynamicCache())


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_an_in_memory_state_of_another_model_is_refused_in_one_error(family):
    model = family.head()
    ids = family.inputs()["input_ids"]
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        deeper_state = family.head(num_hidden_layers=layers + 1)(ids[:, :SPLIT]).past_key_values
    assert_states_of_another_model_are_refused(model, deeper_state, layers, ids)


def assert_states_of_another_model_are_refused(model, deeper_state, layers: int, ids: torch.Tensor) -> None:
    """`model` (with `layers` layers) refuses a state of a model one layer deeper, a state of another batch size and a
    float32 state once it is bfloat16, each by name."""
    with torch.no_grad():
        state = model(ids[:, :SPLIT]).past_key_values
        with pytest.raises(
            ValueError,
            match=rf"(past_key_values|cache) does not fit this model: layers={layers + 1} \(this model: {layers}\)",
        ):
            model(ids[:, SPLIT:], past_key_values=deeper_state)
        with pytest.raises(ValueError, match=r"batch_size=2 \(the input: 1\)"):
            model(ids[:1, SPLIT:], past_key_values=state)
        # A float32 state with a bfloat16 model: refused by name, not a deep attention error.
        with pytest.raises(ValueError, match=r"dtype=torch.float32 \(this model: torch.bfloat16\).*state.to\(dtype="):
            model.to(torch.bfloat16)(ids[:, SPLIT:], past_key_values=state)


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_values_no_run_leaves_in_a_state_are_refused_naming_the_file_and_field(family, tmp_path):
    model, _, good, header = _saved_state(family, tmp_path)
    assert_values_no_run_leaves_are_refused(model, good, header, tmp_path)


def assert_values_no_run_leaves_are_refused(model, good, header: dict, tmp_path) -> None:
    """`model.load_state` refuses rewrites of the state file `good` (with `header`) holding values no run leaves,
    naming the file and the field."""

    def refused(name: str, match: str, **rewrite) -> None:
        path = tmp_path / f"{name}.safetensors"
        _rewrite(good, path, **rewrite)
        with pytest.raises(ValueError, match=match) as error:
            model.load_state(path)
        assert str(path) in str(error.value)

    for bad in (-1, 2.5, "30", None, True):
        refused("seen", rf"malformed 'seen_tokens' in its header: {bad!r}", header={**header, "seen_tokens": bad})
    refused("fewer_seen", r"'seen_tokens'=1, fewer than its rows", header={**header, "seen_tokens": 1})
    # Above int64, which positions and counters become: once an OverflowError that named no file.
    refused(
        "huge", r"malformed 'seen_tokens' in its header: 9223372036854775808", header={**header, "seen_tokens": 2**63}
    )

    name, tensor = next((n, t) for n, t in sorted(_read_tensors(good).items()) if t.is_floating_point())
    refused(
        "nan", rf"has non-finite values \(NaN or inf\) in '{name}'", replace={name: torch.full_like(tensor, torch.nan)}
    )

    for raw, match in (
        ("[1, 2]", "malformed state header: a JSON list"),
        ("[" * 100_000 + "]" * 100_000, "malformed state header"),
        ("{not json", "malformed state header"),
    ):
        save_file({"x": torch.zeros(1)}, str(tmp_path / "raw.safetensors"), metadata={"hf_recurrence_state": raw})
        with pytest.raises(ValueError, match=match) as error:
            model.load_state(tmp_path / "raw.safetensors")
        assert "raw.safetensors" in str(error.value)
    if Path("/dev/zero").exists():
        # Once "No state file at /dev/zero": it is there, and it is not a file.
        with pytest.raises(ValueError, match="/dev/zero is not a state file: it is not a regular file"):
            model.load_state("/dev/zero")
    with pytest.raises(FileNotFoundError, match="No state file at"):
        model.load_state(tmp_path / "absent.safetensors")
    (tmp_path / "text.safetensors").write_text("not a safetensors file")
    with pytest.raises(ValueError, match="text.safetensors is not a safetensors file"):
        model.load_state(tmp_path / "text.safetensors")


WINDOWED_FAMILIES = [family for family in STATEFUL_FAMILIES if family.name != "transformer_xl"]


@pytest.mark.parametrize("family", WINDOWED_FAMILIES, ids=lambda f: f.name)
def test_window_counters_outside_the_window_or_the_cache_are_refused(family, tmp_path):
    model, state, good, header = _saved_state(family, tmp_path)
    assert_window_counters_are_refused(model, state, good, header, tmp_path)
    # The good file still loads and continues the text.
    more = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(
            model(more, past_key_values=model.load_state(good)).logits, model(more, past_key_values=state).logits
        )


@pytest.mark.parametrize("family", WINDOWED_FAMILIES, ids=lambda f: f.name)
def test_a_malformed_window_schedule_or_cache_dtypes_are_refused(family, tmp_path):
    model, _, good, header = _saved_state(family, tmp_path)
    for rewrite, match in (
        ({"header": {**header, "window_size": 0}}, r"malformed 'window_size' in its header: 0"),
        ({"header": {**header, "window_size": 99}}, r"cannot run with this model: window_size=99 exceeds"),
        (
            {"replace": {"values.1": _read_tensors(good)["values.1"].double()}},
            r"has values of shapes .* and dtypes \['torch.float32', 'torch.float64'\]",
        ),
    ):
        _rewrite(good, tmp_path / "bad.safetensors", **rewrite)
        with pytest.raises(ValueError, match=match):
            model.load_state(tmp_path / "bad.safetensors")


def assert_window_counters_are_refused(model, state, good, header: dict, tmp_path) -> None:
    """`model.load_state` refuses rewrites of the windowed state file `good` whose fill counts leave the window or
    disagree with the cache, or whose lockstep header is malformed."""
    header = {**header, "lockstep": None}
    fill = _read_tensors(good)["fill"]
    for name, value, match in (
        ("beyond", state.window_size + 1, r"'fill' .* outside the window"),
        ("negative", -1, r"'fill' .* outside the window"),
        ("uncached", 1, r"but \[\d+, \d+\] valid cache slots"),
    ):
        _rewrite(good, tmp_path / f"{name}.safetensors", header=header, replace={"fill": torch.full_like(fill, value)})
        with pytest.raises(ValueError, match=match):
            model.load_state(tmp_path / f"{name}.safetensors")
    for lockstep in ([1], ["a", 0], 7):
        _rewrite(good, tmp_path / "lockstep.safetensors", header={**header, "lockstep": lockstep})
        with pytest.raises(ValueError, match="malformed 'lockstep'"):
            model.load_state(tmp_path / "lockstep.safetensors")


@pytest.mark.parametrize("family", WINDOWED_FAMILIES, ids=lambda f: f.name)
def test_a_lockstep_state_claiming_more_tokens_than_its_rows_read_is_refused(family, tmp_path):
    # Its rows read every column, so seen_tokens is known: more would make generate() continue from a wrong place.
    model, state, good, header = _saved_state(family, tmp_path)
    assert state.lockstep is not None
    _rewrite(good, tmp_path / "over.safetensors", header={**header, "seen_tokens": state.seen_tokens + 5})
    with pytest.raises(
        ValueError, match=rf"'seen_tokens'={state.seen_tokens + 5}, but its rows, in lockstep .* have read"
    ):
        model.load_state(tmp_path / "over.safetensors")
    # A padded batch's rows read fewer tokens than its columns: there, more seen tokens than rows read is expected.
    ids, mask = _padded_inputs(family)
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).past_key_values
    padded.save(tmp_path / "padded.safetensors")
    assert model.load_state(tmp_path / "padded.safetensors").seen_tokens == padded.seen_tokens


@pytest.mark.parametrize("family", WINDOWED_FAMILIES, ids=lambda f: f.name)
def test_cache_tensors_of_another_dtype_than_h_prev_are_named(family, tmp_path):
    model, _, good, _ = _saved_state(family, tmp_path)
    half = {name: t.half() for name, t in _read_tensors(good).items() if name.startswith("keys.")}
    _rewrite(good, tmp_path / "half.safetensors", replace=half)
    # Once reported as a malformed 'h_prev', the one tensor of the right dtype.
    with pytest.raises(
        ValueError, match=r"has keys of shapes .* and dtypes \['torch.float16'\], expected .* torch.float32"
    ):
        model.load_state(tmp_path / "half.safetensors")


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_of_two_writers_of_one_path_without_overwrite_only_one_succeeds(family, tmp_path, monkeypatch):
    assert_one_of_two_writers_wins(_model_and_state(family)[1], tmp_path, monkeypatch)


def assert_one_of_two_writers_wins(state, tmp_path, monkeypatch) -> None:
    """Of two writers of one path in the empty folder `tmp_path` without overwrite, only the first succeeds, and no
    temporary file is left."""
    path = tmp_path / "state.safetensors"
    module = sys.modules[type(state).__module__]
    write = module.save_file

    def another_writer_wins_meanwhile(*args, **kwargs):
        # The other process creates the file after this one checked that the name was free.
        path.write_bytes(b"the other writer's state")
        write(*args, **kwargs)

    monkeypatch.setattr(module, "save_file", another_writer_wins_meanwhile)
    with pytest.raises(FileExistsError, match="created by another writer meanwhile"):
        state.save(path)
    assert path.read_bytes() == b"the other writer's state"
    assert [p.name for p in tmp_path.iterdir()] == ["state.safetensors"]  # no temporary file left


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_the_next_save_removes_what_a_killed_writer_left_and_keeps_a_running_ones(family, tmp_path):
    assert_a_killed_writers_partial_is_removed(_model_and_state(family)[1], tmp_path)


def assert_a_killed_writers_partial_is_removed(state, tmp_path) -> None:
    """A temporary file of a writer killed outright (a process that no longer runs) goes at the next save of the same
    path; one of a writer still running (this process), or of another path, stays."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)
    abandoned = tmp_path / f".state.safetensors.{dead}-x1y2.partial"
    running = tmp_path / f".state.safetensors.{os.getpid()}-a1b2.partial"
    other = tmp_path / f".other.safetensors.{dead}-c3d4.partial"
    for partial in (abandoned, running, other):
        partial.write_bytes(b"half a state")
    state.save(tmp_path / "state.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, other.name, "state.safetensors"])


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_a_failed_save_leaves_no_partial_file_and_the_state_docs_say_it_is_not_thread_safe(family, tmp_path):
    assert_a_failed_save_leaves_nothing(_model_and_state(family)[1], tmp_path)


def assert_a_failed_save_leaves_nothing(state, tmp_path) -> None:
    """A save over a folder fails without leaving a file in the empty folder `tmp_path`; a saved file is its owner's
    only, and the state's docs say it is not thread-safe."""
    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        state.save(tmp_path / "taken", overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
    state.save(tmp_path / "state.safetensors")
    # The file holds the text the model read: only its owner may read it.
    assert (tmp_path / "state.safetensors").stat().st_mode & 0o077 == 0
    assert "not thread-safe" in type(state).__doc__
