# SPDX-License-Identifier: Apache-2.0
"""Why gate 1's 4-pair recall stops near 1/4 (issue 39): variants of its best arm, each trained once, scored for
accuracy and for how often the answer is one of the row's stored values, right or not.

Gate 1 (`memory_gate1.py`) left every writer near 0.25 on 4-pair associative recall, the level of a memory that
carries the 4 values without binding each to its key. Each variant here changes one thing of the `slots_every_layer`
arm (4 attention slots read at every layer, T=32, a 4-layer reader, the recorded curriculum 8:300): more steps, a
learned bias over window positions, 8 slots, the last layer as the memory's source, twice the width, a lower
learning rate, and the paper's own arm and a 2-pair task for reference; writers of window 0 other than the memory's
(oracles, selections, memory tokens); and, as the reference from above, no memory at all: a stock GPT-2 of the same
size reading both windows as one sequence, which binds if anything of this size and budget can. The row-value rate
(`hf_recurrence.data.among_row_values`) tells the two failures apart: near 1 with accuracy near 1/num_pairs, the
values are carried and the binding is what is missing; near num_pairs/num_values, nothing is carried. The variants
are pilots on the gate's pilot seed (0); nothing here is chosen on the gate's seeds 1 and 2.

Run (about 135 CPU-minutes on one thread; resumable: each finished variant is saved at once, and a rerun with the
same flags skips the variants it holds):

    python experiments/memory_binding.py
"""

import argparse
import contextlib
import datetime
import inspect
import json
import shlex
import time
from collections.abc import Callable, Iterator

import _common as bench
import torch
from torch import nn

from hf_recurrence.data import AssociativeVocab
from hf_recurrence.experiments.key_recall import run_recall_experiment
from hf_recurrence.experiments.memory_gates import (
    FULL_CONTEXT_DESCRIPTION,
    associative_arms,
    describe_memory,
    run_arm,
)
from hf_recurrence.models.recurrent_decoder import RecurrentGPT2LMHeadModel
from hf_recurrence.models.recurrent_decoder.step_recurrent_decoder import RecurrentDecoderRecurrence


