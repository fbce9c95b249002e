# SPDX-License-Identifier: Apache-2.0
"""Does the recurrence carry information? The key-recall task (`hf_recurrence.data.key_recall`): a recurrent GPT-2
against the same GPT-2 without it. `experiments/recurrence_recall.py` runs it over seeds and prints the table.

The same code runs the associative-recall task (`hf_recurrence.data.associative_recall`, `task="associative"`: several
key-value pairs, one asked) and any memory setting of the recurrence (`memory`: `RecurrentGPT2Config` fields such as
`memory_slots`, `memory_pooling` or `recurrence_input="zeros"`, the zero-input control); `memory_gates` runs the
memory's gates on them.

Task (`hf_recurrence.data.key_recall`). The key is only in the window before the answer, so only the one-vector
summary `h_prev` of that window, which the recurrent GPT-2 sees as an extra key/value at block `insertion_layer`, can
carry it to the query.

Baseline. The recurrent GPT-2 with `h_prev` masked out computes exactly a stock `transformers.GPT2LMHeadModel` that
reads each window on its own (positions restart per window in both). So the baseline is a `GPT2LMHeadModel` with the
same config and the same initial weights, trained with the same optimizer, schedule, steps and batches, reshaped from
`(batch, num_windows * window_size)` to `(batch * num_windows, window_size)` with the same labels. It cannot see the
key, so its accuracy should stay at the chance level `1 / num_keys`. The baseline can instead be the reference from
above (`baseline_context="full"`): the same stock GPT-2 with positions for the whole row, reading every window of it
as one sequence. It sees window 0 directly: a task that it does not learn within a budget tests the backbone's
learning there, not the memory's.

Control. The trained recurrent model is also scored with every row's earlier windows swapped for another row's
(keeping its own last window): if it reads the key through `h_prev`, it now answers the other row's key, and its
accuracy against the row's own key falls to chance.

Choices. Only the answer is labelled: the filler is uniform noise, so its language-modelling loss is irreducible for
both models and would only add gradient noise and compute; this gives both models exactly one, identical learnable
target. Accuracy is the argmax over the whole vocabulary at the query position, on a held-out batch drawn from a
random stream the training batches never use. Training is plain AdamW on the models' own `labels=` loss (warmup,
then linear decay, gradient clipping) on fresh batches, with full backpropagation through time (`bptt_windows=None`)
and no dropout. `initializer_range` is 0.1 rather than GPT-2's 0.02 (for both models): trained from scratch at 0.02,
the cross-window path sits at chance for well over a thousand steps, while an in-window version of the task is learnt
in under a hundred.

Curriculum (`curriculum=`, off by default). At windows of 64 tokens and more, a model trained from scratch at its own
window size stays at chance: within a few steps it learns the uniform guess over the keys, and the gradient that
reaches the recurrence collapses (the memory gates' page, `docs/experiments/memory_gates.md`, measures it). Trained
first on the same task at shorter windows (the key among fewer tokens; the recurrent model reads them with a state
of that window schedule), it finds the path across windows, which then carries over to the long ones.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from ..data.associative_recall import (
    AssociativeVocab,
    among_row_values,
    make_associative_batch,
    make_bare_associative_batch,
)
from ..data.key_recall import RecallVocab, make_recall_batch, swap_earlier_windows, to_independent_windows
from ..models.recurrent_decoder import RecurrentGPT2Config, RecurrentGPT2LMHeadModel


# The settings of `run_recall_experiment` that `build_models` takes under their own names.
MODEL_SETTINGS = (
    "window_size",
    "n_layer",
    "n_embd",
    "n_head",
    "insertion_layer",
    "recurrence_hidden_sizes",
    "initializer_range",
    "seed",
    "memory",
)

# The recurrence fields `build_models` sets itself; `memory` may set any other of `RecurrentGPT2Config`'s.
BUILT_SETTINGS = ("window_size", "window_overlap", "insertion_layer", "recurrence_hidden_sizes", "bptt_windows")

TASKS = ("key", "associative")

LR_SCHEDULES = ("linear", "constant")

# What the no-recurrence baseline reads: each window as its own sequence, or every window of a row as one sequence
# (full attention over the whole row: the most any memory of the earlier windows could give).
BASELINE_CONTEXTS = ("window", "full")

# A batch of a task: (batch_size, generator) -> (input_ids, labels, answers).
Batches = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Stage:
    """`steps` training steps on `batches` of the task laid out in windows of `window_size` tokens, which the
    recurrent model reads with a state of that window schedule (`new_state(..., window_size=)`)."""

    window_size: int
    steps: int
    batches: Batches


def build_models(
    *,
    window_size: int,
    vocab: RecallVocab | AssociativeVocab,
    n_layer: int,
    n_embd: int,
    n_head: int,
    insertion_layer: int,
    recurrence_hidden_sizes: list[int],
    initializer_range: float,
    seed: int,
    memory: dict | None = None,
    baseline_positions: int | None = None,
) -> tuple[RecurrentGPT2LMHeadModel, GPT2LMHeadModel]:
    """A tiny recurrent GPT-2 and a stock GPT-2 with the same config and the same initial weights (copies).

    `baseline_positions`: the stock GPT-2's positions (default: `window_size`). With more, it can read several
    windows as one sequence; its first `window_size` position embeddings are the recurrent model's, the rest its own
    initialisation.

    `memory`: further recurrence fields of the recurrent model's config (`RecurrentGPT2Config.family_settings`,
    e.g. `{"memory_slots": 4, "memory_pooling": "attention"}` or `{"recurrence_input": "zeros"}`); none (the
    default) is the paper's recurrence. A name that is not such a field is refused: a config would keep it as an
    inert attribute, and the run would silently be the paper's.
    """
    memory = dict(memory or {})
    unknown = sorted(set(memory) - (set(RecurrentGPT2Config.family_settings) - set(BUILT_SETTINGS)))
    if unknown:
        raise ValueError(
            f"memory: {unknown} not recurrence settings this experiment leaves open; those are "
            f"{sorted(set(RecurrentGPT2Config.family_settings) - set(BUILT_SETTINGS))}"
        )
    # The toys never generate: the special tokens only need ids in range (key recall: its query token).
    special = vocab.size - 1
    common = {
        "vocab_size": vocab.size,
        "n_positions": window_size,
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_head": n_head,
        "initializer_range": initializer_range,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": special,
        "eos_token_id": special,
    }
    torch.manual_seed(seed)
    recurrent = RecurrentGPT2LMHeadModel(
        RecurrentGPT2Config(
            **common,
            window_size=window_size,
            window_overlap=0,
            insertion_layer=insertion_layer,
            recurrence_hidden_sizes=list(recurrence_hidden_sizes),
            bptt_windows=None,  # full backpropagation through time
            **memory,
        )
    )
    baseline = GPT2LMHeadModel(GPT2Config(**{**common, "n_positions": baseline_positions or window_size}))
    weights = recurrent.backbone.state_dict()
    positions = baseline.transformer.wpe.weight.detach().clone()  # (n_positions, n_embd)
    positions[:window_size] = weights["transformer.wpe.weight"]
    weights["transformer.wpe.weight"] = positions
    missing, unexpected = baseline.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"Weights do not map onto GPT-2: missing={missing}, unexpected={unexpected}")
    return recurrent, baseline


def recall_loss(
    model: nn.Module, recurrent: bool, window_size: int, ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The model's own causal-LM loss (`labels=`) on a batch laid out in windows of `window_size` tokens (the
    config's, or shorter: a curriculum's stage); the baseline reads every window as its own sequence.

    Both average over the labelled positions, one per row (in the baseline, windows before the last have none).
    """
    if not recurrent:
        ids, labels = to_independent_windows(ids, window_size), to_independent_windows(labels, window_size)
        return model(ids, labels=labels, use_cache=False).loss
    state = model.new_state(ids.shape[0], window_size=window_size)
    return model(ids, labels=labels, past_key_values=state, use_cache=False).loss


