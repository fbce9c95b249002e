"""Gate 2 of the memory (issue 39): the planted-name probe as a training task, on a pretrained decoder with LoRA.

Every arm is the recurrence core over a copy of the stock model (SmolLM2-135M-Instruct by default, loaded as the book
experiments load it), given LoRA adapters from the insertion layer up and its recurrence module trained whole (as
`book_reproduction` trains its arms), on the same `FactProbeCurriculum` examples in the same order: the name planted
next to the window boundary first, anywhere in window 1 by the end, cut from the training books. An arm is a dict of
`RecurrentDecoderConfig` fields over the paper's defaults (`ARM_PRESETS`; `memory_read_layers="all"` names every
layer), and `NAME-zeros` is arm NAME's zero-input twin (`recurrence_input="zeros"`: the same model with constant
memory slots).

Each arm is scored on `held_out` `FactProbe` examples of the validation book (never the test books: no choice is
made on them), with its own memory and with another example's (`h_prev_from_another_row`), against the stock model
reading window 2 alone: exact name recall, name NLL, and a paired bootstrap interval of swapped minus own NLL per name
token. The goals are checked by `goal_lines`. Each finished arm is written to `work_dir/<arm>.json` as it ends, and a
later run with the same settings takes it from there instead of training it again.
"""

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data import token_stream
from ..data.books import austen_split
from ..data.fact_probe import CURRICULUM_REACHES, FactProbe, FactProbeCurriculum, fact_scores
from ..evaluation.statistics import paired_bootstrap
from ..models.recurrent_decoder import RecurrentDecoderConfig
from ..outputs import UsageError, write_atomically
from .book_reproduction import (
    MEMORY_PRESETS,
    BookReproductionSettings,
    check_recurrence_fields,
    h_prev_from_another_row,
    load_causal_lm,
    num_decoder_layers,
    train_arm,
    with_read_layers_resolved,
)
from .training import RunProgress


# Named arms: the paper's recurrence (every default), and the memories issue 39's gate 1 may choose (k attention
# slots, or k selected tokens, read at every layer). Any other arm is given as NAME={json}.
ARM_PRESETS = {"paper": {}, **MEMORY_PRESETS}
# `NAME-zeros`: arm NAME's zero-input twin.
ZEROS_SUFFIX = "-zeros"
# Gate 1's winner on a backbone that binds: the selecting memory (docs/experiments/memory_gates.md).
DEFAULT_ARMS = ("paper", "select", "select-zeros")

# The goals, fixed before any run (issue 39, gate 2): exact recall and swapped - own name NLL (nats per name token),
# each with the level to reach and the level that lets gate 3 run.
RECALL_GOAL, RECALL_TO_GO_ON = 0.30, 0.10
SWAP_GOAL, SWAP_TO_GO_ON = 2.0, 1.0


def gate2_settings(**overrides) -> BookReproductionSettings:
    """The training settings of gate 2: T=64, two-window examples, batch 8, 1,000 steps, LoRA in every arm, scored on
    the validation book; `overrides` change any field (`bf16`, `max_steps`, ...)."""
    fields = {
        "window_size": 64,
        "windows_per_block": 2,
        "batch_size": 8,
        "max_steps": 1000,
        "backbone": "lora",
        "eval_split": "validation",
        **overrides,
    }
    return BookReproductionSettings(**fields)


def parse_arms(specs: Sequence[str]) -> dict[str, dict]:
    """Arms by name from `specs`, each a preset (`ARM_PRESETS`), `NAME={json settings}`, or `NAME-zeros` (the
    zero-input twin of NAME, a preset or an arm given before it). `UsageError` names a bad spec."""
    arms: dict[str, dict] = {}
    for spec in specs:
        name, _, text = spec.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*", name):
            raise UsageError(f"an arm's name must be letters, digits, '_', '.' or '-', got {name!r} in {spec!r}")
        if name in arms:
            raise UsageError(f"arm {name!r} is given twice")
        if text:
            try:
                settings = json.loads(text)
            except json.JSONDecodeError as error:
                raise UsageError(f"arm {name!r}: {text!r} is not JSON ({error})") from None
            if not isinstance(settings, dict):
                raise UsageError(f"arm {name!r}: the settings must be a JSON object, got {text!r}")
            check_recurrence_fields(settings, f"arm {name!r}")
        elif name in ARM_PRESETS:
            settings = ARM_PRESETS[name]
        elif name.endswith(ZEROS_SUFFIX) and name.removesuffix(ZEROS_SUFFIX) in {**ARM_PRESETS, **arms}:
            settings = {**{**ARM_PRESETS, **arms}[name.removesuffix(ZEROS_SUFFIX)], "recurrence_input": "zeros"}
        else:
            raise UsageError(
                f"arm {spec!r} is no preset ({', '.join(ARM_PRESETS)}), NAME={{json}} or NAME-zeros of an arm given "
                "before it"
            )
        arms[name] = dict(settings)
    if not arms:
        raise UsageError("give at least one arm")
    return arms


