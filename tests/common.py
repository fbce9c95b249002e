"""Tiny configs and helpers shared by the tests."""

import inspect
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerFast, TrainingArguments, pipeline

from hf_recurrence import InductiveBertConfig, RecurrentGPT2Config, RecurrentLlamaConfig, TransformerXLConfig
from hf_recurrence.data import ensure_janeaustenr, python_stdlib_documents, train_byte_level_bpe


REPO_ROOT = Path(__file__).resolve().parents[1]
SRC_ROOT = REPO_ROOT / "src"

T = TypeVar("T")

# For fp32 outputs of the same weights computed by different calls: a model against its reloaded copy (bit-identical
# weights, but tensors read from safetensors can take another CPU kernel path, e.g. AVX-512 on AMD: ~1e-7 apart) or
# against the stock model it extends. Exact equality stays for the same call on the same tensors.
ACROSS_KERNELS = {"rtol": 1e-6, "atol": 1e-6}

# Token id 0 is the padding, beginning and end of every tiny config.
SPECIAL_TOKENS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}

TINY_GPT2 = {"vocab_size": 99, "n_embd": 32, "n_layer": 3, "n_head": 2, "n_positions": 16, **SPECIAL_TOKENS}

# The backbone sizes of the recurrence core's tiny rows (tests/families.py BACKBONES): GQA (4 query heads, 2 key-value
# heads) where the family has it, 16 positions, so 8-token windows and generation run past the position table.
TINY_BACKBONE = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "max_position_embeddings": 16,
    **SPECIAL_TOKENS,
}

# Grouped-query attention: 4 query heads share 2 key-value heads.
GQA = {"intermediate_size": 48, "num_key_value_heads": 2}

# Grouped-query attention, a 16-position RoPE range.
TINY_LLAMA = {**TINY_BACKBONE, **GQA}

# The recurrence of the tiny named families: 8-token windows, h_prev inserted before block 1.
TINY_RECURRENCE = {"window_size": 8, "window_overlap": 0, "insertion_layer": 1, "recurrence_hidden_sizes": [16, 16]}


def tiny_recurrent_config(**overrides) -> RecurrentGPT2Config:
    """A 3-block, 32-wide recurrent GPT-2 with 8-token windows and a 16-entry position table."""
    return RecurrentGPT2Config(**{**TINY_GPT2, **TINY_RECURRENCE, **overrides})


def tiny_recurrent_llama_config(**overrides) -> RecurrentLlamaConfig:
    """A 3-layer, 32-wide recurrent Llama with GQA, 8-token windows and 16 RoPE positions."""
    return RecurrentLlamaConfig(**{**TINY_LLAMA, **TINY_RECURRENCE, **overrides})


def tiny_transformer_xl_config(**overrides) -> TransformerXLConfig:
    """A 2-layer, 32-wide Transformer-XL with 8-token segments and a 6-slot memory."""
    kwargs = {
        "vocab_size": 99,
        "d_model": 32,
        "n_head": 2,
        "d_head": 16,
        "d_inner": 37,
        "n_layer": 2,
        "segment_length": 8,
        "mem_len": 6,
        "dropout": 0.0,
        **SPECIAL_TOKENS,
        **overrides,
    }
    return TransformerXLConfig(**kwargs)


def tiny_training_arguments(output_dir: Path, **overrides) -> TrainingArguments:
    """Trainer arguments of the tests' short CPU runs: 2 steps of 2 examples at 1e-3, no saving, no reporting."""
    arguments = {
        "max_steps": 2,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 2,
        "learning_rate": 1e-3,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        **overrides,
    }
    return TrainingArguments(output_dir=str(output_dir), **arguments)


# TRL trainer arguments of the tests' short CPU runs: fp32 on the CPU, no saving, no reporting.
TRL_ON_CPU = {"use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no", "disable_tqdm": True}


class RandomBlocks(Dataset):
    """Random token blocks for Trainer tests, labels = input ids (the models shift them)."""

    def __init__(self, count: int, length: int, vocab_size: int = 99):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab_size, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_inductive_bert_config(**overrides) -> InductiveBertConfig:
    """A 2-layer, 32-wide I-BERT over a 99-token vocabulary (id 0 is padding), without dropout."""
    kwargs = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 37,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "pad_token_id": 0,
        **overrides,
    }
    return InductiveBertConfig(**kwargs)


def user_error(capsys, argv: list[str]) -> str:
    """Run `hf-recurrence argv`, check it failed as a user error (one argparse-style line on stderr, exit status 2,
    no traceback) and return that line."""
    from hf_recurrence.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"hf-recurrence {argv[0]}: error: "), error
    return error


