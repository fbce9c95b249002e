"""TRL's `DPOTrainer` with a reference model trains a recurrent GPT-2 whose prompts and answers span several windows:
the log-probabilities it computes on padded, batched pairs equal those of each sequence read alone, and with the
policy equal to the reference (every reward 0) the first step's loss is -log(sigmoid(0)) = ln 2."""

import math

import pytest
import torch


trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from transformers import AutoTokenizer  # noqa: E402

from hf_recurrence import RecurrentGPT2LMHeadModel  # noqa: E402

from ..common import SRC_ROOT, TRL_ON_CPU, tiny_recurrent_config  # noqa: E402


TOKENIZER = SRC_ROOT / "hf_recurrence" / "default_model"
# Preference pairs written for this test, of different lengths so that rows are padded.
PAIRS = {
    "prompt": ["The capital of France is", "Two plus two is", "A recurrent model reads", "Windows of text"],
    "chosen": [" Paris, a city on the Seine.", " four.", " its input window by window.", " carry a summary on."],
    "rejected": [" Rome.", " five, which is wrong by one.", " nothing at all.", " are forgotten one by one."],
}


def test_dpo_with_a_reference_model_starts_at_ln2_and_trains(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    config = tiny_recurrent_config(vocab_size=len(tokenizer), window_size=4, window_overlap=1)
    model = RecurrentGPT2LMHeadModel(config)
    reference = RecurrentGPT2LMHeadModel(config)
    reference.load_state_dict(model.state_dict())
    arguments = trl.DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=1,
        learning_rate=0.0,
        max_length=64,
        activation_checkpointing=True,
        **TRL_ON_CPU,
    )
    trainer = trl.DPOTrainer(
        model=model,
        ref_model=reference,
        args=arguments,
        train_dataset=datasets.Dataset.from_dict(PAIRS),
        processing_class=tokenizer,
    )
    result = trainer.train()
    assert result.training_loss == pytest.approx(math.log(2), abs=1e-5)
    logged = trainer.state.log_history[0]["logps/chosen"]  # the batch's mean summed log-probability of the answers
    assert logged == pytest.approx(_mean_answer_logps(model.eval(), tokenizer), rel=1e-5)


def _mean_answer_logps(model, tokenizer) -> float:
    """Summed log-probability of each chosen answer (and the end of text DPO appends) after its prompt, each pair
    read alone, averaged over the pairs."""
    totals = []
    for prompt, answer in zip(PAIRS["prompt"], PAIRS["chosen"], strict=True):
        prompt_ids = tokenizer(prompt)["input_ids"]
        answer_ids = [*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        ids = torch.tensor([prompt_ids + answer_ids])
        with torch.no_grad():
            logps = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        totals.append(logps[len(prompt_ids) - 1 :].sum().item())
    return sum(totals) / len(totals)
