# SPDX-License-Identifier: Apache-2.0
"""PyTorch recurrence over any stock transformers decoder, after Yoshida, Ettinger and Gimpel (2020), "Adding
Recurrence to Pretrained Transformers for Improved Efficiency and Context Size": the models.

The model holds the stock `XForCausalLM` of its backbone, built by transformers itself (`self.backbone`), and the
recurrence (`self.recurrence`). It reads text window by window; each window step calls the stock forward once, with
the window's embeddings and position ids, under the registered attention name `recurrent_<sdpa|eager>`, through
which every layer's attention joins the window's cached keys/values and, at the insertion layer, the key/value of
`h_prev` (computed by the layer's own attention code). The family's rotary embedding, embedding scaling, norms,
biases and head post-processing are therefore its own.

The folder's rooms: this file holds the models (the window loop, the heads, the named GPT-2 and Llama classes and
their checkpoint layouts); `step_recurrent_decoder.py` the window step inside the stock decoder (the attention
function, the masks, `h_prev`'s key/value, the pooling); `state_recurrent_decoder.py` the state, its fixed-shape
variant and its file format; `generation_recurrent_decoder.py` the generate() hooks and the compiled single-token
decode. Every class a checkpoint's `auto_map` names is importable from here.
"""

import copy
import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass

