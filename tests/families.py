"""The model families, as the one table the common tests (`tests/test_families.py`) and the Hub tests (`tests/hub`) run
over; the recurrence core's stock backbones are the rows of `BACKBONES`.

Adding a family: one `Family` entry here, plus the tests of what is its own in `tests/models/<family>/`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    LlamaConfig,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

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
    GQA,
    TINY_BACKBONE,
    TINY_LLAMA,
    TINY_RECURRENCE,
    stdlib_tokenizer,
    tiny_inductive_bert_config,
    tiny_recurrent_config,
    tiny_recurrent_llama_config,
    tiny_transformer_xl_config,
)
from .models.inductive_bert.tokenizer import word_level_tokenizer


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
class Hub:
    """What the Hub tests (`tests/hub`) push, pull and check for a family.

    Args:
        make: a tiny random model in eval mode, and the tokenizer its pipeline uses.
        auto_class: the name of the transformers Auto class that pulls it.
        pipeline_task, pipeline_inputs, pipeline_kwargs: the pipeline run on the pushed and on the pulled model.
        reference_length: length of the random input whose outputs the pulled model must reproduce; longer than the
            family's window, segment or position table, so that the recurrence is exercised.
        invalid_setting: a recurrence setting and a value the family's config rejects with a ValueError naming the
            setting.
        context_limit: for generation, the length the non-recurrent architecture cannot read past (generation must
            go beyond it).
    """

    make: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]
    auto_class: str
    pipeline_task: str
    pipeline_inputs: str
    pipeline_kwargs: dict
    reference_length: int
    invalid_setting: tuple[str, object]
    context_limit: Callable[[PreTrainedConfig], int] | None = None


# min_new_tokens keeps a random model from stopping early at its end-of-text token.
GENERATE_40 = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False, "return_tensors": True}


def windowed_hub(make: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]) -> Hub:
    """The Hub row of a recurrent decoder (named or the core over a stock backbone): generation past the backbone's
    position table, which the recurrent model reads past."""
    return Hub(
        make=make,
        auto_class="AutoModelForCausalLM",
        pipeline_task="text-generation",
        pipeline_inputs="def read_windows(path):",
        pipeline_kwargs=GENERATE_40,
        reference_length=48,
        invalid_setting=("window_size", 0),
        context_limit=lambda config: config.text_config.max_position_embeddings,
    )


def with_stdlib_tokenizer(
    head_class: type[PreTrainedModel], tiny_config: Callable[..., PreTrainedConfig], **overrides
):
    """`Hub.make` for a causal family: its tiny config over the vocabulary of `stdlib_tokenizer()`."""

    def make() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        tokenizer = stdlib_tokenizer()
        return head_class(tiny_config(vocab_size=len(tokenizer), **overrides)).eval(), tokenizer

    return make


def tiny_recurrent_decoder() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The recurrence core over a tiny Llama, for its Hub row."""
    tokenizer = stdlib_tokenizer()
    backbone = LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})
    config = RecurrentDecoderConfig(text_config=backbone, **{**TINY_RECURRENCE, "window_overlap": 3})
    return RecurrentDecoderForCausalLM(config).eval(), tokenizer


def tiny_inductive_bert() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return IBertForMaskedLM(tiny_inductive_bert_config()).eval(), word_level_tokenizer()


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
        hub: what the Hub tests push and pull (`tests/hub`).
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
    hub: Hub | None = None

    @property
    def model_type(self) -> str:
        return self.name

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


def named_decoder(name: str, tiny_config: Callable[..., PreTrainedConfig], classes: tuple, **saved_settings) -> Family:
    """A named recurrent decoder: the recurrence core's windows over a named backbone, h_prev in the window.

    `classes`: the bare model, the causal LM head, then the sequence and token classification heads.
    `saved_settings`: its own non-default settings, besides the window overlap and BPTT windows every one keeps."""
    base_class, head_class, *other_heads = classes
    return Family(
        name=name,
        tiny_config=tiny_config,
        base_class=base_class,
        head_class=head_class,
        head_auto_class=AutoModelForCausalLM,
        other_heads=tuple(other_heads),
        saved_settings={"window_overlap": 2, "bptt_windows": 3, **saved_settings},
        chunk_splits=(3, 11, 28, 29),
        remote_checks=GENERATES_PAST_THE_WINDOW,
        attention_columns=lambda config: 1 + config.window_size,  # h_prev, then the window's positions
        hub=windowed_hub(with_stdlib_tokenizer(head_class, tiny_config, window_overlap=3)),
    )


