"""The first documented path of Gemma 3 270M base's GGUF file (`from hf_recurrence.gemma3 import
gemma3_270m_gguf_path`), kept working: it lives in `hf_recurrence.weights.gemma3`."""

from .weights.gemma3 import *  # noqa: F403
