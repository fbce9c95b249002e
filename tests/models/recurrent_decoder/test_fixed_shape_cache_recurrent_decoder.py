"""generate(cache_implementation="static"): the state in fixed-shape buffers, and its compiled single-token step."""

import collections
import re

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code
from transformers import CompileConfig
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_recurrence.models.recurrent_decoder import generation_recurrent_decoder, step_recurrent_decoder
from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder import (
    STATE_NAME,
    FixedShapeWindowCache,
    fixed_shape_state_class,
)

from ...families import BACKBONES


BY_NAME = {backbone.name: backbone for backbone in BACKBONES}
NEW_TOKENS = 30  # past three boundaries of the 8-token windows in every row


def left_padded_prompts(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 7, 4 and 2 tokens, left-padded: the rows reach their window boundaries at different steps."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab_size, (3, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    return ids.masked_fill(mask == 0, 0), mask


def greedy(model, ids: torch.Tensor, mask: torch.Tensor, **kwargs):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        **kwargs,
    )


# RoPE with grouped-query attention, eager attention (float masks), absolute positions; with and without overlap.
@pytest.mark.parametrize(("family", "overlap"), [("llama", 2), ("gemma2", 0), ("gpt2", 2)])
def test_fixed_shape_cache_generates_the_default_tokens(family, overlap):
    model, _ = BY_NAME[family].models(window_overlap=overlap)
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    default = greedy(model, ids, mask)
    fixed = greedy(model, ids, mask, cache_implementation="static")
    torch.testing.assert_close(fixed.sequences, default.sequences, rtol=0, atol=0)
    state = getattr(fixed, STATE_NAME)
    assert isinstance(state, FixedShapeWindowCache) and isinstance(state, model.state_class)
    # One window plus the spare slot for padding columns, whatever the text's length.
    assert {tuple(k.shape[2:3]) for k in state.keys + state.values} == {(model.config.window_size + 1,)}
    assert state.slot_valid.shape == (3, model.config.window_size + 1)
    torch.testing.assert_close(state.slot_valid.sum(1), state.fill, rtol=0, atol=0)


# The single-token step that writes the cache and advances the state in place, traced by dynamo but run by the eager
# backend (no inductor compile): its bookkeeping is the eager path's, in every family.
@pytest.mark.parametrize(("family", "overlap"), [("llama", 2), ("gemma2", 0), ("gpt2", 2)])
def test_in_place_single_token_step_advances_the_state_as_the_eager_path(family, overlap):
    torch._dynamo.reset()
    model, _ = BY_NAME[family].models(window_overlap=overlap)
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    default = greedy(model, ids, mask, cache_implementation="static")
    config = CompileConfig(backend="eager", fullgraph=True)
    config._compile_all_devices = True
    traced = greedy(model, ids, mask, cache_implementation="static", compile_config=config)
    assert model._compiled_steps  # the in-place step ran
    torch.testing.assert_close(traced.sequences, default.sequences, rtol=0, atol=0)
    expected, state = getattr(default, STATE_NAME), getattr(traced, STATE_NAME)
    assert state.get_seq_length() == expected.get_seq_length()
    for name in ("slot_valid", "fill", "window_index", "overlap_valid"):
        torch.testing.assert_close(getattr(state, name), getattr(expected, name), rtol=0, atol=0)
    for name in ("pooled_sum", "h_prev", "overlap_embeds"):
        torch.testing.assert_close(getattr(state, name), getattr(expected, name))
    valid = state.slot_valid[:, None, :, None]
    for buffers, expected_buffers in ((state.keys, expected.keys), (state.values, expected.values)):
        for buffer, expected_buffer in zip(buffers, expected_buffers, strict=True):
            torch.testing.assert_close(buffer * valid, expected_buffer * valid)


def test_the_compiled_step_reads_and_writes_the_models_static_tensors_and_hands_them_over_between_states():
    """CUDA graphs replay a compiled step only where the tensors it writes are static: the state decodes in the
    model's pinned tensors, marked static; the next generate() of the same shapes takes them over, and the state that
    held them keeps copies of its own, unchanged."""
    torch._dynamo.reset()
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    config = CompileConfig(backend="eager", fullgraph=True)
    config._compile_all_devices = True
    first = getattr(greedy(model, ids, mask, cache_implementation="static", compile_config=config), STATE_NAME)
    pins = model._step_pins["tensors"]
    assert all(t._dynamo_static_input_type for t in pins)
    # The window buffers are written in place by every step; the last step may have run eagerly (a new window),
    # binding new tensors for the rest.
    assert all(any(t is key for t in pins) for key in first.keys + first.values)
    # The per-token check gathers the state's tensors at once, in the order of the places the pins are written to.
    places = generation_recurrent_decoder._step_tensor_places(first)
    gathered = generation_recurrent_decoder._step_tensors(first)
    assert len(gathered) == len(places) == len(pins)
    assert all(
        t is generation_recurrent_decoder._get_step_tensor(first, p) for t, p in zip(gathered, places, strict=True)
    )
    kept = {name: getattr(first, name).clone() for name in ("fill", "slot_valid", "pooled_sum", "h_prev")}
    kept_keys = [k.clone() for k in first.keys]

    second = greedy(model, ids.flip(0), mask.flip(0), cache_implementation="static", compile_config=config)
    state = getattr(second, STATE_NAME)
    assert model._step_pins["tensors"] is pins and all(any(t is key for t in pins) for key in state.keys)
    assert not any(t is key for t in pins for key in first.keys + first.values)
    for name, value in kept.items():
        torch.testing.assert_close(getattr(first, name), value, rtol=0, atol=0)
    for key, value in zip(first.keys, kept_keys, strict=True):
        torch.testing.assert_close(key, value, rtol=0, atol=0)
    eager = greedy(model, ids.flip(0), mask.flip(0), cache_implementation="static")
    torch.testing.assert_close(second.sequences, eager.sequences, rtol=0, atol=0)


