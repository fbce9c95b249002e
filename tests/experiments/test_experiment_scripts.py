"""The experiment scripts (`experiments/*.py`) run on the shared harness: the window-start script end to end on a tiny
Llama, and the drivers of another program refuse a dtype it does not run in. `tests/test_benchmarks.py` checks that
every script takes --device and --dtype and that docs/experiments/ is what the recorded results render to."""

from transformers import LlamaConfig, LlamaForCausalLM

from ..common import TINY_LLAMA, austen_books_or_skip, stdlib_tokenizer
from ..scripts import EXPERIMENTS, exit_of, run_script, written


def test_window_start_reads_the_book_after_each_window_start_on_any_stock_model(tmp_path):
    austen_books_or_skip()
    tokenizer = stdlib_tokenizer()
    LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    output = tmp_path / "window_start.json"
    arguments = ["--window-size", "8", "--eval-tokens-per-book", "60", "--device", "cpu", "--output-json", str(output)]
    model = ["--model", str(tmp_path / "llama")]
    result = run_script(EXPERIMENTS / "window_start.py", *model, *arguments, "--overlaps", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = written(output, EXPERIMENTS)
    # The tests' tokenizer has no BOS: its EOS stands in; each window start against the bare window, with an interval.
    rows = {row[0]: row for row in recorded["tables"]["window_start"]["rows"]}
    overlap = "bare window after the last 2 tokens before it"
    assert list(rows) == ["bare window", "BOS", "BOS + prompt", "prompt alone", overlap]
    assert rows["bare window"][1] == "0" and rows["BOS"][1] == "1"
    for name in ("BOS", overlap):
        comparison = recorded["values"]["comparisons"][name]
        assert comparison["low"] <= comparison["relative_difference"] <= comparison["high"]
    # The same tokens predicted, two more read before each window but the first: a different perplexity.
    perplexity = recorded["values"]["perplexity"]
    assert perplexity[overlap] != perplexity["bare window"]
    refused = run_script(EXPERIMENTS / "window_start.py", *model, *arguments, "--overlaps", "8")
    assert (
        refused.returncode == 2
        and "--overlaps [8]: each must be at least 1 and below --window-size 8" in refused.stderr
    )
    assert recorded["values"]["held_out"][0]["title"] == "Sense & Sensibility"
    missing = run_script(EXPERIMENTS / "window_start.py", "--model", str(tmp_path / "nothing"), *arguments)
    assert missing.returncode == 2 and f"--model {tmp_path / 'nothing'}:" in missing.stderr


def test_a_driver_refuses_a_dtype_the_job_does_not_run_in(monkeypatch):
    refusal = exit_of(EXPERIMENTS / "reproduce.py", "--dtype", "bfloat16", monkeypatch=monkeypatch).code
    assert refusal.startswith("--dtype bfloat16: not available here, `hf-recurrence reproduce` picks its device")