import torch
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming, apply_renamings
from transformers.modeling_layers import (
    GenericForSequenceClassification,
    GenericForTokenClassification,
    GradientCheckpointingLayer,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput, logging

from .configuration_recurrent_decoder import (
    PRE_ATTENTION_NORMS,
    RecurrentDecoderConfig,
    RecurrentGPT2Config,
    RecurrentLlamaConfig,
    check_backbone,
)
from .generation_recurrent_decoder import RecurrentDecoderGenerationMixin, _fixed_shape_decode
from .state_recurrent_decoder import (
    STATE_NAME,
    RecurrentDecoderState,
    RecurrentGPT2State,
    RecurrentLlamaState,
    _cache_geometry,
)
from .step_recurrent_decoder import (
    INNER_ATTENTIONS,
    RECURRENT_PREFIX,
    RecurrentDecoderRecurrence,
    _attention_module,
    _decoder_layers,
    _LockstepTensors,
    _StepOutput,
    _StepSettings,
    h_prev_key_value,
    step_attentions,
    step_context,
    step_positions_and_masks,
)


logger = logging.get_logger(__name__)


def _refuse_logits_to_keep_with_labels(
    logits_to_keep: int | torch.Tensor, labels: torch.Tensor | None, shift_labels: torch.Tensor | None
) -> None:
    """The loss needs every position's logits, so some of them only cannot be asked for with targets."""
    keeps_some = not isinstance(logits_to_keep, int) or logits_to_keep != 0
    if keeps_some and (labels is not None or shift_labels is not None):
        raise ValueError(
            f"logits_to_keep={logits_to_keep} cannot be combined with labels: the loss needs every position"
        )


def _given_state(past_key_values: object | None, cache: object | None) -> object | None:
    """The state passed under either name."""
    if past_key_values is not None and cache is not None:
        raise ValueError(
            "Pass the state once: as cache or as past_key_values (its name before transformers 5.24), not both"
        )
    return past_key_values if cache is None else cache


def _refuse_export(model: nn.Module) -> None:
    """Raise when `model` runs under torch.export (and the dynamo ONNX exporter), TorchScript tracing or the
    TorchScript ONNX exporter; torch.compile is not refused (it guards and recompiles where a trace would not)."""
    if torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        # The window/segment plan (lengths, padding, packed documents, the state's fill) is made in Python from the
        # input's values: an export fails on it, and a TorchScript trace fixes one input's plan into the graph,
        # silently wrong for any other length.
        raise RuntimeError(
            f"{type(model).__name__} cannot be exported or traced (torch.export, torch.onnx.export, "
            "torch.jit.trace): it plans its windows and the state it carries from the input's length, padding and "
            "positions in Python, so a graph would hold one input's plan. Run it eagerly or under torch.compile"
        )


def _document_starts(position_ids: torch.Tensor | None, real: torch.Tensor, continuing: bool) -> torch.Tensor | None:
    """Where packed documents begin, read from `position_ids` (batch, length) as TRL's and transformers' packing
    collators write them: positions count up by one inside a document and restart at 0 where the next one begins.

    real: (batch, length) bool, True at real tokens (the positions of padding are not read). continuing: whether the
    rows already hold text from earlier calls (a state was passed); then a row's first position may be anything
    (the row's text goes on) or 0 (a new document). Returns (batch, length) bool, True at the real tokens that start
    a document after earlier text of their row, or None when there is no such token (plain positions 0, 1, ...).
    """
    if position_ids is None:
        return None
    batch, length = real.shape
    if position_ids.dim() != 2 or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != length:
        raise ValueError(
            f"position_ids must be (batch, length) like the input, or (1, length); got shape "
            f"{tuple(position_ids.shape)} for input of shape {(batch, length)}"
        )
    positions = position_ids.to(real.device).expand(batch, length)
    columns = torch.arange(length, device=real.device)
    # The latest real column before each column, -1 where there is none: padding is skipped, not counted.
    latest = torch.where(real, columns, -1).cummax(1).values  # (batch, length)
    previous = nn.functional.pad(latest[:, :-1], (1, 0), value=-1)
    has_previous = previous >= 0
    follows = has_previous & (positions == positions.gather(1, previous.clamp(min=0)) + 1)
    restarts = positions == 0
    bad = real & ~restarts & ~follows & (has_previous | (not continuing))
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        if has_previous[row, column]:
            problem = f"position {int(positions[row, column])} follows {int(positions[row, previous[row, column]])}"
        else:
            problem = f"the row's first position is {int(positions[row, column])} but no state passed as {STATE_NAME} continues it"
        raise ValueError(
            "position_ids must count up by one within each packed document and restart at 0 where the next one "
            f"begins; at row {row}, column {column}, {problem}"
        )
    starts = real & restarts & (has_previous | continuing)
    return starts if bool(starts.any()) else None


def _drop_cross_document_targets(targets: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """(batch, length) shifted targets without those of the positions followed by a document start (position 0): the
    last token of a packed document does not predict the first token of the next."""
    if position_ids is None or position_ids.shape[-1] != targets.shape[-1]:
        # A misshapen position_ids is reported by `_document_starts`.
        return targets
    next_starts = nn.functional.pad(position_ids[..., 1:] == 0, (0, 1), value=False)  # ([batch,] length)
    return targets.masked_fill(next_starts.to(targets.device), -100)


def _step_settings(
    state: RecurrentDecoderState,
    num_new: int,
    logits_to_keep: int | torch.Tensor | None,
    step_head: Callable | None,
    output_hidden_states: bool,
    output_attentions: bool,
    lockstep_tensors: _LockstepTensors,
) -> _StepSettings:
    """The settings of the next step over `state`, with what its lockstep tells on the host, as the state runs its
    steps (`RecurrentDecoderState.step_settings`); `lockstep_tensors`: the call's, used while the rows are in
    lockstep."""
    lockstep = state.lockstep
    settings = _StepSettings(
        num_new=num_new,
        window_size=state.window_size,
        logits_to_keep=logits_to_keep,
        step_head=step_head,
        output_hidden_states=output_hidden_states,
        output_attentions=output_attentions,
        uses_h_prev=None if lockstep is None else lockstep[1] > 0,
        all_real=None if lockstep is None else True,
        lockstep_tensors=None if lockstep is None else lockstep_tensors,
    )
    return state.step_settings(settings)


class RecurrentDecoderWindowStep(GradientCheckpointingLayer):
    """The unit that gradient checkpointing recomputes: the whole backbone over one stretch of a window (`run`, the
    model's `_step`). It holds no weights, so the backbone keeps its checkpoint names. Checkpointing whole window
    steps keeps only each window's inputs (its embeddings and the cached keys/values) for the backward pass."""

    def forward(self, run: Callable, settings: "_StepSettings", *tensors: torch.Tensor) -> tuple:
        # Everything positional and a flat tuple out: the reentrant checkpoint connects only the tensors of a tuple
        # output to the graph, and its recompute must see this call's arguments.
        return run(settings, *tensors).flat()


# The fields every model of the core returns besides its own, as its output's docstring describes them.
_SHARED_OUTPUTS_DOC = """        past_key_values ([`RecurrentDecoderState`], *optional*):
            State to continue from, returned when `use_cache=True`; the field is named `cache` from transformers 5.24
            on (`past_key_values` still reads it there).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            Embedding output and every layer's output (the last after the final norm), `(batch_size,
            sequence_length, hidden_size)` each.
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Every layer's attention weights, `(batch_size, num_heads, sequence_length, 1 + window_size)` each:
            column 0 is `h_prev` (zero outside the insertion layer and in a row's first window), column `1 + j` is
            position `j` of the query's own window. Rows of padding positions are zero.
    """


def _model_output_class(name: str, doc: str, fields: dict[str, object]) -> type[ModelOutput]:
    """A ModelOutput dataclass with `fields` (name -> annotation, each defaulting to None), then the state and
    `hidden_states` / `attentions`. The state's field takes the installed transformers' name: a dataclass's field
    names are fixed when the class is made, and transformers 5.24's generate() reads `outputs.cache`."""
    shared = {
        STATE_NAME: RecurrentDecoderState | None,
        "hidden_states": tuple[torch.FloatTensor, ...] | None,
        "attentions": tuple[torch.FloatTensor, ...] | None,
    }
    return make_dataclass(
        name,
        [(key, kind, field(default=None)) for key, kind in {**fields, **shared}.items()],
        bases=(ModelOutput,),
        namespace={"__doc__": doc + _SHARED_OUTPUTS_DOC, "__module__": __name__},
    )


RecurrentDecoderCausalLMOutput = _model_output_class(
    "RecurrentDecoderCausalLMOutput",
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Causal language-modelling loss over the whole input (each token predicted once), when `labels` is given.
        logits (`torch.FloatTensor` of shape `(batch_size, kept_positions, vocab_size)`, *optional*):
            Next-token scores from the backbone's own head. Omitted when `labels` is given in training mode, unless
            `return_logits=True`.
""",
    {"loss": torch.FloatTensor | None, "logits": torch.FloatTensor | None},
)


RecurrentDecoderModelOutput = _model_output_class(
    "RecurrentDecoderModelOutput",
    """
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`):
            Every input position's output of the last layer, after the backbone's final norm (as the stock base
            model's), each from the window in which the position is new.
""",
    {"last_hidden_state": torch.FloatTensor | None},
)


class _WindowEmbeddings:
    """A call's token embeddings, looked up window by window (`embeddings[:, start:stop]`) from its (batch, length)
    `input_ids`, for a forward without gradient: the (batch, length, hidden) embeddings of a long prompt never exist
    at once, so what reading it keeps does not grow with its length. Has the `shape`, `dtype` and `device` of the
    tensor it stands for."""

    def __init__(self, embedding: nn.Module, input_ids: torch.Tensor):
        self.embedding, self.input_ids = embedding, input_ids
        first = embedding(input_ids[:, :1])
        self.shape = torch.Size([*input_ids.shape, first.shape[-1]])
        self.dtype, self.device = first.dtype, first.device

    def __getitem__(self, index: tuple) -> torch.Tensor:
        return self.embedding(self.input_ids[index])


def _concat_layers(per_step: list[tuple[torch.Tensor, ...]], dim: int) -> tuple[torch.Tensor, ...]:
    """Per-layer tensors of consecutive steps joined along their sequence dimension `dim`."""
    return tuple(torch.cat(layer, dim=dim) for layer in zip(*per_step, strict=True))


@dataclass
class _WindowsRun:
    """One call's window steps and the state they advanced; builds the outputs."""

    state: RecurrentDecoderState
    steps: list[_StepOutput]
    output_hidden_states: bool
    output_attentions: bool

    def results(self) -> torch.Tensor:
        """The steps' results joined in input order: (batch, kept, vocab) logits of the kept positions (causal LM),
        or (batch, length, hidden) final hidden states (bare model)."""
        return torch.cat([s.result for s in self.steps], dim=1)

    def head_outputs(self) -> list[torch.Tensor]:
        """What the step head returned, one per step."""
        return [s.head for s in self.steps]

    def outputs(self, use_cache: bool | None) -> dict:
        """The output fields besides loss and logits: the state (unless `use_cache=False`), hidden states,
        attentions."""
        return {
            STATE_NAME: self.state if use_cache is not False else None,
            "hidden_states": (
                _concat_layers([s.all_hidden for s in self.steps], dim=1) if self.output_hidden_states else None
            ),
            "attentions": (
                _concat_layers([s.attentions for s in self.steps], dim=2) if self.output_attentions else None
            ),
        }


class _KeptColumns:
    """Which input columns a call returns logits for (`logits_to_keep`), and each step's share of them."""

    def __init__(self, logits_to_keep: int | torch.Tensor, length: int, device: torch.device):
        self.order = None
        self.device = device
        if isinstance(logits_to_keep, int):
            if logits_to_keep < 0:
                raise ValueError(f"logits_to_keep must be >= 0 or a tensor of positions, got {logits_to_keep}")
            self.first = length - logits_to_keep if 0 < logits_to_keep < length else 0
            self.columns = None
            return
        if logits_to_keep.dim() != 1:
            raise ValueError(
                f"logits_to_keep must be an int or a 1D tensor of positions, got shape {tuple(logits_to_keep.shape)}"
            )
        # Absolute, sorted and unique (negative positions count from the end); `order` restores the caller's order.
        absolute = torch.arange(length, device=device)[logits_to_keep.to(device)]
        self.columns, self.order = torch.unique(absolute, sorted=True, return_inverse=True)

    def in_step(self, start: int, stop: int, reread: int) -> int | torch.Tensor:
        """The kept columns among the step's new columns `[start, stop)`, for the backbone's `logits_to_keep`: the
        step's last ones (an int), or indices into the step's columns (which begin with `reread` re-read ones)."""
        if self.columns is None:
            kept = stop - max(start, self.first)
            # 0 would mean "all" to the backbone.
            return kept if kept > 0 else torch.zeros(0, dtype=torch.long, device=self.device)
        inside = self.columns[(self.columns >= start) & (self.columns < stop)]
        return inside - start + reread


# What the stock base model is called in a stock checkpoint: `transformer` for GPT-2, `model` for the other families.
STOCK_BASE_PREFIXES = ("model", "transformer")
# The options of `from_pretrained` that say where a config is read from, which a GGUF file's config is read with too.
_CONFIG_LOADING_OPTIONS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "proxies",
    "revision",
    "subfolder",
    "token",
)


def _stock_layout_renamings(
    backbone_path: str,
    prefixes: tuple[str, ...] = STOCK_BASE_PREFIXES,
    recurrence_path: str = "recurrence",
    saved_recurrence: str = "recurrence",
) -> list[WeightRenaming]:
    """Renamings from the stock layout on disk (the base model under one of `prefixes`, plus `recurrence.*`) to a model
    whose stock base model sits at `backbone_path` and recurrence at `recurrence_path`; transformers reverses them on
    save, so checkpoints keep the stock layout. A key already naming the recurrence under a prefix is left alone."""
    renamings = [
        WeightRenaming(source_patterns=rf"^{prefix}\.(?!recurrence\.)", target_patterns=f"{backbone_path}.")
        for prefix in prefixes
    ]
    if recurrence_path != saved_recurrence:
        renamings.append(
            WeightRenaming(source_patterns=rf"^{saved_recurrence}\.", target_patterns=f"{recurrence_path}.")
        )
    return renamings


class RecurrentDecoderPreTrainedModel(PreTrainedModel):
    """What every model of the recurrence core shares: its config, the attention implementations the recurrence runs
    on, weight initialisation, gradient checkpointing of whole window steps, and its states."""

    config_class = RecurrentDecoderConfig
    state_class = RecurrentDecoderState
    # The named families' checkpoints keep the recurrence inside the stock base model (`model.recurrence.*`,
    # `transformer.recurrence.*`), where their hand-written models had it.
    recurrence_saved_in_base_model = False
    # Modules saved under another name than they have here (on disk -> in memory).
    saved_module_names: dict[str, str] = {}
    # The renamings a model saves with when they cannot be read from its class's (`_keep_stock_layout`).
    _stock_layout: list[WeightRenaming] | None = None
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _is_stateful = True
    # Buffers that old GPT-2 checkpoints still carry.
    _keys_to_ignore_on_load_unexpected = [r"\.attn\.masked_bias$", r"\.attn\.bias$"]

    @classmethod
    def is_custom_code(cls) -> bool:
        # transformers takes code outside it for code that may not initialise through `transformers.initialization`
        # (which leaves loaded tensors alone one by one), and when loading, skips every module whose own tensors are
        # all loaded, vacuously so a module with none. Ours and the stock backbones' `_init_weights` use those
        # functions only, and GPT-2's scaled init of `c_proj` is done at its attention and MLP modules, which hold
        # no tensors of their own: with the shortcut, a model loaded with missing weights initialises them otherwise
        # than one built from its config.
        return False

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate() must not hand us a DynamicCache: the model creates and returns its own RecurrentDecoderState.
        return False

    def _check_and_adjust_attn_implementation(
        self, attn_implementation: str | None, is_init_check: bool = False, allow_all_kernels: bool = False
    ) -> str | None:
        # Only attention that takes an arbitrary per-row mask over extra keys can carry h_prev and the window cache.
        if attn_implementation is None:
            return None
        name = attn_implementation.removeprefix(RECURRENT_PREFIX)
        self._check_inner_attention(name)
        return super()._check_and_adjust_attn_implementation(name, is_init_check, allow_all_kernels)

    def _check_inner_attention(self, name: str) -> None:
        """Raise `ValueError` unless the recurrence can run on the attention implementation `name`."""
        if name in INNER_ATTENTIONS:
            return
        # transformers' own implementations (flash, flex, paged) and Hub kernels ("org/repo") exist but cannot carry
        # it; anything else is no attention implementation at all, and saying why flash cannot would mislead.
        if name in ALL_ATTENTION_FUNCTIONS.valid_keys() or "/" in name:
            reason = "h_prev and the window cache need a custom per-row attention mask, which flash, flex and kernel "
            reason += "attention do not take"
        else:
            reason = "it is not an attention implementation transformers knows"
        raise ValueError(
            f"attn_implementation={name!r} cannot carry the recurrence of {type(self).__name__} over a "
            f"{self.config.text_config.model_type!r} backbone: {reason}; use one of {list(INNER_ATTENTIONS)}"
        )

    def set_attn_implementation(self, attn_implementation: str | dict, allow_all_kernels: bool = False) -> None:
        # transformers would also give the backbones the plain name: stock models without the recurrence.
        super().set_attn_implementation(attn_implementation, allow_all_kernels)
        for module in self.modules():
            if isinstance(module, RecurrentDecoderWindowModel):
                module._bind_attention()

    def _set_gradient_checkpointing(self, *args, **kwargs) -> None:
        super()._set_gradient_checkpointing(*args, **kwargs)
        # Whole window steps are recomputed (`RecurrentDecoderWindowStep`); the stock layers inside need not be.
        for module in self.modules():
            if hasattr(module, "gradient_checkpointing") and not isinstance(module, RecurrentDecoderWindowStep):
                module.gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, RecurrentDecoderRecurrence):
            # Equal layer weights to start with: the summary is the plain mean over layers; zero queries and position
            # biases: every slot starts as the mean too.
            init.zeros_(module.layer_weight_logits)
            for name in ("memory_queries", "memory_position_bias", "memory_selection_query"):
                if hasattr(module, name):
                    init.zeros_(getattr(module, name))
            if hasattr(module, "slot_embeddings"):
                std = getattr(self.config.text_config, "initializer_range", None) or 0.02
                init.normal_(module.slot_embeddings, std=std)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """Also takes a state dict in the checkpoint's layout (its `model.safetensors` read as is: `Trainer` resumes a
        run so), renamed as `from_pretrained` renames it; keys already in this model's layout are kept."""
        own = set(self.state_dict())
        if any(key not in own for key in state_dict):
            renamings = get_checkpoint_conversion_mapping(type(self).__name__) or []
            state_dict = {
                key if key in own else apply_renamings(key, renamings): value for key, value in state_dict.items()
            }
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _keep_stock_layout(self, base_model: PreTrainedModel, backbone_path: str, recurrence_path: str) -> None:
        """Save in the stock layout of `base_model`'s family. transformers reverses the class's renamings on save,
        but two stock prefixes (`model`, `transformer`) map to the same name here, so the reverse would be ambiguous:
        the model records the renaming of its own backbone (from_pretrained replaces it with those the checkpoint
        used)."""
        prefix = base_model.base_model_prefix
        saved = f"{prefix}.recurrence" if self.recurrence_saved_in_base_model else "recurrence"
        self._stock_layout = _stock_layout_renamings(backbone_path, (prefix,), recurrence_path, saved)
        self._stock_layout += _module_renamings(self.saved_module_names)
        self._weight_conversions = list(self._stock_layout)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        if kwargs.get("gguf_file") is not None:
            return cls._from_gguf(*args, **kwargs)
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        # A checkpoint read without any renaming (an old named bare model's `h.*`, which transformers reads under the
        # base-model prefix) would be saved again under the names in memory (`backbone.h.*`), a layout no class
        # writes and the other heads do not read: save it in the family's layout instead.
        if not model._weight_conversions:
            # None: the class's registered renamings, which the causal LMs (no `_stock_layout`) save with.
            model._weight_conversions = list(model._stock_layout) if model._stock_layout is not None else None
        return loaded

    @classmethod
    def _from_gguf(
        cls, pretrained_model_name_or_path: str | os.PathLike, *, gguf_file: str, **kwargs
    ) -> "RecurrentDecoderPreTrainedModel":
        """A GGUF file holds a stock causal LM, which transformers reads (de-quantised to float32; transformers cannot
        map its tensors onto this model's names): this model is built around a copy of its weights, only the
        recurrence new, as `hf-recurrence convert` does. `kwargs`: the recurrence settings (`window_size`, ...), the
        `dtype` of the result, and transformers' loading options."""
        if not issubclass(cls, RecurrentDecoderForCausalLM):
            raise ValueError(
                f"{cls.__name__}.from_pretrained(..., gguf_file={gguf_file!r}) is not supported (a GGUF file holds a "
                "stock causal LM): load it with RecurrentDecoderForCausalLM.from_pretrained(..., gguf_file=...), or "
                "convert it with `hf-recurrence convert` and load the folder it writes"
            )
        settings = {name: kwargs.pop(name) for name in RecurrentDecoderConfig.family_settings if name in kwargs}
        config = kwargs.pop("config", None)
        dtype = kwargs.pop("dtype", None)
        # float32 gives plain de-quantised weights (another dtype keeps them packed).
        stock = AutoModelForCausalLM.from_pretrained(
            pretrained_model_name_or_path, gguf_file=gguf_file, dtype=torch.float32, **kwargs
        )
        if config is None:
            options = {key: kwargs[key] for key in _CONFIG_LOADING_OPTIONS if key in kwargs}
            config = cls.config_class.from_pretrained(
                pretrained_model_name_or_path, gguf_file=gguf_file, **options, **settings
            )
        model = cls(config)._with_stock_weights(stock)
        if dtype is not None and dtype != "auto":
            model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return model.eval()

    def _with_stock_weights(self, stock: PreTrainedModel) -> "RecurrentDecoderPreTrainedModel":
        """This causal LM on `stock`'s device and dtype, its backbone holding a copy of every weight of the loaded stock
        causal LM `stock` (the same stock class built from the same config, so every key must match both ways), and
        the stock model's generation defaults (its end of sequence, ...)."""
        model = self.to(device=stock.device, dtype=stock.dtype)
        missing, unexpected = model.backbone.load_state_dict(stock.state_dict(), strict=False)
        if missing or unexpected:
            raise ValueError(f"not a complete checkpoint: missing {missing}, unexpected {unexpected}")
        model.generation_config = copy.deepcopy(stock.generation_config)
        return model

    def new_state(
        self, batch_size: int, window_size: int | None = None, window_overlap: int | None = None
    ) -> RecurrentDecoderState:
        """A fresh state for `batch_size` rows on the model's device and dtype, to pass as `past_key_values`; its
        window schedule defaults to the config's."""
        weight = self.get_input_embeddings().weight
        return self.state_class(
            self.config,
            batch_size,
            weight.device,
            weight.dtype,
            window_size=window_size,
            window_overlap=window_overlap,
        )

    def load_state(self, path: str | os.PathLike) -> RecurrentDecoderState:
        """A state written by `RecurrentDecoderState.save`, read onto the model's device (see
        `RecurrentDecoderState.load` for what is checked)."""
        return self.state_class.load(path, self.config, self.device)


class RecurrentDecoderWindowModel(RecurrentDecoderPreTrainedModel):
    """The window loop over a stock backbone (`self.backbone`, which transformers builds from `config.text_config`
    with `backbone_auto_class`), shared by [`RecurrentDecoderModel`] (over the stock base model) and
    [`RecurrentDecoderForCausalLM`] (over the stock causal LM). They differ only in what the backbone returns for a
    window step (`_run_backbone`)."""

    backbone_auto_class: type

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__(config)
        check_backbone(config.text_config)
        config.check_recurrence_settings()
        # transformers' own class for the backbone; it shares `config.text_config`.
        self.backbone = self.backbone_auto_class.from_config(config.text_config)
        self._check_backbone_model()
        self.recurrence = RecurrentDecoderRecurrence(config)
        self.window_step = RecurrentDecoderWindowStep()
        # The attention the recurrence runs on: the one asked for, else the one transformers chose for the backbone.
        inner = self.config._attn_implementation or self.backbone.config._attn_implementation
        self.config._attn_implementation_internal = inner.removeprefix(RECURRENT_PREFIX)
        self._bind_attention()
        self.post_init()

    def _check_backbone_model(self) -> None:
        """Refuse, at construction, a backbone whose layers the recurrence cannot reach as it expects."""
        family = self.config.text_config.model_type
        stock = type(self.backbone)
        if not stock._can_set_attn_implementation():
            raise ValueError(
                f"RecurrentDecoder cannot run over a {family!r} backbone: {stock.__name__} does not call transformers' "
                "attention interface, which is where h_prev joins the keys/values"
            )
        norm = PRE_ATTENTION_NORMS[family]
        geometry = _cache_geometry(self.config.text_config)
        for i, layer in enumerate(_decoder_layers(self.backbone)):
            attention = _attention_module(layer)
            problems = []
            if getattr(attention, "layer_idx", None) != i:
                problems.append(f"its attention's layer_idx is {getattr(attention, 'layer_idx', None)!r}")
            if getattr(attention, "head_dim", None) != geometry["head_dim"]:
                problems.append(f"its attention's head_dim is {getattr(attention, 'head_dim', None)!r}")
            if norm is not None and not hasattr(layer, norm):
                problems.append(f"it has no pre-attention norm {norm!r}")
            if not hasattr(sys.modules[type(attention).__module__], "eager_attention_forward"):
                problems.append("its module has no eager_attention_forward")
            if problems:
                raise ValueError(
                    f"RecurrentDecoder cannot run over this {family!r} backbone: layer {i} ({type(layer).__name__}) "
                    f"does not have the expected layout: {'; '.join(problems)}"
                )

    def _bind_attention(self) -> None:
        """Run the backbone under `recurrent_<inner>`, `<inner>` being this model's attention implementation.

        Checked before every forward, because transformers (set_attn_implementation, a config's setter) may have
        given the backbone a plain name since; the backbone's own class validates the inner implementation.
        """
        inner = self.config._attn_implementation
        wanted = RECURRENT_PREFIX + inner
        backbone_config = self.backbone.config
        if backbone_config._attn_implementation != wanted:
            # The config setter reaches this model's config unchecked.
            self._check_inner_attention(inner)
            self.backbone.get_correct_attn_implementation(inner)
            backbone_config._attn_implementation_internal = wanted

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, new_embeddings: nn.Module) -> None:
        self.backbone.set_input_embeddings(new_embeddings)

    def _step(
        self,
        settings: _StepSettings,
        embeds: torch.Tensor,
        real: torch.Tensor,
        fill: torch.Tensor,
        slot_valid: torch.Tensor,
        has_h_prev: torch.Tensor,
        h_prev: torch.Tensor,
        window_pooled: torch.Tensor,
        targets: torch.Tensor | None,
        *past: torch.Tensor,
        h_prev_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
        write_slots: torch.Tensor | None = None,
    ) -> _StepOutput:
        """Run the backbone over one stretch of columns that stays inside each row's current window.

        embeds: (batch, cols, hidden) token embeddings (a re-read overlap prefix, then `num_new` new columns);
        real: (batch, cols) bool; fill: (batch,) tokens already in each row's window; `past` = the cached keys of
        every layer, then their values. Pure in its tensor arguments, so it can be recomputed under checkpointing.
        `h_prev` (batch, memory_slots, hidden); `window_pooled`: the state's `pooled_sum`, the window pooled before
        this step (a selecting memory reads its last token there); `h_prev_kv`: where its key and value at the reading
        layers are kept for the window, by layer (a layer missing from it adds its own; None: computed from `h_prev`
        in the step).
        `write_slots` (batch,): a one-column step over fixed-shape buffers writes its keys/values into them in place,
        at these slots, and returns the buffers as its keys/values (see `_StepContext.write_slots`); that step mutates
        `past`, so it is not pure: the compiled single-token decode alone uses it, without gradients.
        """
        num_layers, num_new = len(_decoder_layers(self.backbone)), settings.num_new
        eager = settings.output_attentions or self.config._attn_implementation == "eager"
        slots = self.config.memory_slots
        use_h_prev = settings.uses_h_prev if settings.uses_h_prev is not None else bool(has_h_prev.any())
        positions, plain_mask, inserted_mask = step_positions_and_masks(
            settings, real, fill, slot_valid, has_h_prev, embeds.dtype, eager, use_h_prev, slots, write_slots
        )
        ctx = step_context(
            self.backbone,
            self.config,
            h_prev if use_h_prev else None,
            h_prev_kv,
            eager=eager,
            past=[(past[i], past[num_layers + i]) if past[i].shape[2] else None for i in range(num_layers)],
            plain_mask=plain_mask,
            inserted_mask=inserted_mask,
            output_attentions=settings.output_attentions,
            write_slots=write_slots,
        )
        result, hidden_states = self._run_backbone(
            settings,
            inputs_embeds=embeds,
            position_ids=positions,
            use_cache=False,
            output_hidden_states=True,
            recurrence=ctx,
            return_dict=True,
        )
        if len(ctx.keys) != num_layers:
            # A layer whose attention never reached `recurrent_attention` ran as a stock layer, without h_prev or
            # the window cache: the result would be silently wrong.
            raise RuntimeError(
                f"Only layers {sorted(ctx.keys)} of the {num_layers} layers of the "
                f"{self.config.text_config.model_type!r} backbone ran through the recurrent attention (backbone "
                f"attn_implementation={self.backbone.config._attn_implementation!r})"
            )
        pooled = self.recurrence.pool(hidden_states[1:], real, positions, self.config, window_pooled)  # layer outputs
        attentions = None
        if settings.output_attentions:
            attentions = step_attentions(ctx, slot_valid, real, num_new, settings.window_size, slots)
        all_hidden = tuple(h[:, -num_new:] for h in hidden_states) if settings.output_hidden_states else None
        head = settings.step_head(result, targets) if settings.step_head is not None else None
        return _StepOutput(
            None if settings.step_head is not None else result,
            [ctx.keys[i] for i in range(num_layers)],
            [ctx.values[i] for i in range(num_layers)],
            pooled,
            all_hidden,
            head,
            attentions,
        )

    def _run_backbone(self, settings: _StepSettings, **inputs) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """Run the backbone over one window step (`inputs`: its forward's keyword arguments); return the step's result
        (see `_StepOutput.result`) and every hidden state, (batch, cols, hidden) each."""
        raise NotImplementedError

    def _read_hidden_states(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        state: RecurrentDecoderState | None,
        inputs_embeds: torch.FloatTensor | None,
        use_cache: bool | None,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
        return_dict: bool | None,
        kwargs: dict,
    ) -> RecurrentDecoderModelOutput:
        """Read the input window by window and return every new position's final hidden state (after the final norm),
        with the state and, when asked, every layer's hidden states and attention weights."""
        embeds, real, document_starts, state = self._prepare(input_ids, attention_mask, state, inputs_embeds, kwargs)
        output_hidden_states, output_attentions = self._output_flags(output_hidden_states, output_attentions)
        steps = self._forward_windows(
            embeds, real, document_starts, state, None, None, None, output_hidden_states, output_attentions
        )
        run = _WindowsRun(state, steps, output_hidden_states, output_attentions)
        output = RecurrentDecoderModelOutput(last_hidden_state=run.results(), **run.outputs(use_cache))
        return output if return_dict is not False else output.to_tuple()

    def _h_prev_key_value(self, h_prev: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """`h_prev`'s key and value at each reading layer, by layer, (batch, kv_head, memory_slots, head_dim) each, as
        a step computes them; what a fixed-shape state keeps for a whole window
        (`FixedShapeWindowCache.h_prev_key_value`)."""
        return h_prev_key_value(self.backbone, self.config, h_prev)

    def _next_h_prev(self, state: RecurrentDecoderState) -> torch.Tensor:
        """(batch, memory_slots, hidden) the `h_prev` of each row's next window: its current window's summary through
        the FFN (zeros instead of the summary for the control arm, `recurrence_input="zeros"`)."""
        summary = state.window_summary()
        if self.config.recurrence_input == "zeros":
            summary = torch.zeros_like(summary)
        k = self.config.bptt_windows
        if k is not None and self.training:
            # Windows 1..k+1, k+2..2k+2, ... form the runs gradient may cross; cut at the window before each run.
            cut = (state.window_index % (k + 1) == 0)[:, None, None]
            summary = torch.where(cut, summary.detach(), summary)
        return self.recurrence(summary.to(state.h_prev.dtype))

    def _forward_windows(
        self,
        inputs_embeds: torch.Tensor | _WindowEmbeddings,
        real: torch.Tensor,
        document_starts: torch.Tensor | None,
        state: RecurrentDecoderState,
        kept: _KeptColumns | None,
        step_targets: torch.Tensor | None,
        step_head: Callable | None,
        output_hidden_states: bool,
        output_attentions: bool,
    ) -> list[_StepOutput]:
        """Feed (batch, length, hidden) embeddings through the state's window schedule, advancing it in place.

        Each step covers columns that stay inside every row's current window; a row whose window is full begins a
        new one (re-reading its overlap) just before its next real token. At the `document_starts` ((batch, length)
        bool, packed sequences) a row forgets its text, so each document is read as if alone from a new state.
        `kept`: the columns to compute logits for (None: none).
        """
        state.mark_checked(self)  # `_prepare` checked the call and the state
        plain = kept is not None and kept.columns is None and step_head is None and document_starts is None
        if plain and inputs_embeds.shape[1] == 1 and not (output_hidden_states or output_attentions):
            logits = _fixed_shape_decode(self, state, inputs_embeds, real)
            if logits is not None:
                return [_StepOutput(logits, [], [], None, None, None, None)]
        length = inputs_embeds.shape[1]
        if state.lockstep is not None and not bool(real.all()):  # the call's one read of the device
            state.leave_lockstep()
        # Steps also begin at every column where some row starts a document, so that no step spans two documents.
        boundaries = [] if document_starts is None else document_starts.any(0).nonzero()[:, 0].tolist()
        boundaries.append(length)
        # The position ids and masks of the steps in lockstep: every full window of the call has the same ones.
        lockstep_tensors = _LockstepTensors()
        steps = []
        start = 0
        while start < length:
            if start == boundaries[0]:
                boundaries.pop(0)
                state.begin_documents(document_starts[:, start])
            starting, reread, width = state.next_step(real[:, start:])
            if starting is not None:
                state.start_windows(starting, self._next_h_prev(state))
            width = min(width, boundaries[0] - start)
            stop = start + width
            new_embeds, new_real = inputs_embeds[:, start:stop], real[:, start:stop]
            embeds, step_real = (
                state.with_overlap(new_embeds, new_real, starting) if reread else (new_embeds, new_real)
            )
            settings = _step_settings(
                state,
                width,
                kept.in_step(start, stop, reread) if kept is not None else None,
                step_head,
                output_hidden_states,
                output_attentions,
                lockstep_tensors,
            )
            args = (
                embeds,
                step_real,
                state.fill,
                state.slot_valid,
                state.has_h_prev,
                state.h_prev,
                state.pooled_sum,
                step_targets[:, start:stop].contiguous() if step_targets is not None else None,
                *state.keys,
                *state.values,
            )
            step_fn = self._step
            if self.__dict__.get("_reads_with_fixed_weights", False) and not torch.is_grad_enabled():
                step_fn = functools.partial(step_fn, h_prev_kv=state.h_prev_key_values(self))
            flat = self.window_step(step_fn, settings, *args)
            step = _StepOutput.from_flat(flat, len(state.keys), settings)
            state.append_step(step.keys, step.values, step_real, step.pooled, new_embeds, new_real)
            # The state owns the cache and the pooled sum now; a reference left here would keep every window's cache
            # alive until return.
            step.keys, step.values, step.pooled = [], [], None
            if steps and steps[-1].carries_nothing:
                # Adds nothing to the outputs (the next step's result follows it, and an empty one joins as nothing):
                # dropped, so that what a call keeps does not grow with the windows it reads for no output.
                steps.pop()
            steps.append(step)
            start = stop
        return steps

    def _prepare(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        state: RecurrentDecoderState | None,
        inputs_embeds: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor | _WindowEmbeddings, torch.Tensor, torch.Tensor | None, RecurrentDecoderState]:
        """Validate the inputs; return the new positions' embeddings (looked up window by window from `input_ids`
        without gradient), their real-token mask, where packed documents start (from `position_ids`, see
        `_document_starts`) and the state."""
        _refuse_export(self)
        if kwargs.get("token_type_ids") is not None:
            raise ValueError(f"token_type_ids are not supported by {type(self).__name__}")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
            if torch.is_grad_enabled() or input_ids.shape[1] <= self.config.window_size:
                # One lookup: with gradient, each window's own would give the embedding's backward a (vocab, hidden)
                # gradient each; an input of one window or less (a decode step) is no longer than a window's.
                inputs_embeds = self.get_input_embeddings()(input_ids)
            else:
                inputs_embeds = _WindowEmbeddings(self.get_input_embeddings(), input_ids)
        batch, length = inputs_embeds.shape[:2]
        if length == 0:
            raise ValueError("The input is empty (length 0)")
        # The config may have been changed since the model was built; integer checks only, no device sync.
        self.config.check_model_settings()
        self._bind_attention()
        if state is None:
            state = self.state_class(self.config, batch, inputs_embeds.device, inputs_embeds.dtype)
        else:
            state = self.state_class.adopt(state, self.config, batch, inputs_embeds.dtype)
            self.config.check_window_schedule(state.window_size, state.window_overlap)
        if attention_mask is None:
            real = torch.ones(batch, length, dtype=torch.bool, device=inputs_embeds.device)
        else:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
                raise ValueError(
                    f"attention_mask must be (batch, length) for the new tokens or (batch, past + length) as "
                    f"generate() passes it; got shape {tuple(attention_mask.shape)} for input of shape "
                    f"{(batch, length)}"
                )
            real = attention_mask[:, -length:].to(device=inputs_embeds.device, dtype=torch.bool)
        continuing = state.get_seq_length() > 0
        # Positions themselves restart in every window and come from the window schedule (so forward() has no
        # position_ids parameter, and generate() builds none); given ones only mark where packed documents start.
        document_starts = _document_starts(kwargs.get("position_ids"), real, continuing)
        return inputs_embeds, real, document_starts, state

    def _output_flags(self, output_hidden_states: bool | None, output_attentions: bool | None) -> tuple[bool, bool]:
        """The call's values, else the config's."""
        return (
            bool(output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states),
            bool(output_attentions if output_attentions is not None else self.config.output_attentions),
        )


class RecurrentDecoderBaseModelView:
    """`RecurrentDecoderForCausalLM.base_model`: called with the inputs of `RecurrentDecoderModel.forward`, the causal
    LM's final hidden states (no logits); any attribute is the stock base model's (`layers`, `embed_tokens`, `h`,
    `wte`, ...), as a stock causal LM's `base_model` is its base model."""

    def __init__(self, model: "RecurrentDecoderForCausalLM"):
        self._model = model

    def __call__(self, *args, **kwargs) -> RecurrentDecoderModelOutput:
        # The bare model's forward, on the causal LM's backbone (whose steps then return final hidden states).
        return RecurrentDecoderModel.forward(self._model, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model.backbone.base_model, name)


class RecurrentDecoderForCausalLM(RecurrentDecoderWindowModel, RecurrentDecoderGenerationMixin):
    """A stock transformers decoder (`backbone`) that reads text window by window with the paper's recurrence.

    `from_pretrained(<a stock checkpoint of a supported family>, window_size=..., window_overlap=...,
    insertion_layer=...)` loads every stock weight unchanged; only `recurrence.*` is new. Saved checkpoints keep the
    stock layout (`model.*`, `lm_head.*`) plus `recurrence.*`.

    Example:

    ```python
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from hf_recurrence import RecurrentDecoderConfig, RecurrentDecoderForCausalLM

    >>> backbone = LlamaConfig(
    ...     vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    ...     num_key_value_heads=2, max_position_embeddings=32,
    ... )
    >>> config = RecurrentDecoderConfig(text_config=backbone, window_size=16, insertion_layer=1)
    >>> model = RecurrentDecoderForCausalLM(config)
    >>> ids = torch.randint(0, 100, (2, 100))  # 7 windows, far past max_position_embeddings
    >>> model(ids, labels=ids).loss.shape
    torch.Size([])

    ```
    """

    backbone_auto_class = AutoModelForCausalLM

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__(config)
        # transformers picks the loss from the class-name suffix; set it so no lookup warns.
        self.loss_type = "ForCausalLM"

    def get_output_embeddings(self) -> nn.Module:
        return self.backbone.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.backbone.set_output_embeddings(new_embeddings)

    @property
    def base_model(self) -> "RecurrentDecoderBaseModelView":
        """The model without its language-modelling head, as tools that apply the head themselves call it (TRL's
        fused LM head, Liger kernels): the stock backbone's attributes, and called, the text read window by window
        with the recurrence, returning every position's final hidden state. (The stock backbone itself is
        `model.backbone`; run outside the window loop, it refuses to run.)"""
        return RecurrentDecoderBaseModelView(self)

    def _run_backbone(self, settings: _StepSettings, **inputs) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """The stock causal LM's logits of the step's kept columns, from its own head (Gemma2's final soft-cap
        included), (batch, kept, vocab), or None when none are asked for; and every hidden state."""
        keep = settings.logits_to_keep
        # An empty tensor of positions keeps none (0 would keep all), so the head computes nothing.
        out = self.backbone(**inputs, logits_to_keep=keep if keep is not None else torch.zeros(0, dtype=torch.long))
        if keep is None:  # no logits asked for: the final hidden states, as the bare model returns (`base_model`)
            return out.hidden_states[-1][:, -settings.num_new :], out.hidden_states
        return out.logits, out.hidden_states

    def _targets(
        self,
        labels: torch.Tensor | None,
        shift_labels: torch.Tensor | None,
        inputs: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """(batch, length) target of every new position, -100 where none: `shift_labels` as given (Trainer passes
        pre-shifted targets under context parallelism and sequence packing), else `labels` shifted left by one; none
        at the last token of a packed document (`position_ids`)."""
        targets = shift_labels
        if targets is None:
            if labels is None:
                return None
            targets = nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        if inputs is None:  # _prepare says what is missing
            return targets
        if targets.shape != inputs.shape[:2]:
            given = "shift_labels" if shift_labels is not None else "labels"
            raise ValueError(
                f"{given} must have the input's shape {tuple(inputs.shape[:2])}, got {tuple(targets.shape)}"
            )
        return _drop_cross_document_targets(targets.to(inputs.device), position_ids)

    def _loss(self, logits: torch.Tensor, shift_labels: torch.Tensor, num_items: torch.Tensor | int) -> torch.Tensor:
        """Summed cross-entropy of already shifted labels, divided by the item count of the whole input."""
        return self.loss_function(
            logits, None, self.config.text_config.vocab_size, shift_labels=shift_labels, num_items_in_batch=num_items
        )

    def _logits_and_loss(
        self,
        embeds: torch.Tensor,
        real: torch.Tensor,
        document_starts: torch.Tensor | None,
        state: RecurrentDecoderState,
        shift_labels: torch.Tensor | None,
        return_logits: bool | None,
        logits_to_keep: int | torch.Tensor,
        num_items: torch.Tensor | int | None,
        outputs: tuple[bool, bool],
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, _WindowsRun]:
        """Read the input's windows; return the logits kept (None when `return_logits` says so, as `forward`
        documents), the loss (None without targets) and the run. Without logits the loss is taken window by
        window, so the `(tokens, vocab)` logits are never held. `num_items`: Trainer's item count, else the targets'
        own; `outputs`: whether to return hidden states and attentions."""
        # Evaluation (Trainer's prediction_step, compute_metrics) needs the logits; training keeps the memory-lean loss.
        keep_logits = (shift_labels is None or not self.training) if return_logits is None else return_logits
        if shift_labels is not None and num_items is None:
            num_items = (shift_labels != -100).sum()

        def window_loss(logits: torch.Tensor, step_labels: torch.Tensor) -> torch.Tensor:
            return self._loss(logits, step_labels, num_items)  # one window's (batch, new, vocab) logits

        loss_per_window = shift_labels is not None and not keep_logits
        # Every column's logits for the loss; none where nothing is returned (then the steps keep nothing).
        columns = logits_to_keep if keep_logits else 0 if loss_per_window else torch.zeros(0, dtype=torch.long)
        kept = _KeptColumns(columns, embeds.shape[1], embeds.device)
        steps = self._forward_windows(
            embeds,
            real,
            document_starts,
            state,
            kept,
            shift_labels if loss_per_window else None,
            window_loss if loss_per_window else None,
            *outputs,
        )
        run = _WindowsRun(state, steps, *outputs)
        logits = loss = None
        if loss_per_window:
            loss = torch.stack(run.head_outputs()).sum()
        elif keep_logits:
            logits = run.results()
            if kept.order is not None:
                logits = logits[:, kept.order]
            loss = self._loss(logits, shift_labels, num_items) if shift_labels is not None else None
        return logits, loss, run

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentDecoderState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        cache: RecurrentDecoderState | None = None,
        **kwargs,
    ) -> RecurrentDecoderCausalLMOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Token ids; with `past_key_values`, only the new tokens.
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
                1 for real tokens, 0 for padding (anywhere; padding never changes real tokens' outputs). May also
                cover the past tokens, as `generate()` passes it; then its last `sequence_length` columns are used.
            past_key_values or cache ([`RecurrentDecoderState`], *optional*):
                State returned by a previous call, or a fresh one with another window schedule (`new_state`); the
                input continues that text exactly. Either name on any supported transformers (`cache` is its name
                from transformers 5.24 on).
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`, *optional*):
                Token embeddings instead of `input_ids` (before any scaling the backbone applies to them).
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, usually `input_ids`; shifted inside the model (`-100` is ignored). The loss is computed
                window by window, so the `(tokens, vocab)` logits are never materialised for it.
            use_cache (`bool`, *optional*, defaults to `True`):
                Whether to return the state. `config.use_cache` is not consulted: `Trainer` switches it off for
                training, and a recurrent model's state is part of its result.
            output_hidden_states (`bool`, *optional*):
                Whether to return the embedding output and every layer's output.
            output_attentions (`bool`, *optional*):
                Whether to return every layer's attention weights, laid out by window position (see
                [`RecurrentDecoderCausalLMOutput`]); computed with the backbone's eager attention.
            return_logits (`bool`, *optional*):
                Whether to return the logits. Defaults to `True`, except with `labels` in training mode (`False`: the
                memory-lean window-by-window loss). `False` in eval mode gives the loss alone, window by window.
            logits_to_keep (`int` or `torch.Tensor`, *optional*, defaults to 0):
                An int: the logits of the last `logits_to_keep` positions only (0: all), as `generate()` asks for
                when it reads a prompt. A 1D tensor: the positions to keep. Not combinable with `labels`.
            position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Only marks packed documents (positions restart in every window): positions count up by one within a
                document and restart at 0 where the next one begins; each document is then read as if alone.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*):
                Passed by `Trainer` under gradient accumulation: the loss is summed and divided by it.
            shift_labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets already aligned with the positions that predict them; used as given instead of shifting
                `labels`.
        """
        state = _given_state(past_key_values, cache)
        if not kwargs and labels is None and inputs_embeds is None:
            outputs = (use_cache, return_logits, logits_to_keep, output_hidden_states, output_attentions)
            logits = self._decode_token(input_ids, attention_mask, state, *outputs)
            if logits is not None:
                output = RecurrentDecoderCausalLMOutput(logits=logits, **{STATE_NAME: state})
                return output if return_dict is not False else output.to_tuple()
        _refuse_logits_to_keep_with_labels(logits_to_keep, labels, kwargs.get("shift_labels"))
        inputs = input_ids if input_ids is not None else inputs_embeds
        shift_labels = self._targets(labels, kwargs.get("shift_labels"), inputs, kwargs.get("position_ids"))
        embeds, real, document_starts, state = self._prepare(input_ids, attention_mask, state, inputs_embeds, kwargs)
        logits, loss, run = self._logits_and_loss(
            embeds,
            real,
            document_starts,
            state,
            shift_labels,
            return_logits,
            logits_to_keep,
            kwargs.get("num_items_in_batch"),
            self._output_flags(output_hidden_states, output_attentions),
        )
        output = RecurrentDecoderCausalLMOutput(loss=loss, logits=logits, **run.outputs(use_cache))
        return output if return_dict is not False else output.to_tuple()


class RecurrentDecoderModel(RecurrentDecoderWindowModel):
    """The stock base model of a supported decoder family (`backbone`, e.g. `LlamaModel`) that reads text window by
    window with the paper's recurrence; returns every position's final hidden state (after the final norm), the state
    to continue from, and on request every layer's hidden states and attention weights.

    `from_pretrained(<a stock checkpoint>)` loads its `model.*` (GPT-2: `transformer.*`) weights into the backbone;
    only `recurrence.*` is new. Saved checkpoints keep that layout, so this model and [`RecurrentDecoderForCausalLM`]
    load each other's checkpoints.
    """

    backbone_auto_class = AutoModel

    def __init__(self, config: RecurrentDecoderConfig):
        super().__init__(config)
        self._keep_stock_layout(self.backbone, "backbone", "recurrence")

    def _run_backbone(self, settings: _StepSettings, **inputs) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...]]:
        """The stock base model's final hidden states of the step's new columns, (batch, new, hidden), and every
        hidden state."""
        out = self.backbone(**inputs)
        return out.last_hidden_state[:, -settings.num_new :], out.hidden_states

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: RecurrentDecoderState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        cache: RecurrentDecoderState | None = None,
        **kwargs,
    ) -> RecurrentDecoderModelOutput:
        r"""
        The arguments of [`RecurrentDecoderForCausalLM.forward`] without the language-modelling ones (`labels`,
        `shift_labels`, `num_items_in_batch`, `return_logits`, `logits_to_keep`). The state (`past_key_values`, or
        `cache` from transformers 5.24 on) may come from either model with the same weights: the input continues its
        text exactly.
        """
        return self._read_hidden_states(
            input_ids,
            attention_mask,
            _given_state(past_key_values, cache),
            inputs_embeds,
            use_cache,
            output_hidden_states,
            output_attentions,
            return_dict,
            kwargs,
        )


class RecurrentDecoderForSequenceClassification(GenericForSequenceClassification, RecurrentDecoderPreTrainedModel):
    """[`RecurrentDecoderModel`] with a linear classifier on the last non-padding token (transformers' generic
    sequence-classification head, as the stock Llama's, Qwen's, GPT-2's), so a document of any length is classified
    after reading all of it window by window. A stock `XForSequenceClassification` checkpoint loads unchanged, only
    `recurrence.*` new.

    A long document may also be read in pieces: pass each call's state (`past_key_values`, `cache` from transformers
    5.24 on) to the next and take the logits of the last call. As with the stock heads, a batch of more than one row
    needs the backbone's `pad_token_id` (padding is found by it, on either side).
    """

    base_model_prefix = "model"
    base_model_class = RecurrentDecoderModel

    def __init__(self, config: RecurrentDecoderConfig):
        # The generic head builds its base model with AutoModel, which remote code cannot resolve: build ours here.
        RecurrentDecoderPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        self.score = nn.Linear(config.text_config.hidden_size, config.num_labels, bias=False)
        self._keep_stock_layout(self.model.backbone, "model.backbone", "model.recurrence")
        self.post_init()


class RecurrentDecoderForTokenClassification(GenericForTokenClassification, RecurrentDecoderPreTrainedModel):
    """[`RecurrentDecoderModel`] with a linear classifier on every token's final hidden state (transformers' generic
    token-classification head, as the stock Llama's and Qwen's, whose checkpoints load unchanged), for inputs of any
    length."""

    base_model_prefix = "model"
    base_model_class = RecurrentDecoderModel

    def __init__(self, config: RecurrentDecoderConfig):
        RecurrentDecoderPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        text = config.text_config
        # As the generic head reads its dropout and bias, from the backbone's config here.
        dropout = next(
            (
                p
                for p in (getattr(text, "classifier_dropout", None), getattr(text, "hidden_dropout", None))
                if p is not None
            ),
            0.1,
        )
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(
            text.hidden_size, config.num_labels, bias=getattr(text, "token_classification_bias", True)
        )
        self._keep_stock_layout(self.model.backbone, "model.backbone", "model.recurrence")
        self.post_init()


class RecurrentGPT2LMHeadModel(RecurrentDecoderForCausalLM, GenerationMixin):
    """[`RecurrentDecoderForCausalLM`] over GPT-2, under the name and in the checkpoint layout (a flat
    [`RecurrentGPT2Config`], the recurrence saved as `transformer.recurrence.*`) that recurrent GPT-2 checkpoints and
    state files have always had; any GPT-2 checkpoint converts with `from_pretrained(..., window_size=...)`."""

    config_class = RecurrentGPT2Config
    state_class = RecurrentGPT2State
    recurrence_saved_in_base_model = True

    @property
    def transformer(self) -> nn.Module:
        """The stock `GPT2Model` inside the backbone, where this class kept it before the core (`model.transformer.h`,
        `model.transformer.wte`, ...)."""
        return self.backbone.transformer

    @property
    def lm_head(self) -> nn.Module:
        """The stock head inside the backbone, where `GPT2LMHeadModel` has it."""
        return self.backbone.lm_head


class RecurrentLlamaForCausalLM(RecurrentDecoderForCausalLM, GenerationMixin):
    """[`RecurrentDecoderForCausalLM`] over Llama, under the name and in the checkpoint layout (a flat
    [`RecurrentLlamaConfig`], the recurrence saved as `model.recurrence.*`) that recurrent Llama checkpoints and
    state files have always had; any Llama checkpoint converts with `from_pretrained(..., window_size=...)`."""

    config_class = RecurrentLlamaConfig
    state_class = RecurrentLlamaState
    recurrence_saved_in_base_model = True

    def __init__(self, config: RecurrentLlamaConfig):
        super().__init__(config)
        # As `LlamaForCausalLM` sets it (`resize_token_embeddings` updates it).
        self.vocab_size = config.vocab_size

    @property
    def model(self) -> nn.Module:
        """The stock `LlamaModel` inside the backbone, where this class kept it before the core (`model.model.layers`,
        `model.model.embed_tokens`, ...)."""
        return self.backbone.model

    @property
    def lm_head(self) -> nn.Module:
        """The stock head inside the backbone, where `LlamaForCausalLM` has it."""
        return self.backbone.lm_head


class RecurrentGPT2Model(RecurrentDecoderModel):
    """[`RecurrentDecoderModel`] over GPT-2 under the recurrent GPT-2's name and config."""

    # What the stock base model is called in the family's checkpoints.
    stock_base_prefix = "transformer"
    config_class = RecurrentGPT2Config
    state_class = RecurrentGPT2State
    recurrence_saved_in_base_model = True


