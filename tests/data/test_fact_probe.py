"""The planted-name probe's data: `FactProbe` (the scored examples) and `FactProbeCurriculum` (the same task as a
training set: the plant moved from window 1's end towards its start as training goes on, mixed with LM blocks)."""

import math
import tempfile
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer

from hf_recurrence.data.fact_probe import PLANT, FactProbe, FactProbeCurriculum, _read_as_text
from hf_recurrence.experiments.training import short_run_arguments

from ..common import TINY_LLAMA, stdlib_tokenizer


WINDOW = 40


@pytest.fixture(scope="module")
def tokenizer():
    return stdlib_tokenizer()


def random_stream(seed: int, length: int = 6000) -> list[int]:
    """Random token ids of the tiny tokenizer's vocabulary (never the special id 0)."""
    return torch.randint(1, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _planted_at(ids: list[int], planted: list[int]) -> int:
    """Where `planted` starts in window 1 of `ids` (exactly once)."""
    starts = [i for i in range(WINDOW - len(planted) + 1) if ids[i : i + len(planted)] == planted]
    assert len(starts) == 1
    return starts[0]


def test_the_curriculum_plants_next_to_the_boundary_first_and_anywhere_in_window_one_last(tokenizer):
    reaches = (0.125, 0.25, 0.5, 1.0)
    data = FactProbeCurriculum(random_stream(0), tokenizer, WINDOW, num_examples=400, reaches=reaches, seed=3)
    ask, period = data.planter.ask, data.planter.period
    bounds, seen = [], [[] for _ in reaches]
    for i in range(len(data)):
        stage = i * len(reaches) // len(data)  # equal shares, in order
        assert data.reach(i) == reaches[stage]
        example = data.draw(i)
        name_ids = data.planter.name_ids(example["name"])
        first_text, _ = data.planter.text_tokens(name_ids)
        bound = math.ceil(reaches[stage] * first_text)
        assert 0 <= example["distance"] <= bound
        # The planted sentence really ends `distance` text tokens before window 1 ends.
        planted = ask + name_ids + period
        ids = example["input_ids"].tolist()
        assert _planted_at(ids, planted) + len(planted) == WINDOW - example["distance"]
        seen[stage].append(example["distance"])
        bounds.append((stage, bound))
    # The range widens stage by stage, and the last stage reaches the whole of window 1's text.
    assert [max(distances) for distances in seen] == sorted(max(distances) for distances in seen)
    assert max(seen[0]) < max(seen[-1])
    assert max(seen[-1]) > 0.8 * max(bound for stage, bound in bounds if stage == len(reaches) - 1)
    # Reproducible by seed, in any order of access; another seed draws other examples.
    again = FactProbeCurriculum(random_stream(0), tokenizer, WINDOW, num_examples=400, reaches=reaches, seed=3)
    assert torch.equal(again[399]["input_ids"], data[399]["input_ids"])
    assert [e["input_ids"].tolist() for e in list(again)[:5]] == [data[i]["input_ids"].tolist() for i in range(5)]
    other = FactProbeCurriculum(random_stream(0), tokenizer, WINDOW, num_examples=400, reaches=reaches, seed=4)
    assert not torch.equal(other[0]["input_ids"], data[0]["input_ids"])
    # The Trainer serves the examples in order (it would shuffle a map-style dataset, scrambling the stages).
    with tempfile.TemporaryDirectory() as scratch:
        settings = SimpleNamespace(max_steps=2, batch_size=4, learning_rate=1e-3, warmup_steps=0, seed=0)
        trainer = Trainer(
            model=LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)), args=short_run_arguments(scratch, settings)
        )
        trainer.train_dataset = data
        served = [batch["input_ids"] for _, batch in zip(range(3), trainer.get_train_dataloader(), strict=False)]
    assert torch.equal(torch.cat(served), torch.stack([data[i]["input_ids"] for i in range(12)]))
    # Fresh names: nearly every example has its own.
    names = [data.draw(i)["name"] for i in range(100)]
    assert len(set(names)) > 90


def test_a_group_size_makes_each_batch_all_probes_or_all_text(tokenizer):
    data = FactProbeCurriculum(random_stream(1), tokenizer, WINDOW, num_examples=32, probe_fraction=0.5, group_size=4)
    kinds = [data.draw(i)["probe"] for i in range(len(data))]
    assert kinds == ([False] * 4 + [True] * 4) * 4
    quarter = FactProbeCurriculum(random_stream(1), tokenizer, WINDOW, 32, probe_fraction=0.25, group_size=4)
    assert [quarter.draw(i)["probe"] for i in range(0, 32, 4)] == [False, False, False, True] * 2
    with pytest.raises(ValueError, match="group_size=0"):
        FactProbeCurriculum(random_stream(1), tokenizer, WINDOW, 8, group_size=0)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_the_probe_fraction_holds_in_every_batch_and_lm_blocks_are_labelled_everywhere(tokenizer, fraction):
    stream = random_stream(1)
    data = FactProbeCurriculum(stream, tokenizer, WINDOW, num_examples=64, probe_fraction=fraction)
    kinds = [data.draw(i)["probe"] for i in range(len(data))]
    for first in range(0, 64, 8):
        assert sum(kinds[first : first + 8]) == round(8 * fraction)
    text = "," + ",".join(map(str, stream)) + ","
    for i, probe in enumerate(kinds):
        example = data[i]
        ids, labels = example["input_ids"], example["labels"]
        assert ids.shape == labels.shape == (2 * WINDOW,)
        if probe:
            name_ids = data.planter.name_ids(data.draw(i)["name"])
            assert (labels != -100).sum() == len(name_ids) and (
                labels[-len(name_ids) :] == ids[-len(name_ids) :]
            ).all()
        else:  # two windows of the stream, every label on
            assert torch.equal(labels, ids)
            assert "," + ",".join(map(str, ids.tolist())) + "," in text
    with pytest.raises(ValueError, match="probe_fraction must lie in"):
        FactProbeCurriculum(stream, tokenizer, WINDOW, 8, probe_fraction=1.5)
    with pytest.raises(ValueError, match="reaches must be increasing"):
        FactProbeCurriculum(stream, tokenizer, WINDOW, 8, reaches=(0.5, 0.25))


