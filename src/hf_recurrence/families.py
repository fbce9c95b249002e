"""The package's model families, in one list: what the code outside the model folders needs to know of each (its
model card, how evaluation reads a long text, PEFT's default targets, what `convert` makes it from).

The model folders stay self-contained (remote code cannot import this package), so the facts that are not a folder's
own live here. Adding a family: its folder under `models/`, registered with the Auto classes, and one entry in
`FAMILIES`.
"""

from dataclasses import dataclass
from typing import Literal

import transformers
from transformers import PreTrainedConfig, PreTrainedModel

# From the model folders themselves: mypy cannot read the `__all__` that `hf_recurrence.models` re-exports.
from .models.inductive_bert import InductiveBertConfig
from .models.recurrent_decoder import RecurrentDecoderConfig, RecurrentGPT2Config, RecurrentLlamaConfig
from .models.transformer_xl import TransformerXLConfig


@dataclass(frozen=True)
class Paper:
    """A paper a family implements, cited on its model cards."""

    authors: tuple[str, ...]
    title: str
    year: int
    arxiv: str

    @property
    def url(self) -> str:
        return f"https://arxiv.org/abs/{self.arxiv}"

    @property
    def short_authors(self) -> str:
        surnames = [author.split()[-1] for author in self.authors]
        if len(surnames) > 3:
            return f"{surnames[0]} et al."
        return " and ".join([", ".join(surnames[:-1]), surnames[-1]]) if len(surnames) > 1 else surnames[0]

    def bibtex(self) -> str:
        key = f"{self.authors[0].split()[-1].lower()}{self.year}"
        return (
            f"@article{{{key},\n"
            f"  title = {{{self.title}}},\n"
            f"  author = {{{' and '.join(self.authors)}}},\n"
            f"  journal = {{arXiv preprint arXiv:{self.arxiv}}},\n"
            f"  year = {{{self.year}}}\n"
            "}"
        )


@dataclass(frozen=True)
class Family:
    """One model family: its config class and what the package says and does about it."""

    config_class: type[PreTrainedConfig]
    # What its model cards say: its name, paper, pipeline and the Auto class that loads its head model.
    name: str
    paper: Paper
    pipeline_tag: str
    auto_class: str
    # How evaluation reads a long document: in the model's own windows with the recurrent state carried ("windows"),
    # in segments with Transformer-XL's memory ("segments"), or as independent inputs (None).
    reads: Literal["windows", "segments"] | None
    # The stock model type whose module names the family keeps: PEFT's defaults for it apply unchanged, and `convert`
    # makes this family from it by default.
    stock_model_type: str | None = None
    # PEFT's default LoRA targets, for a family with names of its own (no `stock_model_type`).
    lora_target_modules: tuple[str, ...] | None = None

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def head_model_class(self) -> type[PreTrainedModel]:
        """The class its Auto class (`auto_class`) registered for it: the model its cards and `convert` speak of."""
        return getattr(transformers, self.auto_class)._model_mapping[self.config_class]


# The paper the recurrent GPT-2, the recurrent Llama and the recurrent decoder implement.
RECURRENCE_PAPER = Paper(
    authors=("Davis Yoshida", "Allyson Ettinger", "Kevin Gimpel"),
    title="Adding Recurrence to Pretrained Transformers for Improved Efficiency and Context Size",
    year=2020,
    arxiv="2008.07027",
)


def _recurrent_decoder(config_class: type[PreTrainedConfig], name: str, **facts) -> Family:
    return Family(
        config_class,
        name=name,
        paper=RECURRENCE_PAPER,
        pipeline_tag="text-generation",
        auto_class="AutoModelForCausalLM",
        reads="windows",
        **facts,
    )


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        # The core runs over several stock decoders under one model type: the attention projections PEFT's LoRA
        # defaults name for them (Llama-like q_proj/v_proj, Phi3's fused qkv_proj, GPT-2's c_attn); PEFT adapts
        # whichever a backbone has.
        _recurrent_decoder(
            RecurrentDecoderConfig, "Recurrent decoder", lora_target_modules=("q_proj", "v_proj", "qkv_proj", "c_attn")
        ),
        _recurrent_decoder(RecurrentGPT2Config, "Recurrent GPT-2", stock_model_type="gpt2"),
        _recurrent_decoder(RecurrentLlamaConfig, "Recurrent Llama", stock_model_type="llama"),
        Family(
            InductiveBertConfig,
            name="I-BERT (inductive BERT)",
            paper=Paper(
                authors=("Hyoungwook Nam", "Seung Byum Seo", "Vikram Sharma Mailthody", "Noor Michael", "Lan Li"),
                title="I-BERT: Inductive Generalization of Transformer to Arbitrary Context Lengths",
                year=2020,
                arxiv="2006.10220",
            ),
            pipeline_tag="fill-mask",
            auto_class="AutoModelForMaskedLM",
            reads=None,
            stock_model_type="bert",
        ),
        Family(
            TransformerXLConfig,
            name="Transformer-XL",
            paper=Paper(
                authors=(
                    "Zihang Dai",
                    "Zhilin Yang",
                    "Yiming Yang",
                    "Jaime Carbonell",
                    "Quoc V. Le",
                    "Ruslan Salakhutdinov",
                ),
                title="Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
                year=2019,
                arxiv="1901.02860",
            ),
            pipeline_tag="text-generation",
            auto_class="AutoModelForCausalLM",
            reads="segments",
            # No stock counterpart in transformers 5: its attention input projection, as c_attn is GPT-2's.
            lora_target_modules=("qkv_net",),
        ),
    )
}


def model_types_reading(reads: str) -> tuple[str, ...]:
    """The model types whose evaluation reads a long document `reads` ("windows" or "segments")."""
    return tuple(model_type for model_type, family in FAMILIES.items() if family.reads == reads)


__all__ = ["FAMILIES", "RECURRENCE_PAPER", "Family", "Paper", "model_types_reading"]
