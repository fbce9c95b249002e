"""The model families, as one table the common tests (`tests/test_families.py`) run over.

Adding a family: one `Family` entry here, plus the tests of what is its own in `tests/models/<family>/`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, PreTrainedConfig, PreTrainedModel

from hf_recurrence import (
    IBertForMaskedLM,
    IBertForSequenceClassification,
    IBertForTokenClassification,
    IBertModel,
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentGPT2LMHeadModel,
    RecurrentGPT2Model,
    RecurrentLlamaForCausalLM,
    RecurrentLlamaForSequenceClassification,
    RecurrentLlamaForTokenClassification,
    RecurrentLlamaModel,
    TransformerXLLMHeadModel,
    TransformerXLModel,
)

from .common import (
    TINY_BACKBONE,
    tiny_inductive_bert_config,
    tiny_recurrent_config,
    tiny_recurrent_llama_config,
    tiny_transformer_xl_config,
)


# Run in the fresh interpreter after a causal model is loaded as remote code: greedy generate() past several window
# boundaries and past the position range equals the argmax loop over one-shot forwards, so the state generate()
# hands back each step (`past_key_values`, `cache` from transformers 5.24 on) is the one the model reads.
GENERATES_PAST_THE_WINDOW = """
ids = reference["inputs"]["input_ids"][:, :4]
generated = model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False)
eos = model.generation_config.eos_token_id
expected = ids
with torch.no_grad():
    for _ in range(40):
        scores = model(expected).logits[:, -1]
        scores[:, [] if eos is None else eos] = -float("inf")  # min_new_tokens forbids the end of sequence
        expected = torch.cat([expected, scores.argmax(-1, keepdim=True)], dim=1)