# The gate's 4-pair recall (`memory_gates.plan_gate1` with the recorded curriculum), on the pilot seed.
BASE = {
    "task": "associative",
    "window_size": 32,
    "n_layer": 4,
    "num_keys": 16,
    "num_values": 16,
    "num_pairs": 4,
    "seed": 0,
    "eval_every": 250,
    "curve_size": 512,
    "eval_size": 4096,
}
SLOTS = associative_arms(4)["slots_every_layer"]
# A backbone that binds within a window before it reads the task: 1,500 steps of the bare task (pairs, then their
# questions, no filler) first, at a learning rate of 1e-3 (at the gate's 2e-3, 2,000 such steps did not bind).
PRETRAINED = {"pretraining_steps": 1500, "lr": 1e-3}
# ... and that keeps binding while it learns the task: half of every batch at T=32 bare rows.
MIXED = {**PRETRAINED, "bare_fraction": 0.5}
# Name -> (what changes, `run_recall_experiment` settings over BASE; `memory` replaces the arm's).
VARIANTS: dict[str, tuple[str, dict]] = {
    "slots_every_layer": ("gate 1's arm (4 attention slots read at every layer)", {"memory": SLOTS}),
    "steps_3000": ("twice the steps", {"memory": SLOTS, "steps": 3000}),
    "position_bias": (
        "a learned per-slot bias over window positions",
        {"memory": {**SLOTS, "memory_position_bias": True}},
    ),
    "slots_8": ("8 slots", {"memory": {**SLOTS, "memory_slots": 8}}),
    "last_layer": ("the last layer as the source", {"memory": {**SLOTS, "memory_source": "last_layer"}}),
    "width_128": ("twice the width (128)", {"memory": SLOTS, "n_embd": 128, "recurrence_hidden_sizes": [128]}),
    "lr_1e-3": ("learning rate 1e-3", {"memory": SLOTS, "lr": 1e-3}),
    "paper": ("the paper's arm (k=1, mean), for reference", {"memory": {}}),
    "pairs_2": ("2 pairs instead of 4", {"memory": SLOTS, "num_pairs": 2}),
    "oracle_value": ("an oracle writer: slot i holds pair i's value token", {"memory": SLOTS, "oracle": "value"}),
    "oracle_key_value": (
        "an oracle writer: slot i holds pair i's key and value tokens",
        {"memory": SLOTS, "oracle": "key_value"},
    ),
    "learned_selection": (
        "a selecting writer: each token with the one before it, the 4 best-scoring kept",
        {"memory": SLOTS, "selection": "learned"},
    ),
    "learned_selection_8": (
        "the selecting writer with 8 slots",
        {"memory": {**SLOTS, "memory_slots": 8}, "selection": "learned"},
    ),
    "sampled_selection": (
        "the selecting writer choosing by its scores plus Gumbel noise in training (it tries every token)",
        {"memory": SLOTS, "selection": "sampled"},
    ),
    "values_first": (
        "the selecting writer made to keep the value tokens for the first half of the steps, then learned",
        {"memory": SLOTS, "selection": "values_first"},
    ),
    "straight_through": (
        "the selecting writer's choice learned straight through a softmax over every token",
        {"memory": SLOTS, "selection": "straight_through"},
    ),
    "straight_through_projected": (
        "straight through, the previous token through a learned projection",
        {"memory": SLOTS, "selection": "straight_through", "shift": "projected"},
    ),
    "selection_of_values_8_projected": (
        "values and 4 others, the previous token through a learned projection",
        {"memory": {**SLOTS, "memory_slots": 8}, "selection": "values", "shift": "projected"},
    ),
    "memory_tokens": (
        "RMT-style memory tokens: 4 learned tokens after window 0, read by the backbone, their final states the slots",
        {"memory": SLOTS, "memory_tokens": True},
    ),
    "selection_of_values": (
        "the selecting writer made to keep the value tokens",
        {"memory": SLOTS, "selection": "values"},
    ),
    "selection_of_values_8": (
        "the same with 8 slots: the value tokens and the 4 latest others",
        {"memory": {**SLOTS, "memory_slots": 8}, "selection": "values"},
    ),
    "full_context": (
        "no memory: a stock GPT-2 reading both windows as one sequence, the reference from above",
        {"memory": {}, "full_context": True},
    ),
    "full_context_steps_6000": (
        "the same reference, 4x the steps",
        {"memory": {}, "full_context": True, "steps": 6000},
    ),
    "pretrained_full_context": (
        "the reference from above, first trained on the bare task (no filler, every question labelled), at lr 1e-3",
        {"memory": {}, "full_context": True, **PRETRAINED},
    ),
    "pretrained": ("gate 1's arm, first trained on the bare task, at lr 1e-3", {"memory": SLOTS, **PRETRAINED}),
    "pretrained_oracle_value": (
        "the value-token oracle, first trained on the bare task, at lr 1e-3",
        {"memory": SLOTS, "oracle": "value", **PRETRAINED},
    ),
    "pretrained_mixed": (
        "gate 1's arm, first trained on the bare task, then half of every batch bare rows, at lr 1e-3",
        {"memory": SLOTS, **MIXED},
    ),
    "pretrained_mixed_oracle_value": (
        "the value-token oracle, first trained on the bare task, then half of every batch bare rows, at lr 1e-3",
        {"memory": SLOTS, "oracle": "value", **MIXED},
    ),
    "pretrained_mixed_memory_tokens": (
        "RMT-style memory tokens, first trained on the bare task, then half of every batch bare rows, at lr 1e-3",
        {"memory": SLOTS, "memory_tokens": True, **MIXED},
    ),
    "pretrained_mixed_straight_through": (
        "the selecting writer learned straight through, first trained on the bare task, then half of every batch bare "
        "rows, at lr 1e-3",
        {"memory": SLOTS, "selection": "straight_through", **MIXED},
    ),
    "pretrained_mixed_paper": (
        "the paper's arm (k=1, mean), first trained on the bare task, then half of every batch bare rows, at lr 1e-3",
        {"memory": {}, **MIXED},
    ),
    "pretrained_mixed_straight_through_no_shift": (
        "the same, each token scored and kept by its own states alone (no previous token added)",
        {"memory": SLOTS, "selection": "straight_through", "shift": "none", **MIXED},
    ),
    "pretrained_mixed_select": (
        "the selecting writer as the model's setting (memory_pooling='select'), first trained on the bare task, then "
        "half of every batch bare rows, at lr 1e-3",
        {"memory": {**SLOTS, "memory_pooling": "select"}, **MIXED},
    ),
    "pretrained_straight_through": (
        "the selecting writer learned straight through, first trained on the bare task, at lr 1e-3",
        {"memory": SLOTS, "selection": "straight_through", **PRETRAINED},
    ),
}
# The toy's filler tokens (the experiment's default), before the keys and values in the vocabulary.
FILLER = inspect.signature(run_recall_experiment).parameters["num_filler"].default
# What an oracle writer's slot i pools of window 0: the states of pair i's value token, or of its key and value.
ORACLES = ("value", "key_value")
# The variant settings that are not `run_recall_experiment`'s: a writer of window 0 in place of the memory's (an
# oracle, a selection and its shift, memory tokens), or the full-context reference in place of the recurrent model.
WRITERS = ("oracle", "selection", "shift", "memory_tokens", "full_context")
# How a selecting writer picks the tokens it keeps: by its learned scores, by them plus Gumbel noise in training,
# forced to the value tokens, or forced for the first half of the training steps and learned after.
SELECTIONS = ("learned", "sampled", "straight_through", "values", "values_first")
# What a selecting writer adds to each token's states: its predecessor's as they are, or through a learned projection
# (orthogonal at first), so that a kept value token holds its key apart from the key tokens' own states; or nothing,
# each token scored and kept by its own states alone.
SHIFTS = ("sum", "projected", "none")
# Added to a value token's score by the forced selection: far above any learned score of this toy.
FORCED_SCORE = 10.0


