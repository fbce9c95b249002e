"""Per-token NLL from windowed_perplexity, the paired bootstrap, NLL by window position and its plot."""

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_recurrence import RecurrentGPT2LMHeadModel
from hf_recurrence.evaluation import (
    TokenNLL,
    nll_by_window_position,
    paired_bootstrap,
    perplexity,
    plot_nll_by_window_position,
    segment_sums,
    windowed_perplexity,
)

from ..common import TINY_GPT2, tiny_recurrent_config


# Batched windows against one window per forward: fp32 kernels may differ by a few ulps per logit.
BATCHED_VS_SINGLE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).eval()


def reference_token_nll(model, ids: torch.Tensor, window: int, overlap: int) -> tuple[list[float], list[int]]:
    """The definition, one window per forward: each position predicts the next token from the first window that
    contains it (windows start every window - overlap tokens); returns per-token NLL and window position."""
    nll, positions, start = [], [], 0
    while len(nll) < len(ids) - 1:
        with torch.no_grad():
            log_probs = torch.log_softmax(model(ids[None, start : start + window]).logits[0].float(), dim=-1)
        for position in range(len(nll), min(start + window, len(ids) - 1)):
            nll.append(-log_probs[position - start, ids[position + 1]].item())
            positions.append(position - start)
        start += window - overlap
    return nll, positions


@pytest.mark.parametrize(("window", "overlap"), [(16, 0), (16, 5), (7, 3)])
def test_stock_token_nll_equals_hand_loop_and_sums_to_the_total(gpt2, window, overlap):
    documents = [torch.randint(0, 99, (length,)) for length in (61, 17, 2, 9)]
    plain = windowed_perplexity(gpt2, documents, window, overlap, batch_size=3, show_progress=False)
    result = windowed_perplexity(
        gpt2, documents, window, overlap, batch_size=3, show_progress=False, return_token_nll=True
    )

    # The same call path either way: the totals do not move.
    assert result.nll == plain.nll and plain.token_nll is None
    assert "token_nll" not in result.to_dict()
    assert len(result.token_nll) == len(documents)
    for doc, token_nll in zip(documents, result.token_nll, strict=True):
        nll, positions = reference_token_nll(gpt2, doc, window, overlap)
        torch.testing.assert_close(token_nll.nll, torch.tensor(nll), **BATCHED_VS_SINGLE)
        assert token_nll.window_position.tolist() == positions
    summed = sum(token_nll.nll.double().sum().item() for token_nll in result.token_nll)
    assert summed == pytest.approx(result.nll * result.num_tokens, rel=1e-6)


@pytest.mark.parametrize("overlap", [0, 3])
def test_recurrent_token_nll_equals_its_own_per_token_loss(overlap, monkeypatch):
    # Chunks that split windows, so the per-token values of a row are gathered across calls.
    monkeypatch.setattr(perplexity, "RECURRENT_CHUNK_TOKENS", 11)
    torch.manual_seed(0)
    model = RecurrentGPT2LMHeadModel(tiny_recurrent_config(window_overlap=overlap)).eval()
    documents = [torch.randint(0, 99, (length,)) for length in (23, 70, 5)]
    result = windowed_perplexity(model, documents, batch_size=2, show_progress=False, return_token_nll=True)

    for doc, token_nll in zip(documents, result.token_nll, strict=True):
        with torch.no_grad():
            logits = model(doc[None]).logits[0]
        expected = torch.nn.functional.cross_entropy(logits[:-1].float(), doc[1:], reduction="none")
        torch.testing.assert_close(token_nll.nll, expected, **BATCHED_VS_SINGLE)
        # Windows of 8 with stride 8 - overlap: the first reads positions 0..7, the others overlap..7.
        first = list(range(min(8, len(doc) - 1)))
        later = [overlap + (p - 8) % (8 - overlap) for p in range(8, len(doc) - 1)]
        assert token_nll.window_position.tolist() == first + later
    summed = sum(token_nll.nll.double().sum().item() for token_nll in result.token_nll)
    assert summed == pytest.approx(result.nll * result.num_tokens, rel=1e-6)


def test_nll_by_window_position_equals_hand_loop(gpt2):
    window, overlap = 16, 4
    documents = [torch.randint(0, 99, (length,)) for length in (90, 33)]
    result = windowed_perplexity(gpt2, documents, window, overlap, show_progress=False, return_token_nll=True)
    by_position = nll_by_window_position(result.token_nll, window)

    sums, counts = [0.0] * window, [0] * window
    for doc in documents:
        for nll, position in zip(*reference_token_nll(gpt2, doc, window, overlap), strict=True):
            sums[position] += nll
            counts[position] += 1
    expected = torch.tensor([total / count for total, count in zip(sums, counts, strict=True)], dtype=torch.float64)
    torch.testing.assert_close(by_position, expected, **BATCHED_VS_SINGLE)


