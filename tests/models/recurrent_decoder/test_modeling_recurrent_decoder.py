"""What is the recurrence core's own: loading stock checkpoints, refusing backbones it cannot run over, keeping the
recurrence whatever attention implementation transformers is asked for, and the features every causal family has
(packed documents, logits_to_keep, pipelines, remote code). The invariants it keeps over every backbone are in the
other files of this folder (shared base: `backbones.py`); PEFT and the Trainer with LoRA: tests/integrations."""

import gc
import json

import pytest
import torch
from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    Qwen2Config,
    Trainer,
)
from transformers.utils import ModelOutput

from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM, RecurrentDecoderState

from ...common import (
    ACROSS_KERNELS,
    REPO_ROOT,
    TINY_BACKBONE,
    assert_loads_with_remote_code,
    generated_alone_and_batched,
    run_isolated_python,
    stdlib_tokenizer,
    tiny_training_arguments,
)
from ...families import BACKBONES, GENERATES_PAST_THE_WINDOW
from ...test_transformers_versions import (
    assert_loads_and_generates_under_the_other_transformers,
    under_the_other_transformers,
)


BY_NAME = {backbone.name: backbone for backbone in BACKBONES}
SETTINGS = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16]}
GQA = {**TINY_BACKBONE, "intermediate_size": 48, "num_key_value_heads": 2}


def ids(batch: int = 2, length: int = 30) -> torch.Tensor:
    return torch.randint(1, 99, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "stock_config",
    [
        LlamaConfig(**GQA, tie_word_embeddings=True),
        Qwen2Config(**GQA, tie_word_embeddings=False),
        GPT2Config(**TINY_BACKBONE),
    ],
    ids=["llama-tied", "qwen2-untied", "gpt2"],
)
def test_a_stock_checkpoint_loads_unchanged_with_only_the_recurrence_new(stock_config, tmp_path):
    stock = AutoModelForCausalLM.from_config(stock_config).eval()
    stock.save_pretrained(tmp_path / "stock")
    model, info = RecurrentDecoderForCausalLM.from_pretrained(tmp_path / "stock", output_loading_info=True, **SETTINGS)
    assert info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    assert info["missing_keys"] and all(key.startswith("recurrence.") for key in info["missing_keys"])
    stock_weights = stock.state_dict()
    for name, tensor in model.backbone.state_dict().items():
        assert torch.equal(tensor, stock_weights[name]), name
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert tied == stock_config.tie_word_embeddings
    assert model.config.window_size == 8 and model.config.text_config.model_type == stock_config.model_type
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids()[:, :8]).logits, stock(ids()[:, :8]).logits, **ACROSS_KERNELS)

    # Saved in the stock layout plus recurrence.*, with no attention implementation in config.json.
    model.save_pretrained(tmp_path / "recurrent")
    saved_keys = {}
    for folder in ("stock", "recurrent"):
        with safe_open(str(tmp_path / folder / "model.safetensors"), "pt") as file:
            saved_keys[folder] = set(file.keys())
    assert {key for key in saved_keys["recurrent"] if not key.startswith("recurrence.")} == saved_keys["stock"]
    config_text = (tmp_path / "recurrent" / "config.json").read_text()
    assert "recurrent_sdpa" not in config_text and "recurrent_eager" not in config_text
    saved = json.loads((tmp_path / "recurrent" / "config.json").read_text())
    assert set(saved["auto_map"]) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForCausalLM",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
    }
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "recurrent").eval()
    assert type(reloaded) is RecurrentDecoderForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids()).logits, model(ids()).logits, **ACROSS_KERNELS)


