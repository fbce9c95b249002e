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

The paper's setting (its Table 1 model: 12 layers of width 768 with a 2048-wide feed-forward, 70.3M parameters for
I-BERT; 50 epochs of 800 steps at batch 32, Adam at 3e-5 decayed x0.97 per epoch; needs a GPU):

    python examples/inductive_generalization/run_inductive_generalization.py --output_dir ig-paper \
        --hidden_size 768 --num_hidden_layers 12 --num_attention_heads 12 --intermediate_size 2048 \
        --num_train_epochs 50 --learning_rate 3e-5 --lr_decay_per_epoch 0.97 --per_device_train_batch_size 32 \
        --eval_strategy epoch --save_strategy no --report_to none

The authors' code (github hwnam831/ibert) makes choices the paper's text leaves open; each is an option here, off by
default: `--train_difficulties 1-12`, `--regenerate_every_epoch`, `--random_offset_layout`,
`--loss_on_every_position`. With evaluations during training (`--eval_strategy epoch` or `steps`) the report gives
the final checkpoint's accuracy and that of the evaluation with the lowest validation loss, the authors' choice; that
one is chosen on the very sequences it is scored on, so its numbers on the validation difficulties are inflated.
"""

import json
import logging
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import matplotlib


matplotlib.use("Agg")  # file output only, no display needed

import matplotlib.pyplot as plt
import transformers
from torch.optim.lr_scheduler import LambdaLR
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
    intermediate_size: int = field(
        default=256, metadata={"help": "Feed-forward width (the paper's model: 2048; BERT-base: 3072)."}
    )
    dropout: float = field(
        default=0.1,
        metadata={
            "help": "Dropout on hidden states and attention probabilities of every model (BERT's default: 0.1)."
        },
    )


@dataclass
class DataArguments:
    task: str = field(default="add", metadata={"help": "NSP task: add, copy or reverse."})
    train_difficulties: str = field(
        default="2-12",
        metadata={"help": "Training difficulties, `first-last` (the paper: 2-12; the authors' code: 1-12)."},
    )
    validation_difficulties: str = field(default="13-16", metadata={"help": "Validation difficulties, `first-last`."})
    train_examples_per_difficulty: int = field(
        default=2327, metadata={"help": "Paper: 25600 / 11 (with difficulties 1-12: 2133, 25596 in all)."}
    )
    validation_examples_per_difficulty: int = field(default=384, metadata={"help": "Paper: 1536 / 4."})


@dataclass
class ProtocolArguments:
    """The authors' code's choices that the paper's text leaves open, each off by default (this repository's)."""

    regenerate_every_epoch: bool = field(
        default=False,
        metadata={
            "help": "Draw a fresh training set every epoch: epoch e > 0 seeds its examples by (task, seed, d, index, "
            "e); epoch 0 is the set drawn without the option. Default: the same set every epoch."
        },
    )
    random_offset_layout: bool = field(
        default=False,
        metadata={
            "help": "Place each sequence at a random offset of a fixed-width window of [PAD] tokens, with no padding "
            "mask (the models attend to the [PAD] tokens); the window fits the longest sequence of the set's highest "
            "difficulty. Default: padding on the right per batch, masked out."
        },
    )
    loss_on_every_position: bool = field(
        default=False,
        metadata={
            "help": "Train and evaluate the loss on every position (each unmasked token predicts itself, [PAD] "
            "included). Default: only the masked answer digits. Sequence accuracy scores the answer digits either way."
        },
    )
    lr_decay_per_epoch: float | None = field(
        default=None,
        metadata={
            "help": "Multiply the learning rate by this factor after every epoch (the paper: 0.97), in place of "
            "--lr_scheduler_type; no warm-up. Default: the TrainingArguments schedule."
        },
    )


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
        "hidden_dropout_prob": model_args.dropout,
        "attention_probs_dropout_prob": model_args.dropout,
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


class EpochDecayTrainer(Trainer):
    """`Trainer` whose learning rate is multiplied by `lr_decay_per_epoch` after every epoch (the paper's schedule:
    Adam, x0.97 per epoch), in place of `lr_scheduler_type` and warm-up."""

    def __init__(self, *args, lr_decay_per_epoch: float, **kwargs):
        super().__init__(*args, **kwargs)
        if not 0 < lr_decay_per_epoch <= 1:
            raise ValueError(f"lr_decay_per_epoch must be in (0, 1], got {lr_decay_per_epoch}")
        if self.args.warmup_steps or getattr(self.args, "warmup_ratio", 0):
            raise ValueError("--lr_decay_per_epoch has no warm-up; drop --warmup_steps / --warmup_ratio")
        self.lr_decay_per_epoch = lr_decay_per_epoch

    def updates_per_epoch(self) -> int:
        """Optimizer steps in one pass over the training set, as `Trainer` counts them."""
        rows = self.args.train_batch_size * self.args.world_size
        batches = len(self.train_dataset) / rows
        batches = math.floor(batches) if self.args.dataloader_drop_last else math.ceil(batches)
        return max(1, math.ceil(batches / self.args.gradient_accumulation_steps))

    def create_scheduler(self, num_training_steps: int, optimizer=None) -> LambdaLR:
        if self.lr_scheduler is None:
            steps, decay = self.updates_per_epoch(), self.lr_decay_per_epoch
            optimizer = self.optimizer if optimizer is None else optimizer
            self.lr_scheduler = LambdaLR(optimizer, lambda step: decay ** (step // steps))
        return self.lr_scheduler


def evaluation_history(log_history: list[dict], loss_key: str) -> list[dict]:
    """Every evaluation of a run in `Trainer.state.log_history`, the eval sets of one step merged: step, epoch, the
    loss per set under `loss_key`, and the sequence accuracy per difficulty."""
    evaluations: dict[int, dict] = {}
    for entry in log_history:
        for split in ("train", "validation"):
            if f"eval_{split}_loss" not in entry:
                continue
            record = evaluations.setdefault(
                entry["step"], {"step": entry["step"], "epoch": entry.get("epoch"), loss_key: {}, "accuracy": {}}
            )
            record[loss_key][split] = entry[f"eval_{split}_loss"]
            prefix = f"eval_{split}_sequence_accuracy_d"
            record["accuracy"].update({int(k[len(prefix) :]): v for k, v in entry.items() if k.startswith(prefix)})
    return [
        {
            "step": r["step"],
            "epoch": r["epoch"],
            loss_key: r[loss_key],
            "sequence_accuracy": dict(sorted(r["accuracy"].items())),
        }
        for r in evaluations.values()
    ]


def train_and_evaluate(
    name: str,
    model_args: ModelArguments,
    training_args: TrainingArguments,
    protocol: ProtocolArguments,
    train_set: NumberSequenceDataset,
    eval_sets: dict[str, NumberSequenceDataset],
    max_length: int,
) -> dict:
    set_seed(training_args.seed)
    model = build_model(name, model_args, max_length)
    args = replace(
        training_args, output_dir=str(Path(training_args.output_dir) / name), include_for_metrics=["inputs"]
    )
    trainer_class, schedule = Trainer, {}
    if protocol.lr_decay_per_epoch is not None:
        trainer_class, schedule = EpochDecayTrainer, {"lr_decay_per_epoch": protocol.lr_decay_per_epoch}
    # A fresh draw per epoch (NumberSequenceDataset.set_epoch, called by Trainer through accelerate) starts at epoch 0.
    train_set.set_epoch(0)
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_sets,
        data_collator=DataCollatorForTokenClassification(number_sequence_tokenizer()),
        compute_metrics=compute_number_sequence_metrics,
        preprocess_logits_for_metrics=logits_to_predictions,
        **schedule,
    )
    train_output = trainer.train()
    metrics = trainer.evaluate()
    per_difficulty = {
        int(key.rsplit("_d", 1)[1]): value
        for key, value in metrics.items()
        if key.startswith(("eval_train_", "eval_validation_")) and "_sequence_accuracy_d" in key
    }
    loss_key = loss_name(protocol)
    # The final evaluation is the last; with evaluations during training (--eval_strategy), the authors' pick is the
    # one of lowest validation loss, the earliest on a tie.
    history = evaluation_history(trainer.state.log_history, loss_key)
    chosen = min(history, key=lambda evaluation: evaluation[loss_key]["validation"])
    return {
        "label": MODEL_LABELS[name],
        "parameters": model.num_parameters(),
        "train_runtime_s": train_output.metrics["train_runtime"],
        "train_loss": train_output.metrics["train_loss"],
        # The final checkpoint's.
        "final_step": trainer.state.global_step,
        "sequence_accuracy": dict(sorted(per_difficulty.items())),
        # Mean loss per masked digit (or per position, with --loss_on_every_position): it still separates the
        # models when no sequence is entirely right.
        loss_key: {split: metrics[f"eval_{split}_loss"] for split in eval_sets},
        # Chosen on the validation set's loss, then scored on that same set: optimistic on the validation difficulties.
        "chosen_on_validation_loss": chosen,
        "evaluations": history,
    }


def loss_name(protocol: ProtocolArguments) -> str:
    """The report's key for the evaluation loss: what it averages over."""
    return "position_loss" if protocol.loss_on_every_position else "digit_loss"


