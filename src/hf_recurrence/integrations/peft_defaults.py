"""PEFT's default target modules for our model types, so that `LoraConfig()` without `target_modules` works on our
families as it does on stock GPT-2, Llama and BERT.

PEFT picks defaults by `config.model_type` from dictionaries in `peft.utils.constants`; it has no entry for a model
type it does not know, and no hook a model could use instead. Registering adds ours to those dictionaries (never
replacing an entry PEFT already has). It runs when `hf_recurrence` is imported with PEFT installed; a model loaded
as Hub remote code without the package installed needs `target_modules` given (docs/guides/training.md lists them).
"""

import importlib.util


# Our model types whose submodules carry the stock model's names, so every PEFT method's defaults for that model
# type apply unchanged.
SAME_MODULE_NAMES_AS = {"recurrent_gpt2": "gpt2", "recurrent_llama": "llama", "inductive_bert": "bert"}
# The recurrence core runs over several stock decoders under one model_type; these are the attention projections
# PEFT's LoRA defaults name for them (Llama-like `q_proj`/`v_proj`, Phi3's fused `qkv_proj`, GPT-2's `c_attn`). PEFT
# adapts whichever of them a backbone has.
RECURRENT_DECODER_LORA_TARGET_MODULES = ["q_proj", "v_proj", "qkv_proj", "c_attn"]
# Transformer-XL has no stock counterpart in transformers 5; its attention input projection, as `c_attn` is GPT-2's.
TRANSFORMER_XL_LORA_TARGET_MODULES = ["qkv_net"]


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
    for mapping in mappings.values():
        for ours, stock in SAME_MODULE_NAMES_AS.items():
            if stock in mapping:
                mapping.setdefault(ours, mapping[stock])
    lora = mappings["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"]
    lora.setdefault("transformer_xl", TRANSFORMER_XL_LORA_TARGET_MODULES)
    lora.setdefault("recurrent_decoder", RECURRENT_DECODER_LORA_TARGET_MODULES)
    return True
