# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the benchmark and experiment scripts: arguments, timing, peak memory, and the machine
description and JSON result file every run writes (`results/` beside the script, rendered into docs/benchmarks.md or
docs/experiments/ by `render.py`).

Not a benchmark itself; the scripts import it as a sibling module (`python benchmarks/<name>.py` puts this folder on
`sys.path`; experiments/_common.py hands the experiment scripts this same module).
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from render import REPO_ROOT, markdown_table, render_docs
from torch.utils._python_dispatch import TorchDispatchMode

from hf_recurrence.evaluation.report import TABLE_COLUMNS


# GPT-2 small (124M) with the paper's 300-token windows.
GPT2_SMALL_SHAPE = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
    "window_size": 300,
}


# A narrow GPT-2 (6 layers, 384 wide) with the full vocabulary, for the scripts that run thousands of steps or
# tokens on a CPU: per-window logits, which the vocabulary sets, dominate their activation memory.
NARROW_GPT2_SHAPE = {"n_layer": 6, "n_embd": 384, "n_head": 6, "vocab_size": 50257, "n_positions": 1024}


def add_model_shape_arguments(parser: argparse.ArgumentParser, shape: dict[str, int]) -> None:
    """The GPT-2 shape flags every benchmark takes, with that benchmark's defaults."""
    for name in ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions", "window_size"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=shape[name])


def gpt2_dims(args: argparse.Namespace) -> dict[str, int]:
    """The GPT-2 config fields set by `add_model_shape_arguments` (all but the window size)."""
    return {name: getattr(args, name) for name in ("n_layer", "n_embd", "n_head", "vocab_size", "n_positions")}


TRANSFORMER_XL_SHAPE = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "vocab_size")


def add_transformer_xl_shape_arguments(parser: argparse.ArgumentParser, shape: dict[str, int]) -> None:
    """The Transformer-XL shape flags of the Transformer-XL benchmarks, with that benchmark's defaults."""
    for name in TRANSFORMER_XL_SHAPE:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=shape[name])


def transformer_xl_dims(args: argparse.Namespace) -> dict[str, int]:
    """The TransformerXLConfig fields set by `add_transformer_xl_shape_arguments`."""
    return {name: getattr(args, name) for name in TRANSFORMER_XL_SHAPE}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_device(text: str) -> torch.device:
    """A `--device` value: cpu, cuda or cuda:N (argparse reports anything else with the value)."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not cpu, cuda or cuda:N")
    return torch.device(text)


def add_device_arguments(parser: argparse.ArgumentParser, cuda_dtype: str = "bfloat16") -> None:
    """`--device` and `--dtype`, the same in every benchmark.

    The dtype defaults to float32 on the CPU (the recorded CPU numbers are float32, and CPUs have no faster bfloat16
    path for most of these operators) and to `cuda_dtype` on CUDA: bfloat16 where speed or memory is measured, since
    that is how models run on a GPU; float32 where the numbers are a trained model's quality, which training in pure
    bfloat16 would change.
    """
    parser.add_argument(
        "--device",
        type=parse_device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N (default: cuda if present, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES),
        help=f"dtype of the weights and activations (default: {cuda_dtype} on CUDA, float32 on the CPU)",
    )
    parser.set_defaults(cuda_dtype=cuda_dtype)


def device_and_dtype(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """The device and dtype asked for; refuses a CUDA device this machine lacks, naming it."""
    device = args.device
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SystemExit(f"--device {device}: no such CUDA device on this machine ({torch.cuda.device_count()} found)")
    dtype = DTYPES[args.dtype or (args.cuda_dtype if device.type == "cuda" else "float32")]
    return device, dtype


def require_device_and_dtype(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, why: str) -> None:
    """For a benchmark whose device and dtype are chosen by the code it runs: refuse any other, naming the value."""
    asked_device, asked_dtype = device_and_dtype(args)
    if asked_device.type != device.type or (asked_device.index or 0) != (device.index or 0):
        raise SystemExit(f"--device {asked_device}: not available here, {why} (it runs on {device})")
    if asked_dtype != dtype:
        raise SystemExit(
            f"--dtype {dtype_name(asked_dtype)}: not available here, {why} (it runs in {dtype_name(dtype)})"
        )


def trainer_device(args: argparse.Namespace, why: str) -> tuple[torch.device, torch.dtype]:
    """For a benchmark that trains in float32 with the stock `Trainer`, which picks the device itself (the first
    CUDA device when there is one): that device and dtype, after refusing any other asked for."""
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    require_device_and_dtype(args, device, torch.float32, why)
    return device, torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def device_description(device: torch.device, dtype: torch.dtype) -> str:
    """ "cuda:0 (NVIDIA H100 80GB HBM3), bfloat16" or "cpu, float32"."""
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    return f"{device}{name}, {dtype_name(dtype)}"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer or a counter read after it sees all of it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """`time.perf_counter()` once `device` has finished its queued work: CUDA kernels run asynchronously, so without
    the wait a timer around a call would measure only their launches."""
    synchronize(device)
    return time.perf_counter()


def _status_mib(field: str) -> float:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) / 1024


def memory_mib(device: torch.device) -> float:
    """Memory in use now: the process's resident memory on the CPU, the tensors allocated on a CUDA device."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return _status_mib("VmRSS")


