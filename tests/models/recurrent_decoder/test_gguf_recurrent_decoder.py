"""`from_pretrained(folder, gguf_file=...)`, as transformers users load a GGUF file: the causal LMs read the stock model
in it (every weight, only the recurrence new, as `hf-recurrence convert` does); the other classes say where to go."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_recurrence import (
    RecurrentDecoderForCausalLM,
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderModel,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaModel,
)

from ...common import ACROSS_KERNELS, TINY_LLAMA


gguf = pytest.importorskip("gguf")

GGUF_NAME = "tiny-llama.gguf"
WINDOW = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16]}


def _permuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection in llama.cpp's rotary layout, which transformers' GGUF reader undoes."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's tensor names."""
    config = model.config
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(config.num_hidden_layers):
        names.update({f"model.layers.{i}.{ours}": f"blk.{i}.{theirs}" for ours, theirs in layer.items()})
    tensors = {}
    for ours, theirs in names.items():
        weight = model.state_dict()[f"{ours}.weight"].float().numpy()
        if ours.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if ours.endswith("q_proj") else config.num_key_value_heads
            weight = _permuted(weight, heads)
        tensors[f"{theirs}.weight"] = np.ascontiguousarray(weight)
    return tensors


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A folder holding a tiny random Llama as a float32 GGUF file, and the stock model transformers reads from it."""
    folder = tmp_path_factory.mktemp("gguf")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, tie_word_embeddings=False))
    config = model.config
    writer = gguf.GGUFWriter(str(folder / GGUF_NAME), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_eos_token_id(0)
    for name, tensor in _gguf_tensors(model).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    stock = LlamaForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    return folder, stock


@pytest.mark.parametrize("model_class", [RecurrentDecoderForCausalLM, RecurrentLlamaForCausalLM])
def test_a_causal_lm_loads_a_gguf_file_with_only_the_recurrence_new(model_class, tiny_gguf, tmp_path):
    folder, stock = tiny_gguf
    model = model_class.from_pretrained(folder, gguf_file=GGUF_NAME, **WINDOW)
    assert type(model) is model_class and not model.training
    assert (model.config.window_size, model.config.insertion_layer) == (8, 1)
    stock_weights = stock.state_dict()
    assert model.backbone.state_dict().keys() == stock_weights.keys()
    assert all(torch.equal(value, stock_weights[key]) for key, value in model.backbone.state_dict().items())
    assert model.generation_config.eos_token_id == stock.generation_config.eos_token_id
    ids = torch.randint(1, 99, (2, 20))
    with torch.no_grad():
        logits = model(ids).logits
        torch.testing.assert_close(logits[:, :8], stock(ids[:, :8]).logits, **ACROSS_KERNELS)
    # Saved, it is an ordinary recurrent checkpoint.
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model_class.from_pretrained(tmp_path)(ids).logits, logits, **ACROSS_KERNELS)


def test_a_gguf_file_loads_in_the_dtype_asked_for(tiny_gguf):
    folder, _ = tiny_gguf
    model = RecurrentDecoderForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.bfloat16, **WINDOW)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    "model_class", [RecurrentDecoderModel, RecurrentLlamaModel, RecurrentDecoderForSequenceClassification]
)
def test_the_other_classes_refuse_a_gguf_file_in_one_line_naming_the_routes(model_class, tiny_gguf):
    folder, _ = tiny_gguf
    with pytest.raises(ValueError) as refused:
        model_class.from_pretrained(folder, gguf_file=GGUF_NAME, **WINDOW)
    message = str(refused.value)
    assert "\n" not in message and GGUF_NAME in message
    assert "hf-recurrence convert" in message and "RecurrentDecoderForCausalLM.from_pretrained" in message