@pytest.mark.parametrize(
    ("text_config", "expected"),
    [
        (AutoConfig.for_model("t5"), r"'t5' backbone: it is an encoder-decoder"),
        (AutoConfig.for_model("bert"), r"'bert' backbone: it is not a causal decoder"),
        (AutoConfig.for_model("qwen3_next"), r"'qwen3_next' backbone: its layer_types include \['linear_attention'\]"),
        (AutoConfig.for_model("deepseek_v3"), r"'deepseek_v3' backbone: it uses multi-head latent attention"),
        (AutoConfig.for_model("falcon"), r"'falcon' backbone: it is unchecked"),
        (GPT2Config(**TINY_BACKBONE, add_cross_attention=True), r"'gpt2' backbone: add_cross_attention=True"),
        (
            AutoConfig.for_model("mistral", **GQA, sliding_window=4),
            r"'mistral' backbone: window_size=8 is larger than its sliding_window=4.*use window_size <= 4",
        ),
    ],
    ids=["encoder-decoder", "bidirectional", "hybrid-linear", "mla", "unchecked", "cross-attention", "sliding"],
)
def test_backbones_it_cannot_run_over_are_refused_with_the_reason(text_config, expected):
    with pytest.raises(ValueError, match=expected) as error:
        RecurrentDecoderConfig(text_config=text_config, **SETTINGS)
    # What works is named too.
    assert "gemma2, gemma3_text, gpt2, llama" in str(error.value)


def test_a_backbone_whose_attention_bypasses_the_interface_is_refused(monkeypatch):
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "_can_set_attn_implementation", classmethod(lambda cls: False))
    with pytest.raises(ValueError, match="'llama' backbone: LlamaForCausalLM does not call transformers' attention"):
        RecurrentDecoderForCausalLM(RecurrentDecoderConfig(text_config=LlamaConfig(**GQA), **SETTINGS))


def test_attn_implementation_never_leaves_a_model_without_the_recurrence(tmp_path):
    """transformers gives a sub-model the plain name on `from_pretrained(attn_implementation=...)`,
    `set_attn_implementation(...)` and the config setter: the backbone would then be a stock model, with no h_prev
    and no window cache, and no error."""
    stock = AutoModelForCausalLM.from_config(LlamaConfig(**GQA)).eval()
    stock.save_pretrained(tmp_path)
    tokens = ids()
    torch.manual_seed(0)
    reference = RecurrentDecoderForCausalLM.from_pretrained(tmp_path, **SETTINGS).eval()
    with torch.no_grad():
        for parameter in reference.recurrence.parameters():
            parameter.normal_(0, 0.5)
        expected = reference(tokens).logits
        # Without h_prev and the window cache, the second window would be the stock model on it alone.
        assert (expected[:, 8:16] - stock(tokens[:, 8:16]).logits).abs().max() > 1e-3

    def assert_recurrent(model):
        assert model.config._attn_implementation in ("sdpa", "eager")
        with torch.no_grad():
            torch.testing.assert_close(model(tokens).logits, expected, rtol=1e-5, atol=1e-5)
        assert model.backbone.config._attn_implementation == "recurrent_" + model.config._attn_implementation

    for implementation in ("eager", "sdpa"):
        model = RecurrentDecoderForCausalLM.from_pretrained(tmp_path, attn_implementation=implementation, **SETTINGS)
        model.load_state_dict(reference.state_dict())
        model.eval()
        assert model.config._attn_implementation == implementation
        assert_recurrent(model)
        model.set_attn_implementation("sdpa" if implementation == "eager" else "eager")
        assert_recurrent(model)
        # The backbone's own method and the config setter, which the model cannot intercept.
        model.backbone.set_attn_implementation("sdpa")
        assert_recurrent(model)
        model.config._attn_implementation = "eager"
        assert model.backbone.config._attn_implementation == "eager"
        assert_recurrent(model)
        assert model.backbone.config._attn_implementation == "recurrent_eager"

    for implementation in ("flash_attention_2", "flex_attention"):
        with pytest.raises(ValueError, match=rf"attn_implementation='{implementation}' cannot carry the recurrence"):
            RecurrentDecoderForCausalLM.from_pretrained(tmp_path, attn_implementation=implementation, **SETTINGS)
        with pytest.raises(ValueError, match="use one of \\['sdpa', 'eager'\\]"):
            reference.set_attn_implementation(implementation)
    reference.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2' cannot carry the recurrence"):
        reference(tokens)
    reference.set_attn_implementation("sdpa")
    # The backbone run on its own under the recurrent name has no window step: an error, not a stock result.
    with pytest.raises(RuntimeError, match="without its window step"):
        reference.backbone(tokens)


