"""The training the reproduction pipelines share: the stock `Trainer` on a short CPU run (AdamW, warm-up then cosine
decay, no checkpoints), used to pretrain the default model and to fine-tune every arm of both reproductions."""

import tempfile
import time
from collections.abc import Sequence
from typing import Protocol

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments, set_seed


class TrainingSchedule(Protocol):
    """The training fields `short_run_arguments` reads (of `PretrainingSettings`, `ReproductionSettings` or
    `BookReproductionSettings`)."""

    max_steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    seed: int


def short_run_arguments(output_dir: str, schedule: TrainingSchedule, bf16: bool = False) -> TrainingArguments:
    """Trainer arguments of the project's own short CPU runs, on `schedule`: AdamW, warm-up then cosine decay, no
    checkpoints; `bf16`: bfloat16 autocast (on CPU too: these CPUs compute it natively), weights and optimizer kept in
    float32."""
    return TrainingArguments(
        bf16=bf16,
        # transformers refuses bf16 without a GPU unless told the run is on the CPU.
        use_cpu=not torch.cuda.is_available(),
        output_dir=output_dir,
        max_steps=schedule.max_steps,
        per_device_train_batch_size=schedule.batch_size,
        per_device_eval_batch_size=schedule.batch_size,
        learning_rate=schedule.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=schedule.warmup_steps,
        weight_decay=0.01,
        logging_steps=max(1, schedule.max_steps // 10),
        save_strategy="no",
        report_to="none",
        seed=schedule.seed,
        dataloader_pin_memory=False,
    )


def fine_tune(
    model: PreTrainedModel,
    dataset,
    settings: TrainingSchedule,
    collator=None,
    parameter_groups: list[dict] | None = None,
    bf16: bool = False,
    callbacks: Sequence[TrainerCallback] = (),
) -> float:
    """Fine-tune the trainable parameters of `model` with the stock Trainer; returns the final training loss.

    `parameter_groups`: AdamW parameter groups with their own `lr` (the schedule scales each), instead of every
    trainable parameter at `settings.learning_rate`. `callbacks`: the Trainer's, e.g. `RunProgress.start`'s pace.
    """
    set_seed(settings.seed)
    optimizer = None
    if parameter_groups is not None:
        optimizer = torch.optim.AdamW(parameter_groups, lr=settings.learning_rate, weight_decay=0.01)
    with tempfile.TemporaryDirectory(prefix="hf_recurrence_reproduce_") as scratch:
        trainer = Trainer(
            model=model,
            args=short_run_arguments(scratch, settings, bf16=bf16),
            train_dataset=dataset,
            data_collator=collator,
            optimizers=(optimizer, None),
            callbacks=list(callbacks),
        )
        return trainer.train().training_loss


# Steps after which a training's pace is measured and the run's training time left estimated from it.
ESTIMATE_AFTER_STEPS = 10


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class RunProgress:
    """What a run of several trainings prints as it goes, so that an hour on a busy machine is never silent: the plan
    up front, each training as it starts ("training recurrent (2/4)"), and, once each training has taken its first
    `ESTIMATE_AFTER_STEPS` steps, its pace and the run's training time left (seconds a step x steps left; measured
    again in every training, as the machine's load and the arms' cost change), and again every `every` steps when
    given (a long training's pace over all its steps so far). Evaluations are not in the estimate."""

    def __init__(self, trainings: Sequence[str], steps_per_training: int, every: int | None = None):
        self.trainings = list(trainings)
        self.steps_per_training = steps_per_training
        self.every = every
        self.started = 0

    def plan(self, evaluations: int) -> str:
        return (
            f"Plan: {len(self.trainings)} training{'s' * (len(self.trainings) != 1)} of {self.steps_per_training} steps "
            f"({', '.join(self.trainings)}), then {evaluations} evaluations"
        )

    def start(self, name: str) -> TrainerCallback:
        """Say that training `name` starts; returns the callback that reports its pace (give it to `fine_tune`)."""
        self.started += 1
        print(f"training {name} ({self.started}/{len(self.trainings)}): {self.steps_per_training} steps", flush=True)
        return _Pace((len(self.trainings) - self.started) * self.steps_per_training, self.every)


class _Pace(TrainerCallback):
    """Prints one training's seconds a step, and the training time left in the run, after its first steps (and every
    `every` steps when given)."""

    def __init__(self, steps_in_later_trainings: int, every: int | None = None):
        self.steps_in_later_trainings = steps_in_later_trainings
        self.every = every
        self.began = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        periodic = self.every is not None and step % self.every == 0 and step < state.max_steps
        if step != min(ESTIMATE_AFTER_STEPS, state.max_steps) and not periodic:
            return
        pace = (time.perf_counter() - self.began) / step
        left = pace * (state.max_steps - step + self.steps_in_later_trainings)
        # Through tqdm, which clears and redraws the Trainer's progress bar around the line.
        tqdm.write(
            f"  {pace:.2f} s a step after {step} steps: about {duration(left)} of training left in "
            "this run (evaluations not counted)"
        )
