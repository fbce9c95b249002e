"""Pretrain a small GPT-2 from scratch on the standard library's training modules: the project's embedded default.

There are no Hub weights on an offline machine, so the model that `hf-recurrence reproduce` starts from is made here:
a byte-level BPE tokenizer and a GPT-2 with a short, fixed position table, trained with the stock `Trainer` on the
"train" split of `hf_recurrence.data.stdlib_split` (validation and test modules are never seen). The shipped folder
`hf_recurrence/default_model` was written by `hf-recurrence pretrain` with its defaults; its README says how.
"""

import json
import math
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, set_seed

from ..data import TokenBlocks, stdlib_split, token_stream, train_byte_level_bpe
from ..outputs import MODEL_FOLDER_FILES, UsageError, finish_output_dir, prepare_output_dir
from .training import short_run_arguments


# Package data of hf_recurrence itself (shipped in the wheel), not of this subpackage.
DEFAULT_MODEL_PATH = Path(__file__).parent.parent / "default_model"


def default_model_path() -> Path:
    """Folder of the shipped default GPT-2 checkpoint and tokenizer (loadable with `from_pretrained`)."""
    if not (DEFAULT_MODEL_PATH / "config.json").exists():
        raise FileNotFoundError(
            f"The embedded default model is missing from {DEFAULT_MODEL_PATH}; rebuild it with "
            f"`hf-recurrence pretrain --output_dir {DEFAULT_MODEL_PATH} --overwrite`"
        )
    return DEFAULT_MODEL_PATH


@dataclass
class PretrainingSettings:
    vocab_size: int = field(default=4096, metadata={"help": "BPE vocabulary size."})
    n_positions: int = field(default=128, metadata={"help": "GPT-2 position table, also the training block length."})
    n_embd: int = field(default=192, metadata={"help": "Hidden size."})
    n_layer: int = field(default=4, metadata={"help": "Transformer blocks."})
    n_head: int = field(default=4, metadata={"help": "Attention heads."})
    max_steps: int = field(default=1000, metadata={"help": "Optimizer steps."})
    batch_size: int = field(default=16, metadata={"help": "Blocks per step."})
    learning_rate: float = field(
        default=1e-3, metadata={"help": "Peak AdamW learning rate (cosine decay after warm-up)."}
    )
    warmup_steps: int = field(default=100, metadata={"help": "Linear warm-up steps."})
    seed: int = field(default=0, metadata={"help": "Seed for initialisation and data order."})

    def __post_init__(self):
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "max_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {name}={getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise UsageError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")
        if self.learning_rate <= 0 or self.warmup_steps < 0:
            raise UsageError(
                f"learning_rate must be positive and warmup_steps non-negative, got learning_rate="
                f"{self.learning_rate}, warmup_steps={self.warmup_steps}"
            )


# What `pretrain` writes: a model folder and its metrics.
PRETRAINING_FILES = (*MODEL_FOLDER_FILES, "pretraining.json")


def pretrain(
    output_dir: Path, settings: PretrainingSettings, command: str | None = None, *, overwrite: bool = False
) -> dict[str, float]:
    """Train the tokenizer and the GPT-2, save both with a model card to `output_dir`, return the metrics.

    `output_dir` is checked first (writable, and empty unless `overwrite`, which replaces the model there), so that
    nothing is trained for a folder that cannot take the result.
    """
    prepare_output_dir(output_dir, PRETRAINING_FILES, writer="hf-recurrence pretrain", overwrite=overwrite)
    start = time.perf_counter()
    set_seed(settings.seed)
    train_texts = [text for _, text in stdlib_split("train")]
    validation_texts = [text for _, text in stdlib_split("validation")]

    tokenizer = train_byte_level_bpe(train_texts, vocab_size=settings.vocab_size)
    train_blocks = TokenBlocks(token_stream(train_texts, tokenizer), settings.n_positions)
    validation_blocks = TokenBlocks(token_stream(validation_texts, tokenizer), settings.n_positions)
    print(
        f"tokenizer: {len(tokenizer)} tokens; train: {len(train_texts)} modules, {train_blocks.blocks.numel():,} tokens;"
        f" validation: {len(validation_texts)} modules, {validation_blocks.blocks.numel():,} tokens"
    )

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=settings.n_positions,
        n_embd=settings.n_embd,
        n_layer=settings.n_layer,
        n_head=settings.n_head,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    scratch = tempfile.TemporaryDirectory(prefix="hf_recurrence_pretrain_")
    trainer = Trainer(
        model=model,
        args=short_run_arguments(scratch.name, settings),
        train_dataset=train_blocks,
        eval_dataset=validation_blocks,
    )
    trainer.train()
    validation_loss = trainer.evaluate()["eval_loss"]
    scratch.cleanup()
    metrics = {
        "validation_loss": round(validation_loss, 4),
        "validation_perplexity": round(math.exp(validation_loss), 2),
        "train_tokens_seen": settings.max_steps * settings.batch_size * settings.n_positions,
        "train_tokens_available": int(train_blocks.blocks.numel()),
        "minutes": round((time.perf_counter() - start) / 60, 1),
    }
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "pretraining.json").write_text(
        json.dumps({"settings": asdict(settings), "metrics": metrics}, indent=2)
    )
    (output_dir / "README.md").write_text(model_card(settings, metrics, command, len(train_texts)))
    finish_output_dir(output_dir)
    return metrics


def model_card(settings: PretrainingSettings, metrics: dict[str, float], command: str | None, num_modules: int) -> str:
    parameters = (
        settings.n_layer * 12 * settings.n_embd**2 + (settings.vocab_size + settings.n_positions) * settings.n_embd
    )
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- gpt2
- hf_recurrence
- python-source-code
---

# hf_recurrence embedded default GPT-2

A small GPT-2 (about {parameters / 1e6:.1f}M parameters) trained from scratch, offline, as the starting point for
`hf-recurrence reproduce`. It is an ordinary `GPT2LMHeadModel` with a byte-level BPE tokenizer; it knows Python source
code and little else, and its position table is short on purpose ({settings.n_positions} positions) so that windows of
text and recurrence across them matter on a CPU.

## How it was made

- Corpus: the top-level modules of the Python {platform.python_version()} standard library read from the machine,
  split by file name (`hf_recurrence.data.stdlib_split`): {num_modules} "train" modules were used; the "validation"
  and "test" modules were never trained on.
- Tokenizer: `hf_recurrence.data.train_byte_level_bpe` on the train modules, {settings.vocab_size} tokens,
  `<|endoftext|>` (id 0) as BOS/EOS/padding.
- Model: GPT-2 with n_layer={settings.n_layer}, n_embd={settings.n_embd}, n_head={settings.n_head},
  n_positions={settings.n_positions}, random initialisation (seed {settings.seed}).
- Training: the stock `Trainer`, {settings.max_steps} steps of {settings.batch_size} blocks x {settings.n_positions}
  tokens ({metrics["train_tokens_seen"]:,} tokens seen of {metrics["train_tokens_available"]:,} available), AdamW,
  learning rate {settings.learning_rate} with {settings.warmup_steps} warm-up steps and cosine decay, weight decay
  0.01, on CPU in {metrics["minutes"]} minutes (torch {torch.__version__}, transformers {transformers.__version__}).
- Command: `{command or "hf-recurrence pretrain"}`

## Results

Validation loss {metrics["validation_loss"]} (perplexity {metrics["validation_perplexity"]}) on the validation
modules, cut into disjoint {settings.n_positions}-token blocks.

## Limits

Tiny and trained on one small corpus: it is a test bed for recurrence on long documents, not a general language
model.
"""