def print_table(
    results: dict, train_difficulties: range, validation_difficulties: range, checkpoint: str = "final"
) -> None:
    """The sequence accuracy of the `final` checkpoints, or of those `chosen` on validation loss."""
    held_in = f"d {train_difficulties[0]}..{train_difficulties[-1]} (mean)"
    columns = [held_in, *(f"d={d}" for d in validation_difficulties)]
    print("| model | parameters | " + " | ".join(columns) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in columns) + " |")
    for result in results.values():
        label, accuracy = result["label"], result["sequence_accuracy"]
        if checkpoint == "chosen":
            chosen = result["chosen_on_validation_loss"]
            label, accuracy = f"{label}, step {chosen['step']}", chosen["sequence_accuracy"]
        seen = sum(accuracy[d] for d in train_difficulties) / len(train_difficulties)
        cells = [f"{seen:.3f}", *(f"{accuracy[d]:.3f}" for d in validation_difficulties)]
        print(f"| {label} | {result['parameters']:,} | " + " | ".join(cells) + " |")


def plot(results: dict, task: str, train_difficulties: range, path: Path) -> None:
    """Accuracy against difficulty of the final checkpoints (solid), and dashed of those of lowest validation loss
    where that is another step."""
    figure, axes = plt.subplots(figsize=(6, 4))
    for result in results.values():
        difficulties = sorted(result["sequence_accuracy"])
        (line,) = axes.plot(
            difficulties, [result["sequence_accuracy"][d] for d in difficulties], marker="o", label=result["label"]
        )
        chosen = result["chosen_on_validation_loss"]
        if chosen["step"] != result["final_step"]:
            axes.plot(
                difficulties,
                [chosen["sequence_accuracy"][d] for d in difficulties],
                linestyle="--",
                marker=".",
                color=line.get_color(),
                label=f"{result['label']}, lowest validation loss (step {chosen['step']})",
            )
    axes.axvspan(train_difficulties[0] - 0.5, train_difficulties[-1] + 0.5, color="0.9", label="training difficulties")
    axes.set(xlabel="difficulty d (digits)", ylabel="sequence accuracy", ylim=(-0.02, 1.02), title=f"NSP {task}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    # 1. Arguments and logging.
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, ProtocolArguments, TrainingArguments, OutputDirArguments)
    )
    model_args, data_args, protocol, training_args, output_args = parser.parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity_warning()
    names = [n.strip() for n in model_args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODEL_NAMES]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {MODEL_NAMES}")
    if protocol.regenerate_every_epoch and training_args.dataloader_persistent_workers:
        # Persistent workers keep the copy of the data set they started with: set_epoch would not reach them.
        raise ValueError(
            "--regenerate_every_epoch needs workers that restart every epoch: drop --dataloader_persistent_workers"
        )
    # Each model trains in its own sub-folder; the report and the plot sit beside them.
    prepare_training_output_dir(
        training_args, (*MODEL_NAMES, *REPORT_FILES), output_args, writer="run_inductive_generalization.py"
    )

    # 2. Data: the inductive split, plus fresh sequences of the training difficulties to check what was learned.
    train_difficulties = parse_range(data_args.train_difficulties)
    validation_difficulties = parse_range(data_args.validation_difficulties)
    layout = {"random_offset": protocol.random_offset_layout, "label_every_position": protocol.loss_on_every_position}
    train_set, validation_set = inductive_split(
        data_args.task,
        train_difficulties,
        validation_difficulties,
        data_args.train_examples_per_difficulty,
        data_args.validation_examples_per_difficulty,
        seed=training_args.seed,
        regenerate_every_epoch=protocol.regenerate_every_epoch,
        **layout,
    )
    held_in_set = NumberSequenceDataset(
        data_args.task,
        train_difficulties,
        data_args.validation_examples_per_difficulty,
        seed=training_args.seed + 1,
        **layout,
    )
    eval_sets = {"train": held_in_set, "validation": validation_set}
    max_length = max(len(example["input_ids"]) for example in validation_set.examples)
    logger.info(
        "%d training and %d validation sequences, longest %d tokens", len(train_set), len(validation_set), max_length
    )

    # 3. Train and evaluate every model with the same data, sizes, seed and training arguments.
    results = {
        name: train_and_evaluate(name, model_args, training_args, protocol, train_set, eval_sets, max_length)
        for name in names
    }

    # 4. Report: table, JSON, plot.
    print("Final checkpoints:")
    print_table(results, train_difficulties, validation_difficulties)
    if any(result["chosen_on_validation_loss"]["step"] != result["final_step"] for result in results.values()):
        print("\nChosen on validation loss (the authors' pick; scored on the sequences that chose it, so inflated):")
        print_table(results, train_difficulties, validation_difficulties, checkpoint="chosen")
    output_dir = Path(training_args.output_dir)
    report = {
        "task": data_args.task,
        "command": " ".join(["python", *sys.argv]) if argv is None else None,
        "train_difficulties": list(train_difficulties),
        "validation_difficulties": list(validation_difficulties),
        "model_arguments": asdict(model_args),
        "data_arguments": asdict(data_args),
        "protocol": asdict(protocol),
        "training_arguments": {
            # The schedule and strategy enums as their command-line values.
            key: getattr(value, "value", value)
            for key in (
                "num_train_epochs",
                "max_steps",
                "learning_rate",
                "per_device_train_batch_size",
                "seed",
                "lr_scheduler_type",
                "warmup_steps",
                "max_grad_norm",
                "eval_strategy",
                "eval_steps",
            )
            for value in [getattr(training_args, key)]
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
