"""The recurrence paper's claim on a real pretrained decoder, with a control (`hf-recurrence reproduce --preset smollm2`
or `--preset gemma3`).

From SmolLM2-135M, Gemma 3 270M base, or any stock causal LM the recurrence core runs over (a folder, or a GGUF file
of a supported model type), and Jane Austen's novels (`hf_recurrence.data.austen_split`: the held-out books were
fixed, with their sha256, before any tuning), three arms share one frozen backbone:

- **baseline**: the stock model (`AutoModelForCausalLM`), each window read from scratch;
- **recurrent**: the paper's recurrence over a copy of the same weights (`RecurrentDecoderForCausalLM`: window
  summary -> FFN -> `h_prev`, one extra key/value), only its weights trained, with backpropagation through the
  windows of each training block;
- **control**: the same recurrence module with its input zeroed (`recurrence_input="zeros"`), trained the same way on
  the same blocks in the same order: a learned constant `h_prev`, i.e. a one-token learned prefix.

`--backbone lora` or `full` adapts the backbone in every arm, the baseline included (the paper fine-tunes GPT-2 in
both arms): the same backbone parameters (LoRA adapters on the chosen layers, or every weight), at their own learning
rate, on the same blocks in the same order for the same steps; the baseline reads each block's windows independently.
With the backbone frozen, the baseline has nothing to train (equal steps on the same tokens leave it unchanged).
The recurrence is reported as a decomposition: the control is what a trained module gains without carried context
(*control minus baseline*: a learned constant key/value), *recurrent minus control* is the gain from carried context,
and the recurrent arm read with every row's `h_prev` taken from another document (*shuffled*) says how much of that
gain is specific to the text actually read. All arms are read on the same fixed prefixes of the held-out books with windowed perplexity (baseline at
every overlap, the recurrent arms at the overlap they were trained with, 0), paired bootstrap intervals over
document segments, the mean NLL by position inside the window, and the Figure 5-shaped perplexity against FLOPs.
"""

import copy
import json
import math
import re
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    set_seed,
)
from transformers.pytorch_utils import Conv1D

from ..data import TokenBlocks, WindowedBlocksCollator, token_stream
from ..data.books import BOOK_SPLITS, austen_split, write_austen_split_manifest
from ..data.fact_probe import FactProbe, FactProbeCurriculum, fact_nll
from ..evaluation import (
    RECURRENT_MODEL_TYPES,
    TokenNLL,
    WindowedPerplexity,
    WindowPrefixed,
    flops_per_token,
    plot_perplexity_vs_flops,
    windowed_perplexity,
    write_report,
)
from ..evaluation.carried import TokenWords, carried_token_mask, token_words
from ..evaluation.flops import has_flops_count
from ..evaluation.perplexity import RECURRENT_CHUNK_TOKENS
from ..evaluation.report import plot_nll_by_window_position
from ..evaluation.statistics import compare, describe, nll_by_window_position, segment_sums
from ..models import RecurrentDecoderForCausalLM
from ..models.recurrent_decoder.configuration_recurrent_decoder import RecurrenceSettings
from ..outputs import UsageError, prepare_output_dir, write_atomically
from ..weights import (
    gemma3_270m_gguf_path,
    load_causal_lm_from_gguf,
    recurrent_decoder_from_causal_lm,
    smollm2_gguf_path,
)
from .reproduction import TRAINED_ARMS, findings, finish_run, overlap_tokens, report_header
from .training import RunProgress, TrainingCheckpoints, fine_tune


# What the book reproduction writes into its output folder (removed first under --overwrite).
BOOK_REPORT_FILES = (
    "results.json",
    "results.md",
    "perplexity_vs_flops.png",
    "nll_by_window_position.png",
    "split.json",
    "recurrence_*.safetensors",
    "checkpoint.json",
    "checkpoint.safetensors",
    "training_*",
)

# What `--resume` continues from: the settings, the stages finished and what they recorded (rows, extra fields;
# token NLLs in the .safetensors beside it), rewritten after each stage.
CHECKPOINT = "checkpoint.json"

# The reference rows' prompt: this project's own sentence of plain narrative prose, read before every window.
REFERENCE_PROMPT = (
    "The morning was fine and the house was quiet; she sat by the window with a letter in her hand and thought "
    "about what her sister had said."
)

# What every window of every arm begins with: the bare text (the paper), or the special tokens the tokenizer puts
# before a text (`text_start_tokens`: Gemma's <bos>, without which stock Gemma 3 reads a window at perplexity 260
# instead of 36 on the validation book).
WINDOW_STARTS = ("bare", "text_start")
# What `--backbone` may train in every arm.
BACKBONE_SETTINGS = ("frozen", "lora", "full")
# How the recurrence FFN of the trained arms starts (`fan_in_init_`).
RECURRENCE_INITS = ("model", "fan_in")

# The installed pretrained models `model_name_or_path` may name instead of a path: name -> their GGUF file's path
# (assembled or located on first use; an ImportError/FileNotFoundError with the pip command when not installed).
NAMED_MODELS = {"smollm2-135m": smollm2_gguf_path, "gemma3-270m": gemma3_270m_gguf_path}

# Memories beyond the paper's one mean-pooled slot (issue 39) that `memory` may name: k attention slots, or k selected
# tokens, read at every layer (`memory_read_layers="all"`, resolved against the model by `recurrent_arm`). Any other
# memory is given as a JSON object of `RecurrentDecoderConfig` fields.
MEMORY_PRESETS = {
    "attention": {"memory_slots": 4, "memory_pooling": "attention", "memory_read_layers": "all"},
    "select": {"memory_slots": 4, "memory_pooling": "select", "memory_read_layers": "all"},
}

# The recurrence settings a run sets for its trained arms from its own options (`recurrence_settings`).
RUN_RECURRENCE_SETTINGS = ("window_size", "window_overlap", "insertion_layer", "normalize_pooled_states")

# Positions predicted fewer times than this are left out of the NLL-by-position means (overlap > 0 re-reads them).
# The validation book's 12,000 tokens predict each position of a 128-token window 93 times.
MIN_TOKENS_PER_POSITION = 50