def test_a_compiled_decode_outside_inference_mode_after_one_inside_it_writes_pins_of_its_own():
    """Pins made under inference_mode are inference tensors, which nothing outside it may write in place."""
    torch._dynamo.reset()
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    config = CompileConfig(backend="eager", fullgraph=True)
    config._compile_all_devices = True
    with torch.inference_mode():
        inside = greedy(model, ids, mask, cache_implementation="static", compile_config=config)
    outside = greedy(model, ids, mask, cache_implementation="static", compile_config=config)
    assert not any(pin.is_inference() for pin in model._step_pins["tensors"])
    torch.testing.assert_close(outside.sequences, inside.sequences, rtol=0, atol=0)


def test_a_single_token_call_gives_the_compiled_step_its_ids_and_mask_column_as_they_are(monkeypatch):
    """The embedding lookup and the mask's bool are in the compiled step, not eager operators before it at every
    token: the step gets the call's ids and the mask's last column (None without a mask, every row real), and gives
    the eager path's logits either way."""
    torch._dynamo.reset()
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    config = CompileConfig(backend="eager", fullgraph=True)
    received = []
    compiled_decode = generation_recurrent_decoder._compiled_decode

    def recording(*args):
        step = compiled_decode(*args)

        def run(settings, tokens, real, *rest):
            received.append((tokens, real))
            return step(settings, tokens, real, *rest)

        return run

    monkeypatch.setattr(generation_recurrent_decoder, "_compiled_decode", recording)
    state_class = fixed_shape_state_class(model.state_class)
    full = torch.ones_like(mask)
    with torch.no_grad():
        logits = {}
        for name, compile_config in (("eager", None), ("compiled", config)):
            for masked in (True, False):
                state = state_class(model.config, 3, ids.device, model.dtype)
                state.compile_config = compile_config
                model(ids, attention_mask=full, **{STATE_NAME: state})  # the prompt, eagerly: it checks the state
                column = ids[:, -1:]
                kwargs = {"attention_mask": torch.ones(3, ids.shape[1] + 1, dtype=torch.long)} if masked else {}
                logits[name, masked] = model(column, **kwargs, **{STATE_NAME: state}).logits
    assert [(tokens.shape, tokens.dtype) for tokens, _ in received] == [((3, 1), torch.long)] * 2
    assert received[0][1].dtype == torch.long and received[0][1].shape == (3, 1) and received[1][1] is None
    for masked in (True, False):
        torch.testing.assert_close(logits["compiled", masked], logits["eager", masked])
    torch.testing.assert_close(logits["compiled", False], logits["compiled", True], rtol=0, atol=0)


def test_fixed_shape_cache_is_refused_beside_a_given_state():
    model, _ = BY_NAME["llama"].models()
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    with pytest.raises(ValueError, match="Passing both"):
        greedy(model, ids, mask, cache_implementation="static", **{STATE_NAME: model.new_state(3)})


@pytest.mark.slow
def test_compiled_single_token_step_generates_the_eager_tokens_in_place_without_breaks_or_recompiles():
    torch._dynamo.reset()
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    eager = greedy(model, ids, mask)
    # fullgraph: a graph break in the step fails the call. CPU: generate() compiles only on accelerators unless asked.
    config = CompileConfig(fullgraph=True)
    config._compile_all_devices = True
    compiled, codes = run_and_get_code(greedy, model, ids, mask, cache_implementation="static", compile_config=config)
    torch.testing.assert_close(compiled.sequences, eager.sequences, rtol=0, atol=0)
    # Inductor writes each token's column into the state's buffers in place: its code allocates nothing of a
    # buffer's shape (a write it cannot do in place becomes a fresh copy of the whole buffer, copied back).
    state = getattr(compiled, STATE_NAME)
    buffer = "empty_strided_cpu(({}, {}, {}, {})".format(*state.keys[0].shape)
    assert codes and not any(buffer in code for code in codes)
    # A longer text, from another prompt length, runs the same graph.
    with torch._dynamo.config.patch(error_on_recompile=True):
        longer = model.generate(
            ids[:, 2:],
            attention_mask=mask[:, 2:],
            max_new_tokens=2 * NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            cache_implementation="static",
            compile_config=config,
        )
    assert longer.shape[1] == 5 + 2 * NEW_TOKENS


