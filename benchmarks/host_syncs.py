# SPDX-License-Identifier: Apache-2.0
"""Device-to-host reads and operator launches per call of the causal families vs stock GPT-2 on the same windows.

Run (a few seconds):

    python benchmarks/host_syncs.py [--device cuda] [--dtype bfloat16] [--write-docs]

What is counted and why: docs/benchmarks.md, "Host syncs and kernel launches per call".
"""

import argparse

import _common as bench
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import (
    RecurrentGPT2Config,
    RecurrentGPT2LMHeadModel,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
    TransformerXLConfig,
    TransformerXLLMHeadModel,
)


# Operators that launch no kernel: views, allocations, dtype/metadata plumbing.
VIEWS_AND_PLUMBING = """select slice view expand as_strided unsqueeze squeeze transpose t reshape _unsafe_view permute narrow
alias detach empty empty_like empty_strided resolve_conj resolve_neg to _to_copy expand_as contiguous result_type
lift_fresh split chunk unbind _reshape_alias view_as dropout"""
NOT_KERNELS = {"aten::" + name for name in VIEWS_AND_PLUMBING.split()}
# Operators whose output's size depends on the input's values: on CUDA the host reads that size from the device
# before it can go on, as it does for a value. (A value read, `.item()`, `bool(t)` or `int(t)`, ends in one
# `aten::_local_scalar_dense`; its callers `aten::item` and `aten::is_nonzero` are not counted again.)
VALUE_SHAPED = {
    "aten::nonzero",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::masked_select",
}


def parse_args() -> argparse.Namespace:
    parser = bench.benchmark_parser(__doc__, __file__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--window-size", type=int, default=32)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    return parser.parse_args()


def models(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    window, hidden, layers, vocab = args.window_size, args.hidden, args.layers, 1000
    gpt2 = {"n_layer": layers, "n_embd": hidden, "n_head": 4, "n_positions": window, "vocab_size": vocab}
    return {
        "recurrent GPT-2": RecurrentGPT2LMHeadModel(RecurrentGPT2Config(**gpt2, window_size=window, insertion_layer=1)),
        "recurrent Llama": RecurrentLlamaForCausalLM(
            RecurrentLlamaConfig(
                vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=window, window_size=window,
                insertion_layer=1,
            )
        ),
        "Transformer-XL": TransformerXLLMHeadModel(
            TransformerXLConfig(
                vocab_size=vocab, d_model=hidden, n_head=4, d_head=hidden // 4, d_inner=2 * hidden, n_layer=layers,
                segment_length=window, mem_len=window,
            )
        ),
        "stock GPT-2": GPT2LMHeadModel(GPT2Config(**gpt2)),
    }  # fmt: skip


def is_host_read(event) -> bool:
    """A value read, or the outermost of nested value-shaped operators (`x[mask]` runs `aten::nonzero` inside)."""
    if event.name == "aten::_local_scalar_dense":
        return True
    parent = event.cpu_parent
    while parent is not None and parent.name not in VALUE_SHAPED:
        parent = parent.cpu_parent
    return event.name in VALUE_SHAPED and parent is None


def count(fn, device: torch.device) -> tuple[int, int]:
    """(host reads of the device's results, kernels) of one call of `fn`."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        fn()
        bench.synchronize(device)
    events = profiler.events()
    if device.type == "cuda":
        # Every read ends in a device-to-host copy; `.tolist()` and `.cpu()` too, which the CPU's events miss.
        reads = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA and "DtoH" in e.name)
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    else:
        reads = sum(1 for e in events if is_host_read(e))
        kernels = sum(
            1 for e in events if e.name.startswith("aten::") and not e.cpu_children and e.name not in NOT_KERNELS
        )
    return reads, kernels


def calls(name: str, model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> dict[str, tuple]:
    """The measured calls of one model, by label: (function, how many tokens it generates, 1 for a forward)."""
    window, windows, batch = args.window_size, args.windows, args.batch_size
    ids = torch.randint(1, 1000, (batch, windows * window), device=device)
    mask = torch.ones_like(ids)
    mask[0, : window // 3] = 0
    stock = name == "stock GPT-2"
    # Stock GPT-2 cannot go past its positions: it generates within one window.
    new_tokens = min(args.new_tokens, window - window // 2) if stock else args.new_tokens
    prompt = ids[:, : window // 2] if stock else ids[:, :window]

    def forward(attention_mask: torch.Tensor | None = None) -> None:
        if not stock:
            model(ids, attention_mask=attention_mask)
            return
        # The same windows, one call after another (what the recurrent model's windows wait for too).
        masks = attention_mask.split(window, 1) if attention_mask is not None else [None] * windows
        for piece, piece_mask in zip(ids.split(window, 1), masks, strict=True):
            model(piece, attention_mask=piece_mask)

    def generate() -> None:
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    return {
        "forward": (forward, 1),
        "forward, left-padded": (lambda: forward(mask), 1),
        "generate, per token": (generate, new_tokens),
    }


def measure(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[list[object]]:
    rows = []
    for name, model in models(args).items():
        model = model.to(device=device, dtype=dtype).eval()
        model.generation_config.pad_token_id = 0
        cells = [name]
        with torch.no_grad():
            for fn, per in calls(name, model, args, device).values():
                fn()  # warm up: lazy initialisation is not what is counted
                reads, kernels = count(fn, device)
                cells += [f"{reads / per:.1f}" if per > 1 else reads, f"{kernels / per:.0f}" if per > 1 else kernels]
        rows.append(cells)
    return rows


COUNTS = [
    "forward_host_reads",
    "forward_kernels",
    "left_padded_host_reads",
    "left_padded_kernels",
    "generate_reads_per_token",
    "generate_kernels_per_token",
]


def main() -> None:
    args = parse_args()
    device, dtype, machine = bench.start(args)
    rows = measure(args, device, dtype)
    headers = [
        "model",
        "forward: host reads",
        "kernels",
        "left-padded: host reads",
        "kernels",
        "generate: reads/token",
        "kernels/token",
    ]
    shape = (
        f"{args.layers} layers, {args.hidden} wide, batch {args.batch_size}, {args.windows} windows of "
        f"{args.window_size} tokens."
    )
    values = {row[0]: dict(zip(COUNTS, row[1:], strict=True)) for row in rows}
    bench.write_results(args, machine, {"counts": bench.table(headers, rows)}, values, {"shape": [shape]})


if __name__ == "__main__":
    main()