@dataclass
class BookReproductionSettings:
    """What the SmolLM2 / long-books reproduction trains and evaluates. Overlaps are fractions of the window."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A stock causal LM's folder or .gguf file (any model type the recurrence core runs over), or an "
            f"installed model: {', '.join(NAMED_MODELS)} (None: smollm2-135m)."
        },
    )
    window_size: int = field(default=128, metadata={"help": "Tokens per window T."})
    overlap_fractions: Sequence[float] = field(
        default=(0.0, 0.125, 0.25, 0.5),
        metadata={"help": "Baseline overlaps as fractions of T; must include 0 (the recurrent arms read at 0)."},
    )
    windows_per_block: int = field(
        default=4,
        metadata={
            "help": "Windows per training block; gradient crosses their boundaries (backpropagation through time)."
        },
    )
    batch_size: int = field(default=4, metadata={"help": "Blocks per optimizer step."})
    max_steps: int = field(default=200, metadata={"help": "Optimizer steps per trained arm."})
    learning_rate: float = field(
        default=1e-3, metadata={"help": "Peak learning rate of the recurrence module (linear warm-up, cosine decay)."}
    )
    backbone: str = field(
        default="frozen",
        metadata={
            "help": "What every arm, the baseline included, trains of the backbone: frozen (nothing), lora (LoRA "
            "adapters) or full (every weight)."
        },
    )
    backbone_learning_rate: float = field(
        default=1e-4, metadata={"help": "Peak learning rate of the backbone's trained parameters (lora, full)."}
    )
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank (backbone lora)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (backbone lora)."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Linear layers given LoRA adapters (backbone lora), by name inside a decoder layer (q_proj, "
            "down_proj, ...); None: every linear layer of a decoder layer."
        },
    )
    lora_first_layer: int | None = field(
        default=None,
        metadata={"help": "First decoder layer given adapters, every layer from it up (None: the insertion layer)."},
    )
    reference_prompt: str = field(
        default=REFERENCE_PROMPT,
        metadata={
            "help": "Prose the reference row's stock model reads before every window, encoded as the tokenizer begins "
            "a text (the other reference row reads the tokenizer's BOS token, else its EOS token)."
        },
    )
    window_start: str = field(
        default="bare",
        metadata={
            "help": "What every window of every arm begins with: bare (the text alone, as in the paper) or text_start "
            "(the special tokens its tokenizer puts before a text, e.g. Gemma's <bos>: read, never predicted; the "
            "recurrent arms' windows grow by as many positions, their h_prev pooled over them too)."
        },
    )
    bf16: bool = field(
        default=False,
        metadata={
            "help": "Train under bfloat16 autocast (weights and evaluation stay float32; CPUs with AVX512-BF16)."
        },
    )
    recurrence_init: str = field(
        default="model",
        metadata={
            "help": "How the recurrence FFN starts: model (the model's own init, weights N(0, 0.02): the window's "
            "signal shrinks about 3x per layer, and a trained h_prev stays nearly a constant) or fan_in (weights "
            "N(0, gain^2 / fan_in), biases 0: each layer keeps its input's scale)."
        },
    )
    memory: str | None = field(
        default=None,
        metadata={
            "help": f"The trained arms' memory: {' or '.join(MEMORY_PRESETS)} (4 slots read at every layer), or a "
            'JSON object of memory settings, e.g. \'{"memory_slots": 2, "memory_pooling": "attention"}\' (None: the '
            "paper's one mean-pooled slot)."
        },
    )
    probe_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of every arm's training blocks that are name-probe blocks, in [0, 1]: an invented name "
            "planted in a block's second-to-last window and asked for at the end of its last, only the name labelled "
            "(`FactProbeCurriculum`: the plant next to the boundary first); the rest are language-model blocks at "
            "random offsets of the training books, each batch all of one kind (the loss is a mean over a batch's "
            "labelled tokens, in which a few name tokens beside whole blocks of text would weigh next to nothing). A "
            "training signal a constant memory cannot satisfy. The trained arms' name recall is then scored on the "
            "validation book, with their own and another example's memory (0: the recorded protocol, consecutive "
            "blocks of the books, no probe)."
        },
    )
    warmup_steps: int = field(default=10, metadata={"help": "Warm-up steps."})
    insertion_layer: int = field(default=2, metadata={"help": "Layer that receives h_prev."})
    normalize_pooled_states: bool = field(
        default=True, metadata={"help": "Scale token states to unit RMS before pooling (true/false)."}
    )
    eval_split: str = field(
        default="test", metadata={"help": "Austen split to evaluate on: test, validation or train."}
    )
    eval_tokens_per_book: int | None = field(
        default=12_000, metadata={"help": "Tokens of each held-out book's beginning to read (None: the whole book)."}
    )
    eval_passages_per_book: int = field(
        default=2,
        metadata={
            "help": "Consecutive passages each held-out book's read tokens are cut into, each read as its own document "
            "(a row): the shuffled control needs two documents, and the validation split holds one book."
        },
    )
    segment_tokens: int = field(default=512, metadata={"help": "Predicted tokens per bootstrap segment."})
    num_resamples: int = field(default=10_000, metadata={"help": "Bootstrap resamples."})
    seed: int = field(default=0, metadata={"help": "Random seed."})

    def __post_init__(self):
        for name in (
            "window_size",
            "windows_per_block",
            "batch_size",
            "max_steps",
            "eval_passages_per_book",
            "segment_tokens",
            "num_resamples",
            "lora_rank",
            "lora_alpha",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a positive integer, got {name}={value!r}")
        for name, choices in (
            ("backbone", BACKBONE_SETTINGS),
            ("recurrence_init", RECURRENCE_INITS),
            ("window_start", WINDOW_STARTS),
            ("eval_split", BOOK_SPLITS),
        ):
            if getattr(self, name) not in choices:
                raise UsageError(f"{name} must be one of {choices}, got {name}={getattr(self, name)!r}")
        if self.window_size < 2:
            raise UsageError(f"window_size must be at least 2, got window_size={self.window_size}")
        memory_settings(self.memory)  # a bad spec refused before anything loads
        if isinstance(self.probe_fraction, bool) or not 0 <= self.probe_fraction <= 1:
            raise UsageError(f"probe_fraction must lie in [0, 1], got probe_fraction={self.probe_fraction!r}")
        for name in ("learning_rate", "backbone_learning_rate"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive, got {name}={getattr(self, name)!r}")
        # Which names exist depends on the model's family: checked against it once it is loaded (`lora_targets`).
        if self.lora_target_modules is not None and not self.lora_target_modules:
            raise UsageError("lora_target_modules must name at least one linear layer, or be left unset")
        if self.eval_tokens_per_book is not None and self.eval_tokens_per_book < self.window_size + 1:
            raise UsageError(
                f"eval_tokens_per_book must be more than one window (window_size={self.window_size}) or unset, got "
                f"eval_tokens_per_book={self.eval_tokens_per_book}"
            )
        if 0.0 not in self.overlap_fractions:
            raise UsageError(
                f"overlap_fractions must include 0 (the recurrent arms are compared at overlap 0), got "
                f"{list(self.overlap_fractions)}"
            )
        bad = [
            f
            for f in self.overlap_fractions
            if not 0 <= f < 1 or overlap_tokens(self.window_size, f) >= self.window_size
        ]
        if bad:
            raise UsageError(
                f"overlap_fractions={bad} leave no new token per window at window size {self.window_size}; each must "
                "lie in [0, 1) and round to fewer tokens than the window"
            )

    def recurrence_settings(self, num_start_tokens: int = 0) -> dict:
        """The trained arms' `RecurrentDecoderConfig` fields; their windows hold `num_start_tokens` more positions."""
        return {
            "window_size": self.window_size + num_start_tokens,
            "window_overlap": 0,
            "insertion_layer": self.insertion_layer,
            "normalize_pooled_states": self.normalize_pooled_states,
            **memory_settings(self.memory),
        }


def memory_settings(memory: str | None) -> dict:
    """The `RecurrentDecoderConfig` memory fields `memory` names: {} for None (the paper's), a preset
    (`MEMORY_PRESETS`) or a JSON object; `UsageError` names anything else."""
    if memory is None:
        return {}
    if memory in MEMORY_PRESETS:
        return dict(MEMORY_PRESETS[memory])
    try:
        settings = json.loads(memory)
    except json.JSONDecodeError:
        settings = None
    if not isinstance(settings, dict):
        raise UsageError(f"memory must be one of {sorted(MEMORY_PRESETS)} or a JSON object, got memory={memory!r}")
    check_recurrence_fields(settings, f"memory={memory!r}")
    owned = sorted(set(settings) & {*RUN_RECURRENCE_SETTINGS, "recurrence_input"})
    if owned:
        raise UsageError(
            f"memory={memory!r} sets {owned}, which the run sets for every trained arm (their own options, and "
            "recurrence_input by arm)"
        )
    return settings


