"""The checks of `RecurrentDecoderState` that the old families' states have, run with the old families' assertions
(tests/test_state_files.py): a state of another model, batch size or dtype refused in one error, values no run leaves
refused naming the file and field, window counters outside the window or the cache refused, one of two writers of a
path winning, a failed save leaving nothing behind; and the core's own: malformed schedules and cache dtypes."""

import pytest
import torch

from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM

from ...families import BACKBONES
from ...test_state_files import (
    _read_header,
    _read_tensors,
    _rewrite,
    assert_a_failed_save_leaves_nothing,
    assert_one_of_two_writers_wins,
    assert_states_of_another_model_are_refused,
    assert_values_no_run_leaves_are_refused,
    assert_window_counters_are_refused,
)


SETTINGS = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16]}
BY_NAME = {backbone.name: backbone for backbone in BACKBONES}


def ids() -> torch.Tensor:
    return torch.randint(1, 99, (2, 30), generator=torch.Generator().manual_seed(1))


def saved_state(folder, name: str = "llama"):
    """A tiny core model, its state after reading 30 tokens saved to a file in `folder`, that file and its header."""
    model, _ = BY_NAME[name].models(window_overlap=2)
    with torch.no_grad():
        state = model(ids()).past_key_values
    path = folder / "state.safetensors"
    state.save(path)
    return model, state, path, _read_header(path)


def test_an_in_memory_state_of_another_model_batch_or_dtype_is_refused_in_one_error():
    model, _ = BY_NAME["llama"].models()
    text_config = BY_NAME["llama"].text_config()
    text_config.num_hidden_layers = 4
    deeper = RecurrentDecoderForCausalLM(RecurrentDecoderConfig(text_config=text_config, **SETTINGS)).eval()
    with torch.no_grad():
        deeper_state = deeper(ids()).past_key_values
    assert_states_of_another_model_are_refused(model, deeper_state, 3, ids())


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_values_no_run_leaves_in_a_state_are_refused_naming_the_file_and_field(name, tmp_path):
    model, _, good, header = saved_state(tmp_path, name)
    assert_values_no_run_leaves_are_refused(model, good, header, tmp_path)
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


def test_window_counters_outside_the_window_or_the_cache_are_refused(tmp_path):
    model, state, good, header = saved_state(tmp_path)
    assert_window_counters_are_refused(model, state, good, header, tmp_path)
    # The good file still loads and continues the text.
    more = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(
            model(more, past_key_values=model.load_state(good)).logits, model(more, past_key_values=state).logits
        )


def test_of_two_writers_of_one_path_without_overwrite_only_one_succeeds(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "writers").mkdir()
    _, state, _, _ = saved_state(tmp_path / "model")
    assert_one_of_two_writers_wins(state, tmp_path / "writers", monkeypatch)


def test_a_failed_save_leaves_no_partial_file_and_the_file_is_its_owners_only(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "saves").mkdir()
    _, state, _, _ = saved_state(tmp_path / "model")
    assert_a_failed_save_leaves_nothing(state, tmp_path / "saves")