def test_fact_probe_records_how_far_before_the_boundary_each_name_was_planted(tokenizer):
    probe = FactProbe(random_stream(2), tokenizer, WINDOW, num_examples=20, seed=0)
    ask = tokenizer(PLANT, add_special_tokens=False)["input_ids"]
    period = tokenizer(".", add_special_tokens=False)["input_ids"]
    for example, name, distance in zip(probe.examples, probe.names, probe.distances, strict=True):
        planted = ask + tokenizer(" " + name, add_special_tokens=False)["input_ids"] + period
        assert _planted_at(example["input_ids"].tolist(), planted) + len(planted) == WINDOW - distance


def test_longer_blocks_lead_with_running_text_and_plant_the_name_one_boundary_before_the_question(tokenizer):
    stream = random_stream(3)
    text = "," + ",".join(map(str, stream)) + ","
    data = FactProbeCurriculum(stream, tokenizer, WINDOW, num_examples=32, probe_fraction=0.5, windows=4)
    two = FactProbeCurriculum(stream, tokenizer, WINDOW, num_examples=32, probe_fraction=0.5)
    planted_ask, period = data.planter.ask, data.planter.period
    for i in range(len(data)):
        example = data.draw(i)
        ids, labels = example["input_ids"], example["labels"]
        assert ids.shape == labels.shape == (4 * WINDOW,)
        if not example["probe"]:  # four consecutive windows of the stream, every label on
            assert torch.equal(labels, ids)
            assert "," + ",".join(map(str, ids.tolist())) + "," in text
            continue
        name_ids = data.planter.name_ids(example["name"])
        # Only the name at the end of window 4 is labelled; windows 1-2 are the stream's text just before window 3's.
        assert (labels != -100).sum() == len(name_ids) and torch.equal(labels[-len(name_ids) :], ids[-len(name_ids) :])
        planted = planted_ask + name_ids + period
        last_two = ids[2 * WINDOW :].tolist()
        assert _planted_at(last_two, planted) + len(planted) == WINDOW - example["distance"]
        plant_window = last_two[:WINDOW]
        start = _planted_at(last_two, planted)
        window_text = plant_window[:start] + plant_window[start + len(planted) :]
        assert "," + ",".join(map(str, ids[: 2 * WINDOW].tolist() + window_text)) + "," in text
        # The same name as the two-window curriculum draws for example i (one generator per example, the name first).
        assert example["name"] == two.draw(i)["name"]
    with pytest.raises(ValueError, match="windows must be an integer of at least 2"):
        FactProbeCurriculum(stream, tokenizer, WINDOW, 8, windows=1)


@pytest.mark.parametrize("recurrent", [True, False])
def test_with_window_start_ids_the_probe_is_read_as_the_book_runs_read_text(tokenizer, recurrent):
    # Gemma's <bos> before every window (`window_start="text_start"`): a recurrent model reads both windows each begun
    # by the start ids, a stock model window 2 alone after them; the start ids predict nothing, the name stays labelled.
    probe = FactProbe(random_stream(4), tokenizer, WINDOW, num_examples=3)
    starts = (301, 302)
    ids, labels = _read_as_text(probe.examples, WINDOW, recurrent, starts)
    windows = 2 if recurrent else 1
    assert ids.shape == labels.shape == (3, windows * (len(starts) + WINDOW))
    for row, example in enumerate(probe.examples):
        read = [example["input_ids"][k * WINDOW : (k + 1) * WINDOW] for k in range(2)][-windows:]
        expected = torch.cat([torch.cat([torch.tensor(starts), window]) for window in read])
        assert torch.equal(ids[row], expected)
        assert (labels[row].view(windows, -1)[:, : len(starts)] == -100).all()
        name = example["labels"][example["labels"] != -100]
        labelled = labels[row] != -100
        assert torch.equal(labels[row][labelled], name)  # the name's tokens, and only they, labelled
        assert torch.equal(ids[row][labelled], name)  # where the name is read
    # Without start ids a stock model reads window 2 exactly as it is.
    bare_ids, bare_labels = _read_as_text(probe.examples, WINDOW, recurrent, ())
    assert torch.equal(bare_ids, torch.stack([e["input_ids"] for e in probe.examples])[:, -windows * WINDOW :])
    assert torch.equal(bare_labels, torch.stack([e["labels"] for e in probe.examples])[:, -windows * WINDOW :])