@contextlib.contextmanager
def _writer_of_window_0(
    pool_window_0: Callable, add_parameters: Callable[[nn.Module, object], None] | None = None
) -> Iterator[None]:
    """While active, every recurrent GPT-2 pools the first window of each forward by `pool_window_0(recurrence,
    layer_states, ids, config, model)` (`ids`: that window's token ids, (batch, window); `model`: the recurrent model
    that runs) instead of its writer, returning what
    `RecurrentDecoderRecurrence.pool` returns; later windows pool as configured (nothing reads their memory).
    `add_parameters(recurrence, config)` runs on every recurrence module built meanwhile.

    The memory sees no token ids, so the forward keeps the call's ids for the pooling of its first window."""
    pool, forward, init = (
        RecurrentDecoderRecurrence.pool,
        RecurrentGPT2LMHeadModel.forward,
        RecurrentDecoderRecurrence.__init__,
    )
    call: dict = {}

    def forward_keeping_ids(model, input_ids=None, *args, **kwargs):
        call.update(ids=input_ids, pooled=0, model=model)
        return forward(model, input_ids, *args, **kwargs)

    def pool_first_window(recurrence, layer_states, real, positions, config, window_pooled=None):
        call["pooled"] += 1
        if call["pooled"] > 1:
            return pool(recurrence, layer_states, real, positions, config, window_pooled)
        window = call["ids"].shape[1] // 2  # the toy's two windows
        return pool_window_0(recurrence, layer_states, call["ids"][:, :window], config, call["model"])

    def init_adding(recurrence, config):
        init(recurrence, config)
        add_parameters(recurrence, config)

    RecurrentGPT2LMHeadModel.forward, RecurrentDecoderRecurrence.pool = forward_keeping_ids, pool_first_window
    if add_parameters is not None:
        RecurrentDecoderRecurrence.__init__ = init_adding
    try:
        yield
    finally:
        RecurrentGPT2LMHeadModel.forward, RecurrentDecoderRecurrence.pool = forward, pool
        RecurrentDecoderRecurrence.__init__ = init


