"""`hf-recurrence reproduce` (default presets, `hf_recurrence.experiments.reproduction`) run end to end on the smoke
preset: what it writes, and what it says as it goes (the plan, each training, an estimate of the time left, and that
smoke numbers mean nothing); the zero-input control trained beside the recurrent model like it, and the decomposition
of the recurrent model's gain (learned constant, carried context) with its intervals; a checkpoint it cannot
fine-tune is refused in one line."""

import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence.cli import main
from hf_recurrence.evaluation import TokenNLL
from hf_recurrence.experiments import reproduction
from hf_recurrence.experiments.reproduction import (
    ReproductionSettings,
    decomposition,
    decomposition_lines,
    decomposition_table,
)

from ..common import TINY_LLAMA, stdlib_tokenizer, user_error


def test_reproduce_smoke_runs_end_to_end_and_says_what_it_does_as_it_goes(tmp_path, capsys):
    out = tmp_path / "reproduce"
    main(["reproduce", "--preset", "smoke", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [(r["model"], r["overlap"]) for r in rows] == [
        ("baseline", 0), ("baseline", 8), ("recurrent", 0), ("control", 0)
    ]  # fmt: skip
    assert all(r["perplexity"] > 1 and r["num_tokens"] > 0 for r in rows)
    # The control is trained like the recurrent model: the same steps on the same tokens.
    recurrent, control = rows[2], rows[3]
    assert control["tokens"] == recurrent["tokens"] and control["train_loss"] is not None
    assert (out / "perplexity_vs_flops.png").stat().st_size > 0
    assert "vs baseline" in printed
    # The plan up front, then each training as it starts, and its pace with the time left once it has taken steps.
    plan = (
        "Plan: 3 trainings of 2 steps (baseline at window 32, recurrent at window 32, control at window 32), then 4 "
        "evaluations"
    )
    first, second = "training baseline at window 32 (1/3): 2 steps", "training recurrent at window 32 (2/3): 2 steps"
    third = "training control at window 32 (3/3): 2 steps"
    assert printed.index(plan) < printed.index(first) < printed.index(second) < printed.index(third)
    assert printed.count(" s a step after 2 steps: about ") == 3
    # The decomposition: in results.json, as findings lines (printed and in results.md) and as a table.
    comparisons = results["comparisons"]
    assert [(c["part"], c["b"], c["a"]) for c in comparisons] == [
        ("total gain", "recurrent", "baseline"),
        ("learned constant", "control", "baseline"),
        ("carried context", "recurrent", "control"),
    ]
    for c in comparisons:
        assert c["low"] <= c["relative_difference"] <= c["high"] and c["num_segments"] >= 2
    total, constant, carried = (1 + c["relative_difference"] for c in comparisons)
    assert total == pytest.approx(constant * carried, rel=1e-9)
    report = (out / "results.md").read_text()
    for line in decomposition_lines(comparisons):
        assert line in printed and f"- {line}" in report
    assert "window 32, overlap 0, carried context: recurrent vs control: " in printed
    assert decomposition_table(comparisons) in report and decomposition_table(comparisons) in printed
    assert "| Learned constant (control vs baseline) | Carried context (recurrent vs control) |" in report
    # A smoke run's numbers are no finding: said before the first training, first among the findings, and in the files.
    caveat = results["caveat"]
    assert "numbers mean nothing" in caveat
    assert printed.index(caveat) < printed.index(first)
    assert printed.split("\n\n")[-2].splitlines()[0] == caveat  # the summary, after the table
    assert (out / "results.md").read_text().split("\n- ")[1].startswith(caveat)


def test_reproduce_refuses_a_checkpoint_that_is_not_a_gpt2_in_one_line(tmp_path, capsys):
    tokenizer = stdlib_tokenizer()
    llama = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})).save_pretrained(llama)
    tokenizer.save_pretrained(llama)
    out = tmp_path / "reproduce"
    error = user_error(capsys, ["reproduce", "--preset", "smoke", "--model_name_or_path", str(llama),
                                "--output_dir", str(out)])  # fmt: skip
    assert f"--model_name_or_path {llama}: a llama checkpoint" in error
    assert "model_type gpt2" in error and "--preset smollm2" in error
    assert not out.exists()


