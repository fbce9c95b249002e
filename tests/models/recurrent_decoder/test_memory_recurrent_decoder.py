"""The memory beyond the paper (`memory_slots`, `memory_pooling`, `memory_position_bias`, `memory_source`,
`memory_read_layers`; ../shared/design/MEMORY.md): every setting keeps the core's invariants (chunked == one-shot,
generate == an argmax loop past several boundaries, a left-padded row == the row alone, the compiled fixed-shape step
== eager, a saved state continues the text, window checkpointing == plain backpropagation) on four families; the
defaults are the paper's model; new queries and biases start as the mean; bad values are refused by name."""

import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import CompileConfig

from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM
from hf_recurrence.models.recurrent_decoder import generation_recurrent_decoder, step_recurrent_decoder
from hf_recurrence.models.recurrent_decoder.state_recurrent_decoder import STATE_NAME
from hf_recurrence.models.recurrent_decoder.step_recurrent_decoder import _decoder_layers, keep_best

from ...common import assert_left_padded_rows_equal_the_rows_alone, chunked_logits, greedy_loop, loss_and_gradients
from .backbones import BY_NAME, ids


# One setting each of what the memory adds: attention pooling with position biases (one slot, the insertion layer),
# several attention slots, and slots of the final layer read at every layer.
MEMORY_SETTINGS = {
    "attention": {"memory_pooling": "attention", "memory_position_bias": True},
    "slots": {"memory_slots": 3, "memory_pooling": "attention"},
    "every_layer": {
        "memory_slots": 2,
        "memory_read_layers": [0, 1, 2],
        "memory_source": "last_layer",
        "memory_position_bias": True,
    },
    "select": {"memory_slots": 3, "memory_pooling": "select", "memory_read_layers": [1, 2]},
}
# RoPE with grouped-query attention and query/key norms (Qwen3), eager attention with soft-caps and sliding windows
# (Gemma 2), learned absolute positions with Conv1D (GPT-2).
MEMORY_BACKBONES = [BY_NAME[name] for name in ("llama", "qwen3", "gemma2", "gpt2")]
# Every setting on two families, every family with one setting or more (all twelve pairs would double the time).
ROWS = [
    (BY_NAME[family], name)
    for family, name in (
        ("llama", "every_layer"),
        ("qwen3", "attention"),
        ("gemma2", "slots"),
        ("gpt2", "every_layer"),
        ("gpt2", "attention"),
        ("llama", "slots"),
        ("llama", "select"),
        ("qwen3", "select"),
        ("gemma2", "select"),
        ("gpt2", "select"),
    )
]
ROW_IDS = [f"{backbone.name}-{name}" for backbone, name in ROWS]
# Slots rotated as the tokens before the window, at layers of both RoPE bases (Gemma 3: sliding, full, sliding).
ROTATED = {"memory_slots": 2, "memory_pooling": "attention", "h_prev_rope_position": -1, "memory_read_layers": [0, 1]}
ROTARY_BACKBONES = [BY_NAME[name] for name in ("llama", "qwen3", "gemma3_text")]


def memory_model(backbone, name: str, **settings):
    model, _ = backbone.models(**MEMORY_SETTINGS[name], **settings)
    return model


@pytest.mark.parametrize(("backbone", "name"), ROWS, ids=ROW_IDS)
@pytest.mark.parametrize("overlap", [0, 3])
def test_chunked_calls_equal_one_call(backbone, name, overlap):
    model = memory_model(backbone, name, window_overlap=overlap)
    tokens = ids(length=45)
    with torch.no_grad():
        whole = model(tokens).logits
        chunked, state = chunked_logits(model, tokens, (3, 11, 28, 29))
    torch.testing.assert_close(chunked, whole)
    slots = model.config.memory_slots
    assert state.h_prev.shape == (2, slots, model.config.text_config.hidden_size)
    # The memory carries the text: another first window changes the later ones.
    with torch.no_grad():
        other = model(torch.cat([ids(length=8, seed=5), tokens[:, 8:]], dim=1)).logits
    assert (other[:, 8:16] - whole[:, 8:16]).abs().max() > 1e-4


