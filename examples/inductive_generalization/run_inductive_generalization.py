# Copyright 2026 The hf-recurrence authors. Licensed under the Apache License, Version 2.0.
"""Inductive generalization on number sequence prediction (Nam et al. 2020, §5.1 and §6.2, Figures 4 and 5).

Trains I-BERT, BERT (absolute learned positions), I-BERT+PE and optionally I-BERT2 from scratch with the stock
`Trainer` on one NSP task (add, copy or reverse) with difficulties d = 2..12, then measures the sequence accuracy on
unseen difficulties d = 13..16 (and on fresh sequences of the training difficulties). Prints a table, writes
`results.json` and plots accuracy against difficulty (`accuracy_vs_difficulty.png`) into `--output_dir`.

CPU smoke run (seconds):

    python examples/inductive_generalization/run_inductive_generalization.py --output_dir /tmp/ig \
        --max_steps 2 --train_examples_per_difficulty 4 --validation_examples_per_difficulty 4 \
        --hidden_size 16 --num_hidden_layers 1 --num_attention_heads 2 --intermediate_size 32 --report_to none

The paper's setting (BERT-base sizes, 50 epochs, Adam at 3e-5, batch 32; needs a GPU):

    python examples/inductive_generalization/run_inductive_generalization.py --output_dir ig-paper \
        --hidden_size 768 --num_hidden_layers 12 --num_attention_heads 12 --intermediate_size 3072 \
        --num_train_epochs 50 --learning_rate 3e-5 --per_device_train_batch_size 32 --report_to none
"""

import json
import logging
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import matplotlib


matplotlib.use("Agg")  # file output only, no display needed

import matplotlib.pyplot as plt
import transformers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForTokenClassification,
    HfArgumentParser,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
    set_seed,
)

import hf_recurrence
from hf_recurrence import IBertForMaskedLM, InductiveBertConfig
from hf_recurrence.data import (
    NumberSequenceDataset,
    compute_number_sequence_metrics,
    inductive_split,
    logits_to_predictions,
    number_sequence_tokenizer,
)
from hf_recurrence.outputs import OutputDirArguments, finish_output_dir, prepare_training_output_dir


logger = logging.getLogger(__name__)

# The models compared in the paper's Figures 4 and 5, by the names used on the command line.
MODEL_NAMES = ("ibert", "bert", "ibert_pe", "ibert2")
REPORT_FILES = ("results.json", "accuracy_vs_difficulty.png")
MODEL_LABELS = {"ibert": "I-BERT", "bert": "BERT", "ibert_pe": "I-BERT+PE", "ibert2": "I-BERT2"}


