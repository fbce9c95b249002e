"""PEFT on every family: LoRA finds its default target modules by our model types (registered by
`hf_recurrence.integrations.peft_defaults`), on the recurrence core over stock backbones too, prompt tuning runs,
prefix tuning is refused with the reason, and adapters with the recurrence in `modules_to_save` save and reload."""

import pytest
import torch
from peft import LoraConfig, PeftModel, PrefixTuningConfig, PromptTuningConfig, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import Trainer

from hf_recurrence import RecurrentLlamaForCausalLM
from hf_recurrence.integrations.peft_defaults import register_peft_defaults

from ..common import RandomBlocks, tiny_recurrent_llama_config, tiny_training_arguments
from ..families import BACKBONES, FAMILIES


EXPECTED_TARGETS = {
    "recurrent_gpt2": {"c_attn"},
    "recurrent_llama": {"q_proj", "v_proj"},
    "transformer_xl": {"qkv_net"},
    "inductive_bert": {"query", "value"},
}
CAUSAL = [family for family in FAMILIES if family.stateful]
BY_NAME = {backbone.name: backbone for backbone in BACKBONES}


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


# The paper's recurrence, and memories of two slots read at two layers, pooled by attention or kept by a selection
# (name -> settings, the memory's own weights, which are trained and saved with the recurrence).
MEMORIES = {
    "paper": ({}, {"layer_weight_logits"}),
    "attention": (
        {"memory_slots": 2, "memory_pooling": "attention", "memory_read_layers": [0, 1]},
        {"layer_weight_logits", "memory_queries", "slot_embeddings"},
    ),
    "select": (
        {"memory_slots": 2, "memory_pooling": "select", "memory_read_layers": [0, 1]},
        {"layer_weight_logits", "memory_selection_query", "slot_embeddings"},
    ),
}


# peft 0.21 still reads the `is_gradient_checkpointing` property that transformers 5.23 deprecates.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(("memory", "memory_weights"), list(MEMORIES.values()), ids=list(MEMORIES))
def test_lora_on_q_and_v_trains_adapters_and_recurrence_only(memory, memory_weights, tmp_path):
    base = RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(**memory))
    base.save_pretrained(tmp_path / "base")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["recurrence"], task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert any("lora_" in name for name in trainable) and any(".recurrence." in name for name in trainable)
    assert all("lora_" in name or ".recurrence.modules_to_save." in name for name in trainable)
    trained = {name.rsplit(".", 1)[-1] for name in trainable if ".recurrence." in name} - {"weight", "bias"}
    assert trained == memory_weights

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(1, 99, (2, 30))
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(
        RecurrentLlamaForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
    assert reloaded.generate(input_ids=ids[:, :3], max_new_tokens=20, do_sample=False).shape == (2, 23)


# peft 0.21 still reads the `is_gradient_checkpointing` property that transformers 5.23 deprecates.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    ("name", "targets"), [("llama", {"q_proj", "v_proj"}), ("phi3", {"qkv_proj"}), ("gpt2", {"c_attn"})]
)
def test_the_core_trains_with_the_trainer_and_lora_finds_its_default_targets(name, targets, tmp_path):
    model, _ = BY_NAME[name].models()
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = Trainer(model=model, args=tiny_training_arguments(tmp_path), train_dataset=RandomBlocks(4, 30)).train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert [n for n, p in model.named_parameters() if torch.equal(before[n], p)] == []

    lora = get_peft_model(model, LoraConfig(r=4, task_type="CAUSAL_LM"))
    adapted = {n.rsplit(".", 1)[-1] for n, module in lora.named_modules() if isinstance(module, LoraLayer)}
    assert adapted == targets
    tokens = torch.randint(1, 99, (2, 30))
    lora(tokens, labels=tokens).loss.backward()
    assert all(p.grad is not None for n, p in lora.named_parameters() if "lora_B" in n)