@pytest.mark.parametrize("backbone", ROTARY_BACKBONES, ids=[b.name for b in ROTARY_BACKBONES])
def test_rotated_slots_carry_the_state(backbone):
    model, _ = backbone.models(window_overlap=2, **ROTATED)
    unrotated, _ = backbone.models(window_overlap=2, **{**ROTATED, "h_prev_rope_position": None})
    tokens = ids()
    with torch.no_grad():
        whole = model(tokens).logits
        chunked, _ = chunked_logits(model, tokens, (5, 13))
        plain = unrotated(tokens).logits
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(whole[:, :8], plain[:, :8])
    assert (whole[:, 8:] - plain[:, 8:]).abs().max() > 1e-4


@pytest.mark.parametrize(("backbone", "name"), ROWS, ids=ROW_IDS)
def test_greedy_generate_past_several_windows_equals_an_argmax_loop(backbone, name):
    model = memory_model(backbone, name, window_overlap=2)
    prompt = ids(length=4)
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, min_new_tokens=30, do_sample=False
    )
    assert torch.equal(generated, greedy_loop(model, prompt, 30))


@pytest.mark.parametrize(("family", "name"), [("llama", "every_layer"), ("gpt2", "slots")])
def test_generate_computes_the_slots_keys_and_values_once_per_window(family, name, monkeypatch):
    model = memory_model(BY_NAME[family], name, window_overlap=2)
    computed = []
    probe = step_recurrent_decoder._h_prev_key_value

    def counting(module, ctx, layer):
        computed.append(layer)
        return probe(module, ctx, layer)

    monkeypatch.setattr(step_recurrent_decoder, "_h_prev_key_value", counting)
    out = model.generate(
        ids(1, 4), max_new_tokens=30, min_new_tokens=30, do_sample=False, return_dict_in_generate=True
    )
    windows_with_memory = int(getattr(out, STATE_NAME).window_index)
    assert windows_with_memory >= 3
    assert sorted(computed) == sorted(model.config.read_layers * windows_with_memory)


@pytest.mark.parametrize(("family", "name"), [("llama", "every_layer"), ("gpt2", "slots")])
def test_a_call_after_generate_reads_the_memory_with_the_weights_of_that_call(family, name):
    model = memory_model(BY_NAME[family], name, window_overlap=2)
    out = model.generate(
        ids(1, 4), max_new_tokens=10, min_new_tokens=10, do_sample=False, return_dict_in_generate=True
    )
    state = getattr(out, STATE_NAME)
    assert int(state.window_index) >= 1 and 0 < int(state.fill) < model.config.window_size
    following = ids(1, 1, seed=3)
    with torch.no_grad():
        before = model(following, past_key_values=copy.deepcopy(state)).logits
        # Weights change between calls on one state (a training step): only the memory's keys at one reading layer.
        attention = _decoder_layers(model.backbone)[model.config.read_layers[-1]]
        next(p for n, p in attention.named_parameters() if "k_proj" in n or "c_attn" in n).mul_(3.0)
        after = model(following, past_key_values=copy.deepcopy(state)).logits
        # The same call over a copy whose memory is a new tensor, so nothing generate() kept can be read.
        recomputed = model(following, past_key_values=copy.deepcopy(state).detach()).logits
    assert (after - before).abs().max() > 1e-4
    torch.testing.assert_close(after, recomputed)


@pytest.mark.parametrize(("backbone", "name"), ROWS, ids=ROW_IDS)
def test_left_padded_rows_equal_the_rows_alone(backbone, name):
    assert_left_padded_rows_equal_the_rows_alone(memory_model(backbone, name, window_overlap=2), ids(length=20))


@pytest.mark.parametrize(("backbone", "name"), ROWS, ids=ROW_IDS)
def test_a_saved_state_continues_the_text(backbone, name, tmp_path):
    model = memory_model(backbone, name, window_overlap=2)
    tokens = ids()
    with torch.no_grad():
        state = model(tokens[:, :13]).past_key_values
        state.save(tmp_path / "state.safetensors")
        expected = model(tokens[:, 13:], past_key_values=state).logits
        loaded = model.load_state(tmp_path / "state.safetensors")
        torch.testing.assert_close(model(tokens[:, 13:], past_key_values=loaded).logits, expected)