@dataclass
class ModelArguments:
    models: str = field(
        default="ibert,bert,ibert_pe", metadata={"help": f"Comma-separated models to train, from {MODEL_NAMES}."}
    )
    hidden_size: int = field(default=64, metadata={"help": "Hidden size of every model (BERT-base: 768)."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Encoder layers (BERT-base: 12)."})
    num_attention_heads: int = field(default=4, metadata={"help": "Attention heads (BERT-base: 12)."})
    intermediate_size: int = field(default=256, metadata={"help": "Feed-forward width (BERT-base: 3072)."})


@dataclass
class DataArguments:
    task: str = field(default="add", metadata={"help": "NSP task: add, copy or reverse."})
    train_difficulties: str = field(default="2-12", metadata={"help": "Training difficulties, `first-last`."})
    validation_difficulties: str = field(default="13-16", metadata={"help": "Validation difficulties, `first-last`."})
    train_examples_per_difficulty: int = field(default=2327, metadata={"help": "Paper: 25600 / 11."})
    validation_examples_per_difficulty: int = field(default=384, metadata={"help": "Paper: 1536 / 4."})


def parse_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def build_model(name: str, model_args: ModelArguments, max_length: int) -> PreTrainedModel:
    """One of the compared models, all of the same size over the 16-token NSP vocabulary."""
    tokenizer = number_sequence_tokenizer()
    sizes = {
        "vocab_size": len(tokenizer),
        "hidden_size": model_args.hidden_size,
        "num_hidden_layers": model_args.num_hidden_layers,
        "num_attention_heads": model_args.num_attention_heads,
        "intermediate_size": model_args.intermediate_size,
        "pad_token_id": tokenizer.pad_token_id,
        "type_vocab_size": 1,
    }
    if name == "bert":
        # The position table must reach the longest validation sequence, or BERT could not even be run on it.
        return BertForMaskedLM(BertConfig(max_position_embeddings=max_length, **sizes))
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose from {MODEL_NAMES}")
    ablation = {
        "ibert": {},
        "ibert_pe": {"use_position_embeddings": True, "max_position_embeddings": max_length},
        "ibert2": {"lstm_feed_forward": True},
    }[name]
    return IBertForMaskedLM(InductiveBertConfig(**sizes, **ablation))


def train_and_evaluate(
    name: str,
    model_args: ModelArguments,
    training_args: TrainingArguments,
    train_set: NumberSequenceDataset,
    eval_sets: dict[str, NumberSequenceDataset],
    max_length: int,
) -> dict:
    set_seed(training_args.seed)
    model = build_model(name, model_args, max_length)
    args = replace(
        training_args, output_dir=str(Path(training_args.output_dir) / name), include_for_metrics=["inputs"]
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_sets,
        data_collator=DataCollatorForTokenClassification(number_sequence_tokenizer()),
        compute_metrics=compute_number_sequence_metrics,
        preprocess_logits_for_metrics=logits_to_predictions,
    )
    train_output = trainer.train()
    metrics = trainer.evaluate()
    per_difficulty = {
        int(key.rsplit("_d", 1)[1]): value
        for key, value in metrics.items()
        if key.startswith(("eval_train_", "eval_validation_")) and "_sequence_accuracy_d" in key
    }
    return {
        "label": MODEL_LABELS[name],
        "parameters": model.num_parameters(),
        "train_runtime_s": train_output.metrics["train_runtime"],
        "train_loss": train_output.metrics["train_loss"],
        "sequence_accuracy": dict(sorted(per_difficulty.items())),
        # Mean loss per masked digit: it still separates the models when no sequence is entirely right.
        "digit_loss": {split: metrics[f"eval_{split}_loss"] for split in eval_sets},
    }


def print_table(results: dict, train_difficulties: range, validation_difficulties: range) -> None:
    held_in = f"d {train_difficulties[0]}..{train_difficulties[-1]} (mean)"
    columns = [held_in, *(f"d={d}" for d in validation_difficulties)]
    print("| model | parameters | " + " | ".join(columns) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in columns) + " |")
    for result in results.values():
        accuracy = result["sequence_accuracy"]
        seen = sum(accuracy[d] for d in train_difficulties) / len(train_difficulties)
        cells = [f"{seen:.3f}", *(f"{accuracy[d]:.3f}" for d in validation_difficulties)]
        print(f"| {result['label']} | {result['parameters']:,} | " + " | ".join(cells) + " |")


def plot(results: dict, task: str, train_difficulties: range, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(6, 4))
    for result in results.values():
        difficulties = sorted(result["sequence_accuracy"])
        axes.plot(
            difficulties, [result["sequence_accuracy"][d] for d in difficulties], marker="o", label=result["label"]
        )
    axes.axvspan(train_difficulties[0] - 0.5, train_difficulties[-1] + 0.5, color="0.9", label="training difficulties")
    axes.set(xlabel="difficulty d (digits)", ylabel="sequence accuracy", ylim=(-0.02, 1.02), title=f"NSP {task}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    # 1. Arguments and logging.
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments, OutputDirArguments))
    model_args, data_args, training_args, output_args = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity_warning()
    names = [n.strip() for n in model_args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODEL_NAMES]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {MODEL_NAMES}")
    # Each model trains in its own sub-folder; the report and the plot sit beside them.
    prepare_training_output_dir(
        training_args, (*MODEL_NAMES, *REPORT_FILES), output_args, writer="run_inductive_generalization.py"
    )

    # 2. Data: the inductive split, plus fresh sequences of the training difficulties to check what was learned.
    train_difficulties = parse_range(data_args.train_difficulties)
    validation_difficulties = parse_range(data_args.validation_difficulties)
    train_set, validation_set = inductive_split(
        data_args.task,
        train_difficulties,
        validation_difficulties,
        data_args.train_examples_per_difficulty,
        data_args.validation_examples_per_difficulty,
        seed=training_args.seed,
    )
    held_in_set = NumberSequenceDataset(
        data_args.task, train_difficulties, data_args.validation_examples_per_difficulty, seed=training_args.seed + 1
    )
    eval_sets = {"train": held_in_set, "validation": validation_set}
    max_length = max(len(example["input_ids"]) for example in validation_set.examples)
    logger.info(
        "%d training and %d validation sequences, longest %d tokens", len(train_set), len(validation_set), max_length
    )

    # 3. Train and evaluate every model with the same data, sizes, seed and training arguments.
    results = {
        name: train_and_evaluate(name, model_args, training_args, train_set, eval_sets, max_length) for name in names
    }

    # 4. Report: table, JSON, plot.
    print_table(results, train_difficulties, validation_difficulties)
    output_dir = Path(training_args.output_dir)
    report = {
        "task": data_args.task,
        "command": " ".join(["python", *sys.argv]) if argv is None else None,
        "train_difficulties": list(train_difficulties),
        "validation_difficulties": list(validation_difficulties),
        "model_arguments": asdict(model_args),
        "training_arguments": {
            key: getattr(training_args, key)
            for key in ("num_train_epochs", "max_steps", "learning_rate", "per_device_train_batch_size", "seed")
        },
        "versions": {"hf_recurrence": hf_recurrence.__version__, "transformers": transformers.__version__},
        "results": results,
    }
    (output_dir / "results.json").write_text(json.dumps(report, indent=2))
    plot(results, data_args.task, train_difficulties, output_dir / "accuracy_vs_difficulty.png")
    logger.info("wrote %s and %s", output_dir / "results.json", output_dir / "accuracy_vs_difficulty.png")
    finish_output_dir(output_dir)
    return report


if __name__ == "__main__":
    main()
