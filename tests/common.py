"""Tiny configs and helpers shared by the tests."""

import subprocess
import sys
from functools import cache
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from hf_recurrence import InductiveBertConfig, RecurrentGPT2Config
from hf_recurrence.data import python_stdlib_documents, train_byte_level_bpe


REPO_ROOT = Path(__file__).resolve().parents[1]
SRC_ROOT = REPO_ROOT / "src"

TINY_GPT2 = {
    "vocab_size": 99,
    "n_embd": 32,
    "n_layer": 3,
    "n_head": 2,
    "n_positions": 16,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}


def tiny_recurrent_config(**overrides) -> RecurrentGPT2Config:
    """A 3-block, 32-wide recurrent GPT-2 with 8-token windows and a 16-entry position table."""
    kwargs = {
        **TINY_GPT2,
        "window_size": 8,
        "window_overlap": 0,
        "insertion_layer": 1,
        "recurrence_hidden_sizes": [16, 16],
        **overrides,
    }
    return RecurrentGPT2Config(**kwargs)


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


@cache
def stdlib_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few standard library modules (cached per session)."""
    return train_byte_level_bpe((text for _, text in python_stdlib_documents(limit=8)), vocab_size=vocab_size)


def run_isolated_python(code: str, cwd: Path, hf_home: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where `hf_recurrence` cannot be imported, even though it is installed."""
    prelude = "import sys\nsys.modules['hf_recurrence'] = None\n"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(hf_home),
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
