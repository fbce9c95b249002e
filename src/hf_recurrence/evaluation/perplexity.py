"""Perplexity of a causal language model over long documents read window by window (Yoshida et al. 2020, §4.2)."""

import inspect
import itertools
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput, logging

from ..families import model_types_reading
from ..models.recurrent_decoder.configuration_recurrent_decoder import check_schedule
from ..models.recurrent_decoder.modeling_recurrent_decoder import STATE_NAME
from .flops import RECURRENT_MODEL_TYPES, flops_per_token, has_flops_count


logger = logging.get_logger(__name__)

# Model types that read a long input in fixed segments and attend to the memory of earlier ones (Transformer-XL):
# read independent windows, they would lose that memory and disagree with their own loss (and with lm-eval's score).
SEGMENT_MODEL_TYPES = model_types_reading("segments")

# Every model type evaluated through its state, one state per document from its first token to its last.
STATEFUL_MODEL_TYPES = RECURRENT_MODEL_TYPES + SEGMENT_MODEL_TYPES

# Tokens fed to a recurrent model per call: bounds the (tokens, vocab) logits held at once.
RECURRENT_CHUNK_TOKENS = 512


@dataclass
class TokenNLL:
    """Per-token negative log-likelihoods of one document, from [`windowed_perplexity`] with `return_token_nll=True`.

    Args:
        nll (`torch.Tensor` of shape `(num_tokens - 1,)`, float32, on the CPU): `nll[p]` is the NLL in nats of
            token `p + 1`, predicted at position `p`.
        window_position (`torch.Tensor` of shape `(num_tokens - 1,)`, int64): the index of position `p` inside the
            window that predicted from it (0 at a window's first token; see [`window_schedule`]).
    """

    nll: torch.Tensor
    window_position: torch.Tensor


@dataclass
class WindowedPerplexity:
    """Result of [`windowed_perplexity`], totals over all documents.

    Args:
        perplexity (`float`): `exp(nll)`.
        nll (`float`): mean negative log-likelihood per predicted token, in nats.
        num_tokens (`int`): predicted tokens (every token of every document but its first).
        num_documents (`int`): documents evaluated.
        window_size (`int`), overlap (`int`): the window schedule used.
        flops_per_token (`float`, *optional*): forward FLOPs per predicted token from [`flops_per_token`]; `None`
            for a model family the analytic count does not cover.
        num_words (`int`, *optional*), word_perplexity (`float`, *optional*): `exp(nll * num_tokens / num_words)`,
            the total negative log-likelihood normalised by words instead of tokens (the paper's WikiText numbers).
        token_nll (`list[TokenNLL]`, *optional*): per document, in the order given, the NLL of every predicted token
            and its position in its window; only with `return_token_nll=True`. Left out of `to_dict()`.
    """

    perplexity: float
    nll: float
    num_tokens: int
    num_documents: int
    window_size: int
    overlap: int
    flops_per_token: float | None = None
    num_words: int | None = None
    word_perplexity: float | None = None
    token_nll: list[TokenNLL] | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "token_nll"}


def window_schedule(num_tokens: int, window_size: int, overlap: int) -> list[tuple[int, int, int]]:
    """The windows that predict every token of a `num_tokens`-token document but the first, as `(start, end, new)`.

    Window `k` covers positions `[start, end) = [k·s, min(k·s + window_size, num_tokens))` with stride
    `s = window_size - overlap`; its positions from `new` on (all of window 0's, the last `s` of the others) are new,
    and position `p` predicts token `p + 1`. The last position predicts nothing, so no window is run for it alone.
    """
    stride = window_size - overlap
    windows = []
    start = 0
    while True:
        end = min(start + window_size, num_tokens)
        windows.append((start, end, start + overlap if start else 0))
        if end >= num_tokens - 1:
            return windows
        start += stride


