# SPDX-License-Identifier: Apache-2.0
"""Does the recurrence carry information? A synthetic key-recall task: recurrent GPT-2 vs. the same GPT-2 without it.

Run (about 1-3 minutes on a CPU, 3 seeds, one thread):

    python benchmarks/recurrence_recall.py

Options: `--steps`, `--seeds`, `--window-size`, `--num-keys`, ... (see `--help`).

Task. Every sequence is `num_windows` windows of `window_size` tokens, without overlap (an overlap could re-read the
key into the last window). The window before the last holds one key token (one of `num_keys`) at a uniformly random
position among random filler tokens. The last window is fresh filler, then a query token, then the key as the
sequence's final token. Only that final token is labelled (every other label is -100), so the one prediction trained
and scored is the key, made at the query position. Within its own window the query position never sees the key:
only the one-vector summary `h_prev` of the previous window, which the recurrent GPT-2 sees as an extra key/value at
block `insertion_layer`, can carry it.

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

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel


@dataclass(frozen=True)
class RecallVocab:
    """Token ids of the task: fillers `[0, num_filler)`, keys `[num_filler, num_filler + num_keys)`, then the query."""

    num_filler: int
    num_keys: int

    @property
    def key_offset(self) -> int:
        return self.num_filler

    @property
    def query(self) -> int:
        return self.num_filler + self.num_keys

    @property
    def size(self) -> int:
        return self.num_filler + self.num_keys + 1


def make_recall_batch(
    batch_size: int,
    window_size: int,
    vocab: RecallVocab,
    num_windows: int = 2,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch of the recall task.

    Returns `input_ids` and `labels`, both `(batch_size, num_windows * window_size)`, and the keys `(batch_size,)`.
    The key sits at a uniformly random position of window `num_windows - 2`; the last window is filler, then the
    query token at its position `window_size - 2`, then the key at `window_size - 1`. `labels` is -100 everywhere
    except that last position, which holds the key (predicted, after the usual shift, at the query position).
    """
    if num_windows < 2:
        raise ValueError(f"num_windows must be at least 2, got {num_windows}")
    if window_size < 3:
        raise ValueError(f"window_size must be at least 3 (filler, query, answer), got {window_size}")
    length = num_windows * window_size
    ids = torch.randint(0, vocab.num_filler, (batch_size, length), generator=generator)
    keys = vocab.key_offset + torch.randint(0, vocab.num_keys, (batch_size,), generator=generator)
    key_pos = (num_windows - 2) * window_size + torch.randint(0, window_size, (batch_size,), generator=generator)
    ids[torch.arange(batch_size), key_pos] = keys
    ids[:, -2] = vocab.query
    ids[:, -1] = keys
    labels = torch.full_like(ids, -100)
    labels[:, -1] = keys
    return ids, labels, keys


def to_independent_windows(tensor: torch.Tensor, window_size: int) -> torch.Tensor:
    """(batch, num_windows * window_size) -> (batch * num_windows, window_size): every window its own sequence."""
    return tensor.reshape(-1, window_size)


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
    missing, unexpected = baseline.load_state_dict(recurrent.state_dict(), strict=False)
    stray = [k for k in unexpected if not k.startswith("transformer.recurrence.")]
    if missing or stray:
        raise RuntimeError(f"Weights do not map onto GPT-2: missing={missing}, unexpected={stray}")
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


def swap_earlier_windows(ids: torch.Tensor, window_size: int) -> torch.Tensor:
    """Row `i` keeps its last window but takes every earlier window from row `i + 1` (cyclically)."""
    swapped = ids.clone()
    swapped[:, :-window_size] = ids.roll(-1, dims=0)[:, :-window_size]
    return swapped


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
        loss = recall_loss(model, recurrent, window_size, ids, labels)
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
) -> dict:
    """Train the recurrent GPT-2 and its no-recurrence baseline on the recall task; score both on held-out data.

    Both start from the same weights and see the same training batches. Returns a dict with `recurrent_accuracy`,
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
    recurrent, baseline = build_models(
        window_size=window_size,
        vocab=vocab,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        insertion_layer=insertion_layer,
        recurrence_hidden_sizes=list(recurrence_hidden_sizes),
        initializer_range=initializer_range,
        seed=seed,
    )
    # Held-out evaluation data from a stream the training batches never use.
    eval_generator = torch.Generator().manual_seed(seed + 1_000_003)
    eval_ids, _, eval_keys = make_recall_batch(eval_size, window_size, vocab, num_windows, eval_generator)
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


def format_table(results: list[dict]) -> str:
    """Markdown table: one row per seed, then the mean."""
    columns = ("recurrent_accuracy", "baseline_accuracy", "swapped_accuracy")
    lines = [
        "| seed | recurrent GPT-2 | GPT-2, windows read independently | recurrent, earlier windows swapped "
        "| chance | train s (recurrent / baseline) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['settings']['seed']} | "
            + " | ".join(f"{r[c]:.3f}" for c in columns)
            + f" | {r['chance']:.3f} | {r['recurrent_train_seconds']:.1f} / {r['baseline_train_seconds']:.1f} |"
        )
    if len(results) > 1:
        means = " | ".join(f"**{statistics.mean(r[c] for r in results):.3f}**" for c in columns)
        lines.append(f"| mean | {means} | {results[0]['chance']:.3f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--window-size", type=int, default=16)
    parser.add_argument("--num-windows", type=int, default=2)
    parser.add_argument("--num-keys", type=int, default=8)
    parser.add_argument("--num-filler", type=int, default=32)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--insertion-layer", type=int, default=1)
    parser.add_argument("--recurrence-hidden-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--initializer-range", type=float, default=0.1)
    parser.add_argument("--eval-size", type=int, default=2048)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; the matrices are tiny, so more threads mostly add synchronisation",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = [
        run_recall_experiment(
            steps=args.steps,
            seed=seed,
            batch_size=args.batch_size,
            lr=args.lr,
            window_size=args.window_size,
            num_windows=args.num_windows,
            num_keys=args.num_keys,
            num_filler=args.num_filler,
            n_layer=args.n_layer,
            n_embd=args.n_embd,
            n_head=args.n_head,
            insertion_layer=args.insertion_layer,
            recurrence_hidden_sizes=tuple(args.recurrence_hidden_sizes),
            initializer_range=args.initializer_range,
            eval_size=args.eval_size,
        )
        for seed in args.seeds
    ]
    settings = {k: v for k, v in results[0]["settings"].items() if k != "seed"}
    print("Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    print(
        f"Recall accuracy on {args.eval_size} held-out sequences "
        f"(torch {torch.__version__}, torch threads: {torch.get_num_threads()}):"
    )
    print(format_table(results))
    print(f"Total time: {time.perf_counter() - start:.0f} s")
    return results


if __name__ == "__main__":
    main()