def test_the_control_is_trained_like_the_recurrent_model_from_the_same_start(tmp_path, monkeypatch):
    """Fails if the control is not trained, or not as a fair control: a recurrence module reading zeros, from the
    recurrent model's initialisation, on the same blocks for the same steps, and changed by its training."""
    trained = []
    fine_tune = reproduction.fine_tune

    def recording_fine_tune(model, dataset, settings, **kwargs):
        start = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("recurrence.")}
        loss = fine_tune(model, dataset, settings, **kwargs)
        after = {k: v for k, v in model.state_dict().items() if k.startswith("recurrence.")}
        blocks = [dataset[i]["input_ids"] for i in range(3)]
        trained.append((getattr(model.config, "recurrence_input", None), start, after, blocks, settings.max_steps))
        return loss

    monkeypatch.setattr(reproduction, "fine_tune", recording_fine_tune)
    main(["reproduce", "--preset", "smoke", "--output_dir", str(tmp_path / "out")])
    baseline, recurrent, control = trained
    assert (baseline[0], recurrent[0], control[0]) == (None, "window", "zeros")
    assert recurrent[1].keys() == control[1].keys() and recurrent[1]
    assert all(torch.equal(recurrent[1][k], control[1][k]) for k in recurrent[1])  # the same initialisation
    assert any(not torch.equal(control[1][k], control[2][k]) for k in control[1])  # and the control was trained
    assert all(torch.equal(a, b) for a, b in zip(recurrent[3], control[3], strict=True))  # on the same blocks
    assert recurrent[4] == control[4] == baseline[4]


def _reads(*arms: str, documents: int = 2, tokens: int = 300) -> dict:
    """Made-up token NLLs of `arms` on the same documents, each arm a little better than the one before."""
    generator = torch.Generator().manual_seed(0)
    base = [torch.rand(tokens, generator=generator) + 3 for _ in range(documents)]
    return {
        arm: [TokenNLL(nll - 0.05 * index, torch.arange(tokens) % 32) for nll in base]
        for index, arm in enumerate(arms)
    }


def test_the_decomposition_needs_the_control_and_adds_up():
    settings = ReproductionSettings(segment_tokens=100, num_resamples=200)
    with pytest.raises(ValueError, match="window 32, overlap 0: the recurrent model was read without its zero-input"):
        decomposition({(32, 0): _reads("baseline", "recurrent")}, settings)
    reads = {(32, 0): _reads("baseline", "control", "recurrent"), (32, 4): _reads("baseline")}
    total, constant, carried = decomposition(reads, settings)
    assert [c["num_segments"] for c in (total, constant, carried)] == [6, 6, 6]
    # Each arm is 0.05 nats a token below the one before: the two parts are equal, and multiply to the total.
    assert constant["relative_difference"] == pytest.approx(math.exp(-0.05) - 1)
    assert carried["relative_difference"] == pytest.approx(math.exp(-0.05) - 1)
    assert total["relative_difference"] == pytest.approx(math.exp(-0.1) - 1)
    assert carried["high"] < 0 and decomposition_lines([carried])[0].endswith("; the interval excludes 0")
    # A recurrent overlap the baseline was not read at: only the carried context.
    (only,) = decomposition({(32, 5): _reads("control", "recurrent")}, settings)
    assert only["part"] == "carried context"
    assert "| 32 | 5 | – | – | " in decomposition_table([only])


def test_reproduce_refuses_held_out_text_too_short_for_the_intervals_before_training(tmp_path, capsys, monkeypatch):
    def fine_tune(*args, **kwargs):
        raise AssertionError("fine-tuning started before the held-out text was checked")

    monkeypatch.setattr(reproduction, "fine_tune", fine_tune)
    out = tmp_path / "reproduce"
    error = user_error(
        capsys, ["reproduce", "--preset", "smoke", "--segment_tokens", "100000", "--output_dir", str(out)]
    )
    assert "1 bootstrap segment(s) of segment_tokens=100000, and the intervals need at least 2" in error
    assert not out.exists()