def windowed_perplexity(
    model: PreTrainedModel,
    input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int] | torch.Tensor],
    window_size: int | None = None,
    overlap: int | None = None,
    *,
    num_words: int | None = None,
    text: str | Sequence[str] | None = None,
    batch_size: int = 8,
    show_progress: bool = True,
    return_token_nll: bool = False,
) -> WindowedPerplexity:
    """Perplexity of `model` over one or more documents, read in windows of `window_size` tokens that repeat the
    last `overlap` tokens of the window before (the paper's overlapped execution, §4.2).

    Every token but a document's first is predicted exactly once, from the window in which its predicting position
    is new (see [`window_schedule`]). A stock causal LM runs each window from scratch, several windows (of any documents) per forward.
    A recurrent model (`config.model_type` in `RECURRENT_MODEL_TYPES`) runs its own schedule with its state carried
    through the document, so the result equals its own loss over the document; it must be evaluated with the
    overlap it was trained with (`config.window_overlap`). A `window_size` other than its `config.window_size` is
    allowed (the paper's window-size curves), with a warning; it is passed in the state given as `past_key_values`
    and `model.config` is left untouched. A Transformer-XL (`SEGMENT_MODEL_TYPES`) likewise reads each document
    with its memory carried from segment to segment, at its own `config.segment_length` and overlap 0, so the
    result equals its own loss and lm-eval's `hf-recurrence` score.

    Args:
        model: a causal language model returning `.logits`.
        input_ids: one document (1-D tensor or list of ints) or several (list of those, or a 2-D tensor of rows),
            each evaluated independently (a fresh state per document); totals are summed.
        window_size: tokens per window. Defaults to `config.window_size` for a recurrent model,
            `config.segment_length` (the only one accepted) for a Transformer-XL, and to the position table size
            (`max_position_embeddings`) otherwise.
        overlap: tokens each window repeats from the previous one. Defaults to `config.window_overlap` for a
            recurrent model and to 0 otherwise (the only one accepted for a Transformer-XL).
        num_words: word count of the documents, for `word_perplexity`.
        text: the documents' text instead of `num_words`; words are whitespace-separated.
        batch_size: windows per forward for a stock model; documents read side by side for a stateful model.
        show_progress: show a tqdm progress bar over the predicted tokens.
        return_token_nll: also return every predicted token's NLL and window position (`token_nll`), for paired
            bootstrap intervals and NLL by window position ([`hf_recurrence.evaluation.statistics`]). The totals
            are the same either way.
    """
    documents = _as_documents(input_ids)
    num_words = _word_count(num_words, text)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got batch_size={batch_size!r}")
    config = model.config
    window_size, overlap = resolve_schedule(config, window_size, overlap)
    documents = [doc.to(model.device) for doc in documents]
    # Filled by the branches; keyed by the document tensor's identity because both branches reorder documents.
    sinks = {id(doc): torch.zeros(len(doc) - 1) for doc in documents} if return_token_nll else None
    token_nll = (
        [TokenNLL(sinks[id(doc)], _window_positions(len(doc), window_size, overlap)) for doc in documents]
        if sinks is not None
        else None
    )

    total_nll = 0.0
    num_tokens = sum(len(doc) - 1 for doc in documents)
    progress = tqdm(total=num_tokens, unit="tok", desc="windowed perplexity", disable=not show_progress)
    with torch.no_grad(), _eval_mode(model), progress:
        total_nll += _documents_nll(model, documents, window_size, overlap, batch_size, progress, sinks)

    nll = total_nll / num_tokens
    # The analytic count covers the recurrence core's backbones (GPT-2- and Llama-shaped blocks), stock or recurrent.
    flops = flops_per_token(config, window_size, overlap) if has_flops_count(config) else None
    return WindowedPerplexity(
        perplexity=math.exp(nll),
        nll=nll,
        num_tokens=num_tokens,
        num_documents=len(documents),
        window_size=window_size,
        overlap=overlap,
        flops_per_token=flops,
        num_words=num_words,
        word_perplexity=math.exp(total_nll / num_words) if num_words else None,
        token_nll=token_nll,
    )


