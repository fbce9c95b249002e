"""lm-evaluation-harness on a recurrent model (`hf_recurrence.integrations.lm_eval`): a perplexity task on a local
document longer than many windows scores the whole document in one pass, exactly the one-shot forward, where lm-eval's
own `hf` model cuts it into independent window-sized chunks. Run with lm-eval itself, offline, on a task written here
whose document is the standard library's textwrap.py, read from where Python installs it."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch


lm_eval = pytest.importorskip("lm_eval")

from lm_eval.tasks import TaskManager  # noqa: E402
from transformers import AutoConfig, AutoTokenizer  # noqa: E402

from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM, RecurrentGPT2LMHeadModel  # noqa: E402
from hf_recurrence.integrations.lm_eval import UNBOUNDED_CONTEXT, RecurrentHFLM  # noqa: E402

from ..common import GQA, SRC_ROOT, TINY_BACKBONE, TINY_RECURRENCE, tiny_recurrent_config  # noqa: E402
from ..families import STATEFUL_FAMILIES  # noqa: E402


DEFAULT_MODEL = SRC_ROOT / "hf_recurrence" / "default_model"  # a stock GPT-2 (and the tokenizer used here)
TASK = """task: local_document
dataset_path: json
dataset_kwargs:
  data_files:
    test: {documents}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """A tiny recurrent GPT-2 (8-token windows, 16 positions) with the default tokenizer, and a one-document task."""
    root = tmp_path_factory.mktemp("lm_eval")
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    torch.manual_seed(0)
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(vocab_size=len(tokenizer), n_positions=16)).eval()
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    text = Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text()[:3000]
    (root / "documents.jsonl").write_text(json.dumps({"text": text}) + "\n")
    (root / "tasks").mkdir()
    (root / "tasks" / "local_document.yaml").write_text(TASK.format(documents=root / "documents.jsonl"))
    ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer(text)["input_ids"]]])  # lm-eval's rolling prefix: EOT
    with torch.no_grad():
        one_shot = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None]).sum().item()
    return {"root": root, "model": str(root / "model"), "text": text, "tokens": ids.shape[1] - 1, "one_shot": one_shot}


def _document_loglikelihood(setup: dict, model: str, monkeypatch, pretrained: Path | None = None) -> float:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    results = lm_eval.simple_evaluate(
        model=model,
        model_args=f"pretrained={pretrained or setup['model']}",
        tasks=["local_document"],
        task_manager=TaskManager(include_path=str(setup["root"] / "tasks")),
        log_samples=True,
        batch_size=1,
        device="cpu",
    )
    return results["samples"]["local_document"][0]["resps"][0][0]


def test_the_whole_document_is_scored_in_one_pass_as_the_one_shot_forward(setup, monkeypatch):
    assert setup["tokens"] > 50 * 8  # many windows
    recurrent = _document_loglikelihood(setup, "hf-recurrence", monkeypatch)
    assert recurrent == pytest.approx(setup["one_shot"], rel=1e-5)
    # lm-eval's own `hf` model reads n_positions = 16 as the context and scores 16-token chunks independently.
    # (The tiny model is random, so context changes its scores little; still far outside the tolerance above.)
    chunked = _document_loglikelihood(setup, "hf", monkeypatch)
    assert chunked != pytest.approx(setup["one_shot"], rel=1e-5)


def test_the_recurrence_core_scores_a_document_as_its_own_whole_document_loss(setup, tmp_path, monkeypatch):
    # What `convert` makes of a Qwen2/3, Mistral, Gemma, Phi-3, OLMo 2 or SmolLM3 checkpoint; refused before.
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    backbone = AutoConfig.for_model("qwen2", **{**TINY_BACKBONE, **GQA, "vocab_size": len(tokenizer)})
    torch.manual_seed(0)
    model = RecurrentDecoderForCausalLM(RecurrentDecoderConfig(text_config=backbone, **TINY_RECURRENCE)).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer(setup["text"])["input_ids"]]])
    with torch.no_grad():
        own_loss = -model(ids, labels=ids).loss.item() * (ids.shape[1] - 1)
    assert ids.shape[1] > 50 * model.config.window_size
    score = _document_loglikelihood(setup, "hf-recurrence", monkeypatch, pretrained=tmp_path)
    assert score == pytest.approx(own_loss, rel=1e-5)


