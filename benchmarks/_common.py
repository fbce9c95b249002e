# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the benchmark scripts: timing, machine info, tables and the docs/benchmarks.md writer.

Not a benchmark itself; the scripts import it as a sibling module (`python benchmarks/<name>.py` puts this folder on
`sys.path`).
"""

import argparse
import contextlib
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


REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_PATH = REPO_ROOT / "docs" / "benchmarks.md"

DOCS_HEADER = """# Benchmarks

Each script in `benchmarks/` measures the recurrent GPT-2 and the baseline it is compared with side by side in one
run (interleaved where timing is involved, so that machine drift hits both alike) and prints a small table of
absolute numbers and ratios; only the ratios are meant to carry over to other machines. Rerun one with
`python benchmarks/<name>.py` (add `--help` for the bigger settings); `--write-docs` also replaces that script's
section of this page. Weights are random: the cost of a forward pass does not depend on their values.

Each section records the commit, the machine, the command, and the load on the machine at the start and at the end
of the run. The "parallel-region probe" is the median time of a small two-thread reduction: about 0.02 ms on an idle
machine, but milliseconds when other processes keep the cores busy, because every OpenMP parallel region then
waits for its worker thread to be scheduled. A model that runs many small operators (single-token decoding, the
recurrent model's per-layer pooling and mask bookkeeping) is slowed far more by that than one that runs a few big
ones, so timing ratios taken while the probe is high are not to be trusted; rerun on an idle machine, or with
`--threads 1`, which has no parallel regions to wait for. Memory numbers do not depend on load.

Every script takes `--device` (cpu, cuda or cuda:N; cuda when there is one) and `--dtype` (float32, bfloat16 or
float16; float32 on the CPU, and on CUDA bfloat16 where speed or memory is measured, float32 where a trained
model's quality is). On CUDA the timers wait for the device's queue (`torch.cuda.synchronize`) and peak memory is
`torch.cuda.max_memory_allocated`; the machine line names the GPU and the dtype. The scripts that run another
program take the device and dtype that program runs in and refuse others by name (`reproduce.py`,
`reproduce_smollm2.py`, `smollm2_recurrence_ablation.py`: the stock `Trainer`'s device, float32), or pass them on
(`inductive_generalization.py`: to the example's `Trainer`).
"""


# GPT-2 small (124M) with the paper's 300-token windows.
GPT2_SMALL_SHAPE = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
    "window_size": 300,
}


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
    """How `reset_peak_memory` and `peak_memory_mib` measure on `device`, for a docs section."""
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


def peak_memory_setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, str]:
    """The parent's side of a peak-memory benchmark: the device (checked that its peak can be read) and dtype, the
    seeded set-up, and the machine line."""
    device, dtype = device_and_dtype(args)
    check_peak_memory(device)
    setup(args.seed, args.threads)
    return device, dtype, machine_info(device, dtype)


def in_child(spec: dict) -> dict:
    """Run this script again in a fresh process with the same flags and `--child SPEC` (JSON); returns the JSON object
    the child prints last. A fresh process per measurement keeps one measurement's allocations out of the next's."""
    argv = [a for a in sys.argv[1:] if a != "--write-docs"]
    proc = subprocess.run(
        [sys.executable, sys.argv[0], *argv, "--child", json.dumps(spec)],
        env={**os.environ, **CHILD_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"child {spec} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_or_render_arguments(description: str, threads: int, runs: str) -> argparse.Namespace:
    """Arguments of a benchmark that runs a long job (or renders a finished one) and records it in the docs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--results-dir", type=Path, help="render this finished run instead of running one")
    # The job's quality is what is recorded: float32 unless asked otherwise, on CUDA too.
    add_device_arguments(parser, cuda_dtype="float32")
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--write-docs", action="store_true", help="write the section and the plot into docs/")
    parser.add_argument("--note", default="", help="a sentence about the run, e.g. the load seen while it ran")
    parser.add_argument("extra", nargs="*", help=f"flags passed on to {runs} after `--`")
    return parser.parse_args()


def run_or_render(args: argparse.Namespace, run: Callable[[Path], None], images: dict[str, Path]) -> tuple[dict, str]:
    """Run a long job with `run(results_dir)` into a scratch folder, or take the finished `args.results_dir`; read
    its results.json and, with `--write-docs`, copy its plots (`{produced file: docs image}`) into docs/.

    Returns the results and a line saying where it ran (or was rendered); `--device` and `--dtype` describe the run
    (checking them against what the job can do is the caller's part).
    """
    info = machine_info(*device_and_dtype(args)) if args.results_dir is None else machine_info()
    with tempfile.TemporaryDirectory() as scratch:
        results_dir = args.results_dir or Path(scratch)
        if args.results_dir is None:
            run(results_dir)
        report = json.loads((results_dir / "results.json").read_text())
        if args.write_docs:
            for produced, image in images.items():
                image.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(results_dir / produced, image)
    where = f"Machine: {info}; {load_at_end()}." if args.results_dir is None else f"Rendered on: {info}."
    return report, where


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


def machine_info(device: torch.device | None = None, dtype: torch.dtype | None = None) -> str:
    """One markdown line describing where the numbers came from: with `device` and `dtype`, where the models ran
    (the GPU by name); without, the GPU that the code a benchmark drives would pick, if any."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    if device is not None and dtype is not None:
        models = f"models on {device_description(device, dtype)}; "
    else:
        models = f"GPU {torch.cuda.get_device_name()}; " if torch.cuda.is_available() else ""
    return (
        f"commit {code_version()}; {models}{cpu_model()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads; "
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}; "
        f"load average at start {load}; parallel-region probe {parallel_probe_ms():.2f} ms (idle: about 0.02 ms)"
    )


def load_at_end() -> str:
    """Load average and parallel-region probe after the measurements, to compare with those at the start."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return f"at the end: load average {load}, parallel-region probe {parallel_probe_ms():.2f} ms"


def command_line() -> str:
    """The command that ran, without `--note` (its text is in the section already)."""
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


def median(values: list[float]) -> float:
    return statistics.median(values)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def write_section(name: str, body: str) -> None:
    """Replace the `<!-- bench:NAME -->` ... `<!-- /bench:NAME -->` section of docs/benchmarks.md, or append it."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = f"{begin}\n{body.strip()}\n{end}"
    text = DOCS_PATH.read_text() if DOCS_PATH.exists() else DOCS_HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOCS_PATH.parent.mkdir(parents=True, exist_ok=True)
    DOCS_PATH.write_text(text)
    print(f"wrote the {name} section of {DOCS_PATH.relative_to(REPO_ROOT)}")