FAMILIES = [
    named_decoder(
        "recurrent_gpt2",
        tiny_recurrent_config,
        (
            RecurrentGPT2Model,
            RecurrentGPT2LMHeadModel,
            RecurrentGPT2ForSequenceClassification,
            RecurrentGPT2ForTokenClassification,
        ),
    ),
    named_decoder(
        "recurrent_llama",
        tiny_recurrent_llama_config,
        (
            RecurrentLlamaModel,
            RecurrentLlamaForCausalLM,
            RecurrentLlamaForSequenceClassification,
            RecurrentLlamaForTokenClassification,
        ),
        h_prev_rope_position=0,
        normalize_pooled_states=True,
        recurrence_input="zeros",
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
        hub=Hub(
            make=with_stdlib_tokenizer(TransformerXLLMHeadModel, tiny_transformer_xl_config),
            auto_class="AutoModelForCausalLM",
            pipeline_task="text-generation",
            pipeline_inputs="def read_segments(path):",
            pipeline_kwargs=GENERATE_40,
            reference_length=40,
            invalid_setting=("mem_len", -1),
            context_limit=lambda config: config.segment_length + config.mem_len,
        ),
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
        hub=Hub(
            make=tiny_inductive_bert,
            auto_class="AutoModelForMaskedLM",
            pipeline_task="fill-mask",
            pipeline_inputs="w5 w17 [MASK] w42 w8",
            pipeline_kwargs={"top_k": 3},
            # Longer than the unused 64-entry position table: I-BERT has no length limit.
            reference_length=80,
            invalid_setting=("hidden_size", 31),
        ),
    ),
]

STATEFUL_FAMILIES = [family for family in FAMILIES if family.stateful]
# The named recurrent decoders (GPT-2 and Llama): windows, h_prev, transformers' generic classification heads.
NAMED_DECODERS = [family for family in FAMILIES if family.name.startswith("recurrent_")]


@dataclass(frozen=True)
class Backbone:
    """A stock transformers decoder that `RecurrentDecoderForCausalLM` runs over, as one row of the backbone driver
    (`tests/models/recurrent_decoder/test_backbones_recurrent_decoder.py`).

    Args:
        name: the stock `model_type`.
        overrides: config fields of this family's tiny config besides `TINY_BACKBONE`.
        attn_implementation: the attention transformers itself picks for this family (Gemma2: eager, for its
            attention soft-cap).
        hub: what the Hub tests push and pull for the recurrence core over this backbone (`tests/hub`).
    """

    name: str
    overrides: dict = field(default_factory=dict)
    attn_implementation: str = "sdpa"
    hub: Hub | None = None

    @property
    def model_type(self) -> str:
        """The model type of the recurrent model over this backbone: the core's."""
        return RecurrentDecoderConfig.model_type

    def text_config(self, **overrides) -> PreTrainedConfig:
        """The tiny stock config of this row; `overrides` are further stock config fields (e.g. `hidden_size`)."""
        config = AutoConfig.for_model(self.name, **{**TINY_BACKBONE, **self.overrides, **overrides})
        config._attn_implementation = self.attn_implementation
        return config

    def models(self, text: dict | None = None, **settings) -> tuple[RecurrentDecoderForCausalLM, PreTrainedModel]:
        """The recurrent model (8-token windows, insertion layer 1, a recurrence network with random weights large
        enough that h_prev matters) and the stock model with the same backbone weights, both in eval mode. `text`:
        stock config fields of the backbone besides the row's; `settings`: recurrence settings."""
        torch.manual_seed(0)
        kwargs = {"window_size": 8, "insertion_layer": 1, "recurrence_hidden_sizes": [16], **settings}
        config = RecurrentDecoderConfig(text_config=self.text_config(**(text or {})), **kwargs)
        model = RecurrentDecoderForCausalLM(config).eval()
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for parameter in model.recurrence.parameters():
                parameter.normal_(0, 0.5, generator=generator)
        stock = AutoModelForCausalLM.from_config(self.text_config(**(text or {}))).eval()
        stock.load_state_dict(model.backbone.state_dict())
        return model, stock


BACKBONES = [
    Backbone("llama", GQA, hub=windowed_hub(tiny_recurrent_decoder)),
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

# The rows the Hub tests push and pull: every family and backbone row with a `hub` record.
HUB_ROWS = [row for row in (*FAMILIES, *BACKBONES) if row.hub is not None]
