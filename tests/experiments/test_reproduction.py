"""`hf-recurrence reproduce` (default presets, `hf_recurrence.experiments.reproduction`) run end to end on the smoke
preset: what it writes, and what it says as it goes (the plan, each training, an estimate of the time left, and that
smoke numbers mean nothing); a checkpoint it cannot fine-tune is refused in one line."""

import json

from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence.cli import main

from ..common import TINY_LLAMA, stdlib_tokenizer, user_error


def test_reproduce_smoke_runs_end_to_end_and_says_what_it_does_as_it_goes(tmp_path, capsys):
    out = tmp_path / "reproduce"
    main(["reproduce", "--preset", "smoke", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert {(r["model"], r["overlap"]) for r in rows} == {("baseline", 0), ("baseline", 8), ("recurrent", 0)}
    assert all(r["perplexity"] > 1 and r["num_tokens"] > 0 for r in rows)
    assert (out / "perplexity_vs_flops.png").stat().st_size > 0
    assert "vs baseline" in printed
    # The plan up front, then each training as it starts, and its pace with the time left once it has taken steps.
    plan = "Plan: 2 trainings of 2 steps (baseline at window 32, recurrent at window 32), then 3 evaluations"
    first, second = "training baseline at window 32 (1/2): 2 steps", "training recurrent at window 32 (2/2): 2 steps"
    assert printed.index(plan) < printed.index(first) < printed.index(second)
    assert printed.count(" s a step after 2 steps: about ") == 2
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