@torch.no_grad()
def recall_predictions(
    model: nn.Module, recurrent: bool, window_size: int, ids: torch.Tensor, chunk_size: int = 256
) -> torch.Tensor:
    """(batch,) the argmax prediction at each row's query position (second-to-last token), read `chunk_size` rows at
    a time (rows are independent: the same result, less memory)."""
    model.eval()
    predictions = []
    for start in range(0, ids.shape[0], chunk_size):
        chunk = ids[start : start + chunk_size]
        if recurrent:
            logits = model(chunk, use_cache=False).logits  # (batch, length, vocab)
        else:
            logits = model(to_independent_windows(chunk, window_size), use_cache=False).logits
            logits = logits.reshape(chunk.shape[0], -1, logits.shape[-1])  # back to (batch, length, vocab)
        predictions.append(logits[:, -2].argmax(-1))
    return torch.cat(predictions)


def recall_accuracy(
    model: nn.Module,
    recurrent: bool,
    window_size: int,
    ids: torch.Tensor,
    keys: torch.Tensor,
    chunk_size: int = 256,
) -> float:
    """Fraction of rows whose prediction at the query position (`recall_predictions`) is `keys` (the answers)."""
    return _accuracy(recall_predictions(model, recurrent, window_size, ids, chunk_size), keys)


