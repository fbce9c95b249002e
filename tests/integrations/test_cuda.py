"""The equality contract of the causal families on a CUDA device, in float32 and bfloat16 (marked `gpu`: CI has no
GPU, so these run where one is, e.g. `python -m pytest -m gpu tests/integrations/test_cuda.py`; ../shared/design/GPU.md)."""

import pytest
import torch

from ..families import STATEFUL_FAMILIES


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DTYPES = [torch.float32, torch.bfloat16]
# bfloat16 keeps 8 bits of mantissa: different kernel shapes (chunks, padding) round differently.
TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 1e-4}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _cuda_model(family, dtype: torch.dtype):
    return family.head().to(device="cuda", dtype=dtype)


def _ids(family, length: int = 30) -> torch.Tensor:
    return family.inputs(length=length)["input_ids"].cuda()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_chunked_calls_carrying_the_state_equal_one_call_on_cuda(family, dtype):
    model = _cuda_model(family, dtype)
    ids = _ids(family)
    bounds = [0, *family.chunk_splits, ids.shape[1]]
    with torch.no_grad():
        whole = model(ids).logits
        state, pieces = None, []
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            out = model(ids[:, start:stop], past_key_values=state)
            state = out.past_key_values
            pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_generate_equals_a_greedy_loop_and_left_padding_equals_alone_on_cuda(family, dtype):
    model = _cuda_model(family, dtype)
    prompt = _ids(family, length=6)
    generated = model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    with torch.no_grad():
        out = model(prompt)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(19):
            out = model(tokens[-1], past_key_values=out.past_key_values)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    assert torch.equal(generated[:, 6:], torch.cat(tokens, dim=1))

    padded = torch.cat([torch.zeros(1, 3, dtype=prompt.dtype, device="cuda"), prompt[:1]], dim=1)
    mask = torch.ones_like(padded)
    mask[:, :3] = 0
    batch = torch.cat([padded, prompt[1:2, :1].expand(1, 9)], dim=0)
    batch_mask = torch.cat([mask, torch.ones_like(mask)], dim=0)
    together = model.generate(batch, attention_mask=batch_mask, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert torch.equal(together[0, 9:], generated[0, 6:18])


@pytest.mark.parametrize("family", STATEFUL_FAMILIES, ids=lambda f: f.name)
def test_cuda_matches_cpu_and_states_round_trip_through_files_on_cuda(family, tmp_path):
    model = family.head()
    ids = family.inputs()["input_ids"]
    split = family.chunk_splits[1]  # Transformer-XL continues exactly on segment boundaries only
    with torch.no_grad():
        on_cpu = model(ids).logits
        model.cuda()
        first = model(ids[:, :split].cuda())
        rest = ids[:, split:].cuda()
        continued = model(rest, past_key_values=first.past_key_values).logits
        torch.testing.assert_close(torch.cat([first.logits, continued], 1).cpu(), on_cpu, **TOLERANCE[torch.float32])
        state = model(ids[:, :split].cuda()).past_key_values
        state.save(tmp_path / "state.safetensors")
        loaded = model.load_state(tmp_path / "state.safetensors")
        assert loaded.mems[0].is_cuda if hasattr(loaded, "mems") else loaded.h_prev.is_cuda
        assert torch.equal(model(rest, past_key_values=loaded).logits, model(rest, past_key_values=state).logits)


@pytest.mark.parametrize(
    "family", [f for f in STATEFUL_FAMILIES if f.name.startswith("recurrent_")], ids=lambda f: f.name
)
def test_a_forward_without_padding_syncs_with_the_host_once_on_cuda(family):
    model = _cuda_model(family, torch.bfloat16)
    ids = _ids(family)
    with torch.no_grad():
        model(ids)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            model(ids)
    reads = sum(e.count for e in profiler.key_averages() if e.key == "aten::_local_scalar_dense")
    assert reads == 1
