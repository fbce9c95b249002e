"""The stock Trainer and PEFT's LoRA train the recurrent Llama on long blocks."""

import pytest
import torch
from transformers import Trainer

from hf_recurrence import RecurrentLlamaForCausalLM

from ...common import RandomBlocks, tiny_recurrent_llama_config, tiny_training_arguments


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trainer_trains_on_long_blocks(tmp_path, checkpointing):
    model = RecurrentLlamaForCausalLM(tiny_recurrent_llama_config(window_overlap=2))
    before = model.recurrence.ffn[0].weight.detach().clone()
    args = tiny_training_arguments(tmp_path, gradient_accumulation_steps=2, activation_checkpointing=checkpointing)
    trainer = Trainer(model=model, args=args, train_dataset=RandomBlocks(8, 48), eval_dataset=RandomBlocks(4, 48))
    result = trainer.train()
    assert model.window_step.gradient_checkpointing is checkpointing
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(before, model.recurrence.ffn[0].weight)
    assert torch.isfinite(torch.tensor(trainer.evaluate()["eval_loss"]))


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