def memory_name(device: torch.device) -> str:
    """What `memory_mib(device)` reads, for a table header."""
    return "CUDA memory allocated" if device.type == "cuda" else "RSS"


def reset_peak_memory(device: torch.device) -> float:
    """Start the peak-memory counter of `device` from the memory in use now, and return that (MiB).

    On the CPU the counter is the kernel's peak RSS (VmHWM), reset through /proc/self/clear_refs: the CPU allocator
    keeps no peak of its own, and `tracemalloc` does not see torch's allocations. Measure in a fresh process started
    by `in_child`, whose environment (`CHILD_ENV`) returns freed tensors to the system, for RSS to follow the live
    tensors.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return memory_mib(device)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def peak_memory_mib(device: torch.device) -> float:
    """The highest memory in use since `reset_peak_memory(device)`."""
    if device.type == "cuda":
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    return _status_mib("VmHWM")


def check_peak_memory(device: torch.device) -> None:
    """Refuse to measure peak memory on a CPU without Linux's resettable peak-RSS counter."""
    if device.type == "cpu" and not Path("/proc/self/clear_refs").exists():
        sys.exit("peak memory on the CPU is read from Linux's /proc/self/status and needs /proc/self/clear_refs")


def peak_memory_method(device: torch.device) -> str:
    """How `reset_peak_memory` and `peak_memory_mib` measure on `device`, recorded with the result."""
    if device.type == "cuda":
        return "`torch.cuda.max_memory_allocated` after `torch.cuda.reset_peak_memory_stats` (tensors only)"
    return (
        "the kernel's peak RSS (VmHWM, reset through `/proc/self/clear_refs`) with glibc's "
        "`MALLOC_MMAP_THRESHOLD_=65536`, so that every allocation of 64 KiB or more is its own mapping, returned to "
        "the system when freed, and RSS follows the live tensors rather than the allocator's high-water mark"
    )


# See `reset_peak_memory`: every allocation of 64 KiB or more gets its own mapping, unmapped when freed.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def add_child_argument(parser: argparse.ArgumentParser) -> None:
    """The internal `--child SPEC` of a benchmark that runs each measurement in a fresh process (`in_child`)."""
    parser.add_argument("--child", help=argparse.SUPPRESS)


def run_if_child(args: argparse.Namespace, run_child: Callable[[argparse.Namespace, dict], dict]) -> bool:
    """In a process started by `in_child`: run the measurement `run_child(args, spec)` for its `--child` spec and print
    the result for the parent. Returns whether this process was such a child."""
    if args.child is None:
        return False
    print(json.dumps(run_child(args, json.loads(args.child))))
    return True


