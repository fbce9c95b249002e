"""The model families the Hub tests push and pull: adding a family is one entry in `HUB_FAMILIES`."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import LlamaConfig, PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from hf_recurrence import (
    IBertForMaskedLM,
    RecurrentDecoderConfig,
    RecurrentDecoderForCausalLM,
    RecurrentGPT2LMHeadModel,
    RecurrentLlamaForCausalLM,
    TransformerXLLMHeadModel,
)

from ..common import (
    TINY_LLAMA,
    stdlib_tokenizer,
    tiny_inductive_bert_config,
    tiny_recurrent_config,
    tiny_recurrent_llama_config,
    tiny_transformer_xl_config,
)
from ..models.inductive_bert.tokenizer import word_level_tokenizer


@dataclass(frozen=True)
class HubFamily:
    model_type: str
    # A tiny random model in eval mode, and the tokenizer its pipeline uses.
    make: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]
    auto_class: str
    pipeline_task: str
    pipeline_inputs: str
    pipeline_kwargs: dict
    # Length of the random input whose outputs the pulled model must reproduce; longer than the family's window,
    # segment or position table, so that the recurrence is exercised.
    reference_length: int
    # A recurrence setting and a value the family's config rejects with a ValueError naming the setting.
    invalid_setting: tuple[str, object]
    # For generation: the length the non-recurrent architecture cannot read past (generation must go beyond it).
    context_limit: Callable[[PreTrainedConfig], int] | None = None


def tiny_recurrent_gpt2() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = stdlib_tokenizer()
    config = tiny_recurrent_config(vocab_size=len(tokenizer), window_overlap=3)
    return RecurrentGPT2LMHeadModel(config).eval(), tokenizer


def tiny_recurrent_llama() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = stdlib_tokenizer()
    config = tiny_recurrent_llama_config(vocab_size=len(tokenizer), window_overlap=3)
    return RecurrentLlamaForCausalLM(config).eval(), tokenizer


def tiny_recurrent_decoder() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = stdlib_tokenizer()
    backbone = LlamaConfig(**{**TINY_LLAMA, "vocab_size": len(tokenizer)})
    config = RecurrentDecoderConfig(
        text_config=backbone, window_size=8, window_overlap=3, insertion_layer=1, recurrence_hidden_sizes=[16, 16]
    )
    return RecurrentDecoderForCausalLM(config).eval(), tokenizer


def tiny_inductive_bert() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return IBertForMaskedLM(tiny_inductive_bert_config()).eval(), word_level_tokenizer()


def tiny_transformer_xl() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = stdlib_tokenizer()
    config = tiny_transformer_xl_config(vocab_size=len(tokenizer))
    return TransformerXLLMHeadModel(config).eval(), tokenizer


HUB_FAMILIES = [
    HubFamily(
        model_type="inductive_bert",
        make=tiny_inductive_bert,
        auto_class="AutoModelForMaskedLM",
        pipeline_task="fill-mask",
        pipeline_inputs="w5 w17 [MASK] w42 w8",
        pipeline_kwargs={"top_k": 3},
        # Longer than the unused 64-entry position table: I-BERT has no length limit.
        reference_length=80,
        invalid_setting=("hidden_size", 31),
    ),
    *(
        HubFamily(
            model_type=model_type,
            make=make,
            auto_class="AutoModelForCausalLM",
            pipeline_task="text-generation",
            pipeline_inputs="def read_windows(path):",
            # min_new_tokens keeps a random model from stopping early at its end-of-text token.
            pipeline_kwargs={"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False, "return_tensors": True},
            reference_length=48,
            invalid_setting=("window_size", 0),
            # The backbone's position table, which the recurrent model reads past.
            context_limit=lambda config: config.text_config.max_position_embeddings,
        )
        for model_type, make in (
            ("recurrent_gpt2", tiny_recurrent_gpt2),
            ("recurrent_llama", tiny_recurrent_llama),
            ("recurrent_decoder", tiny_recurrent_decoder),
        )
    ),
    HubFamily(
        model_type="transformer_xl",
        make=tiny_transformer_xl,
        auto_class="AutoModelForCausalLM",
        pipeline_task="text-generation",
        pipeline_inputs="def read_segments(path):",
        pipeline_kwargs={"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False, "return_tensors": True},
        reference_length=40,
        invalid_setting=("mem_len", -1),
        context_limit=lambda config: config.segment_length + config.mem_len,
    ),
]
