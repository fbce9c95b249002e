"""transformers' common tests on the recurrence core over a stock GPT-2 backbone (multi-head attention, learned
position table, a `transformer.` base model); everything else as `recurrent_decoder_spec.py`."""

from recurrent_decoder_spec import backbone_spec
from spec_builder import TINY_SIZES


# GPT2Config reads hidden_size, num_hidden_layers, num_attention_heads and max_position_embeddings through its
# attribute_map; it has no num_key_value_heads, and its intermediate size is n_inner.
sizes = {name: value for name, value in TINY_SIZES.items() if name != "intermediate_size"}
globals().update(backbone_spec("gpt2", sizes={**sizes, "max_position_embeddings": 512}, n_inner=37))