def is_zero_input(arm: dict) -> bool:
    return arm.get("recurrence_input", "window") == "zeros"


def gate2_streams(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int], dict[str, list[str]]]:
    """The training books' token stream (the curriculum's text), the validation book's (the scored examples') and
    their titles. The test books are never read."""
    train, validation = austen_split("train"), austen_split("validation")
    titles = {"train": [book.title for book in train], "validation": [book.title for book in validation]}
    return (
        token_stream([book.text for book in train], tokenizer),
        token_stream([book.text for book in validation], tokenizer),
        titles,
    )


def swap_difference(own: dict, swapped: dict, settings: BookReproductionSettings) -> dict:
    """Swapped minus own mean NLL per name token (nats), with a paired bootstrap interval over examples: each example
    is a segment read by both (`paired_bootstrap`, whose perplexity ratio is exp of the NLL difference)."""
    result = paired_bootstrap(
        own["nll"],
        own["tokens"],
        swapped["nll"],
        swapped["tokens"],
        num_resamples=settings.num_resamples,
        seed=settings.seed,
    )
    return {
        "nats": math.log1p(result.relative_difference),
        "low": math.log1p(result.low),
        "high": math.log1p(result.high),
        "confidence": result.confidence,
        "num_examples": result.num_segments,
    }


def summary(scores: dict, probe: FactProbe, window_size: int) -> dict:
    """A reader's mean name NLL per token, exact recall, recall by how far before the boundary the name was planted,
    and the per-example values (for later paired comparisons)."""
    recalled = scores["recalled"]
    distances = torch.tensor(probe.distances)
    by_distance = {}
    for reach in CURRICULUM_REACHES:
        near = distances <= math.ceil(reach * window_size)
        by_distance[f"<= {math.ceil(reach * window_size)}"] = (
            float(recalled[near].float().mean()) if near.any() else None
        )
    return {
        "name_nll": float(scores["nll"].sum() / scores["tokens"].sum()),
        "recalled": float(recalled.float().mean()),
        "recalled_by_distance": by_distance,
        "per_example": {key: value.tolist() for key, value in scores.items()},
    }