def test_the_command_line_runs_with_the_model_registered(setup):
    environment = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "hf_recurrence.integrations.lm_eval", "run", "--model", "hf-recurrence",
        "--model_args", f"pretrained={setup['model']}", "--tasks", "local_document",
        "--include_path", str(setup["root"] / "tasks"), "--device", "cpu", "--batch_size", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "local_document" in result.stdout and "word_perplexity" in result.stdout


@pytest.mark.parametrize(
    ("model_args", "batch_size", "reason"),
    [
        (
            f"pretrained={DEFAULT_MODEL}",
            "1",
            "is a 'gpt2' model; hf-recurrence evaluates the recurrent causal families",
        ),
        (None, "auto", "batch_size='auto' cannot be used with hf-recurrence"),
    ],
    ids=["another_model_type", "batch_size_auto"],
)
def test_the_command_line_prints_a_refusal_in_one_line(setup, model_args, batch_size, reason):
    environment = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "hf_recurrence.integrations.lm_eval", "run", "--model", "hf-recurrence",
        "--model_args", model_args or f"pretrained={setup['model']}", "--tasks", "local_document",
        "--include_path", str(setup["root"] / "tasks"), "--device", "cpu", "--batch_size", batch_size,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hf-recurrence lm-eval: error: ") and reason in last


def test_context_is_unbounded_and_what_cannot_work_is_refused(setup):
    model = RecurrentHFLM(pretrained=setup["model"], device="cpu")
    assert model.max_length == UNBOUNDED_CONTEXT
    assert RecurrentHFLM(pretrained=setup["model"], device="cpu", max_length=512).max_length == 512
    with pytest.raises(ValueError, match="'gpt2' model; hf-recurrence evaluates the recurrent causal families"):
        RecurrentHFLM(pretrained=str(DEFAULT_MODEL), device="cpu")
    # A loaded model, with its tokenizer, is taken as lm-eval's `hf` takes one.
    loaded = RecurrentGPT2LMHeadModel.from_pretrained(setup["model"])
    tokenizer = AutoTokenizer.from_pretrained(setup["model"])
    assert RecurrentHFLM(pretrained=loaded, tokenizer=tokenizer, device="cpu").max_length == UNBOUNDED_CONTEXT
    with pytest.raises(ValueError, match="batch_size='auto' cannot be used"):
        RecurrentHFLM(pretrained=setup["model"], device="cpu", batch_size="auto")


@pytest.mark.slow  # about 30 s per family on 2 CPU cores
@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_every_request_type_equals_the_model_alone_in_batches_of_two(family, tmp_path):
    """Rolling perplexity, a long-context log-likelihood and generation, two requests of different lengths per batch
    (right-padded for scoring, left-padded for generation), against the model run on each request alone."""
    from lm_eval.api.instance import Instance

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    family.head(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = RecurrentHFLM(pretrained=str(tmp_path), device="cpu", batch_size=2)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / "textwrap.py").read_text()[:1500], (stdlib / "shlex.py").read_text()[:900]]

    def log_likelihood(ids: list[int], scored: int) -> float:
        """Summed log-probability of the last `scored` of `ids`, read alone in one forward."""
        x = torch.tensor([ids])
        with torch.no_grad():
            log_probs = lm.model(x).logits[0, :-1].log_softmax(-1).gather(-1, x[0, 1:, None])[:, 0]
        return log_probs[-scored:].sum().item()

    rolling = lm.loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)], disable_tqdm=True
    )
    for score, text in zip(rolling, texts, strict=True):
        ids = tokenizer(text)["input_ids"]
        assert score == pytest.approx(log_likelihood([tokenizer.eos_token_id, *ids], len(ids)), rel=1e-5)

    continuation = " return"
    scored = lm.loglikelihood(
        [Instance("loglikelihood", {}, (text, continuation), i) for i, text in enumerate(texts)], disable_tqdm=True
    )
    for (score, _), text in zip(scored, texts, strict=True):
        context = tokenizer(text)["input_ids"]
        whole = tokenizer(text + continuation)["input_ids"]
        assert score == pytest.approx(log_likelihood(whole, len(whole) - len(context)), rel=1e-5)

    settings = {"max_gen_toks": 5, "until": ["\n\n\n"], "do_sample": False}
    generated = lm.generate_until(
        [Instance("generate_until", {}, (text, settings), i) for i, text in enumerate(texts)], disable_tqdm=True
    )
    for text_out, text in zip(generated, texts, strict=True):
        prompt = torch.tensor([tokenizer(text)["input_ids"]])
        alone = lm.model.generate(prompt, max_new_tokens=5, do_sample=False)
        assert text_out == tokenizer.decode(alone[0, prompt.shape[1] :])
