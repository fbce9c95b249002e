"""Gate 2 of the memory (`hf_recurrence.experiments.memory_gate2`, `experiments/memory_gate2.py`): held-out examples
from the validation book only, the arms, the goal lines, the pace lines, and the script end to end on a tiny Llama
with a tiny tokenizer, resumed per arm."""

import json
import math
import runpy
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence.data.books import Book
from hf_recurrence.data.fact_probe import FactProbe, FactProbeCurriculum
from hf_recurrence.experiments import memory_gate2
from hf_recurrence.experiments.memory_gate2 import DEFAULT_ARMS, gate2_streams, goal_lines, parse_arms
from hf_recurrence.experiments.training import RunProgress
from hf_recurrence.outputs import UsageError

from ..common import TINY_LLAMA, stdlib_tokenizer
from ..data.test_fact_probe import WINDOW, random_stream
from ..scripts import EXPERIMENTS, written


@pytest.fixture(scope="module")
def tokenizer():
    return stdlib_tokenizer()


def _running_text(ids: list[int], name_ids: list[int], distance: int, planter) -> list[list[int]]:
    """The stretches of running text of a probe example: window 1 around the plant, window 2 before the question."""
    window = planter.window_size
    planted = len(planter.ask) + len(name_ids) + len(planter.period)
    end = window - distance
    question = len(planter.ask) + len(name_ids)
    return [ids[: end - planted], ids[end:window], ids[window : 2 * window - question]]


def _ngrams(stretches: list[list[int]], n: int = 6) -> set[tuple[int, ...]]:
    return {tuple(s[i : i + n]) for s in stretches for i in range(len(s) - n + 1)}


def test_held_out_examples_come_from_the_validation_book_and_share_no_text_with_training(tokenizer, monkeypatch):
    asked = []

    def split(name: str) -> list[Book]:
        asked.append(name)
        words = {"train": "apple pear plum fig", "validation": "river hill moor dale"}[name].split()
        generator = torch.Generator().manual_seed(len(name))
        text = " ".join(words[i] + str(int(j)) for i, j in torch.randint(0, 4, (3000, 2), generator=generator))
        return [Book(title=f"{name} book", text=text)]

    monkeypatch.setattr(memory_gate2, "austen_split", split)
    train_stream, held_out_stream, titles = gate2_streams(tokenizer)
    assert sorted(asked) == ["train", "validation"]  # never the test books
    assert titles == {"train": ["train book"], "validation": ["validation book"]}
    window = 64  # room for running text beside the tiny tokenizer's long planted sentence
    train = FactProbeCurriculum(train_stream, tokenizer, window, num_examples=200, probe_fraction=0.5)
    held_out = FactProbe(held_out_stream, tokenizer, window, num_examples=40, seed=1)
    planter = train.planter
    training_text = set()
    for i in range(len(train)):
        example = train.draw(i)
        ids = example["input_ids"].tolist()
        if example["probe"]:
            training_text |= _ngrams(
                _running_text(ids, planter.name_ids(example["name"]), example["distance"], planter)
            )
        else:
            training_text |= _ngrams([ids])
    for example, name, distance in zip(held_out.examples, held_out.names, held_out.distances, strict=True):
        stretches = _running_text(example["input_ids"].tolist(), planter.name_ids(name), distance, planter)
        assert sum(map(len, stretches)) > window  # text enough to compare
        assert not _ngrams(stretches) & training_text


