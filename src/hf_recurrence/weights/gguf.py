"""Stock and recurrent models read from a GGUF file: float32 weights de-quantised by transformers (with the `gguf`
package), every mark of quantisation dropped so that they save and fine-tune like any other model; only the
recurrence of a recurrent model is new. `hf-recurrence convert` reads GGUF inputs through here.
"""

import importlib.metadata
import struct
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedModel

from ..models.recurrent_decoder import (
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentLlamaConfig,
    RecurrentLlamaForCausalLM,
)
from .smollm2 import SMOLLM2_INSTALL


def require_gguf_reader() -> None:
    """transformers reads GGUF files only with the `gguf` package installed; say how to get it."""
    try:
        importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"Reading a GGUF file needs the `gguf` package. Install it with: {SMOLLM2_INSTALL}"
        ) from None


def require_whole_gguf(gguf_path: Path) -> None:
    """Refuse, naming the file, a GGUF file cut short (or not GGUF at all): transformers would fail deep in its reader
    with a `struct.error` or "cannot reshape array". Reads the header and maps the tensors; nothing is de-quantised."""
    from gguf import GGUFReader

    try:
        GGUFReader(gguf_path)
    except (ValueError, struct.error) as error:
        raise ValueError(
            f"{gguf_path} ({gguf_path.stat().st_size:,} bytes) is truncated (cut short, e.g. by an interrupted "
            f"download) or not a GGUF file: reading it fails with {error}. Get the file again"
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
    require_whole_gguf(gguf_path)
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
    return RecurrentLlamaForCausalLM(config)._with_stock_weights(llama).eval()


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
    # The model keeps the stock model's end-of-sequence and other generation defaults too.
    return RecurrentDecoderForCausalLM(config)._with_stock_weights(stock).eval()


__all__ = [
    "load_causal_lm_from_gguf",
    "load_llama_from_gguf",
    "recurrent_decoder_from_causal_lm",
    "recurrent_decoder_from_gguf",
    "recurrent_llama_from_gguf",
    "recurrent_llama_from_llama",
    "require_gguf_reader",
    "require_whole_gguf",
]