@cache
def installed_or_skip(find: Callable[[], T]) -> T:
    """What `find` returns (a model or data set that a package installs: `smollm2_gguf_path`, `gemma3_270m_gguf_path`,
    `ensure_janeaustenr`), or the test skipped with the install line `find` raises where the package is absent, so
    that the README's test command passes on a fresh machine (.ci/run installs them, and runs these tests)."""
    try:
        return find()
    except (FileNotFoundError, ImportError) as error:
        pytest.skip(str(error))


def austen_books_or_skip() -> None:
    """Skip unless the Austen novels can be read: `rdata` installed, r-cran-janeaustenr cached or fetched here."""
    pytest.importorskip("rdata", reason="reading the R data files needs `pip install rdata`")
    installed_or_skip(ensure_janeaustenr)


def stdlib_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few standard library modules (cached per session)."""
    return train_byte_level_bpe((text for _, text in python_stdlib_documents(limit=8)), vocab_size=vocab_size)


def run_isolated_python(
    code: str,
    cwd: Path,
    hf_home: Path,
    timeout: int = 300,
    env: dict[str, str] | None = None,
    python: Path | None = None,
    package: bool = False,
) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where `hf_recurrence` cannot be imported, even though it is installed
    (`package=True`: where it can, as beside a Hub checkpoint's remote code on a user's machine).

    The interpreter is offline with an empty cache at `hf_home`; `env` adds or overrides variables, e.g.
    `{"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub_url}` to load from the test Hub. `python`: another interpreter
    (another environment) instead of this one.
    """
    prelude = "" if package else "import sys\nsys.modules['hf_recurrence'] = None\n"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(hf_home),
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    return subprocess.run(
        [str(python or sys.executable), "-c", prelude + code],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load_over_a_stock_checkpoint(stock, recurrent_class, model_type: str, tmp_path: Path):
    """Save the `stock` model and load its checkpoint as `recurrent_class` with 8-token windows (overlap 2, h_prev at
    layer 1), checked: the config is `model_type` with that window, only the recurrence is missing from the checkpoint
    (nothing unexpected or mismatched), and the backbone's weights are the stock ones. The model, in eval mode."""
    stock.save_pretrained(tmp_path)
    model, info = recurrent_class.from_pretrained(
        tmp_path, window_size=8, window_overlap=2, insertion_layer=1, output_loading_info=True
    )
    model.eval()
    assert model.config.window_size == 8 and model.config.model_type == model_type
    assert info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    assert info["missing_keys"] and all(k.startswith("recurrence.") for k in info["missing_keys"])
    ours = model.backbone.state_dict()
    for name, tensor in stock.state_dict().items():
        assert torch.equal(ours[name], tensor), name
    return model


def attentions_and_hidden_states(model, ids: torch.Tensor, mask: torch.Tensor, columns: int, **tolerance):
    """The outputs of `model` on `ids` with `output_attentions` and `output_hidden_states`, once checked: asking for
    them (eager attention) does not change the logits (within `tolerance`, exact by default), there are a weight
    tensor per layer and a hidden state per layer and the embeddings, and each weight tensor is `columns` wide with
    rows summing to 1 at real positions and 0 at padding (`mask`)."""
    with torch.no_grad():
        plain = model(ids, attention_mask=mask)
        out = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(out.logits, plain.logits, **tolerance)
    config = model.config.get_text_config()
    assert len(out.attentions) == config.num_hidden_layers and len(out.hidden_states) == config.num_hidden_layers + 1
    for weights in out.attentions:
        assert weights.shape == (*ids.shape[:1], config.num_attention_heads, ids.shape[1], columns)
        row_sums = weights.sum(-1)  # (batch, head, length): 1 at real positions, 0 at padding
        torch.testing.assert_close(row_sums, mask[:, None, :].float().expand_as(row_sums))
    return out


def chunked_logits(model, ids: torch.Tensor, splits, attention_mask=None, state=None):
    """Logits of `ids` fed in pieces cut at `splits`, carrying the state between calls (from `state`, if given), and
    the last state."""
    pieces = []
    bounds = [0, *splits, ids.shape[1]]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        mask = None if attention_mask is None else attention_mask[:, :b]
        out = model(ids[:, a:b], attention_mask=mask, past_key_values=state)
        state = out.past_key_values
        pieces.append(out.logits)
    return torch.cat(pieces, dim=1), state


def greedy_loop(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Argmax over a one-shot forward of the whole sequence, one token at a time: the definition of greedy decoding
    (with the end of sequence forbidden, as `min_new_tokens` does)."""
    ids = prompt
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        for _ in range(new_tokens):
            scores = model(ids, use_cache=False).logits[:, -1]
            scores[:, [] if eos is None else eos] = -float("inf")
            ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], dim=1)
    return ids


def generated_alone_and_batched(model, tokenizer, prompts: list[str], **kwargs) -> list[str]:
    """The texts a text-generation pipeline generates for `prompts` (`kwargs` to each call), checked to be the same
    whether each prompt is read alone or all in one batch."""
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    alone = [generator(prompt, **kwargs)[0]["generated_text"] for prompt in prompts]
    batched = [out[0]["generated_text"] for out in generator(prompts, batch_size=len(prompts), **kwargs)]
    assert batched == alone
    return alone


def greedy_text(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The text that greedy decoding adds to `prompt`, by definition: argmax over a one-shot forward of the whole
    sequence, one token at a time, up to an end-of-sequence token. A pipeline that decoded from a fresh state at some
    step (transformers 5.24 renamed the state it hands back) would print something else."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    eos = model.generation_config.eos_token_id
    eos = set(eos) if isinstance(eos, list) else {eos}
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            sequence = torch.cat([ids, torch.tensor([new], dtype=ids.dtype)], dim=1)
            new.append(int(model(sequence, use_cache=False).logits[0, -1].argmax()))
            if new[-1] in eos:
                break
    text = tokenizer.decode(ids[0].tolist() + new, skip_special_tokens=True)
    return text[len(tokenizer.decode(ids[0], skip_special_tokens=True)) :]


REMOTE_LOAD = """
import pytest
import torch
import transformers
try:
    import hf_recurrence
    raise SystemExit("hf_recurrence must not be importable here")
except ImportError:
    pass
reference = torch.load({reference!r})
model = getattr(transformers, {auto_class!r}).from_pretrained({checkpoint!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
# The reloaded weights are bit-identical; another kernel path may move fp32 logits by ~1e-7 (see ACROSS_KERNELS).
torch.testing.assert_close(model(**reference["inputs"]).logits, reference["logits"], rtol=1e-6, atol=1e-6)
{checks}
print("REMOTE_OK", type(model).__name__)
"""


def assert_loads_with_remote_code(
    model, inputs: dict[str, torch.Tensor], tmp_path: Path, auto_class: str, checks: str = ""
) -> None:
    """Save `model`, load it with `auto_class` and trust_remote_code in a fresh interpreter where `hf_recurrence`
    cannot be imported, and check it is the folder's copy of the class with exactly the same logits on `inputs`.

    `checks`: more Python run there afterwards, with `model`, `reference` (`inputs`, `logits`) and `transformers`.
    """
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    with torch.no_grad():
        torch.save({"inputs": inputs, "logits": model(**inputs).logits}, tmp_path / "reference.pt")
    code = REMOTE_LOAD.format(
        reference=str(tmp_path / "reference.pt"), auto_class=auto_class, checkpoint=str(checkpoint), checks=checks
    )
    result = run_isolated_python(code, cwd=tmp_path, hf_home=tmp_path / "hf_home")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"REMOTE_OK {type(model).__name__}" in result.stdout


def assert_cache_implementation_is_refused(model, implementation: str, tmp_path: Path) -> None:
    """`generate()` refuses a cache_implementation, given to the call or saved in generation_config.json: the causal
    families carry their own recurrent state, and generate() would otherwise only warn that it "will be ignored"
    ("paged", continuous batching, only logged the failure of its background generation loop)."""
    prompt = torch.randint(1, model.config.get_text_config().vocab_size, (1, 5))
    with pytest.raises(ValueError, match=rf"cache_implementation='{implementation}'.*own recurrent state"):
        model.generate(prompt, max_new_tokens=3, do_sample=False, cache_implementation=implementation)
    model.generation_config.cache_implementation = implementation
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path)
    assert reloaded.generation_config.cache_implementation == implementation
    with pytest.raises(ValueError, match="generation_config.json"):
        reloaded.generate(prompt, max_new_tokens=3, do_sample=False)


def assert_forward_keeps_its_signature(model) -> None:
    """generate() builds inspect.signature(model.forward) at every token of a model registered for the Auto classes;
    the signature kept on the causal LM's forward is the function's own."""
    assert model.is_remote_code()
    forward = type(model).forward
    code = forward.__code__
    flags = bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount + flags]
    kept = forward.__dict__["__signature__"]
    assert list(kept.parameters) == list(names)
    assert list(inspect.signature(model.forward).parameters) == list(names[1:])  # bound: without `self`


def assert_left_padded_rows_equal_the_rows_alone(model, tokens: torch.Tensor) -> torch.Tensor:
    """Row 1 of `tokens` (batch 2) left-padded by 5: each row's logits equal the row read alone. Returns the mask."""
    mask = torch.ones_like(tokens)
    mask[1, :5] = 0
    with torch.no_grad():
        padded = model(tokens, attention_mask=mask).logits
        torch.testing.assert_close(padded[0], model(tokens[:1]).logits[0])
        torch.testing.assert_close(padded[1, 5:], model(tokens[1:, 5:]).logits[0])
    return mask


def loss_and_gradients(model, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The training loss on `tokens` and every parameter's gradient, with the same dropout masks at every call."""
    torch.manual_seed(3)
    model.zero_grad()
    loss = model(tokens, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
