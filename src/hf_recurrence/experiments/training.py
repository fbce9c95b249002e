"""The training the reproduction pipelines share: the stock `Trainer` on a short CPU run (AdamW, warm-up then cosine
decay, no checkpoints unless a long run asks for them), used to pretrain the default model and to fine-tune every arm
of both reproductions."""

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
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
    checkpoints: "TrainingCheckpoints | None" = None,
) -> float:
    """Fine-tune the trainable parameters of `model` with the stock Trainer; returns the final training loss.

    `parameter_groups`: AdamW parameter groups with their own `lr` (the schedule scales each), instead of every
    trainable parameter at `settings.learning_rate`. `callbacks`: the Trainer's, e.g. `RunProgress.start`'s pace.
    `checkpoints`: keep the training resumable in its folder, and continue from the checkpoint it holds.
    """
    set_seed(settings.seed)
    optimizer = None
    if parameter_groups is not None:
        optimizer = torch.optim.AdamW(parameter_groups, lr=settings.learning_rate, weight_decay=0.01)
    folder = (
        contextlib.nullcontext(str(checkpoints.folder))
        if checkpoints is not None
        else tempfile.TemporaryDirectory(prefix="hf_recurrence_reproduce_")
    )
    with folder as output_dir:
        trainer = Trainer(
            model=model,
            args=short_run_arguments(output_dir, settings, bf16=bf16),
            train_dataset=dataset,
            data_collator=collator,
            optimizers=(optimizer, None),
            callbacks=[*callbacks, *([checkpoints] if checkpoints is not None else [])],
        )
        if checkpoints is None:
            return trainer.train().training_loss
        resumed_from = checkpoints.resumed_from
        result = trainer.train(resume_from_checkpoint=None if resumed_from is None else str(resumed_from))
        return checkpoints.whole_training_loss(result.training_loss, trainer.state.global_step)


# The file in each of `TrainingCheckpoints`' checkpoints with every trainable parameter and the minutes so far;
# written last, so a checkpoint without it was cut short and is not resumed from.
TRAINABLE = "trainable.safetensors"


class TrainingCheckpoints(TrainerCallback):
    """Keeps one long training resumable (give it to `fine_tune`): at every logged step before the last (a tenth of
    the training, the Trainer's `logging_steps`) the Trainer's own checkpoint in `folder` (optimizer, schedule, random
    states, its state with the losses logged so far), with every trainable parameter and the training's minutes
    (`TRAINABLE`: PEFT's adapter files leave out what is trained beside the adapter, such as a recurrence module);
    each checkpoint replaces the one before. A `fine_tune` given a folder holding one continues from it, as the
    Trainer does (the same batches in the same order, the data already read skipped), and returns the loss of the
    whole training, as one sitting would; `minutes()` counts every sitting's. Checkpoints fall on logged steps so
    that the losses logged before one add up to the training loss so far."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.resumed_from = self.latest()
        self.began = time.perf_counter()
        self.minutes_before = 0.0
        self.steps_before = 0
        self.loss_sum_before = 0.0

    def latest(self) -> Path | None:
        """The last complete checkpoint in `folder`, if any."""
        complete = [path for path in self.folder.glob("checkpoint-*") if (path / TRAINABLE).is_file()]
        return max(complete, key=lambda path: int(path.name.rsplit("-", 1)[1]), default=None)

    def minutes(self) -> float:
        return self.minutes_before + (time.perf_counter() - self.began) / 60

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.resumed_from is None:
            return
        saved = self.resumed_from / TRAINABLE
        parameters = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in load_file(str(saved)).items():
                parameters[name].copy_(value)
        with safe_open(str(saved), "pt") as file:
            self.minutes_before = float(file.metadata()["minutes"])
        self.steps_before = state.global_step
        self.loss_sum_before = logged_loss_sum(state.log_history, state.global_step)
        print(f"  resuming the training from step {state.global_step} of {state.max_steps} ({self.resumed_from})")

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % state.logging_steps == 0 and state.global_step < state.max_steps:
            control.should_save = True

    def on_save(self, args, state, control, model=None, **kwargs):
        checkpoint = self.folder / f"checkpoint-{state.global_step}"
        trainable = {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}
        partial = checkpoint / f".{TRAINABLE}.partial"
        save_file(trainable, str(partial), metadata={"minutes": repr(self.minutes())})
        os.replace(partial, checkpoint / TRAINABLE)
        for earlier in self.folder.glob("checkpoint-*"):
            if earlier != checkpoint:
                shutil.rmtree(earlier)

    def whole_training_loss(self, sitting_loss: float, steps: int) -> float:
        """The mean loss over all `steps` from this sitting's (the Trainer's `training_loss`) and the earlier ones'."""
        return (self.loss_sum_before + sitting_loss * (steps - self.steps_before)) / steps


def logged_loss_sum(log_history: list[dict], step: int) -> float:
    """The sum of the training losses of steps 1..`step` from the Trainer's `log_history` (each logged loss is the
    mean since the previous log); `step` must be a logged step."""
    total, last = 0.0, 0
    for entry in log_history:
        if "loss" in entry and entry["step"] <= step:
            total += entry["loss"] * (entry["step"] - last)
            last = entry["step"]
    if last != step:
        raise ValueError(f"no training loss logged at step {step} (the last at {last}): cannot resume its mean")
    return total


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
            f"({', '.join(self.trainings)}), then {evaluations} evaluation{'s' * (evaluations != 1)}"
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
        self.first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed training begins at its checkpoint's step: the pace is this sitting's.
        self.began, self.first_step = time.perf_counter(), state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        periodic = self.every is not None and step % self.every == 0 and step < state.max_steps
        if step - self.first_step != min(ESTIMATE_AFTER_STEPS, state.max_steps - self.first_step) and not periodic:
            return
        pace = (time.perf_counter() - self.began) / (step - self.first_step)
        left = pace * (state.max_steps - step + self.steps_in_later_trainings)
        # Through tqdm, which clears and redraws the Trainer's progress bar around the line.
        tqdm.write(
            f"  {pace:.2f} s a step after {step} steps: about {duration(left)} of training left in "
            "this run (evaluations not counted)"
        )
