"""An offline tour of the recurrent GPT-2 on real text, in about two minutes on two CPU cores.

1. Documents: the Python standard library's own sources, split by file into train and held-out documents.
2. A byte-level BPE tokenizer trained on the training documents with `tokenizers`.
3. A small GPT-2 (random weights: no Hub here) saved as an ordinary GPT-2 checkpoint, then converted into a recurrent
   GPT-2 with `RecurrentGPT2LMHeadModel.from_pretrained(<gpt2 dir>, window_size=..., window_overlap=...)`.
4. The stock `Trainer` fine-tunes it on blocks of several windows (backpropagation through time across them).
5. Held-out loss, then the text-generation pipeline writes far past the model's position table at constant memory.
"""

import argparse
import math
import random
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, pipeline

from .data import python_stdlib_documents, train_byte_level_bpe
from .models import RecurrentGPT2LMHeadModel


class TokenBlocks(Dataset):
    """Consecutive fixed-length blocks cut from one long token stream (documents joined by the EOS token)."""

    def __init__(self, stream: list[int], block_size: int):
        if len(stream) < block_size:
            raise ValueError(f"The token stream ({len(stream)} tokens) is shorter than one block ({block_size})")
        self.blocks = torch.tensor(stream[: len(stream) // block_size * block_size]).view(-1, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/demo"), help="Where checkpoints go.")
    parser.add_argument("--documents", type=int, default=60, help="Standard library modules to read.")
    parser.add_argument("--vocab_size", type=int, default=2000, help="BPE vocabulary size.")
    parser.add_argument("--n_positions", type=int, default=64, help="Position table of the GPT-2.")
    parser.add_argument("--window_size", type=int, default=64, help="Tokens per window.")
    parser.add_argument("--window_overlap", type=int, default=8, help="Tokens each window re-reads.")
    parser.add_argument("--windows_per_block", type=int, default=4, help="Windows per training block (BPTT span).")
    parser.add_argument("--max_steps", type=int, default=500, help="Training steps.")
    parser.add_argument("--new_tokens", type=int, default=300, help="Tokens to generate.")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, float]:
    start = time.perf_counter()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.output_dir.mkdir(parents=True, exist_ok=True)

    documents = [text for _, text in python_stdlib_documents(min_chars=2000, limit=args.documents)]
    held_out = documents[::10]
    train = [d for i, d in enumerate(documents) if i % 10]
    print(f"[1/5] {len(train)} training and {len(held_out)} held-out standard library modules")

    tokenizer = train_byte_level_bpe(train, vocab_size=args.vocab_size)
    tokenizer.save_pretrained(args.output_dir / "tokenizer")
    print(f"[2/5] byte-level BPE tokenizer with {len(tokenizer)} tokens")

    gpt2_dir = args.output_dir / "gpt2"
    special = {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id}
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_positions=args.n_positions, n_embd=128, n_layer=4, n_head=4, **special)
    )
    gpt2.save_pretrained(gpt2_dir)
    model, info = RecurrentGPT2LMHeadModel.from_pretrained(
        gpt2_dir,
        window_size=args.window_size,
        window_overlap=args.window_overlap,
        pad_token_id=tokenizer.pad_token_id,
        output_loading_info=True,
    )
    print(
        f"[3/5] converted a GPT-2 checkpoint; new parameters: {len(info['missing_keys'])} under transformer.recurrence"
    )

    def stream(texts: list[str]) -> list[int]:
        ids: list[int] = []
        for text in texts:
            ids += tokenizer(text).input_ids + [tokenizer.eos_token_id]
        return ids

    stride = args.window_size - args.window_overlap
    block = args.window_size + (args.windows_per_block - 1) * stride
    train_set, eval_set = TokenBlocks(stream(train), block), TokenBlocks(stream(held_out), block)
    training_args = TrainingArguments(
        output_dir=str(args.output_dir / "trainer"),
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=2e-3,
        warmup_steps=10,
        logging_steps=20,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=eval_set)
    print(f"[4/5] training on {len(train_set)} blocks of {block} tokens ({args.windows_per_block} windows each)")
    trainer.train()
    eval_loss = trainer.evaluate()["eval_loss"]
    trainer.save_model(str(args.output_dir / "recurrent_gpt2"))
    print(f"      held-out loss {eval_loss:.3f} (perplexity {math.exp(eval_loss):.1f} per token)")

    generator = pipeline("text-generation", model=model.eval(), tokenizer=tokenizer)
    prompt = "def main(argv=None):\n"
    torch.manual_seed(args.seed)
    output = generator(
        prompt,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=True,
        top_k=40,
        temperature=0.8,
        return_tensors=True,
    )[0]["generated_token_ids"]
    generated = len(output) - len(tokenizer(prompt).input_ids)
    text = tokenizer.decode(output, skip_special_tokens=True)
    print(f"[5/5] sampled {generated} new tokens from a model with {args.n_positions} positions:")
    print(text[:800] + ("..." if len(text) > 800 else ""))
    print(f"Done in {time.perf_counter() - start:.0f}s. Saved to {args.output_dir}")
    return {"eval_loss": eval_loss, "generated_tokens": generated}