def single_token_graph(decoder, prompt: torch.Tensor) -> str:
    """Inductor's code for the single-token step of `decoder`'s compiled static-cache `generate()` (on the CPU too)."""
    config = CompileConfig(fullgraph=True)
    config._compile_all_devices = True
    _, codes = run_and_get_code(
        decoder.generate,
        prompt,
        max_new_tokens=4,
        do_sample=False,
        pad_token_id=0,
        cache_implementation="static",
        compile_config=config,
    )
    return max(codes, key=len)  # the prompt's graph is the smaller


def kernel_launches(code: str) -> collections.Counter:
    """What Inductor's generated `call()` launches, one after another, by kind: "fused" kernels, and the operators it
    leaves to aten by name (matrix products, attention, sorts)."""
    launches: collections.Counter = collections.Counter()
    for line in code[code.index("def call(") :].splitlines():
        call = re.match(r"(\w+ = )?(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.aten\.\w+)\(?", line.strip())
        if call:
            name = call.group(2)
            launches["fused" if name.startswith("cpp_fused") else name.rsplit(".", 1)[-1]] += 1
    return launches


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_compiled_decode_step_launches_the_matrix_products_and_attention_of_the_stock_compiled_forward(family):
    """Per token, ours' compiled step launches the same matrix products and attention calls as stock's compiled
    forward over its static cache, and nothing else that is not fused: the pooled state's layer-weighted sum (a
    batched product per layer in a window read eagerly) and the cache and state writes fuse into the layers' own
    kernels. On a GPU a single token costs its launches."""
    torch._dynamo.reset()
    model, stock = BY_NAME[family].models()
    prompt = torch.randint(1, model.config.text_config.vocab_size, (1, 3), generator=torch.Generator().manual_seed(0))
    launches = {
        name: kernel_launches(single_token_graph(decoder, prompt))
        for name, decoder in (("ours", model), ("stock", stock))
    }
    unfused = {name: {kind: n for kind, n in counted.items() if kind != "fused"} for name, counted in launches.items()}
    assert unfused["ours"] == unfused["stock"] and unfused["ours"], launches


@pytest.mark.slow
def test_the_compiled_decode_step_makes_each_attention_mask_once_for_every_layer():
    """The step's two masks (the plain layers' and the reading layer's) are each one buffer that every layer's
    attention reads. From a boolean mask, torch's sdpa made an additive one in every layer, which inductor fused into
    the layers' kernels unevenly: more distinct kernels to build, a slower cold start."""
    torch._dynamo.reset()
    model, _ = BY_NAME["llama"].models(text={"num_hidden_layers": 6})
    prompt = torch.randint(1, model.config.text_config.vocab_size, (2, 3), generator=torch.Generator().manual_seed(0))
    masks = re.findall(r"attn_mask=(\w+)", single_token_graph(model, prompt))
    assert len(masks) == 6 and len(set(masks)) == 2, masks


@pytest.mark.parametrize("kwargs", [{"num_beams": 2}, {"num_return_sequences": 2, "do_sample": True}])
def test_fixed_shape_cache_has_a_row_per_beam_and_returned_sequence(kwargs):
    model, _ = BY_NAME["llama"].models()
    ids, mask = left_padded_prompts(model.config.text_config.vocab_size)
    runs = []
    for implementation in (None, "static"):
        torch.manual_seed(0)  # the same draws for sampling
        runs.append(
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=12,
                pad_token_id=0,
                cache_implementation=implementation,
                **kwargs,
            )
        )
    torch.testing.assert_close(runs[1], runs[0], rtol=0, atol=0)


def test_a_compiled_step_attends_over_grouped_heads_as_transformers_sdpa_does(monkeypatch):
    # Compiled on the CPU with a mask, the step's sdpa groups the key/value heads itself (no copy of each head).
    module = nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, 1, 8, generator=generator)  # (batch, head, cols, head_dim)
    key, value = torch.randn(2, 2, 10, 8, generator=generator), torch.randn(2, 2, 10, 8, generator=generator)
    mask = torch.rand(2, 1, 1, 10, generator=generator) > 0.3
    mask[:, :, :, 0] = True
    expected, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, mask, scaling=0.3)
    copied = []
    monkeypatch.setattr(
        "transformers.integrations.sdpa_attention.repeat_kv", lambda *args: copied.append(1) or repeat_kv(*args)
    )

    def step(query, key, value, mask):
        return step_recurrent_decoder._sdpa_attention(module, query, key, value, mask, scaling=0.3)[0]

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)(query, key, value, mask)
    torch.testing.assert_close(compiled, expected)
    assert compiled.shape == (2, 1, 6, 8) and not copied