def _one_slot_each(total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`pool`'s `(total, weight, reference)` for slots that each hold one state: (batch, k, hidden) as given."""
    ones = total.new_ones(total.shape[:2])
    return total, ones, torch.zeros_like(ones)


@contextlib.contextmanager
def oracle_writer(mode: str, vocab: AssociativeVocab, num_pairs: int) -> Iterator[None]:
    """While active, every recurrent GPT-2 pools window 0 by an oracle instead of its writer: slot i takes the source
    states (the layer mix) of exactly pair i's value token (`mode="value"`) or of its key and value tokens summed
    (`"key_value"`), pairs in window order; later windows pool as configured. It asks whether the reader can bind
    what a perfect writer gives it, apart from what the writer learns to pick."""
    if mode not in ORACLES:
        raise ValueError(f"oracle must be one of {ORACLES}, got {mode!r}")

    def oracle_pool(recurrence, layer_states, ids, config, model):
        states = recurrence._source_states(layer_states, config)  # (batch, window, hidden)
        window = ids.shape[1]
        columns = torch.arange(window).expand_as(ids)
        # Each row's value tokens' columns in window order, (batch, num_pairs).
        values = torch.where(ids >= vocab.value_offset, columns, window).sort(-1).values[:, :num_pairs]
        rows = torch.arange(ids.shape[0])[:, None]
        total = states[rows, values]  # (batch, num_pairs, hidden)
        if mode == "key_value":
            total = total + states[rows, values - 1]  # each key right before its value
        return _one_slot_each(total)

    with _writer_of_window_0(oracle_pool):
        yield


@contextlib.contextmanager
def selecting_writer(
    select: str, vocab: AssociativeVocab, forced_steps: int = 0, shift: str = "sum"
) -> Iterator[list[float]]:
    """While active, every recurrent GPT-2 built pools window 0 by a selecting writer: each token's source states are
    summed with those of the token before it (a token shift: a value token then holds its key, as the key-value
    oracle's slots do), scored by two learned vectors (one over the token's states, one over its predecessor's, zero
    at first), and the `memory_slots` best-scoring tokens are kept, one per slot in window order, each scaled by
    2 sigmoid(score) (1 at the zero start; the scores learn through it, from the kept tokens only). Ties, as at the
    start, go to the latest tokens. `select="sampled"` ranks by the scores plus Gumbel noise while training (a sample
    of k tokens without replacement, each in proportion to exp(score)), so that every token is kept now and then and
    its score learns whether keeping it helps, and by the scores alone when scoring. `select="values"` adds
    `FORCED_SCORE` to the value tokens' scores, so the writer keeps them (and with more slots than pairs the latest
    other tokens too): the same writer with a perfect choice. `select="values_first"` forces it for the first
    `forced_steps` training steps and scores alone after: a reader first trained on a clean choice.
    `select="straight_through"` keeps the chosen tokens unscaled and, while training, adds to every slot a softmax
    over all the window's scores of the tokens' states, less the same detached: nothing in the forward, but every
    token's score gets a gradient, that of moving the slots towards its states. `shift="projected"` adds the
    predecessor's states through a learned projection (orthogonal at first) rather than as they are.

    Yields a list that holds, per window 0 pooled since the last training step (the final scoring, once trained),
    the share of the kept tokens that are value tokens."""
    if select not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {select!r}")
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {SHIFTS}, got {shift!r}")
    kept_values: list[float] = []
    noise = torch.Generator().manual_seed(0)
    training_steps = 0

    def add_scores(recurrence, config):
        hidden = config.text_config.hidden_size
        recurrence.selection_scores = nn.Parameter(torch.zeros(2, hidden))
        if shift == "projected":
            recurrence.previous_projection = nn.Parameter(
                torch.nn.init.orthogonal_(torch.empty(hidden, hidden), generator=torch.Generator().manual_seed(1))
            )

    def selecting_pool(recurrence, layer_states, ids, config, model):
        states = recurrence._source_states(layer_states, config)  # (batch, window, hidden)
        previous = torch.nn.functional.pad(states, (0, 0, 1, 0))[:, :-1]  # zeros before the first token
        batch, window, hidden = states.shape
        token_scores, previous_scores = recurrence.selection_scores.float()
        scores = states @ token_scores
        if shift != "none":
            scores = scores + previous @ previous_scores
        scores = scores / hidden**0.5  # (batch, window)
        nonlocal training_steps
        training = torch.is_grad_enabled()  # a training step's forward; the scoring runs without gradients
        training_steps += training
        if select == "values" or (select == "values_first" and training and training_steps <= forced_steps):
            scores = scores + FORCED_SCORE * (ids >= vocab.value_offset)
        # The tie-break: far below any learned difference, it only orders equal scores, the latest first.
        ranked = scores + 1e-6 * torch.arange(window)
        if select == "sampled" and training:
            # Its own generator, so that the training examples are those of the other variants.
            uniform = torch.rand(scores.shape, generator=noise).clamp_min(torch.finfo(scores.dtype).tiny)
            ranked = ranked - torch.log(-torch.log(uniform))  # Gumbel-top-k
        kept = ranked.topk(config.memory_slots, dim=1).indices.sort(1).values  # (batch, k), in window order
        rows = torch.arange(batch)[:, None]
        if shift == "none":
            shifted = states
        else:
            shifted = states + (
                previous @ recurrence.previous_projection.float() if shift == "projected" else previous
            )
        if select == "straight_through":
            chosen = shifted[rows, kept]  # (batch, k, hidden)
            if training:
                soft = (torch.softmax(scores, 1)[..., None] * shifted).sum(1, keepdim=True)  # (batch, 1, hidden)
                chosen = chosen + (soft - soft.detach())
        else:
            chosen = shifted[rows, kept] * 2 * torch.sigmoid(scores[rows, kept])[..., None]
        if training:
            kept_values.clear()
        else:
            kept_values.append(float((ids.gather(1, kept) >= vocab.value_offset).float().mean()))
        return _one_slot_each(chosen)

    with _writer_of_window_0(selecting_pool, add_scores):
        yield kept_values


@contextlib.contextmanager
def memory_token_writer() -> Iterator[None]:
    """While active, every recurrent GPT-2 writes window 0 with `memory_slots` learned memory tokens, as RMT writes
    its memory: the backbone reads the window and then the memory tokens (causal attention, so each reads the whole
    window at every layer), and slot i holds memory token i's final states. The reader's loss then reaches the
    window's states through every layer's attention of the memory tokens, not only through a pooling. The toy's
    backbone has as many positions as a window has tokens, so the memory tokens all sit at the window's last one (their
    learned embeddings tell them apart). The window is read once more for it, under plain sdpa attention."""

    def add_memory_tokens(recurrence, config):
        text = config.text_config
        embeddings = torch.randn(config.memory_slots, text.hidden_size) * text.initializer_range
        recurrence.memory_token_embeddings = nn.Parameter(embeddings)

    def memory_token_pool(recurrence, layer_states, ids, config, model):
        backbone = model.backbone.base_model
        batch, window = ids.shape
        tokens = recurrence.memory_token_embeddings.expand(batch, -1, -1)  # (batch, k, hidden)
        embeds = torch.cat([backbone.get_input_embeddings()(ids), tokens], 1)  # (batch, window + k, hidden)
        positions = torch.arange(window + tokens.shape[1]).clamp(max=window - 1).expand(batch, -1)
        text = backbone.config
        recurrent_attention = text._attn_implementation
        text._attn_implementation_internal = "sdpa"
        try:
            states = backbone(inputs_embeds=embeds, position_ids=positions).last_hidden_state
        finally:
            text._attn_implementation_internal = recurrent_attention
        return _one_slot_each(states[:, window:].float())

    with _writer_of_window_0(memory_token_pool, add_memory_tokens):
        yield


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__, threads=1, cuda_dtype="float32", seed=False)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=1500, help="training steps of every variant that sets none")
    parser.add_argument(
        "--curriculum-steps", type=int, default=300, help="steps at 8-token windows first (gate 1's curriculum)"
    )
    parser.add_argument(
        "--pretraining-steps",
        type=int,
        default=PRETRAINED["pretraining_steps"],
        help="steps on the bare task first, for the variants that pretrain",
    )
    parser.add_argument("--eval-size", type=int, default=BASE["eval_size"], help="held-out rows (tests: fewer)")
    parser.add_argument("--fresh", action="store_true", help="discard the variants recorded in --output-json")
    return parser.parse_args(argv)