class RecurrentLlamaModel(RecurrentDecoderModel):
    """[`RecurrentDecoderModel`] over Llama under the recurrent Llama's name and config."""

    stock_base_prefix = "model"
    config_class = RecurrentLlamaConfig
    state_class = RecurrentLlamaState
    recurrence_saved_in_base_model = True


class RecurrentGPT2ForSequenceClassification(RecurrentDecoderForSequenceClassification):
    """[`RecurrentDecoderForSequenceClassification`] over GPT-2, in the recurrent GPT-2's checkpoint layout."""

    config_class = RecurrentGPT2Config
    base_model_class = RecurrentGPT2Model
    recurrence_saved_in_base_model = True


class RecurrentGPT2ForTokenClassification(RecurrentDecoderForTokenClassification):
    """[`RecurrentDecoderForTokenClassification`] over GPT-2, in the recurrent GPT-2's checkpoint layout, whose
    scoring layer is `classifier` as in GPT-2's own token classifier."""

    config_class = RecurrentGPT2Config
    base_model_class = RecurrentGPT2Model
    recurrence_saved_in_base_model = True
    saved_module_names = {"classifier": "score"}

    @property
    def classifier(self) -> nn.Linear:
        return self.score


class RecurrentLlamaForSequenceClassification(RecurrentDecoderForSequenceClassification):
    """[`RecurrentDecoderForSequenceClassification`] over Llama, in the recurrent Llama's checkpoint layout."""

    config_class = RecurrentLlamaConfig
    base_model_class = RecurrentLlamaModel
    recurrence_saved_in_base_model = True


