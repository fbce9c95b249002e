"""PEFT's LoRA trains the recurrent Llama (the stock Trainer: tests/models/recurrent_gpt2/test_training_recurrent_gpt2.py)."""

import pytest
import torch

from hf_recurrence import RecurrentLlamaForCausalLM

from ...common import tiny_recurrent_llama_config


# peft 0.21 still reads the `is_gradient_checkpointing` property that transformers 5.23 deprecates.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_on_q_and_v_trains_adapters_and_recurrence_only(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    base = RecurrentLlamaForCausalLM(tiny_recurrent_llama_config())
    base.save_pretrained(tmp_path / "base")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["recurrence"], task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert any("lora_" in name for name in trainable) and any(".recurrence." in name for name in trainable)
    assert all("lora_" in name or ".recurrence.modules_to_save." in name for name in trainable)

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