def planned_kwargs(name: str, args: argparse.Namespace) -> dict:
    """`run_recall_experiment`'s settings of a variant."""
    curriculum = [[8, args.curriculum_steps]] if args.curriculum_steps else []
    settings = {key: value for key, value in VARIANTS[name][1].items() if key not in WRITERS}
    if "pretraining_steps" in settings:
        settings["pretraining_steps"] = args.pretraining_steps
    return {**BASE, "steps": args.steps, "curriculum": curriculum, "eval_size": args.eval_size, **settings}


def results_table(records: dict[str, dict]) -> dict:
    rows = []
    for name, record in records.items():
        kwargs = record["kwargs"]
        pairs, values = kwargs["num_pairs"], kwargs["num_values"]
        rows.append(
            [
                name,
                VARIANTS[name][0],
                (
                    FULL_CONTEXT_DESCRIPTION
                    if record.get("full_context")
                    else describe_memory(kwargs["memory"], kwargs["n_layer"])
                )
                + (f"; oracle writer ({record['oracle']})" if record.get("oracle") else "")
                + (f"; selecting writer ({record['selection']})" if record.get("selection") else "")
                + (f", the previous token {record['shift']}" if record.get("shift") else "")
                + ("; memory tokens" if record.get("memory_tokens") else ""),
                (f"{kwargs['pretraining_steps']:,} bare + " if kwargs.get("pretraining_steps") else "")
                + f"{kwargs['steps']:,}",
                f"{record['accuracy']:.3f}",
                f"{1 / pairs:.2f} / {1 / values:.3f}",
                f"{record['row_value_rate']:.3f}",
                f"{pairs / values:.3f}",
                f"{record['swapped_accuracy']:.3f}",
                f"{record['kept_value_share']:.3f}" if "kept_value_share" in record else "–",
                f"{record['cpu_seconds'] / 60:.1f}",
            ]
        )
    headers = [
        "variant",
        "what changes",
        "memory",
        "steps",
        "accuracy",
        "unbound / chance",
        "answer among the row's values",
        "same, by guessing",
        "swapped",
        "kept tokens that are values",
        "CPU min",
    ]
    return bench.table(headers, rows)


