"""The masked LM split by length (`experiments/inductive_masked_lm.py`, paper §5.2): the novel's sentences, the length
split and its held-out short sentences, a fresh seeded masked word every epoch, the metrics and their intervals, and
the script end to end on a tiny config, resuming from the models it saved."""

import json
import math
import runpy
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_recurrence.data import (
    WholeWordMaskedSentences,
    hold_out,
    minilm_tokenizer,
    pydoc_sentences,
    split_by_length,
    split_novel_sentences,
)

from ..common import installed_or_skip
from ..scripts import EXPERIMENTS, written


SCRIPT = EXPERIMENTS / "inductive_masked_lm.py"
SENTENCES = [
    "The family of Dashwood had long been settled in Sussex.",
    "Unbelievably, the interpreter tokenizes everything, doesn't it?",
    "She thought it would be something very fine indeed.",
    "What do you mean, Mr. Bennet, by such a remark?",
    "A complete change of life became desirable to them all.",
    "It will be no use to us, if twenty such should come.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return installed_or_skip(minilm_tokenizer)


@pytest.fixture
def script(monkeypatch):
    """The script's functions, loaded in this process (its `import _common` resolved from experiments/)."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    for name in ("_common", "render"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return runpy.run_path(str(SCRIPT))


def test_a_novels_sentences_keep_dialogue_and_titles():
    text = (
        'CHAPTER 1\n\n"You mistake me, my dear. I have a high respect for your nerves," replied he; '
        '"they are my _old_ friends."\n\nMr. Darcy smiled. No.\n\n"Ah, you do not know what I suffer!"'
    )
    assert split_novel_sentences(text) == [
        "You mistake me, my dear.",
        "I have a high respect for your nerves, replied he; they are my old friends.",
        "Mr. Darcy smiled.",
        "Ah, you do not know what I suffer!",
    ]


def test_the_length_split_respects_its_bounds_and_is_deterministic(tokenizer, script):
    args = SimpleNamespace(corpus="pydoc", max_train_sentences=None, max_eval_sentences=None)
    split = script["length_split"](args, tokenizer)
    assert split == script["length_split"](args, tokenizer)
    lengths = {
        name: [len(ids) for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"]]
        for name, sentences in split.items()
    }
    assert all(8 <= n <= 32 for n in lengths["train"] + lengths["short"])
    assert all(33 <= n <= 64 for n in lengths["long"])
    assert split["short"] and not set(split["short"]) & set(split["train"])
    short, long = split_by_length(pydoc_sentences(), tokenizer)
    assert sorted(split["train"] + split["short"]) == sorted(short) and split["long"] == long
    # A sentence is held out by its own text, whatever the others are.
    assert hold_out(list(reversed(short)))[1] == list(reversed(split["short"]))
    assert 0.05 < len(split["short"]) / len(short) < 0.15


def test_a_fresh_masked_word_every_epoch_seeded(tokenizer):
    first = WholeWordMaskedSentences(SENTENCES, tokenizer, seed=3, letters_only=True)
    epoch0 = [example["labels"] for example in first]
    first.set_epoch(1)
    epoch1 = [example["labels"] for example in first]
    assert epoch1 != epoch0
    again = WholeWordMaskedSentences(SENTENCES, tokenizer, seed=3, epoch=1, letters_only=True)
    assert [example["labels"] for example in again] == epoch1
    first.set_epoch(0)
    assert [example["labels"] for example in first] == epoch0
    # Epoch 0 draws as before the epochs existed; other seeds draw other words.
    assert epoch0 == [e["labels"] for e in WholeWordMaskedSentences(SENTENCES, tokenizer, seed=3, letters_only=True)]
    assert epoch0 != [e["labels"] for e in WholeWordMaskedSentences(SENTENCES, tokenizer, seed=4, letters_only=True)]
    for epoch in range(6):
        first.set_epoch(epoch)
        for example in first:
            pieces = tokenizer.convert_ids_to_tokens([label for label in example["labels"] if label != -100])
            assert pieces and any(c.isalpha() for piece in pieces for c in piece)


class HandMadeLogits(torch.nn.Module):
    """Stands in for a sparse-head model: the logits at the labelled positions are given rows of log-probabilities."""

    def __init__(self, rows: torch.Tensor):
        super().__init__()
        self.rows = rows

    def forward(self, input_ids, attention_mask, labels):
        return SimpleNamespace(logits=self.rows[: int((labels != -100).sum())])


def test_accuracy_and_perplexity_on_hand_made_logits(script):
    # Sentence 0: one masked piece, right with probability 1/2. Sentence 1: two pieces, the first right (0.4, the
    # argmax), the second wrong (the label 2 has 1/8, the argmax is token 3).
    dataset = [
        {"input_ids": [101, 103, 102], "attention_mask": [1, 1, 1], "labels": [-100, 1, -100]},
        {"input_ids": [101, 103, 103, 102], "attention_mask": [1, 1, 1, 1], "labels": [-100, 1, 2, -100]},
    ]
    # One row per labelled position, in row-major order.
    probabilities = torch.tensor([[0.2, 0.5, 0.1, 0.2], [0.2, 0.4, 0.2, 0.2], [0.1, 0.2, 0.125, 0.575]])
    model = HandMadeLogits(probabilities.log())
    args = SimpleNamespace(eval_batch_size=8, pad_token_id=0)
    evaluation = script["evaluate"](model, dataset, args)
    assert evaluation["length"] == [1, 2] and evaluation["pieces"] == [1, 2]
    assert evaluation["correct"] == [1, 0]
    assert evaluation["nll"] == pytest.approx([math.log(2), math.log(1 / 0.4) + math.log(8)], abs=1e-4)
    metrics = script["metric_intervals"](
        *(np.array(evaluation[key], dtype=float) for key in ("correct", "nll", "pieces")), 200, 0
    )
    assert metrics["accuracy"] == 0.5
    assert metrics["perplexity"] == pytest.approx(math.exp((math.log(2) + math.log(2.5) + math.log(8)) / 3), rel=1e-4)
    for key in ("accuracy", "perplexity"):
        assert metrics[f"{key}_low"] <= metrics[key] <= metrics[f"{key}_high"]


def test_intervals_contain_the_point_and_the_paired_difference_pairs(script):
    rng = np.random.default_rng(0)
    correct = (rng.random(400) < 0.3).astype(float)
    metrics = script["metric_intervals"](correct, rng.random(400) * 3, np.ones(400), 500, 1)
    assert metrics["accuracy_low"] < metrics["accuracy"] < metrics["accuracy_high"]
    assert metrics["accuracy_high"] - metrics["accuracy_low"] < 0.1
    assert metrics["perplexity_low"] < metrics["perplexity"] < metrics["perplexity_high"]
    # Right on the same sentences plus 40 more: a difference of exactly 0.1 whose paired interval excludes 0.
    better = correct.copy()
    better[np.flatnonzero(correct == 0)[:40]] = 1
    difference = script["paired_difference"](better, correct, 500, 2)
    assert difference["difference"] == pytest.approx(0.1)
    assert 0 < difference["low"] < 0.1 < difference["high"]
    same = script["paired_difference"](correct, correct, 100, 2)
    assert same["low"] == same["difference"] == same["high"] == 0
    with pytest.raises(ValueError, match="differ in size"):
        script["paired_difference"](correct, correct[:10], 10, 0)


TINY = [
    "--corpus", "pydoc", "--max-train-sentences", "48", "--max-eval-sentences", "16",
    "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2", "--intermediate-size", "32",
    "--steps", "3", "--batch-size", "8", "--eval-batch-size", "16", "--warmup-steps", "1", "--log-every", "1",
    "--bootstrap", "50", "--device", "cpu", "--threads", "1",
]  # fmt: skip


def test_the_runner_end_to_end_then_resumes_skipping_finished_models(tokenizer, tmp_path, monkeypatch, capsys):
    output = tmp_path / "mlm.json"
    arguments = [*TINY, "--work-dir", str(tmp_path / "runs"), "--output-json", str(output)]

    def run() -> str:
        monkeypatch.syspath_prepend(str(EXPERIMENTS))
        for name in ("_common", "render"):
            monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments])
        runpy.run_path(str(SCRIPT))["main"]()
        return capsys.readouterr().out

    printed = run()
    assert "I-BERT: step 3/3 epoch 0 loss" in printed and "steps/s" in printed and "min left" in printed
    recorded = written(output, EXPERIMENTS)
    assert recorded["values"]["finished"] and recorded["values"]["data"] == {"train": 48, "short": 16, "long": 16}
    assert [row[0] for row in recorded["tables"]["accuracy"]["rows"]] == ["I-BERT", "BERT", "I-BERT+PE"]
    assert {(c["label"], c["split"]) for c in recorded["values"]["comparisons"]} >= {("I-BERT − BERT", "long")}
    long = recorded["values"]["summaries"]["bert"]["long"]["all"]
    assert long["n"] == 16 and long["accuracy_low"] <= long["accuracy"] <= long["accuracy_high"]
    assert (tmp_path / "mlm.png").is_file()
    saved = json.loads((tmp_path / "runs" / "ibert.json").read_text())
    assert len(saved["evaluations"]["long"]["correct"]) == 16

    (tmp_path / "runs" / "bert.json").unlink()
    printed = run()
    assert "I-BERT: saved in" in printed and "I-BERT+PE: saved in" in printed
    assert "BERT: step 3/3" in printed and "I-BERT: step" not in printed
    again = json.loads(output.read_text())
    assert again["values"]["summaries"]["ibert"] == recorded["values"]["summaries"]["ibert"]

    arguments[arguments.index("--steps") + 1] = "2"  # other settings: every model trains again
    printed = run()
    assert "saved in" not in printed and "I-BERT: step 2/2" in printed


def test_a_run_of_other_settings_is_compared_on_the_same_sentences(tokenizer, tmp_path, monkeypatch, capsys):
    def run(*arguments: str) -> dict:
        output = tmp_path / "out.json"
        monkeypatch.syspath_prepend(str(EXPERIMENTS))
        for name in ("_common", "render"):
            monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *TINY, "--output-json", str(output), *arguments])
        runpy.run_path(str(SCRIPT))["main"]()
        return json.loads(output.read_text())

    run("--models", "ibert", "--work-dir", str(tmp_path / "main"))
    saved = str(tmp_path / "main" / "ibert.json")
    other = run(
        "--models", "bert", "--learning-rate", "5e-4", "--work-dir", str(tmp_path / "bert"), "--also-from", saved
    )
    assert [row[0] for row in other["tables"]["accuracy"]["rows"]] == ["BERT", "I-BERT (learning rate 0.001)"]
    labels = {(c["label"], c["split"]) for c in other["values"]["comparisons"]}
    assert ("I-BERT (learning rate 0.001) − BERT", "long") in labels
    assert other["values"]["finished"] and "Goal, I-BERT ahead of BERT" in other["text"]["verdict"][0]
    with pytest.raises(SystemExit, match="scored on other sentences"):
        run("--models", "bert", "--max-eval-sentences", "8", "--work-dir", str(tmp_path / "b"), "--also-from", saved)
    with pytest.raises(SystemExit, match="also trained by this run"):
        run("--models", "ibert", "--work-dir", str(tmp_path / "c"), "--also-from", saved)
