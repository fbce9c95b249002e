# SPDX-License-Identifier: Apache-2.0
"""PyTorch Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
Context"), written from the paper: segment-level recurrence with stop-gradient memories, relative sinusoidal
positions with the u/v biases and the linear-cost relative shift. Plain softmax output tied to the input embeddings."""

import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput, logging

from .configuration_transformer_xl import TransformerXLConfig
from .state_transformer_xl import STATE_NAME, TransformerXLState, _last_slots, _Memory


logger = logging.get_logger(__name__)


# Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder._refuse_logits_to_keep_with_labels
def _refuse_logits_to_keep_with_labels(
    logits_to_keep: int | torch.Tensor, labels: torch.Tensor | None, shift_labels: torch.Tensor | None
) -> None:
    """The loss needs every position's logits, so some of them only cannot be asked for with targets."""
    keeps_some = not isinstance(logits_to_keep, int) or logits_to_keep != 0
    if keeps_some and (labels is not None or shift_labels is not None):
        raise ValueError(
            f"logits_to_keep={logits_to_keep} cannot be combined with labels: the loss needs every position"
        )


# Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder._given_state
def _given_state(past_key_values: object | None, cache: object | None) -> object | None:
    """The state passed under either name."""
    if past_key_values is not None and cache is not None:
        raise ValueError(
            "Pass the state once: as cache or as past_key_values (its name before transformers 5.24), not both"
        )
    return past_key_values if cache is None else cache


def _model_output_class(name: str, doc: str, fields: dict[str, object]) -> type[ModelOutput]:
    """A ModelOutput dataclass with `fields` (name -> annotation, each defaulting to None), in which the field named
    `past_key_values` takes the installed transformers' name for the state (a dataclass's field names are fixed when
    the class is made, and transformers 5.24's generate() reads `outputs.cache`)."""
    return make_dataclass(
        name,
        [(STATE_NAME if key == "past_key_values" else key, kind, field(default=None)) for key, kind in fields.items()],
        bases=(ModelOutput,),
        namespace={"__doc__": doc, "__module__": __name__},
    )


