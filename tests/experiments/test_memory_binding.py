"""`experiments/memory_binding.py`: each variant is the gate's 4-pair arm with the one change it names, its record
says how often the answer is one of the row's stored values, and a rerun resumes or refuses other settings."""

import json

from ..scripts import EXPERIMENTS, run_script, written


def test_the_script_records_each_variant_and_a_rerun_resumes(tmp_path):
    output = tmp_path / "binding.json"
    arguments = [
        *("--steps", "4", "--curriculum-steps", "2", "--eval-size", "32", "--device", "cpu"),
        *("--output-json", str(output)),
    ]
    first = run_script(EXPERIMENTS / "memory_binding.py", *arguments, "--variants", "slots_every_layer", "pairs_2")
    assert first.returncode == 0, first.stderr[-2000:]
    runs = written(output, EXPERIMENTS)["values"]["runs"]
    assert list(runs) == ["slots_every_layer", "pairs_2"]
    arm, pairs = runs["slots_every_layer"], runs["pairs_2"]
    assert arm["kwargs"]["memory"] == {
        "memory_slots": 4,
        "memory_pooling": "attention",
        "memory_read_layers": [0, 1, 2, 3],
    }
    assert arm["kwargs"]["curriculum"] == [[8, 2]] and arm["kwargs"]["steps"] == 4
    # The variant changes only what it names.
    assert {k: v for k, v in pairs["kwargs"].items() if arm["kwargs"][k] != v} == {"num_pairs": 2}
    for record in runs.values():
        assert 0 <= record["row_value_rate"] <= 1 and 0 <= record["accuracy"] <= record["row_value_rate"]
    # A rerun skips what is recorded and adds what is asked; other settings are refused, naming the variant.
    second = run_script(EXPERIMENTS / "memory_binding.py", *arguments, "--variants", "slots_every_layer", "paper")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "slots_every_layer (" not in second.stdout and "paper (" in second.stdout
    again = json.loads(output.read_text())["values"]["runs"]
    assert list(again) == ["slots_every_layer", "paper", "pairs_2"] and again["pairs_2"] == pairs
    assert again["paper"]["kwargs"]["memory"] == {}
    other = run_script(EXPERIMENTS / "memory_binding.py", *arguments, "--steps", "5", "--variants", "pairs_2")
    assert other.returncode == 1 and "'pairs_2' run with other settings" in other.stderr
