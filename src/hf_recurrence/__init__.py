"""hf_recurrence: recurrence across windows of text for Hugging Face transformers models.

Importing the package registers its model families with the transformers Auto classes, and, where PEFT is installed,
their default PEFT target modules (`integrations.peft_defaults`).
"""

__version__ = "0.1.0"

from . import models
from .integrations.peft_defaults import register_peft_defaults
from .models import *  # noqa: F403


register_peft_defaults()

__all__ = [*models.__all__, "__version__"]
