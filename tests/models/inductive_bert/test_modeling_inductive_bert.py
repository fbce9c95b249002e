"""I-BERT architecture: no position embeddings, any length, order through the LSTM, padding-invariance, switches."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError
from torch import nn

from hf_recurrence import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    InductiveBertConfig,
)

from ...common import tiny_inductive_bert_config


def parameter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def test_no_position_embeddings_by_default():
    model = IBertModel(tiny_inductive_bert_config())
    assert not any("position" in name for name in parameter_names(model))
    assert not any("position" in name for name, _ in model.named_buffers())
    assert sum(isinstance(m, nn.LSTM) for m in model.modules()) == 1
    lstm = model.embeddings.lstm
    assert lstm.bidirectional and lstm.hidden_size == 16 and lstm.batch_first


@pytest.mark.parametrize("length", [5, 4000])
def test_inputs_of_any_length_run(length):
    config = tiny_inductive_bert_config(max_position_embeddings=16)
    model = IBertForMaskedLM(config).eval()
    ids = torch.randint(1, 99, (1, length))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, length, 99)
    assert torch.isfinite(logits).all()


def test_reordering_tokens_changes_the_output():
    model = IBertModel(tiny_inductive_bert_config()).eval()
    ids = torch.randint(1, 99, (1, 12))
    shuffled = ids[:, torch.randperm(12)]
    assert not torch.equal(ids, shuffled)
    with torch.no_grad():
        pooled = model(ids).last_hidden_state.mean(dim=1)
        pooled_shuffled = model(shuffled).last_hidden_state.mean(dim=1)
    # Without the LSTM, BERT without positions is permutation-equivariant and the mean would be unchanged.
    assert (pooled - pooled_shuffled).abs().max() > 1e-3


def test_position_embeddings_switch_adds_a_bounded_table():
    config = tiny_inductive_bert_config(use_position_embeddings=True, max_position_embeddings=16)
    model = IBertModel(config).eval()
    assert model.embeddings.position_embeddings.weight.shape == (16, 32)
    assert model(torch.randint(1, 99, (2, 16))).last_hidden_state.shape == (2, 16, 32)
    with pytest.raises(ValueError, match="17 tokens exceeds max_position_embeddings=16"):
        model(torch.randint(1, 99, (1, 17)))


def test_position_ids_without_position_embeddings_are_refused():
    model = IBertModel(tiny_inductive_bert_config())
    with pytest.raises(ValueError, match="use_position_embeddings=False"):
        model(torch.randint(1, 99, (1, 4)), position_ids=torch.arange(4)[None])


def test_four_dimensional_attention_masks_are_refused():
    model = IBertModel(tiny_inductive_bert_config())
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 4, 4\)"):
        model(torch.randint(1, 99, (1, 4)), attention_mask=torch.ones(1, 1, 4, 4))


@pytest.mark.parametrize("mask_shape", [(1, 6), (4, 5), (4, 7)])
def test_attention_masks_of_another_shape_than_the_input_are_refused(mask_shape):
    # A (1, seq) mask with padding once broadcast through the LSTM packing and returned a single row for four.
    model = IBertModel(tiny_inductive_bert_config())
    mask = torch.ones(mask_shape, dtype=torch.long)
    mask[:, -2:] = 0
    with pytest.raises(ValueError, match=rf"input's shape \(4, 6\), got shape \({mask_shape[0]}, {mask_shape[1]}\)"):
        model(torch.randint(1, 99, (4, 6)), attention_mask=mask)


def test_lstm_feed_forward_switch_puts_an_lstm_in_every_layer():
    model = IBertModel(tiny_inductive_bert_config(num_hidden_layers=3, lstm_feed_forward=True))
    assert sum(isinstance(m, nn.LSTM) for m in model.modules()) == 1 + 3
    for layer in model.encoder.layer:
        assert isinstance(layer.output.lstm, nn.LSTM)
        # The paper's I-BERT2 replaces the feed-forward network; it does not add to it.
        assert not hasattr(layer, "intermediate")
    assert model(torch.randint(1, 99, (2, 7))).last_hidden_state.shape == (2, 7, 32)


def padded_batch(rows: list[torch.Tensor], left: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (row, on_left) in enumerate(zip(rows, left, strict=True)):
        span = slice(width - len(row), width) if on_left else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


@pytest.mark.parametrize("lstm_feed_forward", [False, True], ids=["ibert", "ibert2"])
def test_padded_batch_equals_each_row_alone(lstm_feed_forward):
    model = IBertModel(tiny_inductive_bert_config(lstm_feed_forward=lstm_feed_forward)).eval()
    rows = [torch.randint(1, 99, (n,)) for n in (9, 4, 6, 1)]
    ids, mask = padded_batch(rows, left=[False, True, False, True])
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).last_hidden_state
        for i, row in enumerate(rows):
            alone = model(row[None]).last_hidden_state[0]
            torch.testing.assert_close(batched[i][mask[i].bool()], alone, rtol=1e-5, atol=1e-5)


def test_padding_in_the_middle_and_all_padding_rows():
    model = IBertModel(tiny_inductive_bert_config()).eval()
    ids = torch.randint(1, 99, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, 2:5] = 0
    mask[2] = 0
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).last_hidden_state
        alone = model(ids[0:1, mask[0].bool()]).last_hidden_state[0]
        embeddings = model.embeddings(ids, padding_mask=mask)
    torch.testing.assert_close(batched[0][mask[0].bool()], alone, rtol=1e-5, atol=1e-5)
    # Padding positions leave the LSTM as zeros, so after LayerNorm they equal its bias.
    torch.testing.assert_close(embeddings[2], model.embeddings.LayerNorm.bias.expand(8, -1))
    assert torch.isfinite(batched).all()


class MaskedLMLogits(nn.Module):
    """The head as a tracer takes it: tensors in, logits out."""

    def __init__(self, model: IBertForMaskedLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, attention_mask=attention_mask).logits


def test_tracing_with_an_attention_mask_is_refused_and_without_one_matches_eager():
    model = MaskedLMLogits(IBertForMaskedLM(tiny_inductive_bert_config()).eval())
    ids, mask = padded_batch([torch.randint(1, 99, (n,)) for n in (6, 3)], left=[False, True])
    with torch.no_grad(), pytest.raises(RuntimeError, match="cannot be exported or traced with an attention_mask"):
        torch.jit.trace(model, (ids, mask))
    # The packing plan is the only value-dependent step: a trace of unpadded input holds for other ids.
    with torch.no_grad():
        traced = torch.jit.trace(model, (torch.randint(1, 99, (2, 6)),))
        other = torch.randint(1, 99, (2, 6))
        torch.testing.assert_close(traced(other), model(other))


@pytest.mark.parametrize(
    ("model_class", "shape"),
    [
        (IBertModel, (2, 7, 32)),
        (IBertForMaskedLM, (2, 7, 99)),
        (IBertForSequenceClassification, (2, 3)),
        (IBertForTokenClassification, (2, 7, 3)),
    ],
)
def test_forward_shapes_and_hidden_states(model_class, shape):
    model = model_class(tiny_inductive_bert_config(num_labels=3)).eval()
    outputs = model(torch.randint(1, 99, (2, 7)), output_hidden_states=True)
    main = outputs.last_hidden_state if model_class is IBertModel else outputs.logits
    assert main.shape == shape
    # The embedding output (after the LSTM) plus one per layer.
    assert len(outputs.hidden_states) == 3


@pytest.mark.parametrize(
    ("model_class", "labels"),
    [
        (IBertForMaskedLM, torch.randint(1, 99, (2, 7))),
        (IBertForSequenceClassification, torch.tensor([0, 2])),
        (IBertForTokenClassification, torch.randint(0, 3, (2, 7))),
    ],
)
def test_loss_reaches_every_parameter_including_the_lstm(model_class, labels):
    model = model_class(tiny_inductive_bert_config(num_labels=3, lstm_feed_forward=True))
    loss = model(torch.randint(1, 99, (2, 7)), labels=labels).loss
    assert torch.isfinite(loss)
    loss.backward()
    unused = (
        {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
        if model_class is not IBertForSequenceClassification
        else set()
    )
    no_grad = [name for name, p in model.named_parameters() if p.grad is None and name not in unused]
    assert no_grad == []
    assert model.bert.embeddings.lstm.weight_hh_l0_reverse.grad.abs().sum() > 0


def test_masked_lm_head_is_tied_to_the_word_embeddings():
    model = IBertForMaskedLM(tiny_inductive_bert_config())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def masked_lm_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows of 11 tokens, the last two rows right-padded, with a few labelled positions per row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, (3, 11), generator=generator)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 8:] = attention_mask[2, 5:] = 0
    labels = torch.full_like(ids, -100)
    for row, positions in enumerate(([0, 3, 10], [2, 7], [4])):
        labels[row, positions] = torch.randint(1, 99, (len(positions),), generator=generator)
    return {"input_ids": ids, "attention_mask": attention_mask, "labels": labels}


def test_sparse_prediction_gives_the_full_heads_loss_and_gradients():
    torch.manual_seed(0)
    full = IBertForMaskedLM(tiny_inductive_bert_config()).eval()
    sparse = IBertForMaskedLM(tiny_inductive_bert_config(sparse_prediction=True)).eval()
    sparse.load_state_dict(full.state_dict())
    batch = masked_lm_batch()
    labelled = batch["labels"] != -100

    full_output, sparse_output = full(**batch), sparse(**batch)
    assert sparse_output.logits.shape == (int(labelled.sum()), 99)
    torch.testing.assert_close(sparse_output.logits, full_output.logits[labelled])
    torch.testing.assert_close(sparse_output.loss, full_output.loss)
    # Trainer passes the batch's label count for gradient accumulation; the sum over it is the same too.
    count = torch.tensor(17)
    torch.testing.assert_close(
        sparse(**batch, num_items_in_batch=count).loss, full(**batch, num_items_in_batch=count).loss
    )

    full_output.loss.backward()
    sparse_output.loss.backward()
    full_gradients = dict(full.named_parameters())
    for name, parameter in sparse.named_parameters():
        torch.testing.assert_close(parameter.grad, full_gradients[name].grad, msg=name)


def test_sparse_prediction_is_off_by_default_and_needs_labels():
    torch.manual_seed(0)
    model = IBertForMaskedLM(tiny_inductive_bert_config()).eval()
    assert model.config.sparse_prediction is False
    batch = masked_lm_batch()
    output = model(**batch)
    # The default head: logits at every position, and the loss over the labelled ones.
    assert output.logits.shape == (3, 11, 99)
    with torch.no_grad():
        hidden = model.bert(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        torch.testing.assert_close(output.logits, model.cls(hidden))
    expected = nn.functional.cross_entropy(output.logits.view(-1, 99), batch["labels"].view(-1))
    torch.testing.assert_close(output.loss, expected)
    # Without labels there is nothing to select: sparse_prediction returns every position's logits.
    sparse = IBertForMaskedLM(tiny_inductive_bert_config(sparse_prediction=True)).eval()
    sparse.load_state_dict(model.state_dict())
    unlabelled = sparse(batch["input_ids"], batch["attention_mask"])
    assert unlabelled.loss is None
    torch.testing.assert_close(unlabelled.logits, output.logits)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = IBertForMaskedLM(tiny_inductive_bert_config(lstm_feed_forward=True))
    ids = torch.randint(1, 99, (2, 9))

    def lstm_gradient() -> torch.Tensor:
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return model.bert.embeddings.lstm.weight_ih_l0.grad.clone()

    model.train()
    reference = lstm_gradient()
    model.activation_checkpointing_enable()
    assert model.bert.encoder.layer[0].gradient_checkpointing
    torch.testing.assert_close(lstm_gradient(), reference)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 33, "num_attention_heads": 3}, "hidden_size=33"),
        ({"hidden_size": 30, "num_attention_heads": 4}, "num_attention_heads=4"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
        ({"use_position_embeddings": True, "max_position_embeddings": 0}, "max_position_embeddings=0"),
        ({"type_vocab_size": 0}, "type_vocab_size=0"),
        ({"is_decoder": True}, "is_decoder=True"),
        ({"add_cross_attention": True}, "add_cross_attention=True"),
    ],
)
def test_invalid_config_values_raise_naming_field_and_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_inductive_bert_config(**overrides)


@pytest.mark.parametrize(("name", "value"), [("use_position_embeddings", 1), ("lstm_feed_forward", "yes")])
def test_switches_must_be_booleans(name, value):
    with pytest.raises(StrictDataclassFieldValidationError, match=f"{name}.*{value!r}"):
        tiny_inductive_bert_config(**{name: value})


def test_config_changed_after_construction_is_checked_again():
    config = tiny_inductive_bert_config()
    config.hidden_size = 31
    with pytest.raises(ValueError, match="hidden_size"):
        IBertModel(config)


def test_config_defaults_and_auto_map():
    config = InductiveBertConfig()
    assert config.model_type == "inductive_bert"
    assert config.use_position_embeddings is False and config.lstm_feed_forward is False
    assert config.sparse_prediction is False
    assert set(config.auto_map) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForMaskedLM",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
    }
