"""PEFT on every family: LoRA finds its default target modules by our model types (registered by
`hf_recurrence.integrations.peft_defaults`), prompt tuning runs, and prefix tuning is refused with the reason."""

import pytest
import torch
from peft import LoraConfig, PeftModel, PrefixTuningConfig, PromptTuningConfig, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer

from hf_recurrence.integrations.peft_defaults import register_peft_defaults

from .families import FAMILIES


EXPECTED_TARGETS = {
    "recurrent_gpt2": {"c_attn"},
    "recurrent_llama": {"q_proj", "v_proj"},
    "transformer_xl": {"qkv_net"},
    "inductive_bert": {"query", "value"},
}
CAUSAL = [family for family in FAMILIES if family.stateful]


def _loss(model, family) -> torch.Tensor:
    inputs = family.inputs()
    return model(**inputs, labels=inputs["input_ids"]).loss


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_lora_without_target_modules_adapts_the_familys_attention_and_trains(family):
    assert register_peft_defaults()  # idempotent: the package import did it already
    model = get_peft_model(family.head().train(), LoraConfig(r=4))
    adapted = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    assert adapted == EXPECTED_TARGETS[family.name]
    _loss(model, family).backward()
    lora_grads = [p.grad for name, p in model.named_parameters() if "lora_B" in name]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)


@pytest.mark.parametrize("family", CAUSAL, ids=lambda f: f.name)
def test_prompt_tuning_runs_and_prefix_tuning_is_refused_with_the_reason(family):
    prompt_tuned = get_peft_model(
        family.head(), PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=5)
    )
    assert torch.isfinite(_loss(prompt_tuned, family))

    prefix_tuned = get_peft_model(
        family.head(), PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=5)
    )
    with pytest.raises(TypeError, match="PEFT prefix tuning .* is not supported; LoRA and prompt tuning are"):
        _loss(prefix_tuned, family)


@pytest.mark.parametrize("family", CAUSAL, ids=lambda f: f.name)
def test_saved_lora_adapter_loads_through_peft_and_through_transformers(family, tmp_path):
    """Both adapter loaders work on every supported transformers: PEFT's `PeftModel.from_pretrained` and transformers'
    own `model.load_adapter` (whose newer versions check the PEFT version)."""
    adapted = get_peft_model(family.head(), LoraConfig(r=4))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:  # zero at initialisation: make the adapter change the logits
                parameter.normal_()
    ids = family.inputs()["input_ids"]
    with torch.no_grad():
        expected = adapted(ids).logits
        assert not torch.allclose(expected, family.head()(ids).logits)
    adapted.save_pretrained(tmp_path)

    through_peft = PeftModel.from_pretrained(family.head(), tmp_path)
    through_transformers = family.head()
    through_transformers.load_adapter(str(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(through_peft(ids).logits, expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(through_transformers(ids).logits, expected, rtol=1e-6, atol=1e-6)
