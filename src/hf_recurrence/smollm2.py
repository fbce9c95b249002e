"""The first documented path of SmolLM2-135M's GGUF file and the GGUF readers (`from hf_recurrence.smollm2 import
smollm2_gguf_path`), kept working: they live in `hf_recurrence.weights` (`weights.smollm2`, `weights.gguf`)."""

from .weights.gguf import *  # noqa: F403
from .weights.smollm2 import *  # noqa: F403