def test_packed_documents_are_read_as_if_alone():
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    first, second = ids(1, 13), torch.randint(1, 99, (1, 11), generator=torch.Generator().manual_seed(3))
    packed = torch.cat([first, second], dim=1)
    position_ids = torch.cat([torch.arange(13), torch.arange(11)])[None]
    with torch.no_grad():
        out = model(packed, position_ids=position_ids).logits
        torch.testing.assert_close(out[:, :13], model(first).logits)
        torch.testing.assert_close(out[:, 13:], model(second).logits)
    # The last token of a document does not predict the first of the next.
    with torch.no_grad():
        loss = model(packed, position_ids=position_ids, labels=packed).loss
        first_loss = model(first, labels=first).loss
        second_loss = model(second, labels=second).loss
    torch.testing.assert_close(loss, (first_loss * 12 + second_loss * 10) / 22)


def test_logits_to_keep_and_generate_reads_a_prompt_without_its_logits():
    model, _ = BY_NAME["gemma2"].models()
    tokens = ids()
    with torch.no_grad():
        every = model(tokens).logits
        torch.testing.assert_close(model(tokens, logits_to_keep=1).logits, every[:, -1:])
        positions = torch.tensor([17, 0, -1])
        torch.testing.assert_close(model(tokens, logits_to_keep=positions).logits, every[:, positions])
    with pytest.raises(ValueError, match="logits_to_keep=1 cannot be combined with labels"):
        model(tokens, labels=tokens, logits_to_keep=1)
    head_inputs = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, args, _o: head_inputs.append(args[0].shape))
    model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=3, do_sample=False)
    hook.remove()
    # The prompt's 4 window steps ask the head for no position but the very last; then one per new token.
    assert [shape[1] for shape in head_inputs] == [0, 0, 0, 1, 1, 1]


def _state_tensors(state: RecurrentDecoderState) -> dict[str, torch.Tensor]:
    names = ("h_prev", "pooled_sum", "fill", "window_index", "slot_valid", "overlap_embeds", "overlap_valid")
    layers = {f"keys.{i}": k for i, k in enumerate(state.keys)} | {
        f"values.{i}": v for i, v in enumerate(state.values)
    }
    return {name: getattr(state, name) for name in names} | layers


@pytest.mark.parametrize("padded", [False, True], ids=["lockstep", "left-padded"])
def test_a_prompt_read_for_its_last_logits_equals_the_full_read(padded):
    """Without gradient, the embeddings are looked up window by window and steps that give no output are dropped:
    the last logits and the carried state are those of the full read (every position's embeddings and logits)."""
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    tokens = ids(2, 45)
    mask = torch.ones_like(tokens)
    if padded:
        mask[0, :7] = 0
    with torch.no_grad():
        full = model(inputs_embeds=model.get_input_embeddings()(tokens), attention_mask=mask)
        last = model(tokens, attention_mask=mask, logits_to_keep=1)
        silent = model(tokens, attention_mask=mask, return_logits=False)
    assert silent.logits is None
    torch.testing.assert_close(last.logits, full.logits[:, -1:])
    for state in (last.past_key_values, silent.past_key_values):
        assert state.seen_tokens == full.past_key_values.seen_tokens
        for name, tensor in _state_tensors(full.past_key_values).items():
            torch.testing.assert_close(_state_tensors(state)[name], tensor, msg=name)
    # The text continues from either state alike (the calls advance the states in place).
    more = ids(2, 5)
    with torch.no_grad():
        continued = model(more, past_key_values=last.past_key_values)
        expected = model(more, past_key_values=full.past_key_values)
    torch.testing.assert_close(continued.logits, expected.logits)