def _documents_nll(
    model: PreTrainedModel,
    documents: list[torch.Tensor],
    window_size: int,
    overlap: int,
    batch_size: int,
    progress: tqdm,
    sinks: dict[int, torch.Tensor] | None,
) -> float:
    """The summed NLL of every predicted token of `documents`: a stateful model reads `batch_size` documents side by
    side, each through its own state; a stock model runs `batch_size` windows (of any documents) per forward."""
    if model.config.model_type not in STATEFUL_MODEL_TYPES:
        windows = [(doc, *window) for doc in documents for window in window_schedule(len(doc), window_size, overlap)]
        return _stock_nll(model, windows, batch_size, progress, sinks)
    total_nll = 0.0
    # Longest first, so that documents batched together have similar lengths and little padding.
    documents = sorted(documents, key=len, reverse=True)
    for first in range(0, len(documents), batch_size):
        total_nll += _stateful_nll(model, documents[first : first + batch_size], window_size, progress, sinks)
    return total_nll


class WindowPrefixed(nn.Module):
    """A stock causal LM that reads the same `prefix` token ids before every window it is given and returns the
    logits of the window's own positions: with [`windowed_perplexity`], the reference of a fixed window start (a
    BOS-like token, a short prompt) that costs no training. Its FLOPs per token are those of windows of
    `window_size + len(prefix)` positions of which `len(prefix)` are re-read:
    `flops_per_token(config, window_size + len(prefix), len(prefix))`.
    """

    prefix_ids: torch.Tensor  # a buffer (follows the module's device)

    def __init__(self, model: PreTrainedModel, prefix_ids: Sequence[int]):
        super().__init__()
        if not len(prefix_ids):
            raise ValueError("prefix_ids is empty: a window prefix needs at least one token")
        self.model = model
        self.register_buffer("prefix_ids", torch.as_tensor(list(prefix_ids), dtype=torch.long), persistent=False)

    @property
    def config(self) -> PreTrainedConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> ModelOutput:
        """`kwargs` (e.g. `use_cache`) go to the model unchanged."""
        prefix = self.prefix_ids.to(input_ids.device).expand(input_ids.shape[0], -1)  # (batch, prefix)
        ids = torch.cat([prefix, input_ids], dim=1)  # (batch, prefix + window)
        if attention_mask is not None:
            attention_mask = torch.cat([torch.ones_like(prefix), attention_mask.to(prefix.dtype)], dim=1)
        # Never the prefix's logits: at most the window's positions.
        keep = logits_to_keep or input_ids.shape[1]
        return self.model(input_ids=ids, attention_mask=attention_mask, logits_to_keep=keep, **kwargs)