class RecurrentLlamaForTokenClassification(RecurrentDecoderForTokenClassification):
    """[`RecurrentDecoderForTokenClassification`] over Llama, in the recurrent Llama's checkpoint layout."""

    config_class = RecurrentLlamaConfig
    base_model_class = RecurrentLlamaModel
    recurrence_saved_in_base_model = True


def _module_renamings(saved_module_names: dict[str, str]) -> list[WeightRenaming]:
    """Renamings of modules saved under another name (on disk -> in memory)."""
    return [
        WeightRenaming(source_patterns=rf"^{saved}\.", target_patterns=f"{name}.")
        for saved, name in saved_module_names.items()
    ]


def _causal_lm_renamings(saved_recurrence: str = "recurrence") -> list[WeightRenaming]:
    """From the stock causal-LM layout on disk (`model.*` / `transformer.*` / `lm_head.*`, the recurrence at
    `saved_recurrence.*`) to the backbone under `backbone.`; transformers reverses them on save."""
    renamings = []
    if saved_recurrence != "recurrence":
        renamings.append(WeightRenaming(source_patterns=rf"^{saved_recurrence}\.", target_patterns="recurrence."))
    for prefix in ("model", "transformer", "lm_head"):
        renamings.append(WeightRenaming(source_patterns=rf"^{prefix}\.", target_patterns=f"backbone.{prefix}."))
    return renamings