def _live_tensor_bytes(excluded: list[torch.Tensor]) -> int:
    """Bytes of the tensors alive now that are neither parameters nor `excluded` (the caller's inputs)."""
    skip = {t.untyped_storage().data_ptr() for t in excluded}
    storages = {}
    for obj in gc.get_objects():
        # By type: isinstance would read `__class__` of every object, which some lazy modules warn about.
        if issubclass(type(obj), torch.Tensor) and not issubclass(type(obj), torch.nn.Parameter):
            storage = obj.untyped_storage()
            try:
                pointer = storage.data_ptr()
            except RuntimeError:  # a fake tensor that an earlier compilation left alive: it holds no memory
                continue
            if pointer not in skip:
                storages[pointer] = storage.nbytes()
    return sum(storages.values())


def test_reading_a_prompt_for_its_last_logits_keeps_nothing_per_position():
    """What a forward without gradient holds while it computes the last logits does not grow with the prompt: no
    (batch, length, hidden) embeddings, no per-window outputs. Only the (batch, length) bool mask of real tokens
    remains (one byte a position; one hidden state a position would be 4 * 32 here)."""
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    embedding_columns, live = [], {}

    def at_head(_module, args, _output):
        if args[0].shape[1] == 1 and length not in live:  # forward()'s last window, asked for the last position
            live[length] = _live_tensor_bytes([tokens])

    embedding_hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, _args, output: embedding_columns.append(output.shape[1])
    )
    head_hook = model.get_output_embeddings().register_forward_hook(at_head)
    lengths = (24, 240)
    for length in lengths:
        tokens = ids(2, length)
        with torch.no_grad():
            model(tokens, logits_to_keep=1)
            model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=1, do_sample=False)
    embedding_hook.remove()
    head_hook.remove()
    # Every lookup, generate()'s prefill included, is one window's or less: never the whole prompt's.
    assert max(embedding_columns) <= model.config.window_size
    # At most the real-token mask and a copy of it grow: 2 rows, a byte each per position.
    assert live[lengths[1]] - live[lengths[0]] <= 2 * 2 * (lengths[1] - lengths[0]) + 4096, live


def test_text_generation_pipeline_with_left_padded_batches():
    tokenizer = stdlib_tokenizer()
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    config = RecurrentDecoderConfig(
        text_config=LlamaConfig(**{**GQA, "vocab_size": len(tokenizer)}),
        **SETTINGS,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = RecurrentDecoderForCausalLM(config).eval()
    prompts = ["def main():", "import os\nimport sys\n\nclass"]
    generated_alone_and_batched(model, tokenizer, prompts, max_new_tokens=20, do_sample=False, return_full_text=False)


def test_assisted_and_prompt_lookup_decoding_are_refused_by_transformers_as_the_page_says():
    model = RecurrentDecoderForCausalLM(RecurrentDecoderConfig(text_config=LlamaConfig(**GQA), **SETTINGS)).eval()
    for options in ({"prompt_lookup_num_tokens": 3}, {"assistant_model": model}):
        with pytest.raises(ValueError, match="assisted generation is not supported with stateful models"):
            model.generate(ids(1, 12), max_new_tokens=4, do_sample=False, **options)
    limitations = (REPO_ROOT / "docs" / "models" / "recurrent_decoder.md").read_text().split("## Limitations")[1]
    assert "Assisted and prompt-lookup decoding" in limitations


def test_the_state_travels_under_the_installed_name_and_forward_takes_either(tmp_path):
    model, _ = BY_NAME["mistral"].models()
    tokens = ids(length=24)
    name = "cache" if isinstance(getattr(ModelOutput, "past_key_values", None), property) else "past_key_values"
    with torch.no_grad():
        first = model(tokens[:, :16])
        assert name in first and first.past_key_values is first[name]
        by_old_name = model(tokens[:, 16:], past_key_values=model(tokens[:, :16])[name]).logits
        by_new_name = model(tokens[:, 16:], cache=model(tokens[:, :16])[name]).logits
        torch.testing.assert_close(
            by_old_name, by_new_name, rtol=0, atol=0
        )  # the same computation on the same tensors
        torch.testing.assert_close(by_new_name, model(tokens).logits[:, 16:])
        with pytest.raises(ValueError, match="not both"):
            model(tokens[:, 16:], past_key_values=first[name], cache=first[name])
    # Trainer's evaluation gathers logits, not the state.
    trainer = Trainer(model=model, args=tiny_training_arguments(tmp_path))
    _, logits, _ = trainer.prediction_step(model, {"input_ids": tokens, "labels": tokens}, prediction_loss_only=False)
    leaves = logits if isinstance(logits, tuple) else (logits,)
    assert all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves), [type(leaf) for leaf in leaves]