def _as_documents(input_ids) -> list[torch.Tensor]:
    """Normalise the accepted input forms to a list of 1-D LongTensors of at least two tokens."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() not in (1, 2):
            raise ValueError(f"input_ids must be 1-D (one document) or 2-D (rows), got shape {tuple(input_ids.shape)}")
        documents = [input_ids] if input_ids.dim() == 1 else list(input_ids)
    elif len(input_ids) and isinstance(input_ids[0], torch.Tensor | Sequence):
        documents = [torch.as_tensor(doc) for doc in input_ids]
    else:
        documents = [torch.as_tensor(input_ids)]
    if not documents:
        raise ValueError("input_ids holds no document")
    for index, doc in enumerate(documents):
        if doc.dim() != 1:
            raise ValueError(f"document {index} must be 1-D token ids, got shape {tuple(doc.shape)}")
        if len(doc) < 2:
            raise ValueError(
                f"document {index} has {len(doc)} token(s); at least 2 are needed to predict one (empty document?)"
            )
    return [doc.long() for doc in documents]


def _word_count(num_words: int | None, text: str | Sequence[str] | None) -> int | None:
    if num_words is not None and text is not None:
        raise ValueError("Pass num_words or text, not both")
    if text is not None:
        num_words = sum(len(t.split()) for t in ([text] if isinstance(text, str) else text))
    if num_words is not None and (isinstance(num_words, bool) or not isinstance(num_words, int) or num_words < 1):
        raise ValueError(f"num_words must be a positive integer, got num_words={num_words!r}")
    return num_words


def resolve_schedule(config, window_size: int | None, overlap: int | None) -> tuple[int, int]:
    """Fill in the defaults and check `window_size` / `overlap` against the model; raise ValueError naming a bad one."""
    if config.model_type in SEGMENT_MODEL_TYPES:
        return _segment_schedule(config, window_size, overlap)
    if config.model_type in RECURRENT_MODEL_TYPES:
        return _recurrent_schedule(config, window_size, overlap)
    max_window = getattr(config, "max_position_embeddings", None)
    if window_size is None:
        if max_window is None:
            raise ValueError(f"window_size is required: {type(config).__name__} has no max_position_embeddings")
        window_size = max_window
    overlap = 0 if overlap is None else overlap
    check_schedule(window_size, overlap)
    if max_window is not None and window_size > max_window:
        raise ValueError(f"window_size={window_size} exceeds the model's position table ({max_window} positions)")
    return window_size, overlap


def _recurrent_schedule(config, window_size: int | None, overlap: int | None) -> tuple[int, int]:
    """A recurrent model's schedule: its own overlap, and a window its backbone can run (the config's own check)."""
    window_size = config.window_size if window_size is None else window_size
    if overlap is not None and overlap != config.window_overlap:
        raise ValueError(
            f"overlap={overlap} differs from the overlap this recurrent model was trained with "
            f"(config.window_overlap={config.window_overlap}): its h_prev summarises the text up to the first "
            "re-read token, so it must be evaluated with that overlap (paper §4.2)"
        )
    config.check_window_schedule(window_size, config.window_overlap)
    if window_size != config.window_size:
        logger.warning(
            f"Evaluating with window_size={window_size}; the model was configured (and presumably trained) with "
            f"window_size={config.window_size}"
        )
    return window_size, config.window_overlap


def _segment_schedule(config, window_size: int | None, overlap: int | None) -> tuple[int, int]:
    """A Transformer-XL's own schedule: its segments, no overlap (its memory carries the context instead)."""
    if window_size is not None and window_size != config.segment_length:
        raise ValueError(
            f"window_size={window_size} differs from this Transformer-XL's config.segment_length="
            f"{config.segment_length}: it is evaluated in its own segments, with the memory of earlier ones; set "
            "model.config.segment_length (and mem_len) to evaluate another schedule"
        )
    if overlap not in (None, 0):
        raise ValueError(
            f"overlap={overlap} cannot be used with a Transformer-XL: it re-reads nothing, the memory of its "
            f"mem_len={config.mem_len} earlier positions carries the context; use overlap 0"
        )
    return config.segment_length, 0


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _window_positions(num_tokens: int, window_size: int, overlap: int) -> torch.Tensor:
    """(num_tokens - 1,) index of each predicting position inside its window of [`window_schedule`]."""
    positions = torch.empty(num_tokens - 1, dtype=torch.long)
    for start, end, new in window_schedule(num_tokens, window_size, overlap):
        stop = min(end, num_tokens - 1)
        positions[new:stop] = torch.arange(new - start, stop - start)
    return positions


def _summed_nll(logits: torch.Tensor, targets: torch.Tensor, sink: torch.Tensor | None = None) -> float:
    """Summed cross-entropy of (n, vocab) logits against (n,) targets, in float32; the per-token values are also
    copied into the (n,) `sink` when one is given (the sum is computed the same way either way)."""
    logits = logits.float()
    if sink is not None:
        sink.copy_(nn.functional.cross_entropy(logits, targets, reduction="none"))
    return nn.functional.cross_entropy(logits, targets, reduction="sum").item()


