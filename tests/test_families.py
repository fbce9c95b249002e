"""What every model family must pass, run over the family table (`tests/families.py`): Auto classes, save/load with
`auto_map`, remote code in a fresh interpreter, a Trainer run, and for the stateful families the state contract
(chunked == one-shot, detach / reset / reorder)."""

import json
import re

import pytest
import torch
from transformers import AutoConfig, AutoModel, Trainer

from .common import (
    ACROSS_KERNELS,
    RandomBlocks,
    assert_loads_with_remote_code,
    attentions_and_hidden_states,
    tiny_training_arguments,
)
from .families import FAMILIES, NAMED_DECODERS, STATEFUL_FAMILIES, Family


def family_ids(families: list[Family]) -> list[str]:
    return [family.name for family in families]


def by_family(families: list[Family] = FAMILIES):
    return pytest.mark.parametrize("family", families, ids=family_ids(families))


@by_family()
def test_auto_classes_resolve_to_ours(family):
    kwargs = {k: v for k, v in family.tiny_config().to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model(family.name, **kwargs)
    assert type(config) is type(family.tiny_config())
    assert type(AutoModel.from_config(config)) is family.base_class
    assert type(family.head_auto_class.from_config(config)) is family.head_class


@by_family()
def test_save_load_round_trip_keeps_settings_auto_map_and_outputs(family, tmp_path):
    model = family.head(**family.saved_settings)
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    saved = json.loads((tmp_path / "config.json").read_text())
    code_files = {reference.split(".")[0] + ".py" for reference in saved["auto_map"].values()}
    assert {"model.safetensors", "config.json", *code_files} <= files
    assert saved["auto_map"] == type(model.config)().auto_map
    assert {"AutoConfig", "AutoModel", family.head_auto_class.__name__} <= set(saved["auto_map"])
    assert len(saved["auto_map"]) == 3 + len(family.other_heads)
    assert {name: saved[name] for name in family.saved_settings} == family.saved_settings

    inputs = family.inputs()
    with torch.no_grad():
        for loader in (family.head_class, family.head_auto_class):
            loaded = loader.from_pretrained(tmp_path).eval()
            assert type(loaded) is family.head_class
            torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, **ACROSS_KERNELS)
        base = AutoModel.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(
            base(**inputs).last_hidden_state, family.base(model)(**inputs).last_hidden_state, **ACROSS_KERNELS
        )


@pytest.mark.remote_code
@by_family()
def test_trust_remote_code_in_a_fresh_interpreter_without_the_package(family, tmp_path):
    model = family.head(**family.saved_settings)
    assert_loads_with_remote_code(
        model, family.inputs(length=40), tmp_path, family.head_auto_class.__name__, checks=family.remote_checks
    )


@by_family()
def test_trainer_updates_every_parameter(family, tmp_path):
    model = family.head().train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = tiny_training_arguments(tmp_path)
    result = Trainer(model=model, args=args, train_dataset=RandomBlocks(4, 30)).train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert [name for name, p in model.named_parameters() if torch.equal(before[name], p)] == []


@by_family(STATEFUL_FAMILIES)
def test_trainer_evaluation_gives_compute_metrics_the_logits(family, tmp_path):
    # run_clm.py's metric: argmax predictions (preprocess_logits_for_metrics), then next-token accuracy.
    def argmax(logits, labels):
        return logits[0].argmax(-1) if isinstance(logits, tuple) else logits.argmax(-1)

    def accuracy(predictions):
        predicted, labels = predictions
        return {"accuracy": float((predicted[:, :-1] == labels[:, 1:]).mean())}

    model = family.head()
    blocks = RandomBlocks(4, 30)
    trainer = Trainer(
        model=model,
        args=tiny_training_arguments(tmp_path),
        eval_dataset=blocks,
        compute_metrics=accuracy,
        preprocess_logits_for_metrics=argmax,
    )
    with torch.no_grad():
        expected = (model(blocks.ids).logits.argmax(-1)[:, :-1] == blocks.ids[:, 1:]).float().mean().item()
    assert trainer.evaluate()["eval_accuracy"] == pytest.approx(expected)
    assert trainer.predict(blocks).predictions.shape == (4, 30)
    # Training still takes the memory-lean path: the loss without the (tokens, vocab) logits.
    assert model.train()(blocks.ids, labels=blocks.ids).logits is None


