"""TRL's `SFTTrainer(packing=True)` trains a recurrent GPT-2: its default "bfd" packing flattens each batch into one
row without attention mask, marks the documents by `position_ids` that restart at 0, and scores the backbone's hidden
states with its own fused LM head. The first step's loss must be that of the documents read one by one.

With TRL's own defaults `SFTTrainer` trains every causal family: TRL turns activation checkpointing on, which
Transformer-XL once refused."""

from pathlib import Path

import pytest
import torch


trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from transformers import AutoTokenizer  # noqa: E402

from hf_recurrence import RecurrentGPT2LMHeadModel  # noqa: E402

from ..common import SRC_ROOT, TRL_ON_CPU, tiny_recurrent_config  # noqa: E402
from ..families import STATEFUL_FAMILIES  # noqa: E402
from ..test_families import by_family  # noqa: E402


TOKENIZER = SRC_ROOT / "hf_recurrence" / "default_model"

# Short texts of different lengths, written for this test; several fit in one packed sequence.
TEXTS = [
    "A recurrent model reads its input in windows.",
    "Each window passes a summary of itself to the next one, so the model can look further back than a window.",
    "Packing puts several short documents into one sequence.",
    "Positions restart at zero where a new document begins.",
    "The state is reset at that point, and nothing crosses from one document into the next.",
    "Short.",
    "Training on packed sequences wastes no compute on padding, which is why people fine-tune that way.",
    "The loss is the mean over every document's tokens.",
]


def loss_of_documents_alone(model, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over the documents of a padding-free row, each run alone from a new state."""
    starts = [*(position_ids[0] == 0).nonzero()[:, 0].tolist(), input_ids.shape[1]]
    summed, count = 0.0, 0
    for start, stop in zip(starts[:-1], starts[1:], strict=True):
        doc = input_ids[:, start:stop]
        summed = summed + model(input_ids=doc, labels=doc, num_items_in_batch=1).loss
        count += stop - start - 1
    return summed / count


class RecordingSFTTrainer(trl.SFTTrainer):
    """Keeps the first step's batch, its loss, and the same documents' loss computed one by one (before the update)."""

    first_batch: dict | None = None
    first_loss: torch.Tensor | None = None
    first_reference: torch.Tensor | None = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.first_loss is None:
            self.first_batch, self.first_loss = dict(inputs), loss.detach()
            with torch.no_grad():
                self.first_reference = loss_of_documents_alone(model, inputs["input_ids"], inputs["position_ids"])
        return loss


def test_sft_trainer_with_packing_trains_on_documents_as_if_alone(tmp_path: Path):
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    torch.manual_seed(0)
    # No dropout, so that the reference computed in training mode is the same function as the step's.
    config = tiny_recurrent_config(
        vocab_size=len(tokenizer), window_overlap=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = RecurrentGPT2LMHeadModel(config)
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=64,
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-3,
        # TRL's default is on; it exercises the window-step recomputation with document boundaries inside a row.
        activation_checkpointing=True,
        logging_steps=1,
        **TRL_ON_CPU,
    )
    trainer = RecordingSFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"text": TEXTS}),
        processing_class=tokenizer,
    )
    result = trainer.train()

    batch = trainer.first_batch
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    assert int((batch["position_ids"] == 0).sum()) >= 3, "the first batch should pack several documents"
    torch.testing.assert_close(trainer.first_loss, trainer.first_reference)
    assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))


@by_family(STATEFUL_FAMILIES)
def test_sft_trainer_with_trl_defaults_trains(family, tmp_path: Path):
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model = family.head(vocab_size=len(tokenizer)).train()
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_length=64,
        per_device_train_batch_size=2,
        max_steps=2,
        # Only what a CPU test needs; activation checkpointing keeps TRL's default (on).
        **TRL_ON_CPU,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"text": TEXTS[:4]}),
        processing_class=tokenizer,
    )
    result = trainer.train()
    assert model.is_activation_checkpointing
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
