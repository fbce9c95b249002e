"""The shared test base of the recurrence core (`RecurrentDecoderForCausalLM`): every invariant of the core is written
once, in `tests/models/recurrent_decoder/`, and run over rows of the backbone table (`tests/families.py` BACKBONES),
as fla and transformers run their common tests over their model table.

The cheap invariants run on every row (`by_backbone()`); the expensive ones (long generations, many split points,
backpropagation and checkpointing, Trainer runs) on `REPRESENTATIVE`, three rows that between them take every path
the core has for a backbone: rotary positions with grouped-query attention, eager attention with a soft-cap and
sliding windows, and learned absolute positions with Conv1D layers. The named GPT-2 and Llama classes are this core
under other names; their folders test only their names and layouts.
"""

import pytest
import torch

from ...families import BACKBONES, Backbone


BY_NAME = {backbone.name: backbone for backbone in BACKBONES}
# Llama: RoPE and GQA; Gemma 2: eager attention, attention soft-cap, sliding windows; GPT-2: learned positions, Conv1D.
REPRESENTATIVE = [BY_NAME[name] for name in ("llama", "gemma2", "gpt2")]


def by_backbone(backbones: list[Backbone] = BACKBONES):
    """Parametrise a test over `backbones` (every row by default), as the argument `backbone`."""
    return pytest.mark.parametrize("backbone", backbones, ids=[backbone.name for backbone in backbones])


def ids(batch: int = 2, length: int = 30, seed: int = 1) -> torch.Tensor:
    """Token ids without 0, the padding id of the tiny configs."""
    return torch.randint(1, 99, (batch, length), generator=torch.Generator().manual_seed(seed))
