"""Checkpoints and state files written by the hand-written recurrent GPT-2 and Llama (before they became names over the
recurrence core) load into today's classes and give the outputs they gave then; re-saved, they keep their layout.

The files are in tests/fixtures/recurrent_families_0_1 (its make_fixture.py says how they were written).
"""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from hf_recurrence import RecurrentGPT2LMHeadModel, RecurrentLlamaForCausalLM

from .common import ACROSS_KERNELS, REPO_ROOT, assert_loads_with_remote_code


FIXTURES = REPO_ROOT / "tests" / "fixtures" / "recurrent_families_0_1"
CLASSES = {"recurrent_gpt2": RecurrentGPT2LMHeadModel, "recurrent_llama": RecurrentLlamaForCausalLM}
# Folder suffix -> the Auto class that loads it, the class name it gives for each family, and the output compared.
HEADS = {
    "classifier": (AutoModelForSequenceClassification, "{}ForSequenceClassification", "logits"),
    "token_classifier": (AutoModelForTokenClassification, "{}ForTokenClassification", "logits"),
    "bare": (AutoModel, "{}Model", "last_hidden_state"),
}
CLASS_PREFIXES = {"recurrent_gpt2": "RecurrentGPT2", "recurrent_llama": "RecurrentLlama"}


def _tensor_names(path) -> set[str]:
    with safe_open(str(path), framework="pt") as file:
        return set(file.keys())  # noqa: SIM118 (safe_open has no __iter__)


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_an_old_checkpoint_and_state_file_continue_the_text_as_they_did(family):
    reference = torch.load(FIXTURES / f"{family}_reference.pt")
    ids, mask, prefix = reference["input_ids"], reference["attention_mask"], reference["prefix_length"]
    model, info = AutoModelForCausalLM.from_pretrained(FIXTURES / family, output_loading_info=True)
    assert type(model) is CLASSES[family]
    assert not any(info.values()), info  # every tensor has its place, none is new
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids[:, :prefix], attention_mask=mask[:, :prefix]).logits,
            reference["prefix_logits"],
            **ACROSS_KERNELS,
        )
        state = model.load_state(FIXTURES / f"{family}_state.safetensors")
        continued = model(ids[:, prefix:], attention_mask=mask, past_key_values=state).logits
    torch.testing.assert_close(continued, reference["continuation_logits"], **ACROSS_KERNELS)


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_a_resaved_old_checkpoint_keeps_its_layout_and_loads_as_remote_code(family, tmp_path):
    model = CLASSES[family].from_pretrained(FIXTURES / family).eval()
    model.save_pretrained(tmp_path / "resaved")
    assert _tensor_names(tmp_path / "resaved" / "model.safetensors") == _tensor_names(
        FIXTURES / family / "model.safetensors"
    )
    state = model.load_state(FIXTURES / f"{family}_state.safetensors")
    state.save(tmp_path / "state.safetensors")
    # Saved again in state file format 2, which adds the pooled weights of the memory slots (its one slot here).
    new_tensors = {"pooled_weight", "pooled_reference"}
    assert (
        _tensor_names(tmp_path / "state.safetensors")
        == _tensor_names(FIXTURES / f"{family}_state.safetensors") | new_tensors
    )
    reference = torch.load(FIXTURES / f"{family}_reference.pt")
    inputs = {"input_ids": reference["input_ids"], "attention_mask": reference["attention_mask"]}
    assert_loads_with_remote_code(model, inputs, tmp_path / "remote", "AutoModelForCausalLM")


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("family", sorted(CLASSES))
def test_an_old_classifier_or_bare_model_loads_and_gives_its_outputs_as_it_did(family, head, tmp_path):
    auto_class, class_name, output = HEADS[head]
    reference = torch.load(FIXTURES / f"{family}_{head}_reference.pt")
    folder = FIXTURES / f"{family}_{head}"
    model, info = auto_class.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == class_name.format(CLASS_PREFIXES[family])
    assert not any(info.values()), info
    with torch.no_grad():
        outputs = model.eval()(reference["input_ids"], attention_mask=reference["attention_mask"])
    torch.testing.assert_close(outputs[output], reference[output], **ACROSS_KERNELS)
    model.save_pretrained(tmp_path / "resaved")
    if head == "bare":
        # The old bare models saved the stock base model's names unprefixed (`h.*`, `layers.*`); today's write the
        # family's layout (`transformer.h.*`, `model.layers.*`), as a new bare model does, which every head reads.
        type(model)(model.config).save_pretrained(tmp_path / "new")
        assert _tensor_names(tmp_path / "resaved" / "model.safetensors") == _tensor_names(
            tmp_path / "new" / "model.safetensors"
        )
        head_model = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved")
        torch.testing.assert_close(
            head_model.base_model(reference["input_ids"], attention_mask=reference["attention_mask"])[output],
            reference[output],
            **ACROSS_KERNELS,
        )
    else:
        assert _tensor_names(tmp_path / "resaved" / "model.safetensors") == _tensor_names(folder / "model.safetensors")


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_load_state_dict_takes_the_checkpoint_file_as_trainer_resumes_it(family):
    loaded = CLASSES[family].from_pretrained(FIXTURES / family)
    fresh = CLASSES[family](loaded.config)
    result = fresh.load_state_dict(load_file(FIXTURES / family / "model.safetensors"), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"backbone.lm_head.weight"}  # tied, not saved
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
