"""The stock Trainer trains Transformer-XL on blocks of several segments."""

import torch
from transformers import Trainer

from hf_recurrence import TransformerXLLMHeadModel

from ...common import RandomBlocks, tiny_training_arguments, tiny_transformer_xl_config


def test_trainer_trains_on_long_blocks(tmp_path):
    model = TransformerXLLMHeadModel(tiny_transformer_xl_config(dropout=0.1))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = tiny_training_arguments(tmp_path, max_steps=3, gradient_accumulation_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=RandomBlocks(12, 40), eval_dataset=RandomBlocks(4, 40))
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    # Every parameter learns, the position biases and the position-key projection included.
    unchanged = [name for name, p in model.named_parameters() if torch.equal(before[name], p)]
    assert unchanged == []
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