# Checkpoints keep the stock layout: the backbone's `model.*` / `transformer.*` / `lm_head.*` on disk, under
# `backbone.` (`model.backbone.` in the classification heads) in memory, reversed on save, so a stock checkpoint
# loads directly. The named families keep their recurrence inside the base model, as before the core.
register_checkpoint_conversion_mapping(
    RecurrentDecoderModel.__name__, _stock_layout_renamings("backbone"), overwrite=True
)
for _model_class in (RecurrentGPT2Model, RecurrentLlamaModel):
    _prefix = _model_class.stock_base_prefix
    register_checkpoint_conversion_mapping(
        _model_class.__name__,
        _stock_layout_renamings("backbone", (_prefix,), "recurrence", f"{_prefix}.recurrence"),
        overwrite=True,
    )
for _head in (
    RecurrentDecoderForSequenceClassification,
    RecurrentDecoderForTokenClassification,
    RecurrentGPT2ForSequenceClassification,
    RecurrentGPT2ForTokenClassification,
    RecurrentLlamaForSequenceClassification,
    RecurrentLlamaForTokenClassification,
):
    named = _head.recurrence_saved_in_base_model
    prefixes = (_head.base_model_class.stock_base_prefix,) if named else STOCK_BASE_PREFIXES
    register_checkpoint_conversion_mapping(
        _head.__name__,
        _stock_layout_renamings(
            "model.backbone", prefixes, "model.recurrence", f"{prefixes[0]}.recurrence" if named else "recurrence"
        )
        + _module_renamings(_head.saved_module_names),
        overwrite=True,
    )
for _model_class, _saved_recurrence in (
    (RecurrentDecoderForCausalLM, "recurrence"),
    (RecurrentGPT2LMHeadModel, "transformer.recurrence"),
    (RecurrentLlamaForCausalLM, "model.recurrence"),
):
    register_checkpoint_conversion_mapping(
        _model_class.__name__, _causal_lm_renamings(_saved_recurrence), overwrite=True
    )


__all__ = [
    "RecurrentDecoderForCausalLM",
    "RecurrentDecoderForSequenceClassification",
    "RecurrentDecoderForTokenClassification",
    "RecurrentDecoderModel",
    "RecurrentDecoderPreTrainedModel",
    "RecurrentDecoderState",
    "RecurrentGPT2ForSequenceClassification",
    "RecurrentGPT2ForTokenClassification",
    "RecurrentGPT2LMHeadModel",
    "RecurrentGPT2Model",
    "RecurrentGPT2State",
    "RecurrentLlamaForCausalLM",
    "RecurrentLlamaForSequenceClassification",
    "RecurrentLlamaForTokenClassification",
    "RecurrentLlamaModel",
    "RecurrentLlamaState",
]
