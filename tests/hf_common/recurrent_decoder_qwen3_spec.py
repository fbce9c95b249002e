"""transformers' common tests on the recurrence core over a stock Qwen3 backbone (per-head query/key norms, explicit
head_dim); everything else as `recurrent_decoder_spec.py`."""

from recurrent_decoder_spec import backbone_spec


globals().update(backbone_spec("qwen3", head_dim=8))