def recorded(args: argparse.Namespace) -> dict[str, dict]:
    if args.fresh or not args.output_json.exists():
        return {}
    return json.loads(args.output_json.read_text())["values"]["runs"]


def reproducing_command(runs: dict[str, dict]) -> str:
    """The command line, less its `--variants` once the record holds every variant: the variants may have been run
    a few at a time, and the plain command resumes the record (it skips what is recorded with the same settings)."""
    words = shlex.split(bench.command_line())
    if set(runs) != set(VARIANTS) or "--variants" not in words:
        return shlex.join(words)
    start = words.index("--variants")
    end = next((i for i in range(start + 1, len(words)) if words[i].startswith("--")), len(words))
    return shlex.join(words[:start] + words[end:])


def save(args: argparse.Namespace, machine: dict, runs: dict[str, dict]) -> None:
    total = sum(record["cpu_seconds"] for record in runs.values())
    text = {
        "time": [
            f"{len(runs)} variants, {total / 60:.1f} CPU-minutes of training and scoring in all (one torch thread each)."
        ]
    }
    tables = {"variants": results_table(runs)}
    bench.write_results(args, machine, tables, {"runs": runs}, text, command=reproducing_command(runs))


def main(argv: list[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    bench.setup(0, args.threads)
    device, dtype = bench.device_and_dtype(args)
    machine = bench.describe_machine(device, dtype)
    runs = recorded(args)
    for name in args.variants:
        planned = {"id": name, "kwargs": planned_kwargs(name, args)}
        planned |= {key: VARIANTS[name][1][key] for key in WRITERS if key in VARIANTS[name][1]}
        if name in runs:
            if [runs[name].get(key) for key in ("kwargs", *WRITERS)] != [planned.get(k) for k in ("kwargs", *WRITERS)]:
                raise SystemExit(
                    f"{args.output_json} holds variant {name!r} run with other settings ({runs[name]['kwargs']}); "
                    "pass --fresh to discard it, or another --output-json"
                )
            continue
        print(
            f"{name} ({VARIANTS[name][0]}): training, {datetime.datetime.now(datetime.timezone.utc):%H:%M} UTC",
            flush=True,
        )
        started = time.perf_counter()
        kwargs = planned["kwargs"]
        vocab = AssociativeVocab(FILLER, kwargs["num_keys"], kwargs["num_values"])
        if "oracle" in planned:
            writer = oracle_writer(planned["oracle"], vocab, kwargs["num_pairs"])
        elif "selection" in planned:
            writer = selecting_writer(
                planned["selection"], vocab, forced_steps=kwargs["steps"] // 2, shift=planned.get("shift", "sum")
            )
        elif "memory_tokens" in planned:
            writer = memory_token_writer()
        else:
            writer = contextlib.nullcontext()
        with writer as kept_values:
            runs[name] = run_arm(planned, device, dtype)
        if kept_values:
            runs[name]["kept_value_share"] = sum(kept_values) / len(kept_values)
        print(
            f"{name}: accuracy {runs[name]['accuracy']:.3f}, among the row's values {runs[name]['row_value_rate']:.3f}, "
            f"swapped {runs[name]['swapped_accuracy']:.3f} ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        save(args, machine, {n: runs[n] for n in VARIANTS if n in runs})
    return runs


if __name__ == "__main__":
    main()
