# SPDX-License-Identifier: Apache-2.0
"""Does the recurrence carry information? The key-recall task (`hf_recurrence.data.key_recall`): a recurrent GPT-2
against the same GPT-2 without it. `experiments/recurrence_recall.py` runs it over seeds and prints the table.

Task (`hf_recurrence.data.key_recall`). The key is only in the window before the answer, so only the one-vector
summary `h_prev` of that window, which the recurrent GPT-2 sees as an extra key/value at block `insertion_layer`, can
carry it to the query.

Baseline. The recurrent GPT-2 with `h_prev` masked out computes exactly a stock `transformers.GPT2LMHeadModel` that
reads each window on its own (positions restart per window in both). So the baseline is a `GPT2LMHeadModel` with the
same config and the same initial weights, trained with the same optimizer, schedule, steps and batches, reshaped from
`(batch, num_windows * window_size)` to `(batch * num_windows, window_size)` with the same labels. It cannot see the
key, so its accuracy should stay at the chance level `1 / num_keys`.

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
"""

import time

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

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
)


def build_models(
    *,
    window_size: int,
    vocab: RecallVocab,
    n_layer: int,
    n_embd: int,
    n_head: int,
    insertion_layer: int,
    recurrence_hidden_sizes: list[int],
    initializer_range: float,
    seed: int,
) -> tuple[RecurrentGPT2LMHeadModel, GPT2LMHeadModel]:
    """A tiny recurrent GPT-2 and a stock GPT-2 with the same config and the same initial weights (copies)."""
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
        "bos_token_id": vocab.query,
        "eos_token_id": vocab.query,
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
        )
    )
    baseline = GPT2LMHeadModel(GPT2Config(**common))
    missing, unexpected = baseline.load_state_dict(recurrent.backbone.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"Weights do not map onto GPT-2: missing={missing}, unexpected={unexpected}")
    return recurrent, baseline


def recall_loss(
    model: nn.Module, recurrent: bool, window_size: int, ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The model's own causal-LM loss (`labels=`) on a batch; the baseline reads every window as its own sequence.

    Both average over the labelled positions, one per row (in the baseline, windows before the last have none).
    """
    if not recurrent:
        ids, labels = to_independent_windows(ids, window_size), to_independent_windows(labels, window_size)
    return model(ids, labels=labels, use_cache=False).loss


@torch.no_grad()
def recall_accuracy(
    model: nn.Module, recurrent: bool, window_size: int, ids: torch.Tensor, keys: torch.Tensor
) -> float:
    """Fraction of rows whose argmax prediction at the query position (second-to-last token) is `keys`."""
    model.eval()
    if recurrent:
        logits = model(ids, use_cache=False).logits  # (batch, length, vocab)
    else:
        logits = model(to_independent_windows(ids, window_size), use_cache=False).logits
        logits = logits.reshape(ids.shape[0], -1, logits.shape[-1])  # back to (batch, length, vocab)
    return (logits[:, -2].argmax(-1) == keys).float().mean().item()


def train(
    model: nn.Module,
    recurrent: bool,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    window_size: int,
    num_windows: int,
    vocab: RecallVocab,
    data_seed: int,
) -> tuple[float, float]:
    """AdamW with linear warmup and decay on fresh batches of the task. Returns (final-step loss, seconds)."""
    generator = torch.Generator().manual_seed(data_seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup)))
    )
    model.train()
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids, labels, _ = make_recall_batch(batch_size, window_size, vocab, num_windows, generator)
        loss = recall_loss(model, recurrent, window_size, ids.to(model.device), labels.to(model.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return loss.item(), time.perf_counter() - start


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
) -> dict:
    """Train the recurrent GPT-2 and its no-recurrence baseline on the recall task; score both on held-out data.

    Both start from the same weights and see the same training batches (drawn on the CPU, then moved to `device`,
    so that every device trains on the same data); the models run on `device` in `dtype`. Returns a dict with `recurrent_accuracy`,
    `baseline_accuracy`, `swapped_accuracy` (the recurrent model with every row's earlier windows taken from another
    row, scored against the row's own key), `chance` (= 1 / num_keys), the final training losses and seconds, and
    `settings`.
    """
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
    }
    vocab = RecallVocab(num_filler=num_filler, num_keys=num_keys)
    # Built from the recorded settings themselves, so that what results.json says is what ran.
    recurrent, baseline = build_models(vocab=vocab, **{name: settings[name] for name in MODEL_SETTINGS})
    recurrent, baseline = recurrent.to(device, dtype), baseline.to(device, dtype)
    # Held-out evaluation data from a stream the training batches never use.
    eval_generator = torch.Generator().manual_seed(seed + 1_000_003)
    eval_ids, _, eval_keys = make_recall_batch(eval_size, window_size, vocab, num_windows, eval_generator)
    eval_ids, eval_keys = eval_ids.to(device), eval_keys.to(device)
    train_kwargs = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "window_size": window_size,
        "num_windows": num_windows,
        "vocab": vocab,
        "data_seed": seed,
    }
    result: dict = {"chance": 1.0 / num_keys, "settings": settings}
    for name, model, is_recurrent in (("recurrent", recurrent, True), ("baseline", baseline, False)):
        loss, seconds = train(model, is_recurrent, **train_kwargs)
        result[f"{name}_accuracy"] = recall_accuracy(model, is_recurrent, window_size, eval_ids, eval_keys)
        result[f"{name}_final_loss"] = loss
        result[f"{name}_train_seconds"] = seconds
    swapped_ids = swap_earlier_windows(eval_ids, window_size)
    result["swapped_accuracy"] = recall_accuracy(recurrent, True, window_size, swapped_ids, eval_keys)
    return result
