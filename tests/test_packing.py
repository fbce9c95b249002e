"""Packed sequences in every causal family: `position_ids` that restart at 0 (TRL's `SFTTrainer(packing=True)`,
transformers' `DataCollatorWithFlattening`) mark document boundaries, and each packed document reads exactly as if it
were run alone from a new state."""

import pytest
import torch

from .families import STATEFUL_FAMILIES, Family


# Re-read overlap where the family has one, so that a document's windows visibly start at its own first token.
OVERRIDES = {"recurrent_gpt2": {"window_overlap": 3}, "recurrent_llama": {"window_overlap": 3}}

# Several windows / segments of 8 tokens per document, and a document shorter than one.
ROW_LENGTHS = [[19, 5, 30, 1], [11, 23, 2, 17]]


@pytest.fixture(params=STATEFUL_FAMILIES, ids=lambda family: family.name)
def family(request) -> Family:
    return request.param


def make_model(family: Family):
    return family.head(**OVERRIDES.get(family.name, {}))


def random_documents(row_lengths: list[list[int]]) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [[torch.randint(1, 99, (n,), generator=generator) for n in lengths] for lengths in row_lengths]


def pack(rows: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, attention mask and position ids of the documents packed row by row, right-padded."""
    length = max(sum(len(doc) for doc in docs) for docs in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    positions = torch.zeros_like(ids)
    for row, docs in enumerate(rows):
        start = 0
        for doc in docs:
            stop = start + len(doc)
            ids[row, start:stop], mask[row, start:stop], positions[row, start:stop] = doc, 1, torch.arange(len(doc))
            start = stop
    return ids, mask, positions


def alone(model, rows: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Every document run alone from a new state: its logits, and the mean loss over all documents' targets."""
    logits, summed, count = [], 0.0, 0
    for docs in rows:
        logits.append([])
        for doc in docs:
            out = model(doc[None], labels=doc[None], return_logits=True, num_items_in_batch=1)
            logits[-1].append(out.logits[0])
            summed, count = summed + out.loss, count + len(doc) - 1
    return logits, summed / count


@pytest.mark.parametrize("layout", ["one_row", "two_rows"])
def test_packed_documents_equal_documents_alone(family, layout):
    model = make_model(family)
    rows = random_documents(ROW_LENGTHS)
    if layout == "one_row":
        # TRL's padding-free batch: every document in one row, no attention mask.
        rows = [[doc for docs in rows for doc in docs]]
    ids, mask, positions = pack(rows)
    attention_mask = None if layout == "one_row" else mask
    with torch.no_grad():
        expected_logits, expected_loss = alone(model, rows)
        # labels = input ids: the model itself drops the targets that cross a document boundary.
        packed = model(ids, attention_mask=attention_mask, position_ids=positions, labels=ids, return_logits=True)
        per_window_loss = model(ids, attention_mask=attention_mask, position_ids=positions, labels=ids).loss
        # TRL's fused LM head reads the backbone's hidden states and scores them itself.
        hidden = model.base_model(ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state
    head_logits = model.get_output_embeddings()(hidden)
    for row, docs in enumerate(rows):
        start = 0
        for doc, expected in zip(docs, expected_logits[row], strict=True):
            stop = start + len(doc)
            torch.testing.assert_close(packed.logits[row, start:stop], expected)
            torch.testing.assert_close(head_logits[row, start:stop], expected)
            start = stop
    torch.testing.assert_close(packed.loss, expected_loss)
    torch.testing.assert_close(per_window_loss, expected_loss)


def test_trl_labels_give_the_same_loss(family):
    # TRL's collator writes -100 as the label of every document's first token; nothing else changes.
    model = make_model(family)
    ids, _, positions = pack([[doc for docs in random_documents(ROW_LENGTHS) for doc in docs]])
    trl_labels = ids.masked_fill(positions == 0, -100)
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, position_ids=positions, labels=trl_labels).loss,
            model(ids, position_ids=positions, labels=ids).loss,
        )


def test_plain_position_ids_change_nothing(family):
    model = make_model(family)
    ids = torch.randint(1, 99, (2, 21))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    # As generate() would write them for a left-padded batch: counted over real tokens, 1 at padding.
    positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        torch.testing.assert_close(model(ids, attention_mask=mask, position_ids=positions).logits, expected)
        plain = model(ids[:1]).logits
        torch.testing.assert_close(model(ids[:1], position_ids=torch.arange(21)[None]).logits, plain)


@pytest.mark.parametrize(
    ("positions", "match"),
    [
        ([[0, 1, 3, 4, 5]], "column 2, position 3 follows 1"),
        ([[0, 1, 2, 2, 3]], "column 3, position 2 follows 2"),
        ([[0, 1, -1, 0, 1]], "column 2, position -1 follows 1"),
        ([[2, 3, 4, 5, 6]], "first position is 2 but no state passed as .* continues it"),
        ([0, 1, 2, 3, 4], r"must be \(batch, length\).*got shape \(5,\)"),
        ([[0, 1, 2, 3]], r"got shape \(1, 4\)"),
    ],
)
def test_other_position_ids_are_refused(family, positions, match):
    with pytest.raises(ValueError, match=match):
        make_model(family)(torch.randint(1, 99, (1, 5)), position_ids=torch.tensor(positions))


def test_state_continues_the_last_document(family):
    # Three documents in one row; the last goes on in the next call, whose positions continue it. 16 tokens of it
    # before the cut: Transformer-XL continues exactly on segment boundaries.
    model = make_model(family)
    first, second, last = random_documents([[13, 6, 23]])[0]
    ids, _, positions = pack([[first, second, last[:16]]])
    with torch.no_grad():
        state = model(ids, position_ids=positions).past_key_values
        continued = model(last[None, 16:], position_ids=torch.arange(16, 23)[None], past_key_values=state).logits
        expected = model(last[None]).logits[:, 16:]
    torch.testing.assert_close(continued, expected)


def test_position_zero_after_a_state_starts_a_new_document(family):
    model = make_model(family)
    earlier, doc = random_documents([[13, 21]])[0]
    with torch.no_grad():
        state = model(earlier[None]).past_key_values
        fresh = model(doc[None], position_ids=torch.arange(21)[None], past_key_values=state).logits
        expected = model(doc[None]).logits
    torch.testing.assert_close(fresh, expected)