def check_recurrence_fields(settings: dict, owner: str) -> None:
    """Refuse names that are not the recurrence core's own settings, which its config would drop without a word (a
    misspelt `memory_slot` would run the paper's memory)."""
    known = {setting.name for setting in fields(RecurrenceSettings)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UsageError(f"{owner}: {unknown} are not recurrence settings; these are: {', '.join(sorted(known))}")


def with_read_layers_resolved(settings: dict, num_layers: int) -> dict:
    """`settings` with `memory_read_layers="all"` given as every layer's index (0 .. `num_layers` - 1)."""
    if settings.get("memory_read_layers") == "all":
        return {**settings, "memory_read_layers": list(range(num_layers))}
    return dict(settings)


def load_causal_lm(model_name_or_path: str | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The float32 stock causal LM (`AutoModelForCausalLM`), its tokenizer and a description of where they came from:
    a folder, a GGUF file (de-quantised), or one of `NAMED_MODELS` (SmolLM2-135M's GGUF by default)."""
    name = model_name_or_path if model_name_or_path is not None else "smollm2-135m"
    path = NAMED_MODELS[name]() if name in NAMED_MODELS else Path(name)
    if path.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        return load_causal_lm_from_gguf(path, AutoModelForCausalLM), tokenizer, str(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(path), str(path)


def recurrent_arm(stock: PreTrainedModel, **recurrence_settings) -> RecurrentDecoderForCausalLM:
    """The recurrence core over a copy of `stock`'s weights: every trained arm, whatever the family (a Llama too, so
    that SmolLM2 and Gemma runs differ in nothing but the model). `memory_read_layers="all"` names every layer."""
    return recurrent_decoder_from_causal_lm(
        stock, **with_read_layers_resolved(recurrence_settings, num_decoder_layers(stock))
    )


def held_out_documents(
    settings: BookReproductionSettings, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[torch.Tensor], list[dict]]:
    """The held-out documents, and what was read of each book (title, sha256, tokens, passages): each book's fixed
    prefix cut into `eval_passages_per_book` consecutive passages, ordered passage by passage (the first passage of
    every book, then the second ...), so that a document's neighbour row comes from another book where the split
    has several."""
    documents, _, read = held_out_documents_and_words(settings, tokenizer)
    return documents, read


def held_out_documents_and_words(
    settings: BookReproductionSettings, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[torch.Tensor], list[TokenWords], list[dict]]:
    """`held_out_documents`, with the word each document's tokens overlap (`token_words`, for the carried tokens)."""
    passages, words, read = [], [], []
    for book in austen_split(settings.eval_split):
        encoding = tokenizer(book.text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoding["input_ids"]
        end = settings.eval_tokens_per_book or len(ids)
        prefix = torch.tensor(ids[:end])
        if len(prefix) < settings.eval_passages_per_book * (settings.window_size + 1):
            raise UsageError(
                f"{book.title}: {len(prefix):,} tokens read cannot make eval_passages_per_book="
                f"{settings.eval_passages_per_book} passages of more than one window (window_size="
                f"{settings.window_size}) each"
            )
        passages.append(prefix.tensor_split(settings.eval_passages_per_book))
        words.append(token_words(book.text, encoding["offset_mapping"][:end]).split(settings.eval_passages_per_book))
        read.append(
            {
                "title": book.title,
                "sha256": book.sha256,
                "book_tokens": len(ids),
                "tokens_read": len(prefix),
                "passages": settings.eval_passages_per_book,
            }
        )
    order = [(book, i) for i in range(settings.eval_passages_per_book) for book in range(len(passages))]
    return [passages[b][i] for b, i in order], [words[b][i] for b, i in order], read


def decoder_linear_layers(model: PreTrainedModel) -> list[str]:
    """The names, inside one decoder layer, of the stock model's linear layers (Llama and Gemma 3: q_proj ...
    down_proj; Phi-3: qkv_proj, gate_up_proj ...; GPT-2's Conv1D: c_attn, c_proj, c_fc), in module order. A module
    counts when its path holds a layer index (`model.layers.3.self_attn.q_proj`), which leaves out the LM head."""
    names = []
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear | Conv1D) and re.search(r"\.\d+\.", path) and "recurrence" not in path:
            leaf = path.rsplit(".", 1)[-1]
            if leaf not in names:
                names.append(leaf)
    return names


def lora_targets(settings: BookReproductionSettings, model: PreTrainedModel) -> list[str]:
    """LoRA's target modules for `model`: `lora_target_modules`, checked against its decoder layers' linear layers,
    or all of them when unset."""
    available = decoder_linear_layers(model)
    if settings.lora_target_modules is None:
        return available
    unknown = sorted(set(settings.lora_target_modules) - set(available))
    if unknown:
        raise UsageError(
            f"lora_target_modules must name some of this model's {available}, got {list(settings.lora_target_modules)}"
        )
    return list(settings.lora_target_modules)


def lora_layers(settings: BookReproductionSettings, num_layers: int) -> list[int]:
    """The decoder layers given LoRA adapters: from `lora_first_layer` (default: the insertion layer) up."""
    first = settings.insertion_layer if settings.lora_first_layer is None else settings.lora_first_layer
    if not 0 <= first < num_layers:
        raise UsageError(f"lora_first_layer must be a layer of the model (0 to {num_layers - 1}), got {first}")
    return list(range(first, num_layers))


def adapt_backbone(model: PreTrainedModel, settings: BookReproductionSettings) -> tuple[nn.Module, list[dict]]:
    """Make trainable what the arm trains: its recurrence module (if any) and what `settings.backbone` names of
    the backbone. Returns the model to train (PEFT's wrapper for `lora`) and its AdamW parameter groups: the
    recurrence at `learning_rate`, the backbone at `backbone_learning_rate`; empty when nothing is trained."""
    model.requires_grad_(settings.backbone == "full")
    if settings.backbone == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=settings.lora_rank,
            lora_alpha=settings.lora_alpha,
            lora_dropout=0.0,
            target_modules=lora_targets(settings, model),
            layers_to_transform=lora_layers(settings, num_decoder_layers(model)),
        )
        model = get_peft_model(model, lora)
    recurrence, backbone = [], []
    for name, parameter in model.named_parameters():
        if ".recurrence." in f".{name}":  # `recurrence.*`, or under PEFT's wrapper
            parameter.requires_grad_(True)
            recurrence.append(parameter)
        elif parameter.requires_grad:
            backbone.append(parameter)
    groups = [
        {"params": recurrence, "lr": settings.learning_rate},
        {"params": backbone, "lr": settings.backbone_learning_rate},
    ]
    return model, [group for group in groups if group["params"]]


def num_decoder_layers(model: PreTrainedModel) -> int:
    """Decoder layers of a stock model or of the recurrence core over one (its `text_config`)."""
    config = getattr(model.config, "text_config", None) or model.config
    return config.num_hidden_layers


def train_arm(
    stock: PreTrainedModel,
    recurrence_input: str | None,
    data: list[int] | Dataset,
    settings: BookReproductionSettings,
    window_start_ids: Sequence[int] = (),
    callbacks: Sequence[TrainerCallback] = (),
    checkpoints: TrainingCheckpoints | None = None,
    **config_overrides,
) -> tuple[PreTrainedModel, float | None, float]:
    """One arm on a copy of `stock`, trained with the stock Trainer; returns the model (LoRA merged in), the final
    training loss (None if nothing was trained: the baseline on a frozen backbone) and the minutes taken. Every arm
    sees the same blocks in the same order; the baseline (`recurrence_input=None`, the stock model) reads each
    block's windows independently.

    `data`: a token stream, cut into blocks of `windows_per_block` windows, or a dataset of such blocks (with their
    labels, e.g. a `FactProbe`).

    `window_start_ids`: read before every window of the arm (`window_start="text_start"`), never predicted; a
    recurrent arm's windows are that many positions longer.

    `callbacks`: the Trainer's (a `RunProgress` pace).

    `checkpoints`: keep the training resumable in its folder and continue from the checkpoint it holds; the minutes
    returned are then every sitting's.

    `config_overrides`: further `RecurrentDecoderConfig` fields (e.g. `h_prev_rope_position=-1`) for ablations.
    """
    set_seed(settings.seed)  # the recurrence module's initialisation: the same for every arm
    starts = tuple(window_start_ids)
    if recurrence_input is None:
        model, collator = copy.deepcopy(stock), WindowedBlocksCollator(settings.window_size, window_start_ids=starts)
    else:
        recurrence = {
            **settings.recurrence_settings(len(starts)),
            "recurrence_input": recurrence_input,
            **config_overrides,
        }
        model = recurrent_arm(stock, **recurrence)
        # Without start ids the recurrent model reads the blocks as they are.
        collator = (
            WindowedBlocksCollator(settings.window_size, window_start_ids=starts, independent_windows=False)
            if starts
            else None
        )
        if settings.recurrence_init == "fan_in":
            fan_in_init_(model.recurrence)
    trained, groups = adapt_backbone(model, settings)
    if not groups:
        return model.eval(), None, 0.0
    blocks = (
        data if isinstance(data, Dataset) else TokenBlocks(data, settings.windows_per_block * settings.window_size)
    )
    start = time.perf_counter()
    loss = fine_tune(
        trained,
        blocks,
        settings,
        collator=collator,
        parameter_groups=groups,
        bf16=settings.bf16,
        callbacks=callbacks,
        checkpoints=checkpoints,
    )
    minutes = checkpoints.minutes() if checkpoints is not None else (time.perf_counter() - start) / 60
    if trained is not model:  # PEFT's wrapper: LoRA merged into the weights, the plain model back
        trained = trained.merge_and_unload()
    return trained.requires_grad_(False).eval(), loss, minutes


def fan_in_init_(recurrence: nn.Module) -> None:
    """Weights N(0, gain^2 / fan_in) and zero biases for the recurrence FFN's linear layers (gain sqrt(2) before an
    activation, 1 for the last layer): every layer keeps its input's scale, so the part of `h_prev` that depends on
    the window starts as large as the constant its biases can learn (Adam moves a bias as fast as a weight)."""
    linears = [module for module in recurrence.ffn if isinstance(module, nn.Linear)]
    with torch.no_grad():
        for index, layer in enumerate(linears):
            gain = 1.0 if index == len(linears) - 1 else math.sqrt(2.0)
            layer.weight.normal_(0.0, gain / math.sqrt(layer.in_features))
            layer.bias.zero_()


def reference_prefixes(tokenizer: PreTrainedTokenizerBase, settings: BookReproductionSettings) -> dict[str, list[int]]:
    """The no-training reference rows' prefixes: one BOS-like token, and `settings.reference_prompt` as the tokenizer
    begins a text (after the special tokens it puts first, such as Gemma's `<bos>`; none for SmolLM2)."""
    special = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    # A prompt read without the token its model always starts text with is no fair reference: Gemma 3 base, given
    # the bare prompt, read the test books' windows at perplexity 221, against 53 after its BOS alone.
    prompt = text_start_tokens(tokenizer) + tokenizer(settings.reference_prompt, add_special_tokens=False)["input_ids"]
    prefixes = {"stock+bos": [] if special is None else [special], "stock+prompt": prompt}
    return {name: ids for name, ids in prefixes.items() if ids}


def window_start_ids(settings: BookReproductionSettings, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """What every window of every arm begins with under `settings.window_start`: nothing, or the tokenizer's
    `text_start_tokens` (refused, as a usage error, when it puts none before a text)."""
    if settings.window_start == "bare":
        return []
    starts = text_start_tokens(tokenizer)
    if not starts:
        raise UsageError(
            "window_start='text_start' needs a tokenizer that puts a special token before a text (as Gemma's puts "
            "<bos>); this one puts none: use window_start='bare'"
        )
    return starts


def read_windows(
    model: PreTrainedModel,
    documents: list[torch.Tensor],
    window_size: int,
    overlap: int,
    window_start_ids: Sequence[int],
) -> WindowedPerplexity:
    """`windowed_perplexity` of every document (all of them rows of one batch, so that the shuffled read takes
    `h_prev` from another row), each window of `window_size` text tokens begun by `window_start_ids` when given: a
    stock model reads them before every window (`WindowPrefixed`, its FLOPs counted with them), a recurrent arm as the
    first positions of its own windows (`read_recurrent_with_window_starts`)."""
    if window_start_ids and isinstance(model, RecurrentDecoderForCausalLM):
        return read_recurrent_with_window_starts(model, documents, window_size, window_start_ids)
    reader = WindowPrefixed(model, window_start_ids) if window_start_ids else model
    result = windowed_perplexity(
        reader, documents, window_size, overlap, batch_size=len(documents), return_token_nll=True
    )
    if window_start_ids and has_flops_count(model.config):
        starts = len(window_start_ids)
        result.flops_per_token = flops_per_token(model.config, window_size + starts, overlap + starts)
    return result


def read_recurrent_with_window_starts(
    model: RecurrentDecoderForCausalLM,
    documents: list[torch.Tensor],
    window_size: int,
    window_start_ids: Sequence[int],
    show_progress: bool = True,
) -> WindowedPerplexity:
    """What `windowed_perplexity` gives at overlap 0 for a recurrent arm whose every window of `window_size` text
    tokens begins with `window_start_ids` (its `config.window_size` counts both): each document read with its start
    ids put before each window, and every text token but the first predicted once, from the position of the text
    token before it (a window's first token from the previous window's last, as without start ids). The start ids
    predict nothing. The documents are the rows of one batch, read through the model's state."""
    starts = len(window_start_ids)
    width = window_size + starts
    if (model.config.window_size, model.config.window_overlap) != (width, 0):
        raise ValueError(
            f"window_size={window_size} text tokens after {starts} start id(s) needs a recurrent model with "
            f"window_size={width} and window_overlap=0, got {model.config.window_size} and "
            f"{model.config.window_overlap}"
        )
    device = model.device
    documents = [document.to(device) for document in documents]
    start = torch.as_tensor(list(window_start_ids), device=device)
    rows = [
        torch.cat([torch.cat([start, window]) for window in document.split(window_size)]) for document in documents
    ]
    # (tokens,) the column of each text token in its row: after the start ids of its window and of every one before
    text_columns = [
        positions + (positions // window_size + 1) * starts
        for positions in (torch.arange(len(document), device=device) for document in documents)
    ]
    lengths = torch.tensor([len(row) for row in rows], device=device)
    ids = nn.utils.rnn.pad_sequence(rows, batch_first=True)  # (documents, longest row)
    real = (torch.arange(ids.shape[1], device=device)[None] < lengths[:, None]).long()
    token_nll = [torch.zeros(len(document) - 1) for document in documents]
    chunk = width * max(1, RECURRENT_CHUNK_TOKENS // width)
    progress = tqdm(total=sum(map(len, token_nll)), unit="tok", desc="windowed perplexity", disable=not show_progress)
    with torch.no_grad(), progress:
        model.eval()
        state = model.new_state(len(rows))
        for first in range(0, ids.shape[1], chunk):
            out = model(
                input_ids=ids[:, first : first + chunk],
                attention_mask=real[:, first : first + chunk],
                past_key_values=state,
            )
            state = out.past_key_values
            for row, (document, columns) in enumerate(zip(documents, text_columns, strict=True)):
                # Text token j, at column columns[j], predicts text token j + 1.
                inside = ((columns[:-1] >= first) & (columns[:-1] < first + chunk)).nonzero().squeeze(1)
                logits = out.logits[row, columns[inside] - first].float()  # (predicted here, vocab)
                targets = document[inside + 1]
                token_nll[row][inside.cpu()] = nn.functional.cross_entropy(logits, targets, reduction="none").cpu()
                progress.update(len(inside))
    num_tokens = sum(len(values) for values in token_nll)
    nll = float(torch.cat(token_nll).sum()) / num_tokens
    return WindowedPerplexity(
        perplexity=math.exp(nll),
        nll=nll,
        num_tokens=num_tokens,
        num_documents=len(documents),
        window_size=window_size,
        overlap=0,
        flops_per_token=flops_per_token(model.config, width, starts) if has_flops_count(model.config) else None,
        token_nll=[TokenNLL(values, torch.arange(len(values)) % window_size) for values in token_nll],
    )


def text_start_tokens(tokenizer: PreTrainedTokenizerBase, text: str = "text") -> list[int]:
    """The special tokens the tokenizer puts before a text (Gemma's `<bos>`; none for SmolLM2). Those it puts after
    one (an EOS) are not among them."""
    bare = tokenizer(text, add_special_tokens=False)["input_ids"]
    encoded = tokenizer(text)["input_ids"]
    return next((encoded[:i] for i in range(len(encoded) - len(bare) + 1) if encoded[i : i + len(bare)] == bare), [])


@contextmanager
def h_prev_from_another_row(model: PreTrainedModel):
    """Within the block, every row's `h_prev` comes from the row before it (the last from the first): the recurrent
    model reads each document with the summary of another document's previous window. Evaluated with the documents
    as rows of one batch, this is the specificity control of the decomposition."""
    (recurrence,) = [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] == "recurrence"]
    handle = recurrence.register_forward_hook(lambda module, args, h_prev: h_prev.roll(1, dims=0))
    try:
        yield
    finally:
        handle.remove()


def run_fact_probe(
    stock: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_stream: list[int],
    held_out_stream: list[int],
    settings: BookReproductionSettings,
    num_held_out: int = 64,
) -> dict:
    """The long-range probe (`hf_recurrence.data.fact_probe`), a gate cheaper than the perplexity run: the recurrent
    arm trained with the settings' backbone on `max_steps x batch_size` probe examples cut from `train_stream`, then
    scored on `num_held_out` examples from `held_out_stream` (a validation book: choices are made on it), against the
    stock model reading the question's window alone (chance: it cannot know an invented name) and against the
    recurrent arm reading it with another example's `h_prev` (the swap control, which should be at chance too).

    Returns, per reader, the mean NLL per name token and the share of examples recalled exactly, plus the training
    loss and minutes.
    """
    if settings.window_start != "bare":
        raise UsageError(
            f"The fact probe reads bare windows; got window_start={settings.window_start!r} (use window_start='bare')"
        )
    window = settings.window_size
    train = FactProbe(train_stream, tokenizer, window, settings.max_steps * settings.batch_size, seed=settings.seed)
    held_out = FactProbe(held_out_stream, tokenizer, window, num_held_out, seed=settings.seed + 1)
    model, loss, minutes = train_arm(stock, "window", train, settings)
    readers = {"stock": fact_nll(stock, held_out, window), "recurrent": fact_nll(model, held_out, window)}
    with h_prev_from_another_row(model):
        readers["swapped"] = fact_nll(model, held_out, window)
    return {
        "backbone": settings.backbone,
        "train_examples": len(train),
        "held_out_examples": len(held_out),
        "train_loss": loss,
        "train_minutes": minutes,
        **{name: {"name_nll": nll, "recalled": recalled} for name, (nll, recalled) in readers.items()},
    }


def carried_gain_lost(token_nll: dict) -> float:
    """The fraction of the carried-context gain (control minus recurrent, in mean NLL) that reading with another
    document's `h_prev` loses (shuffled minus recurrent): 1 = all of it, 0 = none."""
    mean = {
        key: float(torch.cat([document.nll for document in token_nll[key]]).mean())
        for key in ("recurrent@0", "control@0", "shuffled@0")
    }
    gain = mean["control@0"] - mean["recurrent@0"]
    return (mean["shuffled@0"] - mean["recurrent@0"]) / gain if gain else math.nan


def goals(comparisons: dict[str, dict], lost_fraction: float | None) -> list[str]:
    """The goals fixed before the run, checked on the intervals, one line each."""
    carried = comparisons["recurrent vs control"]
    lines = [
        f"goal carried context, recurrent at overlap 0 at least 3% below the control, interval excluding 0: "
        f"{'met' if carried['relative_difference'] <= -0.03 and carried['high'] < 0 else 'not met'} "
        f"({100 * carried['relative_difference']:+.2f}%, [{100 * carried['low']:+.2f}%, {100 * carried['high']:+.2f}%])"
    ]
    if "recurrent vs baseline@T/8" in comparisons:
        versus_overlap = comparisons["recurrent vs baseline@T/8"]
        lines.append(
            f"goal paper claim 2, recurrent at overlap 0 no worse than the equally adapted baseline at overlap T/8: "
            f"{'met' if versus_overlap['relative_difference'] <= 0 else 'not met'} "
            f"({100 * versus_overlap['relative_difference']:+.2f}%)"
        )
    if lost_fraction is not None:
        line = "goal specificity, another document's h_prev loses at least two thirds of the carried-context gain: "
        # A fraction of a difference indistinguishable from 0, or of a loss, says nothing about specificity.
        if carried["high"] < 0:
            line += f"{'met' if lost_fraction >= 2 / 3 else 'not met'} ({100 * lost_fraction:.0f}% lost)"
        elif carried["low"] > 0:
            line += "not met: no carried-context gain to lose (the recurrent arm is worse than the control, interval excluding 0)"
        else:
            line += "not met: no carried-context gain to lose (the recurrent vs control interval does not exclude 0)"
        lines.append(line)
    return lines


@dataclass
class BookRun:
    """One run of `reproduce_on_books`: what every arm reads, and the rows, token NLLs and extra fields so far."""

    settings: BookReproductionSettings
    output_dir: Path
    stock: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    starts: list[int]
    documents: list[torch.Tensor]
    words: list[TokenWords]
    stream: list[int]
    probe: FactProbe | None = None
    start: float = field(default_factory=time.perf_counter)
    rows: list[dict] = field(default_factory=list)
    token_nll: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    finished_stages: list[str] = field(default_factory=list)
    progress: RunProgress = field(init=False)

    def __post_init__(self):
        # What is left to train, in order: the baseline only when the backbone is.
        trained = (["baseline"] if self.settings.backbone != "frozen" else []) + list(TRAINED_ARMS)
        self.progress = RunProgress([n for n in trained if n not in self.finished_stages], self.settings.max_steps)

    def stage(self, name: str, work: Callable[[], None]) -> None:
        """Run one stage of the run (the baseline with the reference rows, or a trained arm: its training and reads),
        unless an earlier run of this folder finished it (`--resume`); then keep what the run has so far in the
        checkpoint."""
        if name not in self.finished_stages:
            work()
            self.finished_stages.append(name)
            self.save_checkpoint()
        else:
            print(f"[{name}] finished by an earlier run of {self.output_dir}: its reads are kept, not redone")
        # The stage's training checkpoints are no longer needed once the stage is in the run's checkpoint.
        shutil.rmtree(self.training_folder(name), ignore_errors=True)

    def training_folder(self, name: str) -> Path:
        """Where training `name` keeps its checkpoints while it runs (`TrainingCheckpoints`)."""
        return self.output_dir / f"training_{name}"

    def save_checkpoint(self) -> None:
        tensors = {
            f"{read}/{i}/{part}": getattr(document, part).contiguous()
            for read, documents in self.token_nll.items()
            for i, document in enumerate(documents)
            for part in ("nll", "window_position")
        }
        save_file(tensors, str(self.output_dir / "checkpoint.safetensors"))
        checkpoint = {
            **checkpoint_key(self.settings, self.source),
            "stages": self.finished_stages,
            "minutes": (time.perf_counter() - self.start) / 60,
            "rows": self.rows,
            "extra": self.extra,
        }
        write_atomically(self.output_dir / CHECKPOINT, json.dumps(checkpoint, indent=2))

    @property
    def train_tokens(self) -> int:
        s = self.settings
        return s.max_steps * s.batch_size * s.windows_per_block * s.window_size

    def evaluate(self, model, name: str, overlap: int, window_start: Sequence[int] | None = None, **fields) -> None:
        """Read the held-out documents with `model`, keep its row and token NLLs, and rewrite the report."""
        starts = self.starts if window_start is None else window_start
        result = read_windows(model, self.documents, self.settings.window_size, overlap, starts)
        self.token_nll[f"{name}@{overlap}"] = result.token_nll
        self.rows.append({"model": name, **result.to_dict(), **fields})
        print(
            f"  {name:<10} window {self.settings.window_size} overlap {overlap:>3}: perplexity {result.perplexity:.3f}"
        )
        write_report(
            self.output_dir, self.rows, finished=False, **report_header(self.settings, self.source, self.start)
        )

    def train(self, name: str, recurrence_input: str | None) -> tuple[PreTrainedModel, float | None, float]:
        """`train_arm` on the run's stream, announced (and paced) by the run's progress when there is anything to
        train (the baseline on a frozen backbone has nothing)."""
        trains = recurrence_input is not None or self.settings.backbone != "frozen"
        callbacks = [self.progress.start(name)] if trains else []
        return train_arm(
            self.stock,
            recurrence_input,
            self.training_data(),
            self.settings,
            self.starts,
            callbacks=callbacks,
            checkpoints=TrainingCheckpoints(self.training_folder(name)) if trains else None,
        )

    def training_data(self) -> list[int] | FactProbeCurriculum:
        """The stream (cut into consecutive blocks by `train_arm`), or with `probe_fraction` the name-probe curriculum
        of blocks: the same blocks in the same order for every arm either way."""
        s = self.settings
        if not s.probe_fraction:
            return self.stream
        examples = s.max_steps * s.batch_size
        return FactProbeCurriculum(
            self.stream,
            self.tokenizer,
            s.window_size,
            examples,
            s.probe_fraction,
            seed=s.seed,
            windows=s.windows_per_block,
            group_size=s.batch_size,  # each batch all probes or all text: the name tokens not drowned in the mean
        )

    def score_probe(self, model: PreTrainedModel, name: str) -> None:
        """With `probe_fraction`: the arm's exact name recall and name NLL on the validation book's probe, with its own
        memory and (a recurrent arm) another example's, kept in results.json's `name_probe` and printed."""
        if self.probe is None:
            return
        window = self.settings.window_size
        readers = {"own": fact_nll(model, self.probe, window, window_start_ids=self.starts)}
        if model.config.model_type in RECURRENT_MODEL_TYPES:
            with h_prev_from_another_row(model):
                readers["swapped"] = fact_nll(model, self.probe, window, window_start_ids=self.starts)
        scores = {reader: {"name_nll": nll, "recalled": recalled} for reader, (nll, recalled) in readers.items()}
        self.extra.setdefault("name_probe", {})[name] = scores
        print(f"  {name_probe_line(name, scores)}", flush=True)


def reproduce_on_books(
    settings: BookReproductionSettings, output_dir: Path, *, overwrite: bool = False, resume: bool = False
) -> dict:
    """Run the three arms; writes results.json, results.md, split.json, both plots and each trained arm's recurrence
    weights (`recurrence_<arm>.safetensors`) to `output_dir`. Returns what results.json holds.

    Everything that can be checked (settings, model, books, `output_dir`) is checked before training; results are
    rewritten after each evaluation, so a later failure loses nothing finished. After each stage (the baseline with
    the reference rows, then each trained arm with its reads) the run keeps what it has in `checkpoint.json`:
    `resume=True` continues an unfinished run of the same settings in `output_dir` from its last finished stage, so a
    run longer than one sitting can be done in several.
    """
    run = prepare_book_run(settings, output_dir, overwrite, resume)
    run.stage("baseline", lambda: run_baseline_and_references(run))
    for name, recurrence_input in TRAINED_ARMS.items():
        run.stage(
            name, lambda name=name, recurrence_input=recurrence_input: run_trained_arm(run, name, recurrence_input)
        )
    return finish_book_run(run)


def checkpoint_key(settings: BookReproductionSettings, source: str) -> dict:
    """What a checkpoint must share with the run that resumes it, as JSON reads it back."""
    return json.loads(json.dumps({"settings": asdict(settings), "source": source}))


def read_checkpoint(output_dir: Path, settings: BookReproductionSettings, source: str) -> dict:
    """The unfinished run `resume` continues: its checkpoint, its token NLLs as `TokenNLL`s under `token_nll`; a
    `UsageError` naming why when `output_dir` holds none, a finished one, or one of other settings."""
    path = output_dir / CHECKPOINT
    if not path.is_file():
        raise UsageError(f"--resume: {output_dir} holds no book run to continue (no {CHECKPOINT})")
    checkpoint = json.loads(path.read_text())
    results = output_dir / "results.json"
    if results.is_file() and json.loads(results.read_text()).get("finished"):
        raise UsageError(f"--resume: the run in {output_dir} is finished; nothing to continue")
    expected = checkpoint_key(settings, source)
    differing = sorted(k for k in expected["settings"] if checkpoint["settings"].get(k) != expected["settings"][k])
    differing += ["model"] if checkpoint["source"] != expected["source"] else []
    if differing:
        raise UsageError(
            f"--resume: the run in {output_dir} has other settings ({', '.join(differing)} differ); give the same "
            "options, or start a new run in another folder"
        )
    tensors = load_file(str(output_dir / "checkpoint.safetensors"))
    token_nll: dict[str, list[TokenNLL]] = {}
    for key in sorted(tensors, key=lambda k: (k.rsplit("/", 2)[0], int(k.rsplit("/", 2)[1]))):
        read, index, part = key.rsplit("/", 2)
        if part == "nll":
            token_nll.setdefault(read, []).append(TokenNLL(tensors[key], tensors[f"{read}/{index}/window_position"]))
    return {**checkpoint, "token_nll": token_nll}


def prepare_book_run(settings: BookReproductionSettings, output_dir: Path, overwrite: bool, resume: bool) -> BookRun:
    """Load and check everything before any training, prepare `output_dir` (or, `resume`, read the checkpoint of the
    run it holds), and print what the run reads."""
    if overwrite and resume:
        raise UsageError("--overwrite starts the run again and --resume continues it: give one of them")
    start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:  # a missing optional reader (gguf, rdata) or the model's package is a set-up mistake: say which to install
        model = load_checked_model(settings)
        train_books = austen_split("train")
    except (ImportError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    stock, tokenizer, source = model["stock"], model["tokenizer"], model["source"]
    earlier: dict = {"stages": [], "rows": [], "token_nll": {}, "extra": {}, "minutes": 0.0}
    if resume:
        earlier = read_checkpoint(output_dir, settings, source)
    documents, words, read = held_out_documents_and_words(settings, tokenizer)
    stream = token_stream([book.text for book in train_books], tokenizer)
    probe = name_probe(settings, tokenizer) if settings.probe_fraction else None
    if not resume:
        prepare_output_dir(output_dir, BOOK_REPORT_FILES, writer="hf-recurrence reproduce", overwrite=overwrite)
        write_austen_split_manifest(output_dir / "split.json")
    stock.requires_grad_(False)
    stock.to(device)
    run = BookRun(
        settings=settings,
        output_dir=output_dir,
        documents=documents,
        words=words,
        stream=stream,
        probe=probe,
        start=start - 60 * earlier["minutes"],  # the run's minutes count every sitting's
        rows=earlier["rows"],
        token_nll=earlier["token_nll"],
        extra=earlier["extra"],
        finished_stages=earlier["stages"],
        **model,
    )
    if resume:
        print(f"Resuming the run in {output_dir}: {', '.join(run.finished_stages) or 'no stage'} finished before")
    else:  # kept from the start, so that a sitting ended in the first stage's training can be resumed too
        run.save_checkpoint()
    run.extra.update(held_out=read, train_tokens_per_arm=run.train_tokens, device=device)
    block_tokens = settings.windows_per_block * settings.window_size
    print(
        f"Model {source}; backbone {settings.backbone} in every arm. Training stream {len(stream):,} tokens "
        f"({', '.join(book.title for book in train_books)}); each trained arm: {settings.max_steps} steps x "
        f"{settings.batch_size} blocks x {block_tokens} tokens = {run.train_tokens:,} tokens. Held-out: "
        + ", ".join(f"{r['title']} ({r['tokens_read']:,} of {r['book_tokens']:,} tokens)" for r in read)
    )
    print(run.progress.plan(evaluations_left(run)))
    announce_window_start(tokenizer, run.starts)
    return run


# Validation-book examples the name probe scores a book run's arms on (`probe_fraction`), as gate 2 scores its arms.
PROBE_EXAMPLES = 256


def name_probe(settings: BookReproductionSettings, tokenizer: PreTrainedTokenizerBase) -> FactProbe:
    """The name probe a run with `probe_fraction` scores its arms on: two-window examples of the run's window cut
    from the validation book (whatever the run's `eval_split`: the probe only says whether training taught the
    memory to carry a name), seeded apart from the training curriculum."""
    stream = token_stream([book.text for book in austen_split("validation")], tokenizer)
    try:  # a window with no room for the planted sentence, refused before any training
        return FactProbe(stream, tokenizer, settings.window_size, PROBE_EXAMPLES, seed=settings.seed + 1)
    except ValueError as error:
        raise UsageError(f"probe_fraction={settings.probe_fraction}: {error}") from None


def load_checked_model(settings: BookReproductionSettings) -> dict:
    """The stock model, its tokenizer, where they came from (`source`) and the window start ids, after the recurrent
    configuration's own checks (a supported family, window against the position table and sliding window, insertion
    layer) and LoRA's (layers and names the model has): everything refused before any work."""
    stock, tokenizer, source = load_causal_lm(settings.model_name_or_path)
    starts = window_start_ids(settings, tokenizer)
    try:
        recurrent_arm(stock, **settings.recurrence_settings(len(starts)))
    except ValueError as error:
        raise UsageError(f"{source}: {error}") from None
    lora_targets(settings, stock)
    if settings.backbone == "lora":
        lora_layers(settings, num_decoder_layers(stock))
    return {"stock": stock, "tokenizer": tokenizer, "source": source, "starts": starts}


def announce_window_start(tokenizer: PreTrainedTokenizerBase, starts: list[int]) -> None:
    """Say what every window begins with, or that the model will have to learn to read windows without its start."""
    text_starts = text_start_tokens(tokenizer)
    if starts:
        print(
            f"Every window of every arm begins with {tokenizer.convert_ids_to_tokens(starts)} (window_start=text_start)"
        )
    elif text_starts:
        # The paper's windows are bare text; a model trained always to see its start token reads them far worse
        # (stock Gemma 3 base on the validation book: perplexity 260 bare, 36 after <bos>: docs/experiments).
        print(
            f"Note: this tokenizer begins every text with {tokenizer.convert_ids_to_tokens(text_starts)}, and every arm "
            "reads windows without it (window_start=bare), so each arm's training must first teach the model to read a "
            "bare window"
        )


def evaluations_left(run: BookRun) -> int:
    """The reads the run's unfinished stages make: the baseline's at every overlap and the reference rows; one per
    trained arm, and the recurrent arm's shuffled read when there are several documents."""
    per_stage = {
        "baseline": len(run.settings.overlap_fractions) + len(reference_prefixes(run.tokenizer, run.settings)),
        **{name: 1 + (name == "recurrent" and len(run.documents) > 1) for name in TRAINED_ARMS},
    }
    return sum(count for stage, count in per_stage.items() if stage not in run.finished_stages)


def run_baseline_and_references(run: BookRun) -> None:
    """The baseline arm (trained when the backbone is) at every overlap, and the untrained reference rows."""
    settings, stock = run.settings, run.stock
    if settings.backbone != "frozen":
        print(f"[baseline] training the backbone ({settings.backbone}), each window read alone")
    baseline, loss, minutes = run.train("baseline", None)
    run.extra["baseline_train_minutes"] = minutes
    for fraction in settings.overlap_fractions:
        overlap = overlap_tokens(settings.window_size, fraction)
        run.evaluate(baseline, "baseline", overlap, train_loss=loss, tokens=0 if loss is None else run.train_tokens)
    run.score_probe(baseline, "baseline")
    del baseline
    for name, prefix in reference_prefixes(run.tokenizer, settings).items():
        # What a learned window start could be worth, at no training: the stock model reading a fixed prefix.
        # None (a dash in the table, left out of the plot) for a family with no analytic count.
        flops = (
            flops_per_token(stock.config, settings.window_size + len(prefix), len(prefix))
            if has_flops_count(stock.config)
            else None
        )
        reference = WindowPrefixed(stock, prefix)
        run.evaluate(
            reference, name, 0, (), train_loss=None, tokens=0, prefix_tokens=len(prefix), flops_per_token=flops
        )


def run_trained_arm(run: BookRun, name: str, recurrence_input: str) -> None:
    """A trained arm (`TRAINED_ARMS`: recurrent, control), its recurrence weights saved, read at overlap 0; the
    recurrent arm also read with another row's `h_prev` (shuffled) when there are several documents."""
    print(
        f"[{name}] training the recurrence module (recurrence_input={recurrence_input!r}), backbone "
        f"{run.settings.backbone}"
    )
    model, loss, minutes = run.train(name, recurrence_input)
    save_file(
        {k: v.contiguous() for k, v in model.recurrence.state_dict().items()},
        str(run.output_dir / f"recurrence_{name}.safetensors"),
        metadata={"recurrence_input": recurrence_input, "source": run.source},
    )
    run.extra[f"{name}_train_minutes"] = minutes
    run.evaluate(model, name, 0, train_loss=loss, tokens=run.train_tokens)
    run.score_probe(model, name)
    if name == "recurrent" and len(run.documents) > 1:
        with h_prev_from_another_row(model):
            run.evaluate(model, "shuffled", 0, train_loss=loss, tokens=run.train_tokens)


def book_comparisons(token_nll: dict, settings: BookReproductionSettings) -> tuple[dict, float | None]:
    """The paired comparisons of the decomposition, and the fraction of the carried-context gain lost when shuffled
    (None without a shuffled read)."""
    comparisons = {
        "recurrent vs baseline@0": compare(token_nll, "baseline@0", "recurrent@0", settings),
        # The decomposition: the learned constant, the carried context, and how specific the carried context is.
        "control vs baseline@0": compare(token_nll, "baseline@0", "control@0", settings),
        "recurrent vs control": compare(token_nll, "control@0", "recurrent@0", settings),
    }
    lost_fraction = None
    if "shuffled@0" in token_nll:
        comparisons["shuffled vs recurrent"] = compare(token_nll, "recurrent@0", "shuffled@0", settings)
        lost_fraction = carried_gain_lost(token_nll)
    baseline_eighth = f"baseline@{overlap_tokens(settings.window_size, 0.125)}"
    if baseline_eighth in token_nll:
        comparisons["recurrent vs baseline@T/8"] = compare(token_nll, baseline_eighth, "recurrent@0", settings)
    return comparisons, lost_fraction


# The name of the comparison on the carried tokens only, in `comparisons`: its arms are named as the others' are.
CARRIED_COMPARISON = "recurrent vs control, carried tokens"


def describe_comparisons(comparisons: dict[str, dict]) -> list[str]:
    """One `describe` line per comparison, the one on the carried tokens saying so (it pairs the same arms as the
    recurrent-vs-control line)."""
    return [
        describe(c) + (", carried tokens only" if name == CARRIED_COMPARISON else "")
        for name, c in comparisons.items()
    ]


def carried_tokens(
    token_nll: dict, words: list[TokenWords], settings: BookReproductionSettings
) -> tuple[dict, dict | None]:
    """The carried tokens of the reads at overlap 0 (`carried_token_mask`: words the previous window read, met again
    before the current window reads them): how many, every such read's mean NLL on them, and the recurrent arm
    against the control on them (None with fewer than two segments holding any, too few for an interval)."""
    masks = [
        carried_token_mask(document_words, document.window_position)
        for document_words, document in zip(words, token_nll["recurrent@0"], strict=True)
    ]
    count, predicted = sum(int(mask.sum()) for mask in masks), sum(len(mask) for mask in masks)
    nll = {
        key.removesuffix("@0"): float(torch.cat([d.nll[m] for d, m in zip(value, masks, strict=True)]).mean())
        for key, value in token_nll.items()
        if key.endswith("@0") and count
    }
    segments = len(segment_sums(token_nll["recurrent@0"], settings.segment_tokens, masks)[0]) if count else 0
    comparison = compare(token_nll, "control@0", "recurrent@0", settings, masks) if segments >= 2 else None
    return {"tokens": count, "share": count / predicted, "nll": nll}, comparison


def name_probe_line(arm: str, scores: dict[str, dict[str, float]]) -> str:
    """One arm's name-probe scores (`BookRun.score_probe`): recall and name NLL with its own memory, and with another
    example's where it has one."""
    readers = {"own": "", "swapped": " with another example's memory"}
    return f"{arm} name probe: " + "; ".join(
        f"recall {scores[reader]['recalled']:.1%}{label}, name NLL {scores[reader]['name_nll']:.3f}"
        for reader, label in readers.items()
        if reader in scores
    )


def finish_book_run(run: BookRun) -> dict:
    """Compare the arms, write the final report, results.json's extra fields and both plots; print the summary."""
    settings, output_dir = run.settings, run.output_dir
    comparisons, lost_fraction = book_comparisons(run.token_nll, settings)
    if lost_fraction is not None:
        run.extra["carried_gain_lost_when_shuffled"] = lost_fraction
    carried, carried_comparison = carried_tokens(run.token_nll, run.words, settings)
    run.extra["carried_tokens"] = carried
    if carried_comparison is not None:
        comparisons[CARRIED_COMPARISON] = carried_comparison
    by_position = {
        # NaN (a position too rarely predicted) as null: JSON has no NaN
        key: [
            None if math.isnan(v) else v
            for v in nll_by_window_position(value, settings.window_size, MIN_TOKENS_PER_POSITION).tolist()
        ]
        for key, value in run.token_nll.items()
        if key.endswith("@0")
    }
    summary = describe_comparisons(comparisons)
    summary += goals(comparisons, lost_fraction)
    summary += findings(run.rows)
    summary += [name_probe_line(arm, scores) for arm, scores in run.extra.get("name_probe", {}).items()]
    minutes = (time.perf_counter() - run.start) / 60
    table = write_report(
        output_dir, run.rows, summary, finished=True, **report_header(settings, run.source, run.start)
    )
    results = json.loads((output_dir / "results.json").read_text())
    results.update(run.extra, comparisons=comparisons, nll_by_window_position=by_position)
    write_atomically(output_dir / "results.json", json.dumps(results, indent=2))
    # Rows of a family without a FLOPs count stay in the table, not the plot (which needs an x for every point).
    plottable = [row for row in run.rows if row.get("flops_per_token") is not None]
    if plottable:
        plot_perplexity_vs_flops(plottable, output_dir / "perplexity_vs_flops.png")
    plot_nll_by_window_position(
        {key.split("@")[0]: [math.nan if v is None else v for v in values] for key, values in by_position.items()},
        output_dir / "nll_by_window_position.png",
    )
    finish_run(output_dir, table, summary, minutes, "results, tables and plots")
    return results


__all__ = ["BookReproductionSettings", "reproduce_on_books"]