def run_gate2(
    settings: BookReproductionSettings,
    arms: dict[str, dict],
    work_dir: Path,
    *,
    held_out: int = 256,
    probe_fraction: float = 1.0,
    reaches: Sequence[float] = CURRICULUM_REACHES,
    progress_every: int = 50,
    model: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
    streams: tuple[list[int], list[int]] | None = None,
) -> dict:
    """Train and score every arm not finished in `work_dir` by an earlier run with the same settings; returns the
    report: the model, books, stock reader, every arm's results and the goal lines.

    `model`: the stock model and its tokenizer, instead of loading `settings.model_name_or_path` (SmolLM2-135M's GGUF
    by default). `streams`: the training and held-out token streams, instead of the Austen books (`gate2_streams`).
    """
    if settings.eval_split != "validation":
        raise UsageError(f"gate 2 is scored on the validation book, got eval_split={settings.eval_split!r}")
    if settings.window_start != "bare":
        raise UsageError(f"the name probe reads bare windows, got window_start={settings.window_start!r}")
    if settings.memory is not None:
        raise UsageError(f"gate 2's arms carry their own memory settings, got memory={settings.memory!r}")
    if held_out < 2 or held_out % settings.batch_size == 1:
        raise UsageError(
            f"held_out={held_out} would leave an example alone in its batch of {settings.batch_size}, where the swap "
            "has no other example's memory to give it"
        )
    start = time.perf_counter()
    if model is None:
        try:
            stock, tokenizer, source = load_causal_lm(settings.model_name_or_path)
        except (ImportError, FileNotFoundError) as error:
            raise UsageError(str(error)) from None
    else:
        (stock, tokenizer), source = model, type(model[0]).__name__
    layers = num_decoder_layers(stock)
    arms = {name: with_read_layers_resolved(arm, layers) for name, arm in arms.items()}
    for name, arm in arms.items():
        check_arm(stock, name, {**settings.recurrence_settings(), **arm})
    if streams is None:
        train_stream, held_out_stream, books = gate2_streams(tokenizer)
    else:
        (train_stream, held_out_stream), books = streams, None
    window = settings.window_size
    num_train = settings.max_steps * settings.batch_size
    # Each batch all probes or all text: a probe's few name tokens beside blocks of text would weigh next to nothing.
    train = FactProbeCurriculum(
        train_stream,
        tokenizer,
        window,
        num_train,
        probe_fraction,
        reaches,
        settings.seed,
        group_size=settings.batch_size,
    )
    evaluation = FactProbe(held_out_stream, tokenizer, window, held_out, seed=settings.seed + 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stock.requires_grad_(False).to(device).eval()
    common = {  # as JSON reads it back (lists, not tuples), to compare with an earlier run's
        "source": source,
        # `memory` left out: each arm's own is recorded beside it (and runs saved before the field still match).
        "training": {key: value for key, value in asdict(settings).items() if key != "memory"},
        "train_examples": num_train,
        "probe_fraction": probe_fraction,
        "reaches": list(reaches),
        "held_out": held_out,
        "stream_tokens": [len(train_stream), len(held_out_stream)],
    }
    common = json.loads(json.dumps(common))
    print(
        f"Model {source}; LoRA in every arm. Training: {settings.max_steps} steps x {settings.batch_size} two-window "
        f"examples of {window} tokens ({probe_fraction:.0%} name probe, curriculum reaches {list(reaches)}) from "
        f"{', '.join(books['train']) if books else f'a stream of {len(train_stream):,} tokens'}; scored on {held_out} "
        f"examples of {', '.join(books['validation']) if books else 'another stream'}"
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    finished = {name: finished_arm(work_dir, name, arm, common) for name, arm in arms.items()}
    todo = [name for name, result in finished.items() if result is None]
    for name in arms:
        if name not in todo:
            print(f"[{name}] finished in an earlier run: {work_dir / f'{name}.json'}")
    progress = RunProgress(todo, settings.max_steps, every=progress_every)
    print(progress.plan(2 * len(todo) + 1))
    stock_scores = summary(fact_scores(stock, evaluation, window, settings.batch_size), evaluation, window)
    print(f"[stock] window 2 alone: name NLL {stock_scores['name_nll']:.3f}, recall {stock_scores['recalled']:.1%}")
    results = {}
    for name, arm in arms.items():
        results[name] = finished[name] or train_and_score(
            stock, name, arm, train, evaluation, settings, progress, work_dir, common
        )
    report = {
        **common,
        "books": books,
        "minutes": (time.perf_counter() - start) / 60,
        "stock": stock_scores,
        "arms": results,
    }
    report["goals"] = goal_lines(results)
    return report


# What describes the file a stock config came from, not the architecture (as `recurrent_decoder_from_causal_lm` drops).
STOCK_FILE_KEYS = ("architectures", "quantization_config", "transformers_version")


def check_arm(stock: PreTrainedModel, name: str, recurrence: dict) -> None:
    """Refuse, before any training, an arm whose settings the recurrence core refuses over this model."""
    text_config = {k: v for k, v in stock.config.to_dict().items() if k not in STOCK_FILE_KEYS}
    try:
        RecurrentDecoderConfig.from_dict({"text_config": text_config}, **recurrence)
    except (ValueError, TypeError) as error:
        raise UsageError(f"arm {name!r}: {error}") from None


def finished_arm(work_dir: Path, name: str, arm: dict, common: dict) -> dict | None:
    """The arm's results saved by an earlier run with the same settings, None when there are none; `UsageError` when
    the saved arm was run with other settings (it is never overwritten)."""
    path = work_dir / f"{name}.json"
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    expected = {"recurrence": arm, **common}
    differing = sorted(key for key in expected if saved["settings"].get(key) != expected[key])
    if differing:
        raise UsageError(
            f"{path} holds arm {name!r} run with other settings ({', '.join(differing)} differ): remove it, or give "
            "another work folder"
        )
    return saved["result"]


def train_and_score(
    stock: PreTrainedModel,
    name: str,
    arm: dict,
    train: FactProbeCurriculum,
    evaluation: FactProbe,
    settings: BookReproductionSettings,
    progress: RunProgress,
    work_dir: Path,
    common: dict,
) -> dict:
    """Train one arm on the curriculum, score it with its own and with another example's memory, and save it."""
    overrides = {key: value for key, value in arm.items() if key != "recurrence_input"}
    recurrence_input = arm.get("recurrence_input", "window")
    print(f"[{name}] training: recurrence {json.dumps(arm) if arm else 'the paper defaults'}")
    model, loss, minutes = train_arm(
        stock, recurrence_input, train, settings, callbacks=[progress.start(name)], **overrides
    )
    window, batch = settings.window_size, settings.batch_size
    own = fact_scores(model, evaluation, window, batch)
    with h_prev_from_another_row(model):
        swapped = fact_scores(model, evaluation, window, batch)
    result = {
        "recurrence": arm,
        "train_loss": loss,
        "train_minutes": minutes,
        "seconds_per_step": 60 * minutes / settings.max_steps,
        "own": summary(own, evaluation, window),
        "swapped": summary(swapped, evaluation, window),
        "swapped_minus_own": swap_difference(own, swapped, settings),
    }
    difference = result["swapped_minus_own"]
    print(
        f"[{name}] recall {result['own']['recalled']:.1%} own, {result['swapped']['recalled']:.1%} swapped; name NLL "
        f"{result['own']['name_nll']:.3f} own, {result['swapped']['name_nll']:.3f} swapped ({difference['nats']:+.3f} "
        f"nats, 95% interval {difference['low']:+.3f} to {difference['high']:+.3f}); {minutes:.1f} minutes",
        flush=True,
    )
    saved = {"settings": {"recurrence": arm, **common}, "result": result}
    write_atomically(work_dir / f"{name}.json", json.dumps(saved, indent=2))
    return result


def verdict(passed: bool, goal: str, value: str) -> str:
    return f"{'PASS' if passed else 'FAIL'} {goal}: {value}"


def goal_lines(arms: dict[str, dict]) -> list[str]:
    """The gate's goals, one PASS/FAIL line each: for an arm that reads the window, exact recall >= 30% (>= 10% to go
    on to gate 3), swapped - own name NLL >= +2 nats (>= +1 to go on) with a 95% interval excluding 0, and recall
    0% with another example's memory; for a zero-input arm, recall 0%."""
    lines = []
    for name, arm in arms.items():
        own, swapped, difference = arm["own"], arm["swapped"], arm["swapped_minus_own"]
        examples = difference["num_examples"]
        recall = f"{100 * own['recalled']:.1f}% of {examples}"
        if is_zero_input(arm["recurrence"]):
            lines.append(verdict(own["recalled"] == 0, f"{name} (zero input) recalls 0%", recall))
            continue
        interval = (
            f"{difference['nats']:+.2f} nats, 95% interval [{difference['low']:+.2f}, {difference['high']:+.2f}]"
        )
        for level, purpose in ((RECALL_GOAL, "the goal"), (RECALL_TO_GO_ON, "to go on to gate 3")):
            lines.append(
                verdict(own["recalled"] >= level, f"{name} exact name recall >= {level:.0%} ({purpose})", recall)
            )
        for level, purpose in ((SWAP_GOAL, "the goal"), (SWAP_TO_GO_ON, "to go on to gate 3")):
            passed = difference["nats"] >= level and difference["low"] > 0
            goal = f"{name} swapped - own name NLL >= +{level:g} nats, interval excluding 0 ({purpose})"
            lines.append(verdict(passed, goal, interval))
        lines.append(
            verdict(
                swapped["recalled"] == 0,
                f"{name} with another example's memory recalls 0%",
                f"{100 * swapped['recalled']:.1f}% of {examples}",
            )
        )
    return lines


__all__ = ["ARM_PRESETS", "DEFAULT_ARMS", "gate2_settings", "goal_lines", "parse_arms", "run_gate2"]
