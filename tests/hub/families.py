"""The model families the Hub tests push and pull: adding a family is one entry in `HUB_FAMILIES`."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from hf_recurrence import RecurrentGPT2LMHeadModel

from ..common import stdlib_tokenizer, tiny_recurrent_config


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


HUB_FAMILIES = [
    HubFamily(
        model_type="recurrent_gpt2",
        make=tiny_recurrent_gpt2,
        auto_class="AutoModelForCausalLM",
        pipeline_task="text-generation",
        pipeline_inputs="def read_windows(path):",
        # min_new_tokens keeps a random model from stopping early at its end-of-text token.
        pipeline_kwargs={"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False, "return_tensors": True},
        reference_length=48,
        invalid_setting=("window_size", 0),
        context_limit=lambda config: config.n_positions,
    ),
]