@pytest.mark.parametrize(
    ("family", "name"), [("llama", "every_layer"), ("gemma2", "slots"), ("gpt2", "attention"), ("qwen3", "select")]
)
def test_the_in_place_single_token_step_generates_the_eager_tokens(family, name):
    torch._dynamo.reset()
    model = memory_model(BY_NAME[family], name, window_overlap=2)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 99, (3, 7), generator=generator)
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    mask[2, :5] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    kwargs = {
        "attention_mask": mask,
        "max_new_tokens": 30,
        "min_new_tokens": 30,
        "do_sample": False,
        "pad_token_id": 0,
    }
    eager = model.generate(prompt, **kwargs)
    # Traced by dynamo, run by the eager backend: the in-place step's bookkeeping, not a compiler's kernels.
    config = CompileConfig(backend="eager", fullgraph=True)
    config._compile_all_devices = True
    traced = model.generate(prompt, cache_implementation="static", compile_config=config, **kwargs)
    assert model._compiled_steps
    assert torch.equal(traced, eager)


def test_the_compiled_step_reads_the_slots_keys_and_values_from_the_models_static_tensors(monkeypatch):
    """CUDA graphs copy each input that is not static at every replay: the slots' key and value at every reading
    layer come to the compiled step in the model's pinned tensors, marked static, the same at every token and holding
    each window's values (the tokens equal eager's past several windows)."""
    torch._dynamo.reset()
    model = memory_model(BY_NAME["llama"], "every_layer", window_overlap=2)
    prompt = ids(length=5)
    kwargs = {"max_new_tokens": 30, "min_new_tokens": 30, "do_sample": False, "pad_token_id": 0}
    eager = model.generate(prompt, **kwargs)
    read = []
    compiled_decode = generation_recurrent_decoder._compiled_decode

    def recording(*args):
        step = compiled_decode(*args)

        def run(settings, tokens, real, fill, slot_valid, window_index, h_prev, h_prev_kv, *rest):
            read.append((h_prev_kv, {layer: tuple(t.clone() for t in pair) for layer, pair in h_prev_kv.items()}))
            return step(settings, tokens, real, fill, slot_valid, window_index, h_prev, h_prev_kv, *rest)

        return run

    monkeypatch.setattr(generation_recurrent_decoder, "_compiled_decode", recording)
    config = CompileConfig(backend="eager", fullgraph=True)
    config._compile_all_devices = True
    traced = model.generate(prompt, cache_implementation="static", compile_config=config, **kwargs)
    assert torch.equal(traced, eager)
    pins = model._h_prev_kv_pins["key_values"]
    assert sorted(pins) == [0, 1, 2] and all(t._dynamo_static_input_type for pair in pins.values() for t in pair)
    assert len(read) > 20 and all(kv is pins for kv, _ in read)
    # Each window's slots differ from the last's: the pins were written, not read stale.
    values = [kv[0][0] for _, kv in read]
    assert any(not torch.equal(a, b) for a, b in zip(values, values[1:], strict=False))


