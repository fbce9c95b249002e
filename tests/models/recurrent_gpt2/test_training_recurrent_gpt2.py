"""The stock Trainer trains the recurrent GPT-2 and Llama on long blocks, with and without window checkpointing."""

import pytest
import torch
from transformers import Trainer

from ...common import RandomBlocks, tiny_training_arguments
from ...families import NAMED_DECODERS


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("family", NAMED_DECODERS, ids=lambda family: family.name)
def test_trainer_trains_on_long_blocks(tmp_path, family, checkpointing):
    model = family.head_class(family.tiny_config(window_overlap=2))
    before = model.recurrence.ffn[0].weight.detach().clone()
    args = tiny_training_arguments(tmp_path, gradient_accumulation_steps=2, activation_checkpointing=checkpointing)
    trainer = Trainer(model=model, args=args, train_dataset=RandomBlocks(8, 48), eval_dataset=RandomBlocks(4, 48))
    result = trainer.train()
    assert model.window_step.gradient_checkpointing is checkpointing
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(before, model.recurrence.ffn[0].weight)
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