def sinusoidal_position_encoding(distances: torch.Tensor, d_model: int) -> torch.Tensor:
    """The paper's R: `[sin(d * f), cos(d * f)]` with `f = 1 / 10000^(2k / d_model)`. (len,) -> (len, d_model)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=distances.device, dtype=torch.float32) / d_model))
    angles = distances.float()[:, None] * inv_freq[None, :]  # (len, d_model / 2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_shift(scores: torch.Tensor) -> torch.Tensor:
    """Turn position scores indexed by key column into scores indexed by relative distance (paper, appendix B).

    `scores[..., i, c]` holds query i's score for distance `klen - 1 - c`. The result holds at `[..., i, j]` the score
    for distance `(klen - q) + i - j`, i.e. from query i (which sits after `klen - q` memory slots) to key j, for every
    `j <= klen - q + i`; entries for keys after the query are meaningless and must be masked. One pad and two reshapes
    instead of a gather: O(q * klen) work with no index tensor.
    """
    *lead, q, klen = scores.shape
    padded = nn.functional.pad(scores, (1, 0))  # (..., q, klen + 1): a zero column in front of every row
    padded = padded.view(*lead, klen + 1, q)
    return padded[..., 1:, :].reshape(*lead, q, klen)


def distance_attentions(probs: torch.Tensor, slots: int, width: int) -> torch.Tensor:
    """Attention weights indexed by distance instead of key column, so that every segment has the same columns.

    probs: (rows, head, q, slots + q) over memory slots then segment keys. Returns (rows, head, q, width) whose
    column d is the weight on the key d positions before the query (0: itself); distances with no key are zero.
    """
    q = probs.shape[-2]
    distance = torch.arange(width, device=probs.device)
    key = slots + torch.arange(q, device=probs.device)[:, None] - distance[None, :]  # (q, width)
    gathered = probs.gather(-1, key.clamp(min=0).expand(*probs.shape[:2], q, width))
    return gathered * (key >= 0).to(probs.dtype)


# Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder._refuse_export
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


# Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder._document_starts
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


# Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder._drop_cross_document_targets
def _drop_cross_document_targets(targets: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """(batch, length) shifted targets without those of the positions followed by a document start (position 0): the
    last token of a packed document does not predict the first token of the next."""
    if position_ids is None or position_ids.shape[-1] != targets.shape[-1]:
        # A misshapen position_ids is reported by `_document_starts`.
        return targets
    next_starts = nn.functional.pad(position_ids[..., 1:] == 0, (0, 1), value=False)  # ([batch,] length)
    return targets.masked_fill(next_starts.to(targets.device), -100)


class TransformerXLAdaptiveEmbedding(nn.Module):
    """Adaptive input embeddings (Baevski and Auli 2019) laid out as transformers 4.x's TransfoXL has them: the
    vocabulary splits at `config.cutoffs` into clusters, cluster `i` embeds in `d_embed // div_val**i` dimensions
    and is projected to `d_model`. Unscaled: the model multiplies every embedding by `sqrt(d_model)`."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.ranges = config.cluster_ranges()
        widths = config.cluster_widths()
        if config.div_val == 1:
            # One table for the whole vocabulary, projected only if it is narrower than the model.
            self.emb_layers = nn.ModuleList([nn.Embedding(config.vocab_size, widths[0])])
            projected = widths[0] != config.d_model
            self.emb_projs = nn.ParameterList([torch.empty(config.d_model, widths[0])] if projected else [])
        else:
            self.emb_layers = nn.ModuleList(
                nn.Embedding(end - start, w) for (start, end), w in zip(self.ranges, widths, strict=True)
            )
            self.emb_projs = nn.ParameterList(torch.empty(config.d_model, w) for w in widths)
        self.d_model = config.d_model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(batch, length) ids -> (batch, length, d_model) embeddings."""
        if len(self.emb_layers) == 1:
            embeds = self.emb_layers[0](input_ids)
            return nn.functional.linear(embeds, self.emb_projs[0]) if len(self.emb_projs) else embeds
        weight = self.emb_projs[0]
        embeds = weight.new_zeros(*input_ids.shape, self.d_model)
        for (start, end), table, projection in zip(self.ranges, self.emb_layers, self.emb_projs, strict=True):
            in_cluster = (input_ids >= start) & (input_ids < end)
            embeds = embeds.index_put(
                (in_cluster,), nn.functional.linear(table(input_ids[in_cluster] - start), projection)
            )
        return embeds


class TransformerXLAdaptiveLogSoftmax(nn.Module):
    """The adaptive softmax (Grave et al. 2017) of transformers 4.x's TransfoXL, returning log-probabilities over the
    whole vocabulary (valid logits: their softmax is themselves). The head scores the frequent tokens, then one entry per
    tail cluster in order; a token of cluster `i` gets that entry's log-probability plus its own in the cluster. Every
    output layer has a bias."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.ranges = config.cluster_ranges()
        widths = config.cluster_widths()
        clusters = len(self.ranges) - 1
        if clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(clusters, widths[0]))
            self.cluster_bias = nn.Parameter(torch.zeros(clusters))
        if config.div_val == 1:
            self.out_layers = nn.ModuleList([nn.Linear(widths[0], config.vocab_size)])
            projected = widths[0] != config.d_model
            self.out_projs = nn.ParameterList(
                torch.empty(config.d_model, widths[0]) for _ in range(clusters + 1 if projected else 0)
            )
        else:
            self.out_layers = nn.ModuleList(
                nn.Linear(w, end - start) for (start, end), w in zip(self.ranges, widths, strict=True)
            )
            self.out_projs = nn.ParameterList(torch.empty(config.d_model, w) for w in widths)

    def _cluster_logits(self, hidden: torch.Tensor, cluster: int) -> torch.Tensor:
        """(..., d_model) -> the logits of one cluster's tokens (the head's also of the tail clusters)."""
        if len(self.out_layers) == 1:
            start, end = self.ranges[cluster]
            weight, bias = self.out_layers[0].weight[start:end], self.out_layers[0].bias[start:end]
        else:
            weight, bias = self.out_layers[cluster].weight, self.out_layers[cluster].bias
        if cluster == 0 and len(self.ranges) > 1:
            weight = torch.cat([weight, self.cluster_weight], dim=0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        if len(self.out_projs):
            hidden = nn.functional.linear(hidden, self.out_projs[cluster].t())  # (..., cluster width)
        return nn.functional.linear(hidden, weight, bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d_model) hidden states -> (..., vocab) log-probabilities."""
        head = self._cluster_logits(hidden, 0).log_softmax(-1)
        if len(self.ranges) == 1:
            return head
        shortlist = self.ranges[0][1]
        parts = [head[..., :shortlist]]
        for cluster in range(1, len(self.ranges)):
            tail = self._cluster_logits(hidden, cluster).log_softmax(-1)
            parts.append(head[..., shortlist + cluster - 1, None] + tail)
        return torch.cat(parts, dim=-1)


class TransformerXLRelAttention(nn.Module):
    """Multi-head attention with relative position scores: (a)+(c) content terms via u, (b)+(d) position terms via v."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.config = config  # read at every call: the attention implementation may be switched after loading
        self.n_head, self.d_head = config.n_head, config.d_head
        self.pre_lnorm = config.pre_lnorm
        inner = config.n_head * config.d_head
        self.qkv_net = nn.Linear(config.d_model, 3 * inner, bias=False)
        # W_{k,R} of the paper: projects the sinusoidal distance encodings into position keys.
        self.r_net = nn.Linear(config.d_model, inner, bias=False)
        self.o_net = nn.Linear(inner, config.d_model, bias=False)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt = nn.Dropout(config.dropatt)
        self.scale = config.d_head**-0.5
        if config.untie_r:
            self.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))  # u
            self.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))  # v

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.n_head, self.d_head).transpose(1, 2)  # (batch, head, seq, d_head)

    def key_value(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of memory hidden states (batch, slots, d_model), as (batch, head, slots, d_head)."""
        x = self.layer_norm(memory) if self.pre_lnorm else memory
        _, key, value = self.qkv_net(x).chunk(3, dim=-1)
        return self._heads(key), self._heads(value)

    def position_keys(self, encodings: torch.Tensor) -> torch.Tensor:
        """(len, d_model) distance encodings -> (head, len, d_head) position keys."""
        return self.r_net(encodings).view(-1, self.n_head, self.d_head).transpose(0, 1)

    def forward(
        self,
        hidden_states: torch.Tensor,
        memory_key_value: tuple[torch.Tensor, torch.Tensor],
        position_keys: torch.Tensor,
        allowed: torch.Tensor,
        r_w_bias: torch.Tensor | None,
        r_r_bias: torch.Tensor | None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """hidden_states: (batch, q, d_model); memory keys/values: (batch, head, slots, d_head); position_keys:
        (head, slots + q, d_head) for distances `slots + q - 1` down to 0; allowed: (batch, 1, q, slots + q) bool; u and
        v (head, d_head) when shared by all layers, None to use this layer's own.
        Returns the layer output, the keys and values of memory and segment together (batch, head, slots + q, d_head),
        whose last slots become the next memory's, and the attention weights (batch, head, q, slots + q) when
        `output_attentions` (else None: with SDPA they are never materialised)."""
        if r_w_bias is None:
            r_w_bias, r_r_bias = self.r_w_bias, self.r_r_bias
        x = self.layer_norm(hidden_states) if self.pre_lnorm else hidden_states
        query, key, value = (self._heads(t) for t in self.qkv_net(x).chunk(3, dim=-1))
        keys = torch.cat([memory_key_value[0], key], dim=2)  # (batch, head, klen, d_head)
        values = torch.cat([memory_key_value[1], value], dim=2)
        position = relative_shift((query + r_r_bias[:, None]) @ position_keys.transpose(-1, -2))  # terms (b) + (d)
        if output_attentions or self.config._attn_implementation == "eager":
            content = (query + r_w_bias[:, None]) @ keys.transpose(-1, -2)  # (batch, head, q, klen): terms (a) + (c)
            scores = (content + position) * self.scale
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            probs = self.dropatt(torch.softmax(scores, dim=-1))
            attended = probs @ values
        else:
            # The position terms and the mask as an additive bias: the content scores, softmax and weighted sum run
            # fused, and the (q, klen) weights are never materialised.
            bias = (position * self.scale).masked_fill(~allowed, torch.finfo(position.dtype).min)
            dropout = self.dropatt.p if self.training else 0.0
            attended = nn.functional.scaled_dot_product_attention(
                query + r_w_bias[:, None], keys, values, attn_mask=bias, dropout_p=dropout, scale=self.scale
            )
            probs = None
        attended = attended.transpose(1, 2).reshape(*hidden_states.shape[:2], -1)  # (batch, q, head * d_head)
        output = hidden_states + self.drop(self.o_net(attended))
        return (output if self.pre_lnorm else self.layer_norm(output)), keys, values, probs


class TransformerXLFeedForward(nn.Module):
    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.pre_lnorm = config.pre_lnorm
        self.fc1 = nn.Linear(config.d_model, config.d_inner)
        self.fc2 = nn.Linear(config.d_inner, config.d_model)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(hidden_states) if self.pre_lnorm else hidden_states
        output = hidden_states + self.drop(self.fc2(self.drop(torch.relu(self.fc1(x)))))
        return output if self.pre_lnorm else self.layer_norm(output)


class TransformerXLLayer(GradientCheckpointingLayer):
    def __init__(self, config: TransformerXLConfig):
        super().__init__()
        self.attn = TransformerXLRelAttention(config)
        self.ff = TransformerXLFeedForward(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        memory: torch.Tensor,
        memory_key_value: tuple[torch.Tensor, torch.Tensor] | None,
        encodings: torch.Tensor | None,
        position_keys: torch.Tensor | None,
        allowed: torch.Tensor,
        r_w_bias: torch.Tensor | None,
        r_r_bias: torch.Tensor | None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """hidden_states: (rows, q, d_model); memory: (rows, slots, d_model) hidden states with their keys/values
        when cached (else None: recomputed); encodings: (distances, d_model) for distances `distances - 1` down to 0,
        or the layer's position keys computed from them earlier, (head, distances, d_head). What is not given is
        computed here, inside the layer's forward, where FSDP2 has gathered the layer's weights.

        Returns the output, the keys and values of memory and segment (rows, head, slots + q, d_head), the attention
        weights (rows, head, q, slots + q), and the position keys."""
        if memory_key_value is None:
            memory_key_value = self.attn.key_value(memory)
        if position_keys is None:
            position_keys = self.attn.position_keys(encodings)
        klen = memory.shape[1] + hidden_states.shape[1]
        segment_position_keys = _last_slots(position_keys, klen, 1)  # distances klen - 1 .. 0
        output, keys, values, probs = self.attn(
            hidden_states, memory_key_value, segment_position_keys, allowed, r_w_bias, r_r_bias, output_attentions
        )
        return self.ff(output), keys, values, probs, position_keys


def _place(full: torch.Tensor, rows: torch.Tensor | None, cols: torch.Tensor | None, values: torch.Tensor):
    """`values` (rows, count, ...) written at the given rows and columns of `full` (batch, length, ...); all of it
    when `rows` is None."""
    if rows is None:
        return values
    full[rows[:, None], cols] = values
    return full


@dataclass
class _Runs:
    """Runs of tokens of the same length, each read as one sequence: a row's real tokens, or a packed document of
    them. `rows` None stands for every row, all its columns (no padding, no packing)."""

    rows: torch.Tensor | None  # (runs,) the row each run is from
    cols: torch.Tensor | None  # (runs, count) its columns, in order
    fresh: torch.Tensor | None  # (runs,) bool: the run starts a document, so it reads without the row's memory
    last: torch.Tensor | None  # (runs,) bool: the run is its row's last, whose memory the state keeps


def _group_runs(real: torch.Tensor, document_starts: torch.Tensor | None) -> list[_Runs]:
    """Split each row's real tokens ((batch, length) bool) at the `document_starts` ((batch, length) bool or None)
    into runs, grouped by length so that each group reads together."""
    if document_starts is None and bool(real.all()):
        return [_Runs(None, None, None, None)]
    run_starts = real & (real.cumsum(1) == 1)  # (batch, length): each row's first real token
    if document_starts is not None:
        run_starts = run_starts | document_starts
    # Row-major order, so that the tokens of a run are consecutive and the runs of a row follow one another.
    token_rows, token_cols = real.nonzero(as_tuple=True)  # (tokens,) each
    offsets = run_starts[token_rows, token_cols].nonzero()[:, 0]  # (runs,) index of each run's first token
    counts = torch.diff(offsets, append=offsets.new_tensor([len(token_rows)]))
    rows, first_cols = token_rows[offsets], token_cols[offsets]
    fresh = torch.zeros_like(rows, dtype=torch.bool) if document_starts is None else document_starts[rows, first_cols]
    last = torch.ones_like(fresh)
    last[:-1] = rows[1:] != rows[:-1]
    groups = []
    for count in counts.unique().tolist():
        pick = (counts == count).nonzero()[:, 0]
        cols = token_cols[offsets[pick, None] + torch.arange(count, device=offsets.device)]  # (runs, count)
        groups.append(_Runs(rows[pick], cols, fresh[pick], last[pick]))
    return groups


@dataclass
class _SegmentsOutput:
    hidden: torch.Tensor | None  # (batch, length, d_model), zeros at padding; None when a segment head was given
    heads: list[torch.Tensor]  # what the segment head returned for every segment
    hidden_states: tuple[torch.Tensor, ...] | None  # n_layer + 1 x (batch, length, d_model)
    attentions: tuple[torch.Tensor, ...] | None  # n_layer x (batch, head, length, mem_len + segment_length)


TransformerXLModelOutput = _model_output_class(
    "TransformerXLModelOutput",
    """
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, d_model)`):
            Output of the last layer at every input position (zeros at padding positions).
        past_key_values ([`TransformerXLState`], *optional*):
            Memories to continue from, returned unless `use_cache=False`; the field is named `cache` from
            transformers 5.24 on (`past_key_values` still reads it there).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            The input of every layer and the last layer's output, `(batch_size, sequence_length, d_model)` each
            (zeros at padding positions).
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Every layer's attention weights, `(batch_size, n_head, sequence_length, mem_len + segment_length)`
            each, indexed by distance: column `d` is the weight on the token `d` positions before the query (0: the
            query itself), whether it sits in the memory or in the segment. Rows of padding positions are zero.
    """,
    {
        "last_hidden_state": torch.FloatTensor | None,
        "past_key_values": TransformerXLState | None,
        "hidden_states": tuple[torch.FloatTensor, ...] | None,
        "attentions": tuple[torch.FloatTensor, ...] | None,
    },
)


TransformerXLCausalLMOutput = _model_output_class(
    "TransformerXLCausalLMOutput",
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Causal language-modelling loss over the whole input, when `labels` is given.
        logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`, *optional*):
            Next-token scores. Omitted when `labels` is given, unless `return_logits=True`.
        past_key_values ([`TransformerXLState`], *optional*):
            Memories to continue from, returned unless `use_cache=False`; the field is named `cache` from
            transformers 5.24 on (`past_key_values` still reads it there).
        hidden_states (`tuple(torch.FloatTensor)`, *optional*):
            The input of every layer and the last layer's output, `(batch_size, sequence_length, d_model)` each
            (zeros at padding positions).
        attentions (`tuple(torch.FloatTensor)`, *optional*):
            Every layer's attention weights, `(batch_size, n_head, sequence_length, mem_len + segment_length)`
            each, indexed by distance: column `d` is the weight on the token `d` positions before the query (0: the
            query itself), whether it sits in the memory or in the segment. Rows of padding positions are zero.
    """,
    {
        "loss": torch.FloatTensor | None,
        "logits": torch.FloatTensor | None,
        "past_key_values": TransformerXLState | None,
        "hidden_states": tuple[torch.FloatTensor, ...] | None,
        "attentions": tuple[torch.FloatTensor, ...] | None,
    },
)


class TransformerXLPreTrainedModel(PreTrainedModel):
    config_class = TransformerXLConfig
    state_class = TransformerXLState
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransformerXLLayer"]
    _is_stateful = True
    # SDPA runs the content scores, softmax and weighted sum fused, the relative-position terms given as its bias.
    _supports_sdpa = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate() must not hand us a DynamicCache: the model creates and returns its own TransformerXLState.
        return False

    # Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder.RecurrentDecoderPreTrainedModel.load_state with RecurrentDecoderState->TransformerXLState
    def load_state(self, path: str | os.PathLike) -> TransformerXLState:
        """A state written by `TransformerXLState.save`, read onto the model's device (see
        `TransformerXLState.load` for what is checked)."""
        return self.state_class.load(path, self.config, self.device)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        for name in ("r_w_bias", "r_r_bias"):
            if isinstance(getattr(module, name, None), nn.Parameter):
                init.normal_(getattr(module, name), mean=0.0, std=std)
        if isinstance(module, nn.ParameterList):  # the adaptive embedding's and softmax's projections
            for projection in module:
                init.normal_(projection, mean=0.0, std=std)


class TransformerXLModel(TransformerXLPreTrainedModel):
    """Transformer-XL decoder; returns the last layer's output at every input position."""

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        config.check_transformer_xl_settings()
        self.word_emb = (
            nn.Embedding(config.vocab_size, config.d_model)
            if config.cutoffs is None
            else TransformerXLAdaptiveEmbedding(config)
        )
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([TransformerXLLayer(config) for _ in range(config.n_layer)])
        if not config.untie_r:
            # u and v shared by every layer.
            self.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            self.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        # Pre-norm layers leave the residual stream unnormalised; post-norm layers end with a layer norm already.
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon) if config.pre_lnorm else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.word_emb

    def set_input_embeddings(self, new_embeddings: nn.Embedding) -> None:
        self.word_emb = new_embeddings

    def _shared_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """u and v when every layer shares them; (None, None) when each layer has its own, which it reads in its
        forward (where FSDP2 has gathered them)."""
        return (None, None) if self.config.untie_r else (self.r_w_bias, self.r_r_bias)

    def _positions(
        self, state: TransformerXLState, distances: int, device: torch.device
    ) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        """The distance encodings for distances `distances - 1` down to 0, (distances, d_model), and every layer's
        position keys when the state has them cached (computed without gradients, for as many distances or more).

        Descending, so that the keys a segment needs, distances `klen - 1` .. 0, are the last `klen` columns: a view.
        The layers compute their keys from the encodings in their own forward.
        """
        cached = state.position_keys
        if not torch.is_grad_enabled() and cached is not None and cached[0].shape[1] >= distances:
            return None, list(cached)
        clamp = self.config.clamp_len
        steps = torch.arange(distances - 1, -1, -1, device=device)
        encodings = sinusoidal_position_encoding(
            steps if clamp is None else steps.clamp(max=clamp), self.config.d_model
        )
        return self.drop(encodings.to(self.dtype)), [None] * len(self.layers)

    def _allowed(self, valid: torch.Tensor, q: int) -> torch.Tensor:
        """(rows, 1, q, slots + q) bool: causal over memory + segment, valid memory slots only, and with
        `same_length` `mem_len` keys at most, itself included (as the original code and transformers 4.x count them).
        Every query sees itself, so no row is empty."""
        slots = valid.shape[1]
        query = torch.arange(q, device=valid.device)[:, None]
        key = torch.arange(slots + q, device=valid.device)[None, :]
        distance = slots + query - key  # (q, klen)
        allowed = distance >= 0
        if self.config.same_length:
            allowed = allowed & (distance < max(self.config.mem_len, 1))
        key_valid = torch.cat([valid, valid.new_ones(valid.shape[0], q)], dim=1)  # (rows, klen)
        return (allowed[None] & key_valid[:, None, :])[:, None]

    def _segment(
        self,
        embeds: torch.Tensor,
        memory: _Memory,
        encodings: torch.Tensor | None,
        position_keys: list[torch.Tensor | None],
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, _Memory, list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """One segment: (rows, q, d_model) scaled embeddings -> (rows, q, d_model) outputs, the next memory, and
        when asked every layer's input plus the output, and every layer's (rows, head, q, mem_len + segment_length)
        attention weights by distance. Layers fill in `position_keys` the first time they compute theirs."""
        rows, q = embeds.shape[:2]
        slots, keep = memory.slots(), min(self.config.mem_len, memory.slots() + q)
        allowed = self._allowed(memory.valid, q)
        # With gradients on, memory keys/values are recomputed from the (detached) memories so that the projections
        # learn from them, as in the paper; otherwise the cached ones are the same numbers.
        recompute = torch.is_grad_enabled() and slots > 0
        hidden = self.drop(embeds)
        mems, keys, values = [], [], []
        states = [] if output_hidden_states else None
        attentions = [] if output_attentions else None
        width = self.config.mem_len + self.config.segment_length
        for i, layer in enumerate(self.layers):
            if states is not None:
                states.append(hidden)
            cached_kv = None if recompute else (memory.keys[i], memory.values[i])
            output, layer_keys, layer_values, probs, position_keys[i] = layer(
                hidden,
                memory.mems[i],
                cached_kv,
                encodings,
                position_keys[i],
                allowed,
                *self._shared_biases(),
                output_attentions,
            )
            if attentions is not None:
                attentions.append(distance_attentions(probs, slots, width))
            mems.append(_last_slots(torch.cat([memory.mems[i], hidden], dim=1), keep, 1).detach())
            keys.append(_last_slots(layer_keys, keep, 2).detach())
            values.append(_last_slots(layer_values, keep, 2).detach())
            hidden = output
        if self.ln_f is not None:
            hidden = self.ln_f(hidden)
        valid = _last_slots(torch.cat([memory.valid, memory.valid.new_ones(rows, q)], dim=1), keep, 1)
        hidden = self.drop(hidden)
        if states is not None:
            states.append(hidden)
        return hidden, _Memory(mems, keys, values, valid), states, attentions

    def _forward_segments(
        self,
        embeds: torch.Tensor,
        real: torch.Tensor,
        document_starts: torch.Tensor | None,
        state: TransformerXLState,
        shift_labels: torch.Tensor | None = None,
        segment_head: Callable | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> _SegmentsOutput:
        """Run (batch, length, d_model) embeddings segment by segment, advancing `state` in place.

        Each row reads only its real tokens, as if its padding were not there, and each packed document
        (`document_starts`, (batch, length) bool) as if alone from a new state: runs of the same length are gathered
        and read together, so segment boundaries and relative distances are those of the run alone. The state keeps
        the memory of each row's last run. Every per-position result is zero at padding.
        """
        batch, length = real.shape
        mem_len, segment_length = self.config.mem_len, self.config.segment_length
        if state.memory.slots() > mem_len:
            # mem_len may have been lowered since the state was made (evaluating with another memory length).
            state.memory = state.memory.keep_last(mem_len)
        encodings, position_keys = self._positions(state, mem_len + min(segment_length, length), embeds.device)
        d_model, n_head = self.config.d_model, self.config.n_head
        outputs = None if segment_head is not None else embeds.new_zeros(batch, length, d_model)
        n_states = self.config.n_layer + 1 if output_hidden_states else 0
        all_states = [embeds.new_zeros(batch, length, d_model) for _ in range(n_states)]
        # (batch, length, head, width) while placing rows; transposed at the end.
        n_attentions = self.config.n_layer if output_attentions else 0
        all_attentions = [
            embeds.new_zeros(batch, length, n_head, mem_len + segment_length) for _ in range(n_attentions)
        ]
        heads = []
        embeds = embeds * math.sqrt(self.config.d_model)
        # Every run starts from the memory its row had before the call, whatever the state keeps meanwhile.
        initial = state.memory
        for runs in _group_runs(real, document_starts):
            rows, cols = runs.rows, runs.cols
            group_embeds = embeds if rows is None else embeds[rows[:, None], cols]
            group_labels = shift_labels if rows is None or shift_labels is None else shift_labels[rows[:, None], cols]
            memory = initial if rows is None else initial.select(rows).forget(runs.fresh)
            memory, hidden, states, attentions = self._read_run_group(
                group_embeds,
                group_labels,
                memory,
                encodings,
                position_keys,
                segment_head,
                heads,
                output_hidden_states,
                output_attentions,
            )
            if rows is None:
                state.update_rows(None, memory)
            else:
                kept = runs.last.nonzero()[:, 0]
                state.update_rows(rows[kept], memory.select(kept))
            if outputs is not None:
                outputs = _place(outputs, rows, cols, torch.cat(hidden, dim=1))
            if output_hidden_states:
                all_states = [
                    _place(full, rows, cols, torch.cat(layer, dim=1))
                    for full, layer in zip(all_states, zip(*states, strict=True), strict=True)
                ]
            if output_attentions:
                all_attentions = [
                    _place(full, rows, cols, torch.cat(layer, dim=2).transpose(1, 2))
                    for full, layer in zip(all_attentions, zip(*attentions, strict=True), strict=True)
                ]
        state.seen_tokens += length
        # Without gradients the position keys are the same numbers in every call: keep them for the next.
        state.position_keys = None if torch.is_grad_enabled() else position_keys
        return _SegmentsOutput(
            outputs,
            heads,
            tuple(all_states) if output_hidden_states else None,
            tuple(a.transpose(1, 2) for a in all_attentions) if output_attentions else None,
        )

    def _read_run_group(
        self,
        embeds: torch.Tensor,
        shift_labels: torch.Tensor | None,
        memory: _Memory,
        encodings: torch.Tensor | None,
        position_keys: list[torch.Tensor | None],
        segment_head: Callable | None,
        heads: list[torch.Tensor],
        output_hidden_states: bool,
        output_attentions: bool,
    ) -> tuple[_Memory, list[torch.Tensor], list, list]:
        """Read one group of runs ((runs, count, d_model) scaled embeddings) segment by segment from `memory`. Returns
        the memory after the last segment and, per segment, its output (none when `segment_head` is given: what it
        returns is appended to `heads` instead), its hidden states and its attentions (see `_segment`)."""
        hidden, states, attentions = [], [], []
        segment_length = self.config.segment_length
        for start in range(0, embeds.shape[1], segment_length):
            stop = start + segment_length
            segment_hidden, memory, segment_states, segment_attentions = self._segment(
                embeds[:, start:stop], memory, encodings, position_keys, output_hidden_states, output_attentions
            )
            if segment_head is not None:
                heads.append(segment_head(segment_hidden, shift_labels[:, start:stop].contiguous()))
            else:
                hidden.append(segment_hidden)
            states.append(segment_states)
            attentions.append(segment_attentions)
        return memory, hidden, states, attentions

    def _prepare(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        past_key_values: TransformerXLState | None,
        inputs_embeds: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, TransformerXLState]:
        """Validate the inputs; return the new positions' embeddings, their real-token mask, where packed documents
        start (from `position_ids`, see `_document_starts`) and the state."""
        _refuse_export(self)
        # Adapted from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder.RecurrentDecoderForCausalLM._prepare: model
        # folders must stay self-contained, so the shared input contract is restated here.
        if kwargs.get("token_type_ids") is not None:
            raise ValueError("token_type_ids cannot be passed to Transformer-XL")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
            inputs_embeds = self.word_emb(input_ids)
        batch, length = inputs_embeds.shape[:2]
        if length == 0:
            raise ValueError("The input is empty (length 0)")
        # The config may have been changed since the model was built; integer checks only, no device sync.
        self.config.check_segment_schedule()
        if past_key_values is None:
            past_key_values = TransformerXLState(self.config, batch, inputs_embeds.device, inputs_embeds.dtype)
        else:
            past_key_values = TransformerXLState.adopt(past_key_values, self.config, batch, inputs_embeds.dtype)
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
        continuing = past_key_values.get_seq_length() > 0
        # Positions are relative, so given ones only mark where packed documents start.
        document_starts = _document_starts(kwargs.get("position_ids"), real, continuing)
        return inputs_embeds, real, document_starts, past_key_values

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: TransformerXLState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        cache: TransformerXLState | None = None,
        **kwargs,
    ) -> TransformerXLModelOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Token ids; with `past_key_values`, only the new tokens. Read in segments of `segment_length`.
            attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*):
                1 for real tokens, 0 for padding (anywhere). A row reads only its real tokens, so padding never
                changes real tokens' outputs. May also cover the past tokens, as `generate()` passes it; then its
                last `sequence_length` columns are used.
            past_key_values or cache ([`TransformerXLState`], *optional*):
                Memories returned by a previous call (either name on any supported transformers: `cache` is its name
                from transformers 5.24 on). Continuing is exact when the earlier calls' lengths are
                multiples of `segment_length` (the one-shot forward would have cut the segments there too).
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, d_model)`, *optional*):
                Token embeddings (before the `sqrt(d_model)` scaling) instead of `input_ids`.
            position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Only marks packed documents (positions are relative): positions count up by one within a document and
                restart at 0 where the next one begins, as TRL's `SFTTrainer(packing=True)` writes them. Each document
                is then read exactly as if alone from a new state (its segments start at its first token), and the
                returned state is that of each row's last document. With `past_key_values`, a row whose first position
                is not 0 continues the state's text. Plain `0, 1, ...` change nothing; positions at padding are not
                read; `(1, sequence_length)` applies to every row. Any other sequence raises a `ValueError`.
            use_cache (`bool`, *optional*, defaults to `True`):
                Whether to return the state. `config.use_cache` is not consulted: `Trainer` switches it off, and a
                recurrent model's state is part of its result.
            output_hidden_states (`bool`, *optional*):
                Whether to return every layer's input and the last layer's output.
            output_attentions (`bool`, *optional*):
                Whether to return every layer's attention weights, indexed by distance (see
                [`TransformerXLModelOutput`]).
        """
        inputs_embeds, real, document_starts, state = self._prepare(
            input_ids, attention_mask, _given_state(past_key_values, cache), inputs_embeds, kwargs
        )
        output_hidden_states, output_attentions = self._output_flags(output_hidden_states, output_attentions)
        segments = self._forward_segments(
            inputs_embeds,
            real,
            document_starts,
            state,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        output = TransformerXLModelOutput(
            last_hidden_state=segments.hidden,
            **{STATE_NAME: state if use_cache is not False else None},
            hidden_states=segments.hidden_states,
            attentions=segments.attentions,
        )
        return output if return_dict is not False else output.to_tuple()

    # Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder.RecurrentDecoderWindowModel._output_flags
    def _output_flags(self, output_hidden_states: bool | None, output_attentions: bool | None) -> tuple[bool, bool]:
        """The call's values, else the config's."""
        return (
            bool(output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states),
            bool(output_attentions if output_attentions is not None else self.config.output_attentions),
        )


class TransformerXLLMHeadModel(TransformerXLPreTrainedModel, GenerationMixin):
    """Transformer-XL with a softmax output layer tied to the input embeddings.

    Example:

    ```python
    >>> import torch
    >>> from hf_recurrence import TransformerXLConfig, TransformerXLLMHeadModel

    >>> config = TransformerXLConfig(vocab_size=100, d_model=32, n_head=2, d_head=16, d_inner=64, n_layer=2,
    ...     segment_length=8, mem_len=8)
    >>> model = TransformerXLLMHeadModel(config)
    >>> ids = torch.randint(0, 100, (2, 40))  # five segments
    >>> model(ids, labels=ids).loss.shape
    torch.Size([])

    ```
    """

    _tied_weights_keys = {"lm_head.weight": "transformer.word_emb.weight"}

    def __init__(self, config: TransformerXLConfig):
        super().__init__(config)
        self.transformer = TransformerXLModel(config)
        if config.cutoffs is None:
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        else:
            self.lm_head = TransformerXLAdaptiveLogSoftmax(config)
            self._tied_weights_keys = _adaptive_tied_weights(config)
        # transformers picks the loss from the class-name suffix, which "LMHeadModel" is not.
        self.loss_type = "ForCausalLM"
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear | None:
        # The adaptive softmax is no single output embedding (resizing the vocabulary cannot work on it).
        return self.lm_head if isinstance(self.lm_head, nn.Linear) else None

    def _prepare_cache_for_generation(self, generation_config: GenerationConfig, model_kwargs: dict, *args, **kwargs):
        # generate() would only warn that a cache_implementation "will be ignored" and run anyway.
        if generation_config.cache_implementation is not None:
            raise ValueError(
                f"cache_implementation={generation_config.cache_implementation!r} cannot be honoured by "
                f"{type(self).__name__}: the model carries its own recurrent state of bounded size (returned as "
                f"{STATE_NAME}) instead of a transformers Cache, so there is no cache to choose. Remove "
                "cache_implementation from the generate() call or from the generation config (generation_config.json)"
            )
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    # Copied from hf_recurrence.models.recurrent_decoder.generation_recurrent_decoder.RecurrentDecoderGenerationMixin.init_continuous_batching
    def init_continuous_batching(self, *args, **kwargs):
        # generate(cache_implementation="paged") and generate_batch() come here, past _prepare_cache_for_generation.
        raise ValueError(
            f"Continuous batching (cache_implementation='paged', generate_batch()) cannot be used with "
            f"{type(self).__name__}: it needs a paged key/value cache, and the model carries its own recurrent state "
            "instead. Call generate() without cache_implementation; batched prompts may be left-padded"
        )

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    # Adapted from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder.RecurrentDecoderForCausalLM._targets (this
    # model also masks padding, which it removes before reading segments).
    def _targets(
        self,
        labels: torch.Tensor | None,
        shift_labels: torch.Tensor | None,
        real: torch.Tensor,
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
        if targets.shape != real.shape:
            given = "shift_labels" if shift_labels is not None else "labels"
            raise ValueError(f"{given} must have the input's shape {tuple(real.shape)}, got {tuple(targets.shape)}")
        # Padding is removed before the segments are read, so its positions must not be targets.
        return _drop_cross_document_targets(targets.to(real.device).masked_fill(~real, -100), position_ids)

    # Adapted from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder.RecurrentDecoderForCausalLM (same loss
    # and return_logits contract; model folders must stay self-contained).
    def _loss(self, logits: torch.Tensor, shift_labels: torch.Tensor, num_items: torch.Tensor | int) -> torch.Tensor:
        """Summed cross-entropy of already shifted labels, divided by the item count of the whole input."""
        return self.loss_function(
            logits, None, self.config.vocab_size, shift_labels=shift_labels, num_items_in_batch=num_items
        )

    def _logits_and_loss(
        self,
        inputs_embeds: torch.Tensor,
        real: torch.Tensor,
        document_starts: torch.Tensor | None,
        state: TransformerXLState,
        shift_labels: torch.Tensor | None,
        return_logits: bool | None,
        logits_to_keep: int | torch.Tensor,
        num_items: torch.Tensor | int | None,
        outputs: tuple[bool, bool],
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, _SegmentsOutput]:
        """Read the input's segments; return the logits kept (None when `return_logits` says so, as `forward`
        documents), the loss (None without targets) and the segments' output. Without logits the loss is taken
        segment by segment, so the `(tokens, vocab)` logits are never held. `num_items`: Trainer's item count, else
        the targets' own; `outputs`: whether to return hidden states and attentions."""
        # Training needs only the loss, so it skips the (tokens, vocab) logits; evaluation (Trainer's prediction_step
        # calls the model with labels in eval mode) gets them, as from a stock causal LM, for compute_metrics.
        keep_logits = (shift_labels is None or not self.training) if return_logits is None else return_logits
        if shift_labels is not None and num_items is None:
            num_items = (shift_labels != -100).sum()

        def segment_loss(hidden: torch.Tensor, segment_labels: torch.Tensor) -> torch.Tensor:
            return self._loss(self.lm_head(hidden), segment_labels, num_items)  # (rows, q, vocab) logits, then freed

        if shift_labels is not None and not keep_logits:
            segments = self.transformer._forward_segments(
                inputs_embeds, real, document_starts, state, shift_labels, segment_loss, *outputs
            )
            return None, torch.stack(segments.heads).sum(), segments
        segments = self.transformer._forward_segments(
            inputs_embeds, real, document_starts, state, None, None, *outputs
        )
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(segments.hidden[:, kept]) if keep_logits else None
        loss = self._loss(logits, shift_labels, num_items) if shift_labels is not None else None
        return logits, loss, segments

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: TransformerXLState | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_logits: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        cache: TransformerXLState | None = None,
        **kwargs,
    ) -> TransformerXLCausalLMOutput:
        r"""
        Args:
            input_ids, attention_mask, past_key_values, cache, inputs_embeds, position_ids, use_cache, output_hidden_states, output_attentions:
                As in [`TransformerXLModel.forward`].
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, usually `input_ids`; shifted inside the model (`-100` and padding positions are ignored).
                In training mode the loss is computed segment by segment, so the `(tokens, vocab)` logits are never
                materialised for it unless they are asked for. With packed `position_ids`, the last token of a
                document predicts nothing (not the next document's first token).
            return_logits (`bool`, *optional*):
                Whether to return the logits. Defaults to `True`, except with `labels` in training mode (`False`: the
                memory-lean segment-by-segment loss). `False` in eval mode gives the loss alone, segment by segment.
            logits_to_keep (`int` or `torch.Tensor`, *optional*, defaults to 0):
                An int: return the logits of the last `logits_to_keep` positions only (0: all), as `generate()` asks
                for when it reads a prompt, so that reading a long prompt never holds its `(length, vocab)` logits.
                A 1D tensor: the positions to keep. Not combinable with `labels`.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*):
                Passed by `Trainer` under gradient accumulation: the loss is summed and divided by it.
            shift_labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets already aligned with the positions that predict them (Trainer passes them under context
                parallelism and sequence packing); used as given instead of shifting `labels`.
        """
        _refuse_logits_to_keep_with_labels(logits_to_keep, labels, kwargs.get("shift_labels"))
        inputs_embeds, real, document_starts, state = self.transformer._prepare(
            input_ids, attention_mask, _given_state(past_key_values, cache), inputs_embeds, kwargs
        )
        output_hidden_states, output_attentions = self.transformer._output_flags(
            output_hidden_states, output_attentions
        )
        shift_labels = self._targets(labels, kwargs.get("shift_labels"), real, kwargs.get("position_ids"))
        logits, loss, segments = self._logits_and_loss(
            inputs_embeds,
            real,
            document_starts,
            state,
            shift_labels,
            return_logits,
            logits_to_keep,
            kwargs.get("num_items_in_batch"),
            (output_hidden_states, output_attentions),
        )
        output = TransformerXLCausalLMOutput(
            loss=loss,
            logits=logits,
            **{STATE_NAME: state if use_cache is not False else None},
            hidden_states=segments.hidden_states,
            attentions=segments.attentions,
        )
        return output if return_dict is not False else output.to_tuple()

    # generate() builds inspect.signature(model.forward) at every token of a model registered for the Auto classes (a
    # check whether remote code still takes `cache_position`): a signature kept on the function is read, not built.
    forward.__signature__ = inspect.signature(forward)


def _adaptive_tied_weights(config: TransformerXLConfig) -> dict[str, str]:
    """The adaptive softmax's weights that are the adaptive embedding's, as transformers 4.x ties them: every output
    table (with `tie_word_embeddings`), and the projections that `tie_projs` names."""
    tied = {}
    if config.tie_word_embeddings:
        for i in range(1 if config.div_val == 1 else len(config.cutoffs) + 1):
            tied[f"lm_head.out_layers.{i}.weight"] = f"transformer.word_emb.emb_layers.{i}.weight"
    projected = config.div_val != 1 or config.embedding_width != config.d_model
    for i, tie in enumerate(config.tie_projs or []):
        if tie and projected:
            tied[f"lm_head.out_projs.{i}"] = f"transformer.word_emb.emb_projs.{0 if config.div_val == 1 else i}"
    return tied


__all__ = [
    "TransformerXLLMHeadModel",
    "TransformerXLModel",
    "TransformerXLPreTrainedModel",
    "TransformerXLState",
]