def _stock_nll(
    model: PreTrainedModel,
    windows: list[tuple[torch.Tensor, int, int, int]],
    batch_size: int,
    progress: tqdm,
    sinks: dict[int, torch.Tensor] | None,
) -> float:
    """Summed NLL of the `windows` (document, start, end, first new position), each run from scratch; per-token NLLs
    into `sinks[id(doc)]` when given.

    Windows with the same length and number of new positions, from any document, share a forward instead of being
    padded: the full windows, the documents' first windows, then their shorter last windows. Where the model takes
    `logits_to_keep`, the LM head runs on the new positions only.
    """
    keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def shape(window):
        _, start, end, new = window
        return end - start, end - new

    windows.sort(key=shape, reverse=True)
    total = 0.0
    for (_, num_new), group in itertools.groupby(windows, key=shape):
        same_shape = list(group)
        extra = {"logits_to_keep": num_new} if keeps_logits else {}
        for first in range(0, len(same_shape), batch_size):
            batch = same_shape[first : first + batch_size]
            ids = torch.stack([doc[start:end] for doc, start, end, _ in batch])  # (windows, length)
            # An explicit all-ones mask: the ids may contain the pad token, which is real text here.
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra)
            logits = out.logits[:, -num_new:]  # (windows, new, vocab): positions new..end-1
            for row, (doc, _, end, new) in enumerate(batch):
                # Position p predicts token p + 1; the document's last position predicts nothing.
                stop = min(end, len(doc) - 1)
                sink = sinks[id(doc)][new:stop] if sinks is not None else None
                total += _summed_nll(logits[row, : stop - new], doc[new + 1 : stop + 1], sink)
                progress.update(stop - new)
    return total


def _stateful_nll(
    model: PreTrainedModel,
    documents: list[torch.Tensor],
    window_size: int,
    progress: tqdm,
    sinks: dict[int, torch.Tensor] | None = None,
) -> float:
    """Summed NLL of documents read side by side (right-padded, each row its own state) in chunks of columns;
    per-token NLLs into `sinks[id(doc)]` when given.

    The stateful models skip padding exactly, so each row gets what it gets alone. A recurrent model's window size
    travels in the state, so `model.config` is never changed (other callers may be using the model meanwhile).
    """
    lengths = torch.tensor([len(doc) for doc in documents], device=documents[0].device)
    ids = nn.utils.rnn.pad_sequence(documents, batch_first=True)  # (docs, longest)
    real = torch.arange(ids.shape[1], device=ids.device)[None] < lengths[:, None]
    # Position p predicts token p + 1 when that token is real text.
    targets = nn.functional.pad(ids[:, 1:], (0, 1))
    predicts = nn.functional.pad(real[:, 1:], (0, 1))
    if model.config.model_type in SEGMENT_MODEL_TYPES:
        # Every call starts a new segment, so chunks are whole segments: the one-shot forward's schedule. Rows are
        # right-padded, so each row's real tokens before a chunk boundary are whole segments too.
        chunk_tokens = window_size * max(1, RECURRENT_CHUNK_TOKENS // window_size)
        state = None
    else:
        chunk_tokens = RECURRENT_CHUNK_TOKENS
        # The recurrent models' own method, which PreTrainedModel's annotations do not know.
        state = model.new_state(len(documents), window_size=window_size)  # type: ignore[operator]
    total = 0.0
    for start in range(0, ids.shape[1], chunk_tokens):
        columns = slice(start, start + chunk_tokens)
        # Under the installed transformers' name: 5.24 warns that `past_key_values` is deprecated.
        out = model(input_ids=ids[:, columns], attention_mask=real[:, columns].long(), **{STATE_NAME: state})
        state = getattr(out, STATE_NAME)
        chunk_sink = torch.zeros(int(predicts[:, columns].sum())) if sinks is not None else None
        total += _summed_nll(out.logits[predicts[:, columns]], targets[:, columns][predicts[:, columns]], chunk_sink)
        if sinks is not None and chunk_sink is not None:
            _scatter_rows(chunk_sink, predicts[:, columns], start, [sinks[id(doc)] for doc in documents])
        progress.update(int(predicts[:, columns].sum()))
    return total


def _scatter_rows(values: torch.Tensor, mask: torch.Tensor, start: int, sinks: list[torch.Tensor]) -> None:
    """Copy `values`, taken from a (rows, columns) chunk by its boolean `mask` (row-major), into each row's sink at
    the chunk's first column `start` (every masked column of a row is one of its predicting positions)."""
    counts = mask.sum(dim=1).tolist()
    for sink, row_values, count in zip(sinks, values.split(counts), counts, strict=True):
        sink[start : start + count] = row_values
