#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Fine-tune a recurrent GPT-2 (or, as the baseline, a plain GPT-2) for causal language modelling on long blocks.

The shape of transformers' `examples/pytorch/language-modeling/run_clm.py`. The documents are tokenised, joined with
the EOS token and cut into blocks of `--windows_per_block` windows: `window_overlap + windows_per_block * stride`
tokens, `stride = window_size - window_overlap`. The recurrent GPT-2 reads a block window by window and
backpropagates through all of them (or `--bptt_windows` back). The baseline (`--model_type gpt2`) is a stock
`GPT2LMHeadModel` trained on the same blocks cut into those windows, read independently: the overlap is context only
(its labels are -100), so both models predict the same tokens and a step holds the same tokens for both.

`--model_name_or_path` is a GPT-2 checkpoint (converted on load into a recurrent GPT-2 with the window settings
given here) or a recurrent GPT-2 checkpoint; its folder (or `--tokenizer_name`) holds the tokenizer. The text is
`--train_file`/`--validation_file` (one document per file), or by default the Python standard library's own sources
split by module (`hf_recurrence.data.stdlib_split`). `--use_lora` trains LoRA adapters on the GPT-2 backbone plus the
whole recurrence module and saves only those; its base must be a converted recurrent GPT-2 checkpoint.

CPU smoke run (a GPT-2 checkpoint with its tokenizer in ./tiny-gpt2):

    python examples/language-modeling/run_clm_recurrent.py --model_name_or_path tiny-gpt2 \
        --window_size 16 --window_overlap 4 --windows_per_block 4 --max_train_samples 64 \
        --do_train --do_eval --max_steps 4 --per_device_train_batch_size 2 --output_dir out --use_cpu

