"""PEFT's default target modules for our model types, so that `LoraConfig()` without `target_modules` works on our
families as it does on stock GPT-2, Llama and BERT.

PEFT picks defaults by `config.model_type` from dictionaries in `peft.utils.constants`; it has no entry for a model
type it does not know, and no hook a model could use instead. Registering adds ours to those dictionaries (never
replacing an entry PEFT already has). It runs when `hf_recurrence` is imported with PEFT installed; a model loaded
as Hub remote code without the package installed needs `target_modules` given (docs/guides/training.md lists them).
"""

import importlib.util

from ..families import FAMILIES


def _default_mappings() -> dict[str, dict]:
    """PEFT's per-method `model_type -> modules` dictionaries, by name."""
    from peft.utils import constants

    return {
        name: mapping
        for name, mapping in vars(constants).items()
        if name.startswith("TRANSFORMERS_MODELS_TO_")
        and name.endswith(("_TARGET_MODULES_MAPPING", "_FEEDFORWARD_MODULES_MAPPING"))
        and isinstance(mapping, dict)
    }


def register_peft_defaults() -> bool:
    """Add our model types to PEFT's default target modules; returns False (and does nothing) without PEFT."""
    if importlib.util.find_spec("peft") is None:
        return False
    try:
        mappings = _default_mappings()
    except ImportError:
        # A PEFT that cannot be imported beside this transformers must not make hf_recurrence unimportable; using it
        # will say what is wrong.
        return False
    lora = mappings["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"]
    for ours, family in FAMILIES.items():
        # A family that keeps a stock model's module names takes every method's defaults for that model type.
        for mapping in mappings.values():
            if family.stock_model_type in mapping:
                mapping.setdefault(ours, mapping[family.stock_model_type])
        if family.lora_target_modules is not None:
            lora.setdefault(ours, list(family.lora_target_modules))
    return True