@pytest.mark.parametrize(("backbone", "name"), ROWS, ids=ROW_IDS)
def test_window_checkpointing_gives_the_same_loss_and_gradients(backbone, name):
    model = memory_model(backbone, name, window_overlap=3)
    model.train()
    tokens = ids(length=40)
    plain_loss, plain_grads = loss_and_gradients(model, tokens, tokens)
    model.activation_checkpointing_enable({"use_reentrant": False})
    checked_loss, checked_grads = loss_and_gradients(model, tokens, tokens)
    torch.testing.assert_close(checked_loss, plain_loss)
    assert checked_grads.keys() == plain_grads.keys()
    # The memory's own weights learn from the text.
    memory = [n for n in plain_grads if n.startswith("recurrence.memory_") or n == "recurrence.slot_embeddings"]
    assert memory and all(plain_grads[n].abs().sum() > 0 for n in memory)
    for key, grad in plain_grads.items():
        torch.testing.assert_close(checked_grads[key], grad, rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.parametrize("backbone", MEMORY_BACKBONES, ids=[b.name for b in MEMORY_BACKBONES])
def test_zero_queries_and_biases_start_as_the_mean(backbone):
    """Attention pooling and position biases at their initial zeros pool exactly the paper's mean."""
    mean, _ = backbone.models(window_overlap=2)
    attention, _ = backbone.models(window_overlap=2, memory_pooling="attention", memory_position_bias=True)
    with torch.no_grad():
        attention.recurrence.memory_queries.zero_()
        attention.recurrence.memory_position_bias.zero_()
        attention.recurrence.ffn.load_state_dict(mean.recurrence.ffn.state_dict())
        attention.recurrence.layer_weight_logits.copy_(mean.recurrence.layer_weight_logits)
        tokens = ids(length=30)
        torch.testing.assert_close(attention(tokens).logits, mean(tokens).logits)


@pytest.mark.parametrize("backbone", MEMORY_BACKBONES, ids=[b.name for b in MEMORY_BACKBONES])
def test_a_zero_selection_query_keeps_the_last_tokens_of_the_window(backbone):
    """At its initial zero queries every token ties, so a selecting memory keeps the window's last k tokens' states,
    each summed with its predecessor's."""
    model, _ = backbone.models(**MEMORY_SETTINGS["select"])
    with torch.no_grad():
        model.recurrence.memory_selection_query.zero_()
        out = model(ids(length=13), output_hidden_states=True)
    state = out.past_key_values
    k, fill = model.config.memory_slots, int(state.fill[0])  # the second window's 5 tokens
    mix = sum(w * h for w, h in zip(model.recurrence.layer_weights(), out.hidden_states[1:], strict=True))
    torch.testing.assert_close(state.window_summary(), mix[:, -k:] + mix[:, -k - 1 : -1])
    assert state.pooled_weight[:, :k].tolist() == [list(map(float, range(fill - k + 1, fill + 1)))] * 2


def test_the_kept_tokens_are_the_best_scored_of_the_whole_window_however_it_is_split():
    """`keep_best` of the best of each part == `keep_best` of the whole, ties to the later token, empties last."""
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(3, 10, 4, generator=generator)
    places = torch.arange(1, 11).float().expand(3, -1).clone()
    places[2, :6] = 0  # a row with 4 tokens only, as after left padding
    scores = torch.randint(0, 3, (3, 10), generator=generator).float()  # many ties
    scores[2, :6], states[2, :6] = 0, 0
    whole = keep_best(states, places, scores, 5)
    best = keep_best(states[:, :4], places[:, :4], scores[:, :4], 5)  # fewer candidates than slots: padded
    for start, stop in ((4, 7), (7, 8), (8, 10)):
        part = keep_best(states[:, start:stop], places[:, start:stop], scores[:, start:stop], 5)
        best = keep_best(*(torch.cat(pair, 1) for pair in zip(best, part, strict=True)), 5)
    for merged, expected in zip(best, whole, strict=True):
        assert torch.equal(merged, expected)
    kept = whole[1][0]
    ranked = sorted(range(10), key=lambda i: (-float(scores[0, i]), -i))[:5]
    assert kept.tolist() == [float(i + 1) for i in sorted(ranked)]
    assert whole[1][2].tolist() == [0.0, 7.0, 8.0, 9.0, 10.0]
    assert torch.equal(whole[0][2, 0], torch.zeros(4))


def test_a_new_model_initialises_queries_and_biases_to_zero_and_slot_embeddings_at_random():
    backbone = BY_NAME["llama"]
    config = RecurrentDecoderConfig(
        text_config=backbone.text_config(),
        window_size=8,
        insertion_layer=1,
        memory_slots=3,
        memory_pooling="attention",
        memory_position_bias=True,
    )
    recurrence = RecurrentDecoderForCausalLM(config).recurrence
    assert recurrence.memory_queries.shape == (3, 32) and not recurrence.memory_queries.any()
    assert recurrence.memory_position_bias.shape == (3, 8) and not recurrence.memory_position_bias.any()
    embeddings = recurrence.slot_embeddings
    assert embeddings.shape == (3, 32) and bool((embeddings[0] != embeddings[1]).any())


@pytest.mark.parametrize("backbone", MEMORY_BACKBONES, ids=[b.name for b in MEMORY_BACKBONES])
def test_the_defaults_are_the_paper(backbone):
    """Spelled out, the defaults build the same model: the same weights, no new ones, the same logits."""
    paper, _ = backbone.models()
    spelled, _ = backbone.models(
        memory_slots=1, memory_pooling="mean", memory_position_bias=False, memory_source="layer_mix",
        memory_read_layers=[1],
    )  # fmt: skip
    assert paper.state_dict().keys() == spelled.state_dict().keys()
    assert {n for n, _ in paper.recurrence.named_parameters()} == {"layer_weight_logits"} | {
        n for n, _ in paper.recurrence.named_parameters() if n.startswith("ffn.")
    }
    tokens = ids()
    with torch.no_grad():
        torch.testing.assert_close(spelled(tokens).logits, paper(tokens).logits, rtol=0, atol=0)


def test_a_state_file_from_before_the_slots_continues_the_text(tmp_path):
    """A state written in file format version 1 (h_prev and the pooled sum (batch, hidden), no pooled weights) loads
    as the one-slot state it was."""
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    tokens = ids()
    with torch.no_grad():
        state = model(tokens[:, :13]).past_key_values
        expected = model(tokens[:, 13:], past_key_values=state).logits
    state = model(tokens[:, :13]).past_key_values
    tensors, header = state._file_contents()
    tensors = {k: v.contiguous().clone() for k, v in tensors.items() if k not in ("pooled_weight", "pooled_reference")}
    tensors["h_prev"], tensors["pooled_sum"] = tensors["h_prev"][:, 0].clone(), tensors["pooled_sum"][:, 0].clone()
    for recorded_later in ("memory_slots", "memory_pooling"):
        header["model_shape"].pop(recorded_later)
    header["format_version"] = 1
    save_file(tensors, tmp_path / "v1.safetensors", metadata={"hf_recurrence_state": json.dumps(header)})
    loaded = model.load_state(tmp_path / "v1.safetensors")
    assert loaded.h_prev.shape == (2, 1, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:, 13:], past_key_values=loaded).logits, expected)