Realistic run (GPT-2 small converted with the paper's settings, all of the standard library):

    accelerate launch examples/language-modeling/run_clm_recurrent.py --model_name_or_path openai-community/gpt2 \
        --window_size 300 --window_overlap 0 --windows_per_block 4 --do_train --do_eval \
        --per_device_train_batch_size 2 --gradient_accumulation_steps 8 --learning_rate 5e-5 --num_train_epochs 1 \
        --activation_checkpointing --output_dir recurrent-gpt2-stdlib
"""

import logging
import math
import sys
from dataclasses import dataclass, field

import transformers
from torch.utils.data import Dataset, Subset
from transformers import (
    AutoTokenizer,
    GPT2LMHeadModel,
    HfArgumentParser,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.utils.versions import require_version

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel
from hf_recurrence.data import TokenBlocks, WindowedBlocksCollator, read_documents, token_stream
from hf_recurrence.outputs import (
    MODEL_FOLDER_FILES,
    TRAINING_RUN_FILES,
    OutputDirArguments,
    finish_output_dir,
    prepare_training_output_dir,
)


require_version("transformers>=5.23,<6", "hf_recurrence is tested with transformers 5.x from 5.23 on")

logger = logging.getLogger(__name__)

MODEL_TYPES = ("recurrent_gpt2", "gpt2")


# The recurrence settings this script takes: every one but the rotary position of h_prev (GPT-2's are absolute).
RECURRENCE_SETTINGS = [name for name in RecurrentGPT2Config.family_settings if name != "h_prev_rope_position"]


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        metadata={"help": "GPT-2 checkpoint to convert, or recurrent GPT-2 checkpoint to continue training."}
    )
    model_type: str = field(
        default="recurrent_gpt2",
        metadata={
            "help": "recurrent_gpt2, or gpt2 for the baseline that reads the windows independently.",
            "choices": MODEL_TYPES,
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer to use, if not the one saved with the model."}
    )
    window_size: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per window. Default: the recurrent checkpoint's (300 when converting GPT-2); n_positions for gpt2."
        },
    )
    window_overlap: int | None = field(
        default=None,
        metadata={"help": "Tokens each window re-reads from the previous one. Default: the checkpoint's, or 0."},
    )
    insertion_layer: int | None = field(
        default=None, metadata={"help": "Block that receives h_prev (recurrent_gpt2)."}
    )
    recurrence_hidden_sizes: list[int] | None = field(
        default=None, metadata={"help": "Hidden widths of the recurrence network (recurrent_gpt2)."}
    )
    bptt_windows: int | None = field(
        default=None, metadata={"help": "Backpropagate at most this many windows back (recurrent_gpt2). Default: all."}
    )
    normalize_pooled_states: bool | None = field(
        default=None, metadata={"help": "Scale each layer's states to unit RMS before pooling (recurrent_gpt2)."}
    )
    recurrence_input: str | None = field(
        default=None,
        metadata={"help": "window (the paper) or zeros (the control: a learned constant h_prev) (recurrent_gpt2)."},
    )
    memory_slots: int | None = field(
        default=None, metadata={"help": "Memory slots h_prev carries (recurrent_gpt2). Default: 1, the paper's."}
    )
    memory_pooling: str | None = field(
        default=None,
        metadata={"help": "mean (the paper) or attention (a learned query per slot) (recurrent_gpt2)."},
    )
    memory_position_bias: bool | None = field(
        default=None,
        metadata={"help": "A learned per-slot bias over window positions in the pooling (recurrent_gpt2)."},
    )
    memory_source: str | None = field(
        default=None,
        metadata={"help": "layer_mix (the paper) or last_layer: what the memory pools (recurrent_gpt2)."},
    )
    memory_read_layers: list[int] | None = field(
        default=None,
        metadata={"help": "The layers that read the slots (recurrent_gpt2). Default: the insertion layer."},
    )
    use_lora: bool = field(
        default=False,
        metadata={
            "help": "Train LoRA adapters on the GPT-2 backbone (frozen otherwise) and the whole recurrence module."
        },
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(
        default=16, metadata={"help": "LoRA scaling numerator (the scale is lora_alpha / lora_r)."}
    )
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["c_attn"],
        metadata={"help": "GPT-2 submodules that get adapters (c_attn, c_proj, c_fc)."},
    )


@dataclass
class DataTrainingArguments:
    train_file: list[str] | None = field(
        default=None, metadata={"help": "Text files to train on, one document each. Default: the stdlib train split."}
    )
    validation_file: list[str] | None = field(
        default=None, metadata={"help": "Text files to evaluate on. Default: the stdlib validation split."}
    )
    windows_per_block: int = field(default=4, metadata={"help": "Windows per training example (block)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N evaluation blocks."})


def load_model(model_args: ModelArguments) -> PreTrainedModel:
    """The model to train: a GPT-2 for the baseline, else a recurrent GPT-2 with the recurrence settings given."""
    overrides = {
        name: getattr(model_args, name) for name in RECURRENCE_SETTINGS if getattr(model_args, name) is not None
    }
    if model_args.model_type == "gpt2":
        recurrent_only = sorted(set(overrides) - {"window_size", "window_overlap"})
        if recurrent_only:
            raise ValueError(f"{recurrent_only} apply to model_type='recurrent_gpt2' only, got model_type='gpt2'")
        return GPT2LMHeadModel.from_pretrained(model_args.model_name_or_path)
    return RecurrentGPT2LMHeadModel.from_pretrained(model_args.model_name_or_path, **overrides)


def window_settings(model: PreTrainedModel, model_args: ModelArguments) -> tuple[int, int]:
    """(window_size, window_overlap) the blocks are cut for: the recurrent model's own, or the baseline's arguments."""
    if model_args.model_type == "recurrent_gpt2":
        return model.config.window_size, model.config.window_overlap
    window_size = model_args.window_size or model.config.n_positions
    window_overlap = model_args.window_overlap or 0
    if not 0 <= window_overlap < window_size <= model.config.n_positions:
        raise ValueError(
            f"The baseline needs 0 <= window_overlap < window_size <= n_positions={model.config.n_positions}, got "
            f"window_size={window_size}, window_overlap={window_overlap}"
        )
    return window_size, window_overlap


def check_lora_base(model_args: ModelArguments) -> None:
    """An adapter is loaded back onto its base checkpoint as saved, so a recurrent base must be saved as trained."""
    if model_args.model_type != "recurrent_gpt2":
        return
    saved_type = PreTrainedConfig.get_config_dict(model_args.model_name_or_path)[0].get("model_type")
    changed = [
        name for name in RECURRENCE_SETTINGS if name != "bptt_windows" and getattr(model_args, name) is not None
    ]
    if saved_type != "recurrent_gpt2" or changed:
        raise ValueError(
            f"--use_lora needs a recurrent GPT-2 checkpoint used with its own window settings, so that the adapter "
            f"loads back onto it; got model_type={saved_type!r} at {model_args.model_name_or_path} and settings "
            f"{changed}. Convert the GPT-2 first: hf-recurrence convert <gpt2> <output_dir> --window_size ..."
        )


def add_lora(model: PreTrainedModel, model_args: ModelArguments) -> PreTrainedModel:
    """Freeze the backbone, add LoRA adapters to it, and train (and save) the recurrence module in full."""
    from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig(
        task_type="CAUSAL_LM",
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        fan_in_fan_out=True,  # GPT-2's projections are Conv1D, weights stored (in, out)
        # The recurrence module is new: it is trained whole and saved with the adapter, which is useless without it.
        modules_to_save=["recurrence"] if model_args.model_type == "recurrent_gpt2" else None,
    )
    model = get_peft_model(model, lora_config)
    model.print_trainable_parameters()
    return model


def load_blocks(
    files: list[str] | None, split: str, tokenizer: PreTrainedTokenizerBase, block_size: int, max_samples: int | None
) -> Dataset:
    """The documents of `split` as consecutive `block_size`-token blocks, the first `max_samples` of them if given."""
    blocks = TokenBlocks(token_stream((text for _, text in read_documents(files, split)), tokenizer), block_size)
    logger.info(f"{split}: {len(blocks)} blocks of {block_size} tokens, {blocks.num_dropped_tokens} tokens left over")
    return blocks if max_samples is None else Subset(blocks, range(min(max_samples, len(blocks))))


def main() -> None:
    # 1. Arguments, from the command line or one JSON file.
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments, OutputDirArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args, output_args = parser.parse_json_file(json_file=sys.argv[1])
    else:
        model_args, data_args, training_args, output_args = parser.parse_args_into_dataclasses()

    # 2. Logging: info on the main process only.
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, "
        f"n_gpu: {training_args.n_gpu}, distributed: {training_args.parallel_mode.value}"
    )
    logger.info(f"Training/evaluation parameters {training_args}")
    # A non-empty output_dir is refused (or, with --overwrite_output_dir, cleaned) before any work: a stale
    # checkpoint-N of an earlier, longer run would otherwise be the one `get_last_checkpoint` finds.
    prepare_training_output_dir(
        training_args, MODEL_FOLDER_FILES + TRAINING_RUN_FILES, output_args, writer="run_clm_recurrent.py"
    )

    # 3. Seed before the recurrence module is initialised, so every run (and every process) starts from the same one.
    set_seed(training_args.seed)

    # 4. Tokenizer and model.
    if model_args.use_lora:
        check_lora_base(model_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    model = load_model(model_args)
    window_size, window_overlap = window_settings(model, model_args)
    block_size = window_overlap + data_args.windows_per_block * (window_size - window_overlap)
    if model_args.use_lora:
        model = add_lora(model, model_args)

    # 5. Data: blocks of whole windows. Tokenised on the main process first so the logs are not repeated.
    with training_args.main_process_first(desc="tokenising"):
        train_dataset = eval_dataset = None
        if training_args.do_train:
            train_dataset = load_blocks(
                data_args.train_file, "train", tokenizer, block_size, data_args.max_train_samples
            )
        if training_args.do_eval:
            if data_args.train_file is not None and data_args.validation_file is None:
                raise ValueError("--do_eval with --train_file needs --validation_file")
            eval_dataset = load_blocks(
                data_args.validation_file, "validation", tokenizer, block_size, data_args.max_eval_samples
            )

    # 6. Trainer.
    collator = (
        default_data_collator
        if model_args.model_type == "recurrent_gpt2"
        else WindowedBlocksCollator(window_size, window_overlap)
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        processing_class=tokenizer,
    )

    # 7. Train, resuming from --resume_from_checkpoint when given.
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()  # the model (or the adapter) and the tokenizer
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    # 8. Evaluate: loss per predicted token and its perplexity.
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        metrics["perplexity"] = math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 100 else float("inf")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.should_save:
        finish_output_dir(training_args.output_dir)


if __name__ == "__main__":
    main()