assert torch.equal(generated, expected), (generated, expected)
"""


@dataclass(frozen=True)
class Family:
    """What the common tests need to know about a family.

    Args:
        name: the folder under `hf_recurrence/models` (also the config's `model_type`).
        tiny_config: builds a tiny config; keyword overrides are config fields.
        base_class, head_class: the bare model and the main head.
        head_auto_class: the Auto class that resolves to `head_class`.
        other_heads: the family's further heads.
        saved_settings: non-default config fields that a save/load round trip must keep.
        stateful: whether the model carries a state through `past_key_values` (the causal families).
        chunk_splits: where an input may be cut so that chunked calls carrying the state equal one call.
        state_carries_gradient: whether the state returned in training mode holds tensors with autograd history
            (backpropagation through time across calls); Transformer-XL's memories never do (paper §3.2).
        remote_checks: more Python run in the fresh interpreter after loading as remote code.
        attention_columns: the width of the attention weights the model returns, from its config (the stateful
            families lay them out by window position or by distance, the same columns in every call).
    """

    name: str
    tiny_config: Callable[..., PreTrainedConfig]
    base_class: type[PreTrainedModel]
    head_class: type[PreTrainedModel]
    head_auto_class: type
    other_heads: tuple[type[PreTrainedModel], ...] = ()
    saved_settings: dict = field(default_factory=dict)
    stateful: bool = True
    chunk_splits: tuple[int, ...] = ()
    state_carries_gradient: bool = True
    remote_checks: str = ""
    attention_columns: Callable[[PreTrainedConfig], int] | None = None

    @property
    def model_classes(self) -> tuple[type[PreTrainedModel], ...]:
        return (self.base_class, self.head_class, *self.other_heads)

    def head(self, **overrides) -> PreTrainedModel:
        torch.manual_seed(0)
        return self.head_class(self.tiny_config(**overrides)).eval()

    def inputs(self, batch: int = 2, length: int = 30) -> dict[str, torch.Tensor]:
        """Token ids (no 0, the padding id of the tiny configs) and, for I-BERT, a mask with left padding."""
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(1, 99, (batch, length), generator=generator)
        if self.stateful:
            return {"input_ids": ids}
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        return {"input_ids": ids, "attention_mask": mask}

    def base(self, model: PreTrainedModel) -> PreTrainedModel:
        """The bare model inside a head: what `base_model` gives, which for the recurrence core's causal LM reads with
        the recurrence too."""
        return model.base_model


FAMILIES = [
    Family(
        name="recurrent_gpt2",
        tiny_config=tiny_recurrent_config,
        base_class=RecurrentGPT2Model,
        head_class=RecurrentGPT2LMHeadModel,
        head_auto_class=AutoModelForCausalLM,
        other_heads=(RecurrentGPT2ForSequenceClassification, RecurrentGPT2ForTokenClassification),
        saved_settings={"window_overlap": 2, "bptt_windows": 3},
        chunk_splits=(3, 11, 28, 29),
        remote_checks=GENERATES_PAST_THE_WINDOW,
        attention_columns=lambda config: 1 + config.window_size,  # h_prev, then the window's positions
    ),
    Family(
        name="recurrent_llama",
        tiny_config=tiny_recurrent_llama_config,
        base_class=RecurrentLlamaModel,
        head_class=RecurrentLlamaForCausalLM,
        head_auto_class=AutoModelForCausalLM,
        other_heads=(RecurrentLlamaForSequenceClassification, RecurrentLlamaForTokenClassification),
        saved_settings={
            "window_overlap": 2,
            "bptt_windows": 3,
            "h_prev_rope_position": 0,
            "normalize_pooled_states": True,
            "recurrence_input": "zeros",
        },
        chunk_splits=(3, 11, 28, 29),
        remote_checks=GENERATES_PAST_THE_WINDOW,
        attention_columns=lambda config: 1 + config.window_size,  # h_prev, then the window's positions
    ),
    Family(
        name="transformer_xl",
        tiny_config=tiny_transformer_xl_config,
        base_class=TransformerXLModel,
        head_class=TransformerXLLMHeadModel,
        head_auto_class=AutoModelForCausalLM,
        saved_settings={"clamp_len": 5, "untie_r": False},
        chunk_splits=(8, 24),  # on segment boundaries: a call starts a new segment
        state_carries_gradient=False,
        remote_checks=GENERATES_PAST_THE_WINDOW,
        attention_columns=lambda config: config.mem_len + config.segment_length,  # distances
    ),
    Family(
        name="inductive_bert",
        tiny_config=tiny_inductive_bert_config,
        base_class=IBertModel,
        head_class=IBertForMaskedLM,
        head_auto_class=AutoModelForMaskedLM,
        other_heads=(IBertForSequenceClassification, IBertForTokenClassification),
        saved_settings={"use_position_embeddings": True, "lstm_feed_forward": True},
        stateful=False,
        # Ours, not transformers' Integer-BERT class of the same name; the other heads resolve from the same folder.
        remote_checks="""
assert type(model) is not transformers.IBertForMaskedLM
folder = model.name_or_path
classifier = transformers.AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
assert type(classifier).__name__ == "IBertForSequenceClassification", type(classifier)
""",
    ),
]

STATEFUL_FAMILIES = [family for family in FAMILIES if family.stateful]


@dataclass(frozen=True)
class Backbone:
    """A stock transformers decoder that `RecurrentDecoderForCausalLM` runs over, as one row of the backbone driver
    (`tests/test_backbones.py`).

    Args:
        name: the stock `model_type`.
        overrides: config fields of this family's tiny config besides `TINY_BACKBONE`.
        attn_implementation: the attention transformers itself picks for this family (Gemma2: eager, for its
            attention soft-cap).
    """

    name: str
    overrides: dict = field(default_factory=dict)
    attn_implementation: str = "sdpa"

    def text_config(self) -> PreTrainedConfig:
        config = AutoConfig.for_model(self.name, **{**TINY_BACKBONE, **self.overrides})
        config._attn_implementation = self.attn_implementation
        return config

    def models(self, **settings) -> tuple[RecurrentDecoderForCausalLM, PreTrainedModel]:
        """The recurrent model (8-token windows, insertion layer 1, a recurrence network with random weights large
        enough that h_prev matters) and the stock model with the same backbone weights, both in eval mode."""
        torch.manual_seed(0)
        kwargs = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16], **settings}
        model = RecurrentDecoderForCausalLM(RecurrentDecoderConfig(text_config=self.text_config(), **kwargs)).eval()
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for parameter in model.recurrence.parameters():
                parameter.normal_(0, 0.5, generator=generator)
        stock = AutoModelForCausalLM.from_config(self.text_config()).eval()
        stock.load_state_dict(model.backbone.state_dict())
        return model, stock


GQA = {"intermediate_size": 48, "num_key_value_heads": 2}
BACKBONES = [
    Backbone("llama", GQA),
    Backbone("qwen2", GQA),
    Backbone("qwen3", {**GQA, "head_dim": 8}),
    Backbone("mistral", {**GQA, "sliding_window": 16}),
    Backbone("gemma2", {**GQA, "head_dim": 8, "sliding_window": 16, "query_pre_attn_scalar": 8}, "eager"),
    Backbone(
        "gemma3_text",
        {
            **GQA,
            "head_dim": 8,
            "sliding_window": 16,
            "query_pre_attn_scalar": 8,
            # Both layer types, so both RoPE bases run.
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
    Backbone("phi3", {**GQA, "partial_rotary_factor": 0.5}),
    Backbone("olmo2", GQA),
    # A NoPE layer (no rotary embedding) at the insertion layer.
    Backbone("smollm3", {**GQA, "no_rope_layers": [1, 0, 1]}),
    Backbone("gpt2", {"n_inner": 48}),
]