@by_family(STATEFUL_FAMILIES)
def test_chunked_calls_carrying_the_state_equal_one_call(family):
    model = family.head(window_overlap=3) if "window_overlap" in family.saved_settings else family.head()
    ids = family.inputs(length=30)["input_ids"]
    with torch.no_grad():
        whole = model(ids).logits
        pieces, state = [], None
        bounds = [0, *family.chunk_splits, ids.shape[1]]
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            out = model(ids[:, start:stop], past_key_values=state)
            pieces.append(out.logits)
            state = out.past_key_values
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole)
    assert state.get_seq_length() == 30


@by_family(STATEFUL_FAMILIES)
def test_logits_to_keep_and_generate_reads_a_prompt_without_its_logits(family):
    model = family.head()
    ids = family.inputs(length=30)["input_ids"]
    with torch.no_grad():
        every = model(ids).logits
        torch.testing.assert_close(model(ids, logits_to_keep=1).logits, every[:, -1:])
        positions = torch.tensor([0, 17, 29])
        torch.testing.assert_close(model(ids, logits_to_keep=positions).logits, every[:, positions])
    with pytest.raises(ValueError, match="logits_to_keep=1 cannot be combined with labels"):
        model(ids, labels=ids, logits_to_keep=1)
    # generate() asks for the last position only, so a long prompt never costs its (length, vocab) logits.
    head_inputs = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, args, _o: head_inputs.append(args[0].shape))
    model.generate(ids, max_new_tokens=3, do_sample=False)
    hook.remove()
    # (A window step that keeps no logits may call the head on no positions at all.)
    assert [shape[1] for shape in head_inputs if shape[1]] == [1, 1, 1]


def _tensors(state) -> list[torch.Tensor]:
    """Every tensor the state holds, directly or in a list/tuple attribute."""
    found = []
    for value in vars(state).values():
        values = value if isinstance(value, list | tuple) else [value]
        found += [v for v in values if isinstance(v, torch.Tensor)]
    return found


@by_family(STATEFUL_FAMILIES)
def test_state_detach_reset_and_reorder(family):
    model = family.head()
    ids = family.inputs(batch=3, length=20)["input_ids"]
    following = family.inputs(batch=3, length=9)["input_ids"]

    state = model.train()(ids).past_key_values
    assert any(t.requires_grad for t in _tensors(state)) == family.state_carries_gradient
    assert state.detach() is state
    assert not any(t.requires_grad for t in _tensors(state))

    model.eval()
    with torch.no_grad():
        state = model(ids).past_key_values
        continued = model(following, past_key_values=state).logits
        # Reordered rows continue as the rows they were copied from (beam search).
        state = model(ids).past_key_values
        order = torch.tensor([2, 2, 0])
        state.reorder_cache(order)
        assert state.batch_size == 3
        torch.testing.assert_close(model(following[order], past_key_values=state).logits, continued[order])
        # A reset state reads like a fresh one.
        state.reset()
        assert state.get_seq_length() == 0
        torch.testing.assert_close(model(following, past_key_values=state).logits, model(following).logits)


@by_family(STATEFUL_FAMILIES)
def test_attentions_and_hidden_states(family):
    model = family.head(window_overlap=3) if "window_overlap" in family.saved_settings else family.head()
    ids = family.inputs(length=30)["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    out = attentions_and_hidden_states(model, ids, mask, family.attention_columns(model.config))
    torch.testing.assert_close(out.hidden_states[-1], family.base(model)(ids, attention_mask=mask).last_hidden_state)

    # The columns mean the same in every call: chunked calls' weights are the one call's.
    with torch.no_grad():
        whole = model(ids, output_attentions=True).attentions
        pieces, state = [], None
        bounds = [0, *family.chunk_splits, ids.shape[1]]
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            chunk = model(ids[:, start:stop], past_key_values=state, output_attentions=True)
            pieces.append(chunk.attentions)
            state = chunk.past_key_values
    for layer, weights in enumerate(whole):
        torch.testing.assert_close(torch.cat([piece[layer] for piece in pieces], dim=2), weights)


# What the two named recurrent decoders share, from their config to forward (what is particular to each stays in
# tests/models/<family>/).
INVALID_RECURRENCE_SETTINGS = [
    ({"window_size": 8, "window_overlap": 8}, "window_overlap", "8"),
    ({"window_size": 8, "window_overlap": -1}, "window_overlap", "-1"),
    ({"window_size": 17}, "window_size", "17"),
    ({"window_size": 0}, "window_size", "0"),
    ({"insertion_layer": 3}, "insertion_layer", "3"),
    ({"insertion_layer": -1}, "insertion_layer", "-1"),
    ({"recurrence_hidden_sizes": []}, "recurrence_hidden_sizes", "[]"),
    ({"recurrence_hidden_sizes": [16, 0]}, "recurrence_hidden_sizes", "[16, 0]"),
    ({"bptt_windows": 0}, "bptt_windows", "0"),
]


@by_family(NAMED_DECODERS)
@pytest.mark.parametrize(("overrides", "field", "value"), INVALID_RECURRENCE_SETTINGS)
def test_invalid_recurrence_settings_name_field_and_value(family, overrides, field, value):
    with pytest.raises(ValueError, match=re.escape(f"{field}={value}")):
        family.tiny_config(**overrides)


@by_family(NAMED_DECODERS)
def test_recurrence_defaults_follow_the_paper(family):
    config = type(family.tiny_config())()
    assert (config.window_size, config.window_overlap, config.insertion_layer) == (300, 0, 2)
    assert config.recurrence_hidden_sizes == [200, 200, 200]
    assert config.bptt_windows is None
    assert config.model_type == family.name
    assert set(config.auto_map) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForCausalLM",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
    }


