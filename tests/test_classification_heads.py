"""Sequence and token classification on the recurrent decoders: a document of any length is read window by window
(the state carried), and the sequence head scores its last non-padding token, as transformers' generic heads do."""

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    Trainer,
)

from hf_recurrence import (
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentLlamaForSequenceClassification,
)

from .common import (
    ACROSS_KERNELS,
    assert_loads_with_remote_code,
    tiny_training_arguments,
)
from .families import NAMED_DECODERS


PAD = 0
# (tiny config, sequence head, token head) of the named recurrent decoders, whose heads are transformers' generic ones.
HEADS = {family.name: (family.tiny_config, *family.other_heads) for family in NAMED_DECODERS}
by_family = pytest.mark.parametrize("family", list(HEADS))


def _model(family: str, head: int, **overrides):
    tiny_config, *classes = HEADS[family]
    torch.manual_seed(0)
    return classes[head](tiny_config(num_labels=3, pad_token_id=PAD, **overrides)).eval()


def _document(length: int = 50) -> torch.Tensor:
    """(2, length) ids far past the 16-entry position tables, the second row left-padded by 7."""
    ids = torch.randint(1, 99, (2, length), generator=torch.Generator().manual_seed(1))
    ids[1, :7] = PAD
    return ids


@by_family
def test_auto_classes_resolve_to_the_heads(family):
    tiny_config, sequence_class, token_class = HEADS[family]
    config = tiny_config(num_labels=3)
    assert type(AutoModelForSequenceClassification.from_config(config)) is sequence_class
    assert type(AutoModelForTokenClassification.from_config(config)) is token_class


@by_family
@pytest.mark.parametrize("overlap", [0, 3])
def test_sequence_head_scores_the_documents_last_token_after_reading_all_of_it(family, overlap):
    model = _model(family, 0, window_overlap=overlap)
    ids = _document()
    mask = (ids != PAD).long()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        hidden = model.base_model(ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(logits, model.score(hidden[:, -1]), rtol=1e-6, atol=1e-6)
        # The padded row equals the row alone, and right padding finds the same last token.
        torch.testing.assert_close(logits[1:], model(ids[1:, 7:]).logits, rtol=1e-5, atol=1e-5)
        right_padded = torch.cat([ids[1:, 7:], torch.full((1, 7), PAD)], dim=1)
        torch.testing.assert_close(
            model(right_padded, attention_mask=(right_padded != PAD).long()).logits, logits[1:], rtol=1e-5, atol=1e-5
        )
        # A document read in two calls carrying the state gives the same logits as one call.
        first = model(ids[:, :21], attention_mask=mask[:, :21])
        state = first.get("cache", first.get("past_key_values"))
        rest = model(ids[:, 21:], attention_mask=mask, cache=state)
        torch.testing.assert_close(rest.logits, logits, rtol=1e-5, atol=1e-5)
        # The head reads the whole document: its first token reaches the scores through the carried state (with a
        # recurrence that carries something: an untrained one starts near zero; without the state nothing changes).
        for parameter in model.base_model.recurrence.parameters():
            parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
        logits = model(ids, attention_mask=mask).logits
        changed = ids.clone()
        changed[0, 0] = changed[0, 0] % 98 + 1
        assert not torch.equal(model(changed, attention_mask=mask).logits[0], logits[0])


@by_family
def test_token_head_scores_every_token(family):
    model = _model(family, 1)
    ids = _document()
    mask = (ids != PAD).long()
    labels = torch.randint(0, 3, ids.shape)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, labels=labels)
        hidden = model.base_model(ids, attention_mask=mask).last_hidden_state
    assert out.logits.shape == (2, 50, 3)
    classifier = model.classifier if family == "recurrent_gpt2" else model.score
    torch.testing.assert_close(out.logits, classifier(hidden), rtol=1e-6, atol=1e-6)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1))
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("stock", "ours", "config"),
    [
        (GPT2ForSequenceClassification, RecurrentGPT2ForSequenceClassification, GPT2Config),
        (GPT2ForTokenClassification, RecurrentGPT2ForTokenClassification, GPT2Config),
        (LlamaForSequenceClassification, RecurrentLlamaForSequenceClassification, LlamaConfig),
    ],
    ids=lambda value: value.__name__,
)
def test_stock_classifier_checkpoint_loads_with_only_the_recurrence_new(stock, ours, config, tmp_path):
    sizes = {"vocab_size": 100, "num_labels": 3, "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": 2}
    if config is GPT2Config:
        sizes |= {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 16}
    else:
        sizes |= {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
        sizes |= {"num_key_value_heads": 2, "max_position_embeddings": 16}
    torch.manual_seed(0)
    stock_model = stock(config(**sizes)).eval()
    stock_model.save_pretrained(tmp_path)
    model, info = ours.from_pretrained(tmp_path, window_size=16, insertion_layer=1, output_loading_info=True)
    assert not info["unexpected_keys"]
    assert info["missing_keys"] and all(".recurrence." in key for key in info["missing_keys"])
    # Within the first window there is no h_prev: the stock model's scores.
    ids = torch.randint(3, 100, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, stock_model(ids).logits, **ACROSS_KERNELS)


@by_family
def test_trainer_fine_tunes_the_sequence_head_and_compute_metrics_gets_scores(family, tmp_path):
    assert_trainer_fine_tunes_the_sequence_head(_model(family, 0), tmp_path)


def assert_trainer_fine_tunes_the_sequence_head(model, tmp_path) -> None:
    """The stock Trainer trains `model` (3 labels, a `score` layer) on documents of 40 tokens, and compute_metrics
    gets only the scores (the state is left out of the gathered predictions); shared with the recurrence core's
    tests."""

    class Documents(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(1, 99, (40,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": torch.tensor(i % 3)}

    seen = {}

    def compute_metrics(prediction) -> dict:
        seen["shape"] = np.asarray(prediction.predictions).shape
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    before = model.score.weight.detach().clone()
    args = tiny_training_arguments(tmp_path, per_device_eval_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=Documents(), compute_metrics=compute_metrics)
    trainer.train()
    metrics = trainer.evaluate(Documents())
    assert not torch.equal(model.score.weight, before)
    assert seen["shape"] == (8, 3) and "eval_accuracy" in metrics


@pytest.mark.remote_code
@by_family
def test_heads_load_as_remote_code_in_a_fresh_interpreter(family, tmp_path):
    assert_sequence_head_loads_as_remote_code(
        _model(family, 0),
        _document(),
        tmp_path,
        checks="""
token_model = transformers.AutoModelForTokenClassification.from_pretrained(model.name_or_path, trust_remote_code=True)
assert type(token_model).__name__.endswith("ForTokenClassification"), type(token_model)
""",
    )


def assert_sequence_head_loads_as_remote_code(model, document: torch.Tensor, tmp_path, checks: str) -> None:
    """`assert_loads_with_remote_code` for a sequence head on a left-padded `document` (the mask from `PAD`)."""
    inputs = {"input_ids": document, "attention_mask": (document != PAD).long()}
    assert_loads_with_remote_code(model, inputs, tmp_path, "AutoModelForSequenceClassification", checks=checks)
