"""Every family trains under FSDP2 and DDP on CPU with two gloo ranks, each reading half the batch, with the
single-process loss and gradients at every step.

FSDP2: `fully_shard` on every class the model names in `_no_split_modules`, then on the root, which is what
`accelerate launch --use_fsdp --fsdp_version 2 --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP` does with the blocks.
DDP: `DistributedDataParallel`, as `torchrun` and `accelerate launch` give `Trainer`. One pair of processes runs every
case of a strategy (process start-up and imports are most of the time).

The recurrence core (`RecurrentDecoderForCausalLM`) runs over stock backbones whose decoder layers (its
`_no_split_modules`, which transformers collects from the backbone) are the sharded units: h_prev's key/value is
computed by the insertion layer's own attention projections, so it must be computed where that layer's weights are
gathered.
"""

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..families import BACKBONES, FAMILIES


STEPS = 3
BATCH, LENGTH = 4, 20
CORE_BACKBONES = ("llama", "qwen3", "gemma3_text", "phi3", "olmo2")


def _family_model(name: str, **overrides) -> Callable[[], torch.nn.Module]:
    family = next(f for f in FAMILIES if f.name == name)
    return lambda: family.head_class(family.tiny_config(**overrides))


def _backbone_model(name: str) -> Callable[[], torch.nn.Module]:
    # The backbone table's model: 8-token windows (so the 20-token rows read three), insertion layer 1, and a
    # recurrence network large enough that h_prev changes the loss, so its gradient path is exercised.
    backbone = next(b for b in BACKBONES if b.name == name)
    return lambda: backbone.models()[0]


# Every family; I-BERT also with its LSTM feed-forward layers (then the sharded units), Transformer-XL also with u and v
# shared by all layers (then held by the root); the core over backbones whose layers differ where h_prev enters (GQA,
# per-head key norms, sliding and full layers, fused qkv with partial rotary, norms after attention).
CASES = (
    {family.name: _family_model(family.name) for family in FAMILIES}
    | {
        "inductive_bert-lstm_feed_forward": _family_model("inductive_bert", lstm_feed_forward=True),
        "transformer_xl-shared_biases": _family_model("transformer_xl", untie_r=False),
    }
    | {f"recurrent_decoder-{name}": _backbone_model(name) for name in CORE_BACKBONES}
)
STRATEGIES = ("fsdp2", "ddp")
# DDP only all-reduces whole gradients, the same for every backbone under the core, so one backbone row is enough there
# (each case adds a few seconds to a test in the default run).
DDP_SKIPS = {f"recurrent_decoder-{name}" for name in CORE_BACKBONES[1:]}


def _cases(strategy: str) -> list[str]:
    return [case for case in CASES if strategy != "ddp" or case not in DDP_SKIPS]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wrap(model: torch.nn.Module, strategy: str) -> tuple[torch.nn.Module, int]:
    """The wrapped model and how many blocks FSDP2 sharded on their own (besides the root)."""
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model), 0
    from torch.distributed.fsdp import fully_shard

    block_classes = tuple(
        {type(module) for module in model.modules() if type(module).__name__ in model._no_split_modules}
    )
    blocks = [module for module in model.modules() if isinstance(module, block_classes)]
    for module in blocks:
        fully_shard(module)
    fully_shard(model)
    return model, len(blocks)


def _gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full gradients by name; gathering a sharded one is a collective, so every rank calls this alike."""
    found = {}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            grad = parameter.grad
            found[name.removeprefix("module.")] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return found


def _run_case(build: Callable[[], torch.nn.Module], strategy: str, rank: int, world: int) -> dict:
    torch.manual_seed(0)
    # Eval mode: no dropout, so both runs compute the same function (gradients are computed all the same).
    model = build().eval()
    reference = build().eval()
    reference.load_state_dict(model.state_dict())
    model, sharded_blocks = _wrap(model, strategy)
    ids = torch.randint(1, 99, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    report = {
        "losses": [],
        "reference_losses": [],
        "max_gradient_difference": [],
        "unmatched": [],
        "sharded_blocks": sharded_blocks,
    }
    for _ in range(STEPS):
        loss = model(ids[rows], labels=ids[rows]).loss
        loss.backward()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # every rank reads as many tokens, so the mean of means is the batch mean
        gradients = _gradients(model)
        reference_loss = reference(ids, labels=ids).loss
        reference_loss.backward()
        expected = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}
        report["losses"].append(mean_loss.item() / world)
        report["reference_losses"].append(reference_loss.item())
        report["unmatched"] += sorted(set(expected) ^ set(gradients))
        report["max_gradient_difference"].append(
            max((gradients[n] - expected[n]).abs().max().item() for n in set(expected) & set(gradients))
        )
        for step in (optimizer, reference_optimizer):
            step.step()
            step.zero_grad()
    return report


def _train_every_case(rank: int, world: int, port: int, strategy: str, result_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    reports = {}
    try:
        for case in _cases(strategy):
            try:
                reports[case] = _run_case(CASES[case], strategy, rank, world)
            except Exception as error:  # noqa: BLE001 - reported per case; both ranks fail alike
                reports[case] = {"error": f"{type(error).__name__}: {error}"}
        if rank == 0:
            Path(result_path).write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    found = {}
    for strategy in STRATEGIES:
        result = tmp_path_factory.mktemp(strategy) / "reports.json"
        mp.spawn(_train_every_case, args=(2, _free_port(), strategy, str(result)), nprocs=2, join=True)
        found[strategy] = json.loads(result.read_text())
    return found


@pytest.mark.parametrize(
    ("strategy", "case"), [(strategy, case) for strategy in STRATEGIES for case in _cases(strategy)]
)
def test_two_ranks_match_one_process(reports, strategy, case):
    report = reports[strategy][case]
    assert "error" not in report, report.get("error")
    assert report["unmatched"] == []
    if strategy == "fsdp2":
        # The blocks were sharded on their own, not only the root (a _no_split_modules naming no class of the model).
        assert report["sharded_blocks"] > 0, report
    torch.testing.assert_close(report["losses"], report["reference_losses"], rtol=1e-5, atol=1e-6)
    assert max(report["max_gradient_difference"]) < 1e-5, report