def start(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, dict]:
    """The seeded set-up of a benchmark built by `benchmark_parser`: its device, dtype and machine description."""
    device, dtype = device_and_dtype(args)
    setup(getattr(args, "seed", 0), args.threads)
    return device, dtype, describe_machine(device, dtype)


def peak_memory_setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, dict]:
    """The parent's side of a peak-memory benchmark: `start`, after checking that the device's peak can be read."""
    check_peak_memory(device_and_dtype(args)[0])
    return start(args)


def in_child(spec: dict) -> dict:
    """Run this script again in a fresh process with the same flags and `--child SPEC` (JSON); returns the JSON object
    the child prints last. A fresh process per measurement keeps one measurement's allocations out of the next's."""
    proc = subprocess.run(
        [sys.executable, sys.argv[0], *sys.argv[1:], "--child", json.dumps(spec)],
        env={**os.environ, **CHILD_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"child {spec} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_or_render_parser(doc: str, script: str, threads: int, runs: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark that runs a long job (or renders a finished one) and records it; the script adds
    its own before parsing."""
    # The job's quality is what is recorded: float32 unless asked otherwise, on CUDA too.
    parser = benchmark_parser(doc, script, threads=threads, cuda_dtype="float32", seed=False)
    parser.add_argument("--results-dir", type=Path, help="render this finished run instead of running one")
    parser.add_argument("extra", nargs="*", help=f"flags passed on to {runs} after `--`")
    return parser


def run_or_render(args: argparse.Namespace, run: Callable[[Path], None], images: dict[str, Path]) -> tuple[dict, dict]:
    """Run a long job with `run(results_dir)` into a scratch folder, or take the finished `args.results_dir`; read
    its results.json and, with `--write-docs`, copy its plots (`{produced file: docs image}`) into docs/.

    Returns the job's results and the machine it ran on (or, with `--results-dir`, was rendered on); `--device` and
    `--dtype` describe the run (checking them against what the job can do is the caller's part).
    """
    machine = describe_machine(*device_and_dtype(args)) if args.results_dir is None else describe_machine()
    with tempfile.TemporaryDirectory() as scratch:
        results_dir = args.results_dir or Path(scratch)
        if args.results_dir is None:
            run(results_dir)
        report = json.loads((results_dir / "results.json").read_text())
        if args.write_docs:
            for produced, image in images.items():
                image.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(results_dir / produced, image)
    return report, machine


def setup(seed: int, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    # Checkpoint loading and `generate` are chatty; the benchmarks print their own tables.
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else "unknown"


def parallel_probe_ms(repeats: int = 25) -> float:
    """Median milliseconds of a small multithreaded reduction; about 0.02 ms on an idle machine.

    When other processes keep the cores busy, every OpenMP parallel region waits for its worker threads to be
    scheduled (milliseconds each), so a model's many small operators slow down far more than its big ones and timing
    ratios become meaningless. This probe shows whether that was happening.
    """
    x = torch.randn(1, 300, 768)
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            x.sum(1)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def code_version() -> str:
    """Commit of the checkout the benchmark ran on, with "+changes" when the model's sources differ from it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=REPO_ROOT, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" +changes" if dirty.stdout.strip() else "")


def _load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _load_text(load: list[float] | None) -> str:
    return ", ".join(f"{x:.2f}" for x in load) if load else "n/a"


def describe_machine(device: torch.device | None = None, dtype: torch.dtype | None = None) -> dict:
    """Where the numbers come from, as data, with `description`, the one line the docs show: with
    `device` and `dtype`, where the models ran (the GPU by name); without, the GPU that the code a benchmark drives
    would pick, if any. Taken before the measurements: the load and the parallel-region probe are those at the start."""
    gpu = (
        torch.cuda.get_device_name(device)
        if torch.cuda.is_available() and (device is None or device.type == "cuda")
        else None
    )
    machine = {
        "commit": code_version(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": None if device is None else str(device),
        "gpu": gpu,
        "dtype": None if dtype is None else dtype_name(dtype),
        "load_average_at_start": _load_average(),
        "parallel_probe_ms_at_start": round(parallel_probe_ms(), 3),
    }
    if device is not None and dtype is not None:
        models = f"models on {device_description(device, dtype)}; "
    else:
        models = f"GPU {gpu}; " if gpu else ""
    machine["description"] = (
        f"commit {machine['commit']}; {models}{machine['cpu']}, {machine['cpus']} CPUs, "
        f"{machine['torch_threads']} torch threads; Python {machine['python']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}; load average at start {_load_text(machine['load_average_at_start'])}; "
        f"parallel-region probe {machine['parallel_probe_ms_at_start']:.2f} ms (idle: about 0.02 ms)"
    )
    return machine


def finish_machine(machine: dict) -> dict:
    """`machine` with the load and the parallel-region probe after the measurements, to compare with the start."""
    load, probe = _load_average(), round(parallel_probe_ms(), 3)
    at_end = f"at the end: load average {_load_text(load)}, parallel-region probe {probe:.2f} ms"
    return {**machine, "load_average_at_end": load, "parallel_probe_ms_at_end": probe, "at_end": at_end}


def command_line() -> str:
    """The command that ran, without `--note` (its text is recorded on its own)."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(REPO_ROOT)
    arguments, skip = [], False
    for argument in sys.argv[1:]:
        if skip or argument == "--note" or argument.startswith("--note="):
            skip = argument == "--note"
            continue
        arguments.append(argument)
    return "python " + " ".join(shlex.quote(a) for a in [str(script), *arguments])


def interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, device: torch.device | None = None
) -> dict[str, list[float]]:
    """Time each function `repeats` times in rounds (A B C A B C ...), after `warmup` untimed rounds.

    Returns the seconds of every timed call per name. The order inside a round rotates from round to round so that
    no function always runs right after the same other one. On a CUDA `device` each call is timed from an empty queue
    to an empty queue (kernels run asynchronously; the host would otherwise time only their launches).
    """
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    device = device or torch.device("cpu")
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock(device)
            fns[name]()
            elapsed = clock(device) - start
            if round_index >= warmup:
                times[name].append(elapsed)
    return times


class _OperatorCalls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def aten_calls(fn: Callable[[], object]) -> int:
    """The aten operators one call of `fn` dispatches, its backward's included: on a GPU, the kernels the host
    launches one after another, which is what a step costs where each kernel is too small to hide its launch."""
    with _OperatorCalls() as counted:
        fn()
    return counted.calls


def ratio_cells(ratios: dict[str, float], bold_paired: bool = False) -> list[str]:
    """The table cells of `ratios`: paired (the headline, bold if asked), medians, minima."""
    paired = f"{ratios['paired']:.3f}x"
    return [f"**{paired}**" if bold_paired else paired, f"{ratios['medians']:.3f}x", f"{ratios['minima']:.3f}x"]


def median(values: list[float]) -> float:
    return statistics.median(values)


def ratios(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """Three views of numerator / denominator over interleaved rounds: `paired`, the median of the per-round ratios
    (each pair measured back to back, which cancels drift); `medians`, the ratio of the median times; `minima`, that
    of the fastest calls (the least disturbed by other processes)."""
    return {
        "paired": median([n / d for n, d in zip(numerator, denominator, strict=True)]),
        "medians": median(numerator) / median(denominator),
        "minima": min(numerator) / min(denominator),
    }


def table(headers: list[str], rows: list[list[object]], align: list[str] | None = None) -> dict:
    """A result table as data: the cells as shown in the docs (see `render.markdown_table`)."""
    result = {"headers": headers, "rows": [[str(cell) for cell in row] for row in rows]}
    if align:
        result["align"] = align
    return result


def perplexity_table(rows: list[dict]) -> dict:
    """The windowed-perplexity rows of a reproduction as a result table, in `format_table`'s layout (the paper's
    Tables 1-2)."""
    columns = [
        column
        for column in TABLE_COLUMNS
        if column[0] != "word_perplexity" or any(row.get("word_perplexity") is not None for row in rows)
    ]
    cells = [["–" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in columns] for row in rows]
    align = ["" if key == "model" else "right" for key, _, _ in columns]
    return table([header for _, header, _ in columns], cells, align)


def benchmark_parser(
    doc: str, script: str, threads: int = 2, cuda_dtype: str = "bfloat16", seed: bool = True
) -> argparse.ArgumentParser:
    """The arguments every benchmark takes: `--device`, `--dtype`, `--threads`, `--seed` (unless the job seeds
    itself), and where the result goes (`--output-json`, `--write-docs`, `--note`). `doc` is the script's docstring
    (its first paragraph is the description), `script` its `__file__` (its name names the result file)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_device_arguments(parser, cuda_dtype=cuda_dtype)
    parser.add_argument("--threads", type=int, default=threads, help=f"torch threads (default {threads})")
    if seed:
        parser.add_argument("--seed", type=int, default=0)
    name = Path(script).stem
    # benchmarks/results or experiments/results: the recorded runs of the script's own folder.
    results_dir = Path(script).resolve().parent / "results"
    folder = results_dir.relative_to(REPO_ROOT)
    parser.add_argument(
        "--output-json",
        type=Path,
        default=results_dir / f"{name}.json",
        help=f"where the run's numbers go (default: {folder}/{name}.json, the recorded run)",
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help=f"then re-render the docs from the recorded runs (shows this run if --output-json is in {folder})",
    )
    parser.add_argument("--note", default="", help="a sentence about the run, e.g. the load seen while it ran")
    return parser


# Arguments that say where a result goes, not what was measured.
_NOT_SETTINGS = {"output_json", "write_docs", "note", "child", "cuda_dtype"}


def _jsonable(value: object) -> object:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def write_json(path: Path, content: dict) -> None:
    """Write `content` as indented JSON to `path`, beside it first and then moved over it, so that an interrupted write
    leaves the file as it was (resumable runs rewrite their record after every arm)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(content, indent=2) + "\n")
    os.replace(partial, path)


def write_results(
    args: argparse.Namespace,
    machine: dict,
    tables: dict[str, dict],
    values: dict,
    text: dict[str, list[str]] | None = None,
    **extra: object,
) -> dict:
    """Print the run's tables and text, and write the run as JSON to `args.output_json`: the command, the date, the
    machine (with the load at the end), the settings, the measured `values`, and what the docs show of
    them: `tables` and `text` (named groups of lines derived from the numbers, such as a goal's verdict); `extra`
    adds top-level fields (or replaces one, such as the `command` a resumable run records). The file is replaced
    whole (`write_json`). With `--write-docs`, re-render the docs. Returns what was written."""
    result = {
        "script": Path(sys.argv[0]).name,
        "command": command_line(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "note": args.note,
        "machine": finish_machine(machine),
        "settings": {k: _jsonable(v) for k, v in vars(args).items() if k not in _NOT_SETTINGS},
        "values": _jsonable(values),
        "tables": tables,
        "text": text or {},
        **extra,
    }
    print(f"\n{result['machine']['description']}; {result['machine']['at_end']}\n")
    for shown in tables.values():
        print(markdown_table(shown) + "\n")
    for lines in result["text"].values():
        print("\n".join(lines) + "\n")
    write_json(args.output_json, result)
    print(f"wrote {args.output_json}")
    if args.write_docs:
        render_docs()
    return result
