# SPDX-License-Identifier: Apache-2.0
r"""Train a Transformer-XL language model with the stock `Trainer` on the Python standard library's own sources.

The corpus is read from the machine: the standard library's modules, split into train / validation by module name
(`hf_recurrence.data.stdlib_split`, the split every script of the package uses), real long documents that exist
wherever Python does, so the script runs offline and in CI. A byte-level BPE tokenizer is trained on the same text
(`hf_recurrence.data.train_byte_level_bpe`) unless `--tokenizer_name` points to one. The token stream is cut into blocks
of `--block_segments` segments (`hf_recurrence.data.TokenBlocks`); inside every block the model reads segment after segment with its memory, so the
Trainer trains the recurrence (memory is not carried from one block to the next: blocks are shuffled).

Smoke run (seconds):

    python examples/transformer_xl/run_clm_transformer_xl.py --output_dir /tmp/txl --max_steps 2 \
        --per_device_train_batch_size 2 --report_to none --max_train_documents 4 --max_eval_documents 2 --sample_tokens 20 \
        --config_overrides n_layer=2,d_model=64

Realistic CPU run (about an hour on 2 cores):

    python examples/transformer_xl/run_clm_transformer_xl.py --output_dir txl-stdlib --num_train_epochs 1 \
        --per_device_train_batch_size 8 --learning_rate 5e-4 --report_to none
"""

import logging
import math
import sys
from dataclasses import dataclass, field

import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    set_seed,
)

import hf_recurrence
from hf_recurrence.data import TokenBlocks, read_documents, token_stream, train_byte_level_bpe
from hf_recurrence.outputs import (
    MODEL_FOLDER_FILES,
    TRAINING_RUN_FILES,
    OutputDirArguments,
    finish_output_dir,
    prepare_training_output_dir,
)


logger = logging.getLogger(__name__)

if not transformers.__version__.startswith("5."):
    raise RuntimeError(
        f"hf_recurrence {hf_recurrence.__version__} needs transformers 5, got {transformers.__version__}"
    )


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(default=None, metadata={"help": "Checkpoint to continue from."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder; default: train a BPE."})
    vocab_size: int = field(default=4000, metadata={"help": "Vocabulary of the tokenizer trained here."})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Config fields to change, as transformers' run_clm.py takes them: n_layer=4,d_model=256."},
    )


@dataclass
class DataTrainingArguments:
    segment_length: int = field(default=64, metadata={"help": "Tokens per segment (config.segment_length)."})
    mem_len: int = field(default=64, metadata={"help": "Memory per layer (config.mem_len)."})
    block_segments: int = field(default=4, metadata={"help": "Segments per training block."})
    max_train_documents: int | None = field(default=None, metadata={"help": "Use only the first N training modules."})
    max_eval_documents: int | None = field(default=None, metadata={"help": "Use only the first N validation modules."})
    sample_tokens: int = field(default=400, metadata={"help": "Length of the greedy continuation logged at the end."})


def main() -> None:
    # 1. Arguments and logging
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments, OutputDirArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args, output_args = parser.parse_json_file(sys.argv[1])
    else:
        model_args, data_args, training_args, output_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    prepare_training_output_dir(
        training_args, MODEL_FOLDER_FILES + TRAINING_RUN_FILES, output_args, writer="run_clm_transformer_xl.py"
    )
    set_seed(training_args.seed)

    # 2. Data: one document per standard library module, in the package's train / validation split.
    train_texts = [text for _, text in read_documents(None, "train")][: data_args.max_train_documents]
    eval_texts = [text for _, text in read_documents(None, "validation")][: data_args.max_eval_documents]

    # 3. Tokenizer and blocks
    if model_args.tokenizer_name:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model_args.tokenizer_name)
    else:
        tokenizer = train_byte_level_bpe(train_texts, vocab_size=model_args.vocab_size)
    block_size = data_args.block_segments * data_args.segment_length
    train_dataset = TokenBlocks(token_stream(train_texts, tokenizer), block_size)
    eval_dataset = TokenBlocks(token_stream(eval_texts, tokenizer), block_size)
    logger.info(f"{len(train_dataset)} training and {len(eval_dataset)} evaluation blocks of {block_size} tokens")

    # 4. Config and model
    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        settings = {
            "vocab_size": len(tokenizer),
            "d_model": 256,
            "n_head": 4,
            "d_head": 64,
            "d_inner": 1024,
            "n_layer": 4,
            "segment_length": data_args.segment_length,
            "mem_len": data_args.mem_len,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
        config = AutoConfig.for_model("transformer_xl", **settings)
        if model_args.config_overrides:
            config.update_from_string(model_args.config_overrides)
        model = AutoModelForCausalLM.from_config(config)
    logger.info(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")

    # 5. Train, evaluate, save
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset)
    result = trainer.train()
    trainer.save_model()
    tokenizer.save_pretrained(training_args.output_dir)
    trainer.save_metrics("train", result.metrics)
    metrics = trainer.evaluate()
    metrics["perplexity"] = math.exp(min(metrics["eval_loss"], 50.0))
    trainer.save_metrics("eval", metrics)
    prompt = tokenizer("def ", return_tensors="pt").to(model.device)
    sample = model.generate(**prompt, max_new_tokens=data_args.sample_tokens, do_sample=False)
    logger.info("Greedy continuation:\n" + tokenizer.decode(sample[0]))
    if training_args.should_save:
        finish_output_dir(training_args.output_dir)


if __name__ == "__main__":
    main()