@by_family(NAMED_DECODERS)
def test_config_changed_after_construction_is_refused_by_the_model(family):
    config = family.tiny_config()
    config.window_size = 40
    with pytest.raises(ValueError, match="window_size=40"):
        family.head_class(config)


@by_family(NAMED_DECODERS)
def test_output_shapes(family):
    model = family.head_class(family.tiny_config()).eval()
    ids = torch.randint(0, 99, (3, 21))
    out = model(ids, output_hidden_states=True)
    assert out.logits.shape == (3, 21, 99)
    assert len(out.hidden_states) == 4 and all(h.shape == (3, 21, 32) for h in out.hidden_states)
    assert family.base_class(model.config).eval()(ids).last_hidden_state.shape == (3, 21, 32)


@by_family(NAMED_DECODERS)
def test_loss_is_the_ordinary_causal_lm_loss(family):
    model = family.head_class(family.tiny_config(window_overlap=3)).eval()
    ids = torch.randint(0, 99, (2, 37))
    labels = ids.clone()
    labels[0, 5:9] = -100
    out = model(ids, labels=labels, return_logits=True)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 99), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    # Without logits the loss is computed window by window: the same number.
    no_logits = model(ids, labels=labels, return_logits=False)
    assert no_logits.logits is None
    torch.testing.assert_close(no_logits.loss, expected)


@by_family(NAMED_DECODERS)
def test_reads_far_past_the_position_table(family):
    # Positions restart every window: any length runs although the position table has only 16 entries.
    model = family.head_class(family.tiny_config()).eval()
    assert model(torch.randint(0, 99, (1, 500))).logits.shape == (1, 500, 99)


@by_family(NAMED_DECODERS)
def test_reordering_earlier_windows_changes_later_outputs(family):
    model = family.head_class(family.tiny_config()).eval()
    ids = torch.randint(0, 99, (1, 16))
    swapped = ids.clone()
    swapped[0, :8] = ids[0, :8].flip(0)
    # Window 1 is identical; it differs only through h_prev.
    assert not torch.allclose(model(ids).logits[:, 8:], model(swapped).logits[:, 8:])


@by_family(NAMED_DECODERS)
def test_eager_equals_sdpa(family):
    sdpa = family.head_class(family.tiny_config(window_overlap=3)).eval()
    eager = family.head_class(family.tiny_config(window_overlap=3, attn_implementation="eager")).eval()
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    eager.load_state_dict(sdpa.state_dict())
    ids = torch.randint(0, 99, (2, 40))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    torch.testing.assert_close(eager(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits)


@by_family(NAMED_DECODERS)
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"position_ids": torch.tensor([[0, 1, 3, 4, 5]])}, ValueError, "position 3 follows 1"),
        ({"attention_mask": torch.ones(1, 3)}, ValueError, "attention_mask"),
        ({"past_key_values": object()}, TypeError, "{state_class}"),
    ],
)
def test_bad_input_is_refused_clearly(family, kwargs, error, match):
    # The family's state class: RecurrentGPT2State, RecurrentLlamaState.
    state_class = family.base_class.__name__.removesuffix("Model") + "State"
    with pytest.raises(error, match=match.format(state_class=state_class)):
        family.head_class(family.tiny_config()).eval()(torch.randint(0, 99, (1, 5)), **kwargs)
