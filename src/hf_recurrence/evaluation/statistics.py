"""Paired comparisons of two models read on the same text: a bootstrap interval of their perplexity ratio, and the
mean NLL by position inside the window (where a recurrent model's carried context should help: the window starts).

Inputs come from [`windowed_perplexity`] with `return_token_nll=True` (its `token_nll`), or from any per-segment sums.
`compare` and `describe` are what both reproductions (`hf-recurrence reproduce`) report their arms with.
"""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

import torch

from .perplexity import TokenNLL


@dataclass
class PairedBootstrap:
    """A paired bootstrap interval of `perplexity_b / perplexity_a - 1` (negative: model b is better).

    Args:
        relative_difference (`float`): the point estimate on all segments.
        low (`float`), high (`float`): the bounds of the percentile interval.
        confidence (`float`): the interval's nominal coverage, e.g. 0.95.
        perplexity_a (`float`), perplexity_b (`float`): each arm's perplexity on all segments.
        num_segments (`int`), num_resamples (`int`), seed (`int`): how the interval was drawn.
    """

    relative_difference: float
    low: float
    high: float
    confidence: float
    perplexity_a: float
    perplexity_b: float
    num_segments: int
    num_resamples: int
    seed: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict:
        return asdict(self)


def segment_sums(
    token_nll: Sequence[TokenNLL], segment_tokens: int | None = None, masks: Sequence[torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and token count per segment: each document cut into consecutive pieces of `segment_tokens`
    predicted tokens (its last piece shorter), or kept whole with `segment_tokens=None`. `masks`: per document, a bool
    tensor like its `nll`: only the tokens it marks are counted, the segments still cut by position, and a segment
    without any left out.

    Returns two (segments,) float64 tensors, NLL sums and token counts, segments in document order. Cut two arms'
    results on the same tokens the same way (with the same masks) to pair them.
    """
    if segment_tokens is not None and (
        isinstance(segment_tokens, bool) or not isinstance(segment_tokens, int) or segment_tokens < 1
    ):
        raise ValueError(f"segment_tokens must be a positive integer or None, got segment_tokens={segment_tokens!r}")
    if masks is not None and len(masks) != len(token_nll):
        raise ValueError(f"masks must give one mask per document ({len(token_nll)}), got {len(masks)}")
    sums, counts = [], []
    for i, document in enumerate(token_nll):
        keep = torch.ones_like(document.nll, dtype=torch.bool) if masks is None else masks[i]
        if keep.shape != document.nll.shape:
            raise ValueError(
                f"masks[{i}] has shape {tuple(keep.shape)}, the document's nll {tuple(document.nll.shape)}"
            )
        size = segment_tokens or max(len(document.nll), 1)
        for piece, kept in zip(document.nll.split(size), keep.split(size), strict=True):
            if masks is None or kept.any():
                sums.append(piece.double()[kept].sum())
                counts.append(int(kept.sum()))
    return torch.stack(sums), torch.tensor(counts, dtype=torch.float64)


def paired_bootstrap(
    nll_a: Sequence[float] | torch.Tensor,
    tokens_a: Sequence[int] | torch.Tensor,
    nll_b: Sequence[float] | torch.Tensor,
    tokens_b: Sequence[int] | torch.Tensor,
    *,
    num_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedBootstrap:
    """Paired bootstrap interval of `perplexity_b / perplexity_a - 1` over segments read by both models.

    Segment `i` has summed NLL `nll_a[i]` over `tokens_a[i]` tokens under model a and `nll_b[i]` over `tokens_b[i]`
    under model b (the same text; the counts differ only under different tokenizers). Each resample draws segments
    with replacement, the same segments for both arms (the pairing), and recomputes both corpus perplexities
    `exp(sum nll / sum tokens)`; the interval is the resamples' `(1 - confidence) / 2` and `(1 + confidence) / 2`
    quantiles. Deterministic for a given `seed`.
    """
    arms = [torch.as_tensor(values, dtype=torch.float64) for values in (nll_a, tokens_a, nll_b, tokens_b)]
    names = ("nll_a", "tokens_a", "nll_b", "tokens_b")
    for name, values in zip(names, arms, strict=True):
        if values.dim() != 1 or len(values) != len(arms[0]):
            raise ValueError(
                f"{name} must be 1-D with one value per segment like nll_a ({tuple(arms[0].shape)}), "
                f"got shape {tuple(values.shape)}"
            )
    if len(arms[0]) < 2:
        raise ValueError(f"A bootstrap needs at least 2 segments, got {len(arms[0])}; cut documents into segments")
    if (arms[1] <= 0).any() or (arms[3] <= 0).any():
        raise ValueError("tokens_a and tokens_b must be positive for every segment")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got confidence={confidence!r}")
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or num_resamples < 1:
        raise ValueError(f"num_resamples must be a positive integer, got num_resamples={num_resamples!r}")

    def relative_difference(totals: torch.Tensor) -> torch.Tensor:
        # totals: (..., 4) sums of nll_a, tokens_a, nll_b, tokens_b
        return torch.exp(totals[..., 2] / totals[..., 3] - totals[..., 0] / totals[..., 1]) - 1

    segments = torch.stack(arms, dim=1)  # (segments, 4)
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    # Resamples drawn in blocks so that the (resamples, segments) index matrix stays small.
    for first in range(0, num_resamples, 1000):
        count = min(1000, num_resamples - first)
        draws = torch.randint(len(segments), (count, len(segments)), generator=generator)
        blocks.append(relative_difference(segments[draws].sum(dim=1)))
    resampled = torch.cat(blocks)
    low, high = torch.quantile(
        resampled, torch.tensor([(1 - confidence) / 2, (1 + confidence) / 2], dtype=torch.float64)
    )
    totals = segments.sum(dim=0)
    return PairedBootstrap(
        relative_difference=relative_difference(totals).item(),
        low=low.item(),
        high=high.item(),
        confidence=confidence,
        perplexity_a=torch.exp(totals[0] / totals[1]).item(),
        perplexity_b=torch.exp(totals[2] / totals[3]).item(),
        num_segments=len(segments),
        num_resamples=num_resamples,
        seed=seed,
    )


class BootstrapSettings(Protocol):
    """The fields `compare` reads (of `ReproductionSettings` or `BookReproductionSettings`)."""

    segment_tokens: int | None
    num_resamples: int
    seed: int


def compare(
    token_nll: Mapping[str, Sequence[TokenNLL]],
    a: str,
    b: str,
    settings: BootstrapSettings,
    masks: Sequence[torch.Tensor] | None = None,
) -> dict:
    """Paired bootstrap of arm `b` against arm `a` (keys of `token_nll`: each arm's `windowed_perplexity(...,
    return_token_nll=True).token_nll` on the same documents) over the same segments of `settings.segment_tokens`
    predicted tokens, counting only the tokens `masks` marks if given (`segment_sums`): `{"a": a, "b": b,
    **PairedBootstrap.to_dict()}`."""
    nll_a, tokens_a = segment_sums(token_nll[a], settings.segment_tokens, masks)
    nll_b, tokens_b = segment_sums(token_nll[b], settings.segment_tokens, masks)
    result = paired_bootstrap(
        nll_a, tokens_a, nll_b, tokens_b, num_resamples=settings.num_resamples, seed=settings.seed
    ).to_dict()
    return {"a": a, "b": b, **result}


def describe(comparison: dict) -> str:
    """One line for a `compare` result: "b vs a: -1.23% perplexity (95% interval -2.00% to -0.50%, 48 segments)"."""
    return (
        f"{comparison['b']} vs {comparison['a']}: {100 * comparison['relative_difference']:+.2f}% perplexity "
        f"({100 * comparison['confidence']:.0f}% interval {100 * comparison['low']:+.2f}% to "
        f"{100 * comparison['high']:+.2f}%, {comparison['num_segments']} segments)"
    )


def nll_by_window_position(token_nll: Sequence[TokenNLL], window_size: int, min_tokens: int = 1) -> torch.Tensor:
    """Mean NLL (nats) of the tokens predicted at each position `0 .. window_size - 1` inside their window.

    Returns a (window_size,) float64 tensor. A position that predicted fewer than `min_tokens` tokens is NaN: with
    overlap `o`, positions below `o` predict only in each document's first window, too few tokens for a mean worth
    plotting beside the others (pass e.g. `min_tokens=100`).
    """
    if not token_nll:
        raise ValueError("token_nll holds no document; pass windowed_perplexity(..., return_token_nll=True).token_nll")
    positions = torch.cat([document.window_position for document in token_nll])
    if len(positions) and positions.max() >= window_size:
        raise ValueError(
            f"window_size={window_size} is smaller than the windows these tokens were read in "
            f"(positions up to {int(positions.max())})"
        )
    nll = torch.cat([document.nll for document in token_nll]).double()
    sums = torch.zeros(window_size, dtype=torch.float64).index_add_(0, positions, nll)
    counts = torch.bincount(positions, minlength=window_size).double()
    means = sums / counts
    means[counts < min_tokens] = float("nan")
    return means