def test_arms_are_presets_json_settings_or_zero_input_twins():
    arms = parse_arms(["paper", "attention", "attention-zeros", 'k2={"memory_slots": 2}', "k2-zeros"])
    assert arms["paper"] == {} and arms["attention"]["memory_read_layers"] == "all"
    assert arms["attention-zeros"] == {**arms["attention"], "recurrence_input": "zeros"}
    assert parse_arms(["select"])["select"] == {**arms["attention"], "memory_pooling": "select"}
    assert arms["k2-zeros"] == {"memory_slots": 2, "recurrence_input": "zeros"}
    for specs, message in [
        (["k2-zeros"], "no preset"),
        (["x={not json}"], "is not JSON"),
        (["x=[1]"], "must be a JSON object"),
        (["paper", "paper"], "given twice"),
        (["a/b={}"], "an arm's name"),
        (
            ['x={"memory_slot": 2}'],
            r"arm 'x': \['memory_slot'\] are not recurrence settings; these are: .*memory_slots",
        ),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_arms(specs)


def _arm(recall: float, swapped_recall: float, nats: float, low: float, zeros: bool = False) -> dict:
    return {
        "recurrence": {"recurrence_input": "zeros"} if zeros else {},
        "own": {"recalled": recall},
        "swapped": {"recalled": swapped_recall},
        "swapped_minus_own": {"nats": nats, "low": low, "high": nats + 1, "num_examples": 256},
    }


def test_goal_lines_fail_where_a_goal_is_not_reached():
    lines = goal_lines(
        {
            "good": _arm(0.40, 0.0, 2.5, 1.5),
            "go-on": _arm(0.15, 0.0, 1.5, 0.5),
            "noisy": _arm(0.40, 0.01, 2.5, -0.1),  # the interval holds 0
            "control": _arm(1 / 256, 0.0, 0.0, 0.0, zeros=True),
        }
    )
    verdicts = {line.split(":")[0]: line.split()[0] for line in lines}

    def verdict(start: str) -> str:
        (match,) = [
            v for goal, v in verdicts.items() if goal.startswith(f"PASS {start}") or goal.startswith(f"FAIL {start}")
        ]
        return match

    assert verdict("good exact name recall >= 30%") == "PASS"
    assert verdict("good swapped - own name NLL >= +2 nats") == "PASS"
    assert verdict("go-on exact name recall >= 30%") == "FAIL"
    assert verdict("go-on exact name recall >= 10%") == "PASS"
    assert verdict("go-on swapped - own name NLL >= +2 nats") == "FAIL"
    assert verdict("go-on swapped - own name NLL >= +1 nats") == "PASS"
    assert verdict("noisy swapped - own name NLL >= +2 nats") == "FAIL"
    assert verdict("noisy swapped - own name NLL >= +1 nats") == "FAIL"
    assert verdict("noisy with another example's memory recalls 0%") == "FAIL"
    assert verdict("control (zero input) recalls 0%") == "FAIL"
    assert len(lines) == 3 * 5 + 1


@pytest.mark.parametrize("resumed_at, reported", [(0, ["10", "25", "50", "75"]), (40, ["50", "75"])])
def test_progress_reports_the_pace_every_n_steps(capsys, resumed_at, reported):
    # A training resumed from a checkpoint at step 40 reports its first pace 10 steps into the sitting.
    pace = RunProgress(["a", "b"], steps_per_training=100, every=25).start("a")
    pace.on_train_begin(None, SimpleNamespace(global_step=resumed_at), None)
    for step in range(resumed_at + 1, 101):
        pace.on_step_end(None, SimpleNamespace(global_step=step, max_steps=100), None)
    lines = [line for line in capsys.readouterr().out.splitlines() if "s a step after" in line]
    assert [line.split("after ")[1].split(" steps")[0] for line in lines] == reported
    assert all("of training left in this run" in line for line in lines)


def _script_main(monkeypatch, arguments: list[str]):
    """`experiments/memory_gate2.py`'s main, run in this process with `arguments` as its command line."""
    script = EXPERIMENTS / "memory_gate2.py"
    monkeypatch.syspath_prepend(str(script.parent))
    for name in ("_common", "render"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "argv", [str(script), *arguments])
    return runpy.run_path(str(script))["main"]


def test_the_script_runs_every_arm_end_to_end_and_a_second_run_resumes(tokenizer, tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    config = {**TINY_LLAMA, "vocab_size": len(tokenizer), "max_position_embeddings": WINDOW}
    llama = LlamaForCausalLM(LlamaConfig(**config)).eval()
    streams = (random_stream(5), random_stream(6, 2000))
    output = tmp_path / "gate2.json"
    arguments = [
        *("--arms", *DEFAULT_ARMS),
        *("--max-steps", "2", "--batch-size", "2", "--window-size", str(WINDOW), "--held-out", "4"),
        *("--probe-fraction", "0.5", "--device", "cpu", "--threads", "1"),
        *("--work-dir", str(tmp_path / "work"), "--output-json", str(output)),
    ]
    main = _script_main(monkeypatch, arguments)
    main(arguments, model=(llama, tokenizer), streams=streams)
    recorded = written(output, EXPERIMENTS)
    arms = recorded["values"]["arms"]
    assert list(arms) == ["paper", "select", "select-zeros"]
    # "all" read layers: every layer of the tiny model.
    assert arms["select"]["recurrence"]["memory_read_layers"] == [0, 1, 2]
    for arm in arms.values():
        difference = arm["swapped_minus_own"]
        assert difference["low"] <= difference["nats"] <= difference["high"] and difference["num_examples"] == 4
        assert math.isfinite(arm["own"]["name_nll"]) and 0 <= arm["own"]["recalled"] <= 1
    # The zero-input arm's memory is the same for every example: another example's reads the same.
    assert arms["select-zeros"]["swapped"]["name_nll"] == arms["select-zeros"]["own"]["name_nll"]
    assert arms["select"]["swapped"]["name_nll"] != arms["select"]["own"]["name_nll"]
    goals = recorded["text"]["goals"]
    assert len(goals) == 2 * 5 + 1 and all(line.split()[:2] in (["-", "PASS"], ["-", "FAIL"]) for line in goals)
    assert [row[0] for row in recorded["tables"]["arms"]["rows"]] == ["stock, window 2 alone", *arms]
    by_distance = recorded["tables"]["by_distance"]
    assert len(by_distance["rows"]) == 1 + 2 * len(arms) and len(by_distance["headers"]) == 1 + 4
    out = capsys.readouterr().out
    assert "training select-zeros (3/3)" in out and "s a step after 2 steps" in out
    for name in arms:
        assert json.loads((tmp_path / "work" / f"{name}.json").read_text())["result"] == arms[name]

    # Run again with one more arm: the finished ones are read back, only the new one trains.
    trained = []
    train_arm = memory_gate2.train_arm
    monkeypatch.setattr(
        memory_gate2, "train_arm", lambda stock, *a, **k: trained.append(a) or train_arm(stock, *a, **k)
    )
    again = [*arguments[:4], "paper-zeros", *arguments[4:]]
    main(again, model=(llama, tokenizer), streams=streams)
    assert len(trained) == 1 and trained[0][0] == "zeros"
    resumed = json.loads(output.read_text())["values"]["arms"]
    assert list(resumed) == ["paper", "select", "select-zeros", "paper-zeros"]
    assert all(resumed[name] == arms[name] for name in arms)
    assert "[paper] finished in an earlier run" in capsys.readouterr().out

    # Other settings never reuse (or overwrite) a finished arm.
    with pytest.raises(SystemExit) as refused:
        main([*arguments, "--seed", "1"], model=(llama, tokenizer), streams=streams)
    assert refused.value.code == 2
    assert "holds arm 'paper' run with other settings (training differ)" in capsys.readouterr().err