def test_nll_by_window_position_marks_positions_without_tokens():
    token_nll = [TokenNLL(torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([0, 1, 1, 1]))]
    by_position = nll_by_window_position(token_nll, 3)
    assert by_position[:2].tolist() == [1.0, 10.0 / 3]
    assert math.isnan(by_position[2])
    assert nll_by_window_position(token_nll, 3, min_tokens=2)[:2].isnan().tolist() == [True, False]
    with pytest.raises(ValueError, match="window_size=1 is smaller"):
        nll_by_window_position(token_nll, 1)


def test_segment_sums_cut_documents_into_pieces():
    token_nll = [
        TokenNLL(torch.arange(5.0), torch.zeros(5, dtype=torch.long)),
        TokenNLL(torch.ones(2), torch.zeros(2, dtype=torch.long)),
    ]
    sums, counts = segment_sums(token_nll, 2)
    assert sums.tolist() == [1.0, 5.0, 4.0, 2.0] and counts.tolist() == [2.0, 2.0, 1.0, 2.0]
    sums, counts = segment_sums(token_nll)
    assert sums.tolist() == [10.0, 2.0] and counts.tolist() == [5.0, 2.0]
    with pytest.raises(ValueError, match="segment_tokens=0"):
        segment_sums(token_nll, 0)
    # A mask counts only the tokens it marks, the segments still cut by position; a segment it leaves empty is dropped.
    masks = [torch.tensor([True, False, False, False, True]), torch.tensor([False, False])]
    sums, counts = segment_sums(token_nll, 2, masks)
    assert sums.tolist() == [0.0, 4.0] and counts.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"masks\[1\] has shape \(3,\), the document's nll \(2,\)"):
        segment_sums(token_nll, 2, [masks[0], torch.ones(3, dtype=torch.bool)])


def synthetic_arms(delta: float, num_segments: int = 200, seed: int = 1):
    """Segments of 100 tokens with uneven difficulty; arm b's NLL per token is arm a's plus `delta`, plus noise that
    sums to zero, so the true relative difference is exactly exp(delta) - 1."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.full((num_segments,), 100.0, dtype=torch.float64)
    nll_a = tokens * (3 + torch.rand(num_segments, generator=generator, dtype=torch.float64))
    noise = 5 * torch.randn(num_segments, generator=generator, dtype=torch.float64)
    nll_b = nll_a + delta * tokens + noise - noise.mean()
    return nll_a, tokens, nll_b, tokens


def test_bootstrap_interval_contains_a_known_difference_and_excludes_zero():
    result = paired_bootstrap(*synthetic_arms(-0.05), num_resamples=2000)
    assert result.relative_difference == pytest.approx(math.exp(-0.05) - 1, rel=1e-9)
    assert result.low < math.exp(-0.05) - 1 < result.high
    assert result.high < 0 and result.excludes_zero
    assert result.perplexity_b / result.perplexity_a - 1 == pytest.approx(result.relative_difference, rel=1e-9)
    assert (result.num_segments, result.num_resamples, result.confidence) == (200, 2000, 0.95)


def test_bootstrap_interval_contains_zero_for_equal_arms():
    result = paired_bootstrap(*synthetic_arms(0.0), num_resamples=2000)
    assert result.relative_difference == pytest.approx(0.0, abs=1e-12)
    assert result.low < 0 < result.high and not result.excludes_zero


def test_bootstrap_pairs_segments():
    # Segments differ far more from one another than the arms differ: unpaired resampling would straddle 0.
    nll_a, tokens, nll_b, _ = synthetic_arms(-0.01)
    result = paired_bootstrap(nll_a, tokens, nll_b, tokens, num_resamples=2000)
    assert result.high < 0


def test_bootstrap_is_deterministic_under_a_seed():
    arms = synthetic_arms(-0.02)
    first = paired_bootstrap(*arms, num_resamples=1500, seed=3)
    assert paired_bootstrap(*arms, num_resamples=1500, seed=3) == first
    assert paired_bootstrap(*arms, num_resamples=1500, seed=4).low != first.low


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"nll_b": [1.0, 2.0, 3.0]}, "nll_b must be 1-D with one value per segment"),
        ({"nll_a": [1.0], "tokens_a": [1], "nll_b": [1.0], "tokens_b": [1]}, "at least 2 segments"),
        ({"tokens_a": [0, 1]}, "must be positive"),
        ({"confidence": 95}, "confidence=95"),
        ({"num_resamples": 0}, "num_resamples=0"),
    ],
)
def test_bootstrap_bad_input_is_named(kwargs, named):
    arms = {"nll_a": [1.0, 2.0], "tokens_a": [1, 1], "nll_b": [1.0, 2.0], "tokens_b": [1, 1]} | kwargs
    with pytest.raises(ValueError, match=named):
        paired_bootstrap(**arms)


def test_plot_nll_by_window_position_writes_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    arms = {"baseline": [5.0, 4.0, 3.5], "recurrent": [4.5, 3.9, 3.5], "control": [4.9, 4.0, float("nan")]}
    path = plot_nll_by_window_position(arms, tmp_path / "nll_by_position.png")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="one value per window position"):
        plot_nll_by_window_position({"a": [1.0], "b": [1.0, 2.0]}, tmp_path / "bad.png")