@pytest.mark.parametrize(
    ("settings", "difference"),
    [
        (MEMORY_SETTINGS["slots"], r"memory_slots=3 \(this model: 1\)"),
        # One slot pooled by attention keeps tensors of the mean's shapes, with another meaning.
        ({"memory_pooling": "attention"}, r"memory_pooling='attention' \(this model: 'mean'\)"),
    ],
    ids=["slot_count", "pooling"],
)
def test_a_state_of_another_memory_is_refused_naming_it(settings, difference, tmp_path):
    model, _ = BY_NAME["llama"].models(**settings)
    paper, _ = BY_NAME["llama"].models()
    tokens = ids()
    with torch.no_grad():
        state = model(tokens).past_key_values
    state.save(tmp_path / "state.safetensors")
    with pytest.raises(ValueError, match=difference):
        paper.load_state(tmp_path / "state.safetensors")
    with pytest.raises(ValueError, match=difference):
        paper(tokens, **{STATE_NAME: state})


def test_attentions_have_a_column_per_slot():
    model = memory_model(BY_NAME["llama"], "every_layer")
    tokens = ids(length=20)
    with torch.no_grad():
        out = model(tokens, output_attentions=True)
    for weights in out.attentions:
        assert weights.shape[-1] == 2 + 8
        slots = weights[..., :2]  # every layer reads the two slots, from the second window on
        assert not slots[:, :, :8].any() and bool((slots[:, :, 8:].sum(-1) > 0).all())
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"memory_slots": 0}, "memory_slots must be a positive integer, got memory_slots=0"),
        ({"memory_pooling": "max"}, "memory_pooling must be one of .* got memory_pooling='max'"),
        ({"memory_source": "first"}, "memory_source must be one of .* got memory_source='first'"),
        ({"memory_read_layers": [0, 3]}, r"memory_read_layers=\[0, 3\]"),
        ({"memory_read_layers": []}, r"memory_read_layers=\[\]"),
        ({"memory_read_layers": [1, 1]}, r"memory_read_layers=\[1, 1\]"),
        ({"memory_slots": 9, "memory_pooling": "attention"}, "memory_slots=9 > window_size=8"),
        ({"memory_slots": 9, "memory_pooling": "select"}, "'select' with memory_slots=9 > window_size=8"),
        ({"memory_pooling": "select", "memory_position_bias": True}, "'select' with memory_position_bias=True"),
        # 16 positions, 8-token windows: -8 is the farthest a key may be, and slot 1 sits one before slot 0.
        ({"memory_slots": 2, "h_prev_rope_position": -8}, r"memory_slots=2 .* got h_prev_rope_position=-8"),
    ],
)
def test_bad_memory_settings_are_refused_naming_the_value(settings, message):
    with pytest.raises(ValueError, match=message):
        BY_NAME["llama"].models(**settings)


def test_slots_cannot_be_rotated_at_a_layer_without_rotary_embeddings():
    with pytest.raises(ValueError, match="layer 1 .* NoPE"):
        BY_NAME["smollm3"].models(insertion_layer=0, h_prev_rope_position=-1, memory_read_layers=[0, 1])


def test_position_biases_refuse_a_state_with_longer_windows():
    model = memory_model(BY_NAME["llama"], "attention")
    with pytest.raises(ValueError, match="window_size=12 is larger than the config's window_size=8"):
        model.new_state(2, window_size=12)