def test_a_state_of_another_backbone_is_refused(tmp_path):
    llama, _ = BY_NAME["llama"].models()
    qwen2, _ = BY_NAME["qwen2"].models()
    with torch.no_grad():
        llama(ids()).past_key_values.save(tmp_path / "state.safetensors")
    with pytest.raises(ValueError, match="backbone='llama' \\(this model: 'qwen2'\\)"):
        qwen2.load_state(tmp_path / "state.safetensors")
    assert isinstance(llama.load_state(tmp_path / "state.safetensors"), RecurrentDecoderState)


@pytest.mark.remote_code
@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_trust_remote_code_in_a_fresh_interpreter_without_the_package(name, tmp_path):
    model, _ = BY_NAME[name].models(window_overlap=2)
    inputs = {"input_ids": ids(length=40)}
    assert_loads_with_remote_code(model, inputs, tmp_path, "AutoModelForCausalLM", checks=GENERATES_PAST_THE_WINDOW)


# Both copies of the model folder in one process, each model's attention calls recorded by the copy that ran them.
TWO_COPIES = """
import sys
import torch
import transformers
ids = torch.load("ids.pt")
# The checkpoint's own copy of the folder registers its attention first, then the package its own under the same names.
remote = transformers.AutoModelForCausalLM.from_pretrained("checkpoint", trust_remote_code=True).eval()
assert type(remote).__module__.startswith("transformers_modules."), type(remote).__module__
import hf_recurrence
from hf_recurrence.models.recurrent_decoder import step_recurrent_decoder
installed = transformers.AutoModelForCausalLM.from_pretrained("checkpoint").eval()
assert type(installed).__module__.startswith("hf_recurrence."), type(installed).__module__
remote_step = sys.modules[type(remote).__module__.replace("modeling_", "step_")]
ran = []
for step_module in (step_recurrent_decoder, remote_step):
    def recording(module, eager, inner=step_module._inner_attention, name=step_module.__name__):
        ran.append(name)
        return inner(module, eager)
    step_module._inner_attention = recording
with torch.no_grad():
    for model, expected in ((installed, step_recurrent_decoder), (remote, remote_step), (installed, step_recurrent_decoder)):
        ran.clear()
        logits = model(ids).logits
        assert set(ran) == {expected.__name__}, (type(model).__module__, set(ran))
        torch.testing.assert_close(logits, torch.load("logits.pt"), rtol=1e-6, atol=1e-6)
print("TWO_COPIES_OK")
"""


@pytest.mark.remote_code
def test_installed_and_remote_code_models_each_run_their_own_copy_of_the_attention(tmp_path):
    model, _ = BY_NAME["llama"].models(window_overlap=2)
    model.save_pretrained(tmp_path / "checkpoint")
    with torch.no_grad():
        torch.save(model(ids(length=40)).logits, tmp_path / "logits.pt")
    torch.save(ids(length=40), tmp_path / "ids.pt")
    result = run_isolated_python(TWO_COPIES, cwd=tmp_path, hf_home=tmp_path / "hf_home", package=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TWO_COPIES_OK" in result.stdout


@pytest.mark.remote_code
@under_the_other_transformers
def test_checkpoint_saved_here_loads_and_generates_under_the_other_transformers(tmp_path):
    model, _ = BY_NAME["gemma3_text"].models(window_overlap=2)
    assert_loads_and_generates_under_the_other_transformers(model, {"input_ids": ids(length=40)}, tmp_path)