def _accuracy(predictions: torch.Tensor, keys: torch.Tensor) -> float:
    return (predictions == keys).sum().item() / keys.shape[0]


def learning_rate_factor(schedule: str, steps: int) -> Callable[[int], float]:
    """Step -> the factor of the peak learning rate: "linear" warms up over the first tenth of `steps`, then decays
    linearly to 0; "constant" keeps the peak throughout."""
    if schedule == "constant":
        return lambda step: 1.0
    if schedule == "linear":
        warmup = max(1, steps // 10)
        return lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))
    raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {schedule!r}")


def train(
    model: nn.Module,
    recurrent: bool,
    *,
    stages: Sequence[Stage],
    batch_size: int,
    lr: float,
    data_seed: int,
    lr_schedule: str = "linear",
    eval_every: int | None = None,
    evaluate: Callable[[int], None] | None = None,
) -> tuple[float, float]:
    """AdamW on fresh batches of the task, stage after stage (`Stage`: a window size, its steps and its batches),
    the learning rate following `lr_schedule` over all of the stages' steps (`learning_rate_factor`).

    With `eval_every`, `evaluate(step)` is called before the first step and after every `eval_every` steps (and
    after the last), counted over all stages, the model then back in training mode. Returns (final-step loss,
    seconds of training, evaluation excluded).
    """
    steps = sum(stage.steps for stage in stages)
    generator = torch.Generator().manual_seed(data_seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(lr_schedule, steps))
    evaluating = 0.0

    def checkpoint(step: int) -> None:
        nonlocal evaluating
        if evaluate is not None and eval_every and (step % eval_every == 0 or step == steps):
            started = time.perf_counter()
            evaluate(step)
            model.train()
            evaluating += time.perf_counter() - started

    model.train()
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    checkpoint(0)
    step = 0
    for stage in stages:
        for _ in range(stage.steps):
            ids, labels, _ = stage.batches(batch_size, generator)
            loss = recall_loss(model, recurrent, stage.window_size, ids.to(model.device), labels.to(model.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            checkpoint(step)
    return loss.item(), time.perf_counter() - start - evaluating


def task_data(
    task: str, *, window_size: int, num_windows: int, num_keys: int, num_filler: int, num_values: int, num_pairs: int
) -> tuple[RecallVocab | AssociativeVocab, Batches, float]:
    """The vocabulary, the batches and the chance accuracy of `task`: "key" (`make_recall_batch`: one of `num_keys`
    keys) or "associative" (`make_associative_batch`: `num_pairs` pairs of `num_keys` keys and `num_values` values)."""
    if task == "key":
        key_vocab = RecallVocab(num_filler=num_filler, num_keys=num_keys)

        def key_batches(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
            return make_recall_batch(batch_size, window_size, key_vocab, num_windows, generator)

        return key_vocab, key_batches, 1.0 / num_keys
    if task == "associative":
        pairs_vocab = AssociativeVocab(num_filler=num_filler, num_keys=num_keys, num_values=num_values)

        def pairs_batches(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
            return make_associative_batch(batch_size, window_size, pairs_vocab, num_windows, generator, num_pairs)

        return pairs_vocab, pairs_batches, 1.0 / num_values
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def check_curriculum(curriculum: Sequence[tuple[int, ...]], window_size: int, steps: int) -> None:
    """Raise `ValueError` naming the bad stage unless every stage is `(window_size, steps)` with a window of 3 to
    `window_size` tokens and at least one step, and the stages leave at least one of `steps` for `window_size`."""
    for stage in curriculum:
        if len(stage) != 2 or not 3 <= stage[0] <= window_size or stage[1] < 1:
            raise ValueError(
                f"curriculum stage {stage}: must be (window_size, steps) with 3 <= window_size <= {window_size} and "
                "steps >= 1"
            )
    staged = sum(stage[1] for stage in curriculum)
    if staged >= steps:
        raise ValueError(
            f"curriculum: its stages take {staged} of steps={steps}, leaving none at window {window_size}"
        )


def run_recall_experiment(
    *,
    steps: int = 300,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 2e-3,
    window_size: int = 16,
    num_windows: int = 2,
    num_keys: int = 8,
    num_filler: int = 32,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    insertion_layer: int = 1,
    recurrence_hidden_sizes: tuple[int, ...] = (64,),
    initializer_range: float = 0.1,
    eval_size: int = 2048,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    task: str = "key",
    num_values: int = 16,
    num_pairs: int = 4,
    memory: dict | None = None,
    baseline: bool = True,
    eval_every: int | None = None,
    curve_size: int | None = None,
    curriculum: Sequence[Sequence[int]] = (),
    lr_schedule: str = "linear",
    baseline_context: str = "window",
    recurrent: bool = True,
    pretraining_steps: int = 0,
    bare_fraction: float = 0.0,
) -> dict:
    """Train the recurrent GPT-2 and its no-recurrence baseline on the recall task; score both on held-out data.

    Both start from the same weights and see the same training batches (drawn on the CPU, then moved to `device`,
    so that every device trains on the same data); the models run on `device` in `dtype`. Returns a dict with `recurrent_accuracy`,
    `baseline_accuracy`, `swapped_accuracy` (the recurrent model with every row's earlier windows taken from another
    row, scored against the row's own key), `chance` (= 1 / num_keys), the final training losses and seconds, and
    `settings`.

    `task="associative"` runs the associative-recall task instead (`num_pairs` pairs of `num_keys` keys and
    `num_values` values; chance 1 / num_values), and adds `recurrent_row_value_rate`: the fraction of the recurrent
    model's answers that are one of the row's stored values, right or not (`among_row_values`: near 1 where the
    memory carries the values but not their keys); `memory` sets the recurrent model's memory (see `build_models`);
    `baseline=False` trains the recurrent model alone (no `baseline_*` entries). With `eval_every`, the recurrent
    model is also scored on the first `curve_size` held-out rows (default: all) before training and every
    `eval_every` steps: `recurrent_curve`, a list of `{"step", "accuracy"}`, and `recurrent_eval_seconds`, the time
    those scores took.

    `curriculum`: `(window_size, steps)` stages trained first, each on the task laid out in windows of that size
    (shorter than `window_size`: the key among fewer tokens, the recurrent model reading with a state of that
    schedule); the rest of `steps` trains at `window_size`, and the scores are always at `window_size`. Both models
    follow it. `lr_schedule`: "linear" (warmup, then linear decay) or "constant" over all `steps`.

    `baseline_context="full"` makes the baseline a reference from above instead: a stock GPT-2 with positions for the
    whole row that reads every window of it as one sequence (full attention across the windows), the most a memory of
    the earlier windows could give, trained on the same batches and curriculum (a stage's rows read whole). On
    associative recall it adds `baseline_row_value_rate`. `recurrent=False` trains and scores the baseline alone:
    no `recurrent_*` entries, its curve is `baseline_curve` (with `baseline_eval_seconds`), and `swapped_accuracy` is
    the baseline's, reading rows whose earlier windows are another row's.

    `pretraining_steps` (associative recall only): steps on the bare task first (`make_bare_associative_batch`: pairs
    and then every question within each block, no filler, rows as long as the task's), before the curriculum and
    `steps`; the learning-rate schedule and the curve run over both. Each model reads them as it reads the task (the
    recurrent one in its windows, which must hold whole blocks: `window_size` a multiple of `4 * num_pairs`), so its
    backbone can learn to bind within a window before it has to carry pairs across one. `bare_fraction` keeps it
    binding afterwards: that share of the rows of every later batch at `window_size` (the curriculum's shorter
    stages are left as they are) is bare-task rows, labelled as in pretraining; the held-out rows are the task's.
    """
    curriculum = [tuple(stage) for stage in curriculum]
    check_curriculum(curriculum, window_size, steps)
    if baseline_context not in BASELINE_CONTEXTS:
        raise ValueError(f"baseline_context must be one of {BASELINE_CONTEXTS}, got {baseline_context!r}")
    if not (recurrent or baseline):
        raise ValueError("recurrent=False and baseline=False: no model to train")
    if (pretraining_steps or bare_fraction) and (task != "associative" or window_size % (4 * num_pairs)):
        raise ValueError(
            f"pretraining_steps={pretraining_steps}, bare_fraction={bare_fraction} need task='associative' (got "
            f"{task!r}) and window_size a multiple of the bare task's block of 4 * num_pairs = {4 * num_pairs} tokens "
            f"(got {window_size})"
        )
    if not 0 <= bare_fraction < 1:
        raise ValueError(f"bare_fraction must be in [0, 1): the share of a batch's rows, got {bare_fraction}")
    learning_rate_factor(lr_schedule, steps)  # refuses an unknown schedule before any model is built
    settings = {
        "steps": steps,
        "seed": seed,
        "batch_size": batch_size,
        "lr": lr,
        "window_size": window_size,
        "num_windows": num_windows,
        "num_keys": num_keys,
        "num_filler": num_filler,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "insertion_layer": insertion_layer,
        "recurrence_hidden_sizes": list(recurrence_hidden_sizes),
        "initializer_range": initializer_range,
        "eval_size": eval_size,
        "task": task,
        **({"num_values": num_values, "num_pairs": num_pairs} if task == "associative" else {}),
        "memory": dict(memory or {}),
        **({"eval_every": eval_every, "curve_size": curve_size or eval_size} if eval_every else {}),
        **({"curriculum": [list(stage) for stage in curriculum]} if curriculum else {}),
        **({"lr_schedule": lr_schedule} if lr_schedule != "linear" else {}),
        **({"baseline_context": baseline_context} if baseline and baseline_context != "window" else {}),
        **({"recurrent": False} if not recurrent else {}),
        **({"pretraining_steps": pretraining_steps} if pretraining_steps else {}),
        **({"bare_fraction": bare_fraction} if bare_fraction else {}),
    }
    layout = {"num_windows": num_windows, "num_keys": num_keys, "num_filler": num_filler}
    layout |= {"num_values": num_values, "num_pairs": num_pairs}
    vocab, batches, chance = task_data(task, window_size=window_size, **layout)
    stages = [Stage(size, count, task_data(task, window_size=size, **layout)[1]) for size, count in curriculum]

    def bare_batches(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return make_bare_associative_batch(batch_size, num_windows * window_size, vocab, generator, num_pairs)

    def mixed_batches(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        ids, labels, answers = batches(batch_size, generator)
        bare = int(batch_size * bare_fraction)
        if bare:  # the first rows: a batch of 8 at 0.5 holds 4 of each
            ids[:bare], labels[:bare], answers[:bare] = bare_batches(bare, generator)
        return ids, labels, answers

    stages.append(Stage(window_size, steps - sum(count for _, count in curriculum), mixed_batches))
    if pretraining_steps:
        stages.insert(0, Stage(window_size, pretraining_steps, bare_batches))
    # The baseline's sequence: one window, or with full context the whole row.
    baseline_reading = window_size * (num_windows if baseline_context == "full" else 1)
    # Built from the recorded settings themselves, so that what results.json says is what ran.
    recurrent_model, stock = build_models(
        vocab=vocab,
        **{name: settings[name] for name in MODEL_SETTINGS},
        baseline_positions=baseline_reading,
    )
    recurrent_model, stock = recurrent_model.to(device, dtype), stock.to(device, dtype)
    # Held-out evaluation data from a stream the training batches never use.
    eval_generator = torch.Generator().manual_seed(seed + 1_000_003)
    eval_ids, _, eval_keys = batches(eval_size, eval_generator)
    eval_ids, eval_keys = eval_ids.to(device), eval_keys.to(device)
    train_kwargs = {
        "stages": stages,
        "batch_size": batch_size,
        "lr": lr,
        "data_seed": seed,
        "lr_schedule": lr_schedule,
    }
    result: dict = {"chance": chance, "settings": settings}
    curve: list[dict] = []
    started = time.perf_counter()

    curve_rows = slice(0, curve_size or eval_size)
    # The curve's latest predictions: the final ones when the curve scores every held-out row.
    latest: dict[str, torch.Tensor] = {}
    arms = [("recurrent", recurrent_model, True, window_size)] if recurrent else []
    if baseline:
        arms.append(("baseline", stock, False, baseline_reading))
    # The curve follows the first arm: the recurrent model, or the baseline trained alone.
    curve_arm = arms[0][0]

    for name, model, is_recurrent, reading in arms:

        def evaluate(step: int, model: nn.Module = model, is_recurrent: bool = is_recurrent, reading: int = reading):
            latest["predictions"] = recall_predictions(model, is_recurrent, reading, eval_ids[curve_rows])
            curve.append({"step": step, "accuracy": _accuracy(latest["predictions"], eval_keys[curve_rows])})

        scoring = {"eval_every": eval_every, "evaluate": evaluate} if name == curve_arm and eval_every else {}
        # A model reads each stage's rows in windows of its reading size: the baseline with full context, whole rows.
        read_stages = [
            Stage(stage.window_size * reading // window_size, stage.steps, stage.batches) for stage in stages
        ]
        loss, seconds = train(model, is_recurrent, **{**train_kwargs, "stages": read_stages}, **scoring)
        if scoring:
            result[f"{name}_curve"] = curve
            result[f"{name}_eval_seconds"] = time.perf_counter() - started - seconds
        if scoring and (curve_size or eval_size) >= eval_size:  # the curve's last point: the same rows, scored
            predictions = latest["predictions"]
        else:
            predictions = recall_predictions(model, is_recurrent, reading, eval_ids)
        result[f"{name}_accuracy"] = _accuracy(predictions, eval_keys)
        if task == "associative":
            stored = among_row_values(predictions, eval_ids, window_size, vocab)
            result[f"{name}_row_value_rate"] = stored.sum().item() / eval_ids.shape[0]
        result[f"{name}_final_loss"] = loss
        result[f"{name}_train_seconds"] = seconds
    _, swapped_model, swapped_is_recurrent, swapped_reading = arms[0]
    swapped_ids = swap_earlier_windows(eval_ids, window_size)
    result["swapped_accuracy"] = recall_accuracy(
        swapped_model, swapped_is_recurrent, swapped_reading, swapped_ids, eval_keys
    )
    return result
