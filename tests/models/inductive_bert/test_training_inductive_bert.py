"""The stock Trainer with DataCollatorForLanguageModeling trains I-BERT's masked-LM head."""

import torch
from transformers import DataCollatorForLanguageModeling, Trainer

from hf_recurrence import IBertForMaskedLM

from ...common import tiny_inductive_bert_config, tiny_training_arguments
from .tokenizer import word_level_tokenizer


def test_trainer_with_mlm_collator_lowers_the_loss_on_a_repeated_batch(tmp_path):
    tokenizer = word_level_tokenizer()
    generator = torch.Generator().manual_seed(0)
    # Four sequences of different lengths, so the collator pads and the LSTM packs.
    sequences = [torch.randint(3, 99, (n,), generator=generator).tolist() for n in (12, 9, 16, 5)]
    dataset = [{"input_ids": ids} for ids in sequences * 10]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.3, seed=0)
    fixed_batch = collator([{"input_ids": ids} for ids in sequences])

    model = IBertForMaskedLM(tiny_inductive_bert_config())
    lstm_before = model.bert.embeddings.lstm.weight_hh_l0.detach().clone()
    with torch.no_grad():
        loss_before = model.eval()(**fixed_batch).loss
    args = tiny_training_arguments(
        tmp_path,
        max_steps=10,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        activation_checkpointing=True,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    result = trainer.train()
    with torch.no_grad():
        loss_after = model.eval()(**fixed_batch).loss

    assert torch.isfinite(torch.tensor(result.training_loss))
    assert loss_after < loss_before - 0.5, (loss_before, loss_after)
    assert model.bert.encoder.layer[0].gradient_checkpointing
    assert not torch.equal(lstm_before, model.bert.embeddings.lstm.weight_hh_l0)
