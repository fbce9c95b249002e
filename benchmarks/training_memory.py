# SPDX-License-Identifier: Apache-2.0
"""Peak memory of one training step (forward + backward) of the recurrent GPT-2: 12 windows vs 1 window, with and
without window-level activation checkpointing.

Run (about 1-2 minutes on 2 CPU cores):

    python benchmarks/training_memory.py [--write-docs]

What is measured and how: docs/benchmarks.md, "Training memory: 12 windows vs 1". GPT-2 small with the paper's
300-token windows:

    python benchmarks/training_memory.py --n-layer 12 --n-embd 768 --n-head 12 --window-size 300
"""

import argparse
import gc

import _common as bench
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2Config, RecurrentGPT2LMHeadModel


GOAL = 1.3


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__)
    bench.add_model_shape_arguments(parser, {**bench.NARROW_GPT2_SHAPE, "window_size": 128})
    parser.add_argument("--windows", type=int, default=12, help="windows of the long input (compared with 1)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--no-stock", action="store_true", help="skip the stock GPT-2 reference")
    bench.add_child_argument(parser)
    return parser.parse_args()


def run_child(args: argparse.Namespace, spec: dict) -> dict:
    """One configuration, in this (fresh) process."""
    bench.setup(args.seed, args.threads)
    device, dtype = bench.device_and_dtype(args)
    window, windows, batch = args.window_size, spec["windows"], args.batch_size
    dims = bench.gpt2_dims(args)
    if spec["model"] == "stock":
        model = GPT2LMHeadModel(GPT2Config(**dims))
    else:
        config = RecurrentGPT2Config(
            **dims, window_size=window, window_overlap=0, insertion_layer=min(2, args.n_layer - 1)
        )
        model = RecurrentGPT2LMHeadModel(config)
    model.to(device, dtype).train()
    if spec["checkpointing"]:
        model.activation_checkpointing_enable()
    ids = torch.randint(0, args.vocab_size, (batch, windows * window), device=device)
    warm = ids[:, : min(2, windows) * window] if spec["model"] != "stock" else ids
    model(warm, labels=warm).loss.backward()  # warm-up: lazy initialisation, thread pools, kernels
    model.zero_grad(set_to_none=True)
    del warm
    gc.collect()

    before = bench.reset_peak_memory(device)
    start = bench.clock(device)
    loss = model(ids, labels=ids).loss
    forward_peak = bench.peak_memory_mib(device)
    loss.backward()
    seconds = bench.clock(device) - start
    peak = bench.peak_memory_mib(device)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "before_mib": before,
        "peak_mib": peak,
        "step_mib": peak - before,
        "forward_mib": forward_peak - before,
        "grads_mib": grads / 2**20,
        "params_mib": params / 2**20,
        "seconds": seconds,
        "loss": loss.item(),
    }


def main() -> None:
    args = parse_args()
    if bench.run_if_child(args, run_child):
        return
    device, _, machine = bench.peak_memory_setup(args)
    n = args.windows
    specs = {
        ("recurrent", True, 1): {"model": "recurrent", "checkpointing": True, "windows": 1},
        ("recurrent", True, n): {"model": "recurrent", "checkpointing": True, "windows": n},
        ("recurrent", False, 1): {"model": "recurrent", "checkpointing": False, "windows": 1},
        ("recurrent", False, n): {"model": "recurrent", "checkpointing": False, "windows": n},
    }
    if not args.no_stock:
        specs[("stock", False, 1)] = {"model": "stock", "checkpointing": False, "windows": 1}
    results = {}
    for key, spec in specs.items():
        results[key] = bench.in_child(spec)
        print(f"{key}: {results[key]}", flush=True)

    window = args.window_size
    rows = []
    for (model, ckpt, windows), r in results.items():
        name = "recurrent GPT-2" if model == "recurrent" else "stock GPT2LMHeadModel"
        rows.append(
            [
                name,
                "on" if ckpt else "off",
                f"{windows} x {window}",
                f"{r['forward_mib']:.0f}",
                f"{r['step_mib']:.0f}",
                f"{r['seconds']:.2f}",
            ]
        )
    table = bench.table(
        ["model", "checkpointing", "tokens", "forward peak (MiB)", "step peak (MiB)", "step time (s)"], rows
    )

    def ratio(ckpt: bool, key: str = "step_mib") -> float:
        return results[("recurrent", ckpt, n)][key] / results[("recurrent", ckpt, 1)][key]

    ratio_table = bench.table(
        ["checkpointing", f"step peak, {n} windows / 1", f"forward peak, {n} windows / 1"],
        [
            ["on", f"**{ratio(True):.2f}x**", f"{ratio(True, 'forward_mib'):.2f}x"],
            ["off", f"{ratio(False):.2f}x", f"{ratio(False, 'forward_mib'):.2f}x"],
        ],
    )
    saving = results[("recurrent", False, n)]["step_mib"] / results[("recurrent", True, n)]["step_mib"]
    r1 = results[("recurrent", True, 1)]
    findings = [
        f"Without checkpointing the {n}-window step needs {saving:.2f}x the memory of the checkpointed one. Goal "
        f"{'met' if ratio(True) <= GOAL else 'missed'} ({ratio(True):.2f}x); model at rest {r1['before_mib']:.0f} MiB "
        f"{bench.memory_name(device)} ({r1['params_mib']:.0f} MiB parameters), gradients {r1['grads_mib']:.0f} MiB."
    ]
    values = {
        f"{model}, checkpointing {'on' if ckpt else 'off'}, {w} windows": r for (model, ckpt, w), r in results.items()
    }
    bench.write_results(
        args,
        machine,
        {"steps": table, "ratios": ratio_table},
        values,
        {"verdict": findings},
        memory_method=bench.peak_memory_method(device),
        goal=GOAL,
        goal_met=ratio(True) <= GOAL,
    )


if __name__ == "__main__":
    main()
