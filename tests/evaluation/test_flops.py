"""The analytic FLOPs count against the paper's FLOPs/token column and the recurrence's overhead."""

import pytest
from transformers import GPT2Config

from hf_recurrence import RecurrentGPT2Config
from hf_recurrence.evaluation import flops_per_token


# Paper Table 2 (PG-19), GPT-2 small with 300-token windows: overlap -> FLOPs/token.
PAPER_GPT2_SMALL_T300 = {
    0: 1.75e8, 5: 1.78e8, 10: 1.81e8, 30: 1.94e8, 50: 2.10e8, 75: 2.33e8, 100: 2.62e8, 150: 3.50e8, 200: 5.25e8
}  # fmt: skip


@pytest.mark.parametrize(("overlap", "paper"), sorted(PAPER_GPT2_SMALL_T300.items()))
def test_gpt2_small_matches_the_papers_column(overlap, paper):
    # The paper's rows are its rounded 1.75e8 times 300 / (300 - overlap); ours start from the unrounded 1.754e8.
    assert flops_per_token(GPT2Config(), 300, overlap) == pytest.approx(paper, rel=0.005)
    assert f"{flops_per_token(GPT2Config(), 300, 0):.2e}" == "1.75e+08"


@pytest.mark.parametrize("window", [200, 300, 600])
def test_recurrence_adds_under_one_percent(window):
    baseline = flops_per_token(GPT2Config(), window, 0)
    recurrent = flops_per_token(RecurrentGPT2Config(window_size=window), window, 0)
    assert baseline < recurrent < 1.01 * baseline


@pytest.mark.parametrize(("window", "overlap"), [(300, 50), (300, 200), (64, 32), (16, 15)])
def test_overlap_costs_the_recomputed_fraction(window, overlap):
    for config in (GPT2Config(), RecurrentGPT2Config(window_size=window, n_positions=1024)):
        ratio = flops_per_token(config, window, overlap) / flops_per_token(config, window, 0)
        assert ratio == pytest.approx(window / (window - overlap), rel=1e-3)


@pytest.mark.parametrize(("window", "overlap", "named"), [(0, 0, "window_size=0"), (8, 8, "overlap=8")])
def test_bad_schedule_raises(window, overlap, named):
    with pytest.raises(ValueError, match=named):
        flops_per_token(GPT2Config(), window, overlap)


def test_other_families_are_refused():
    config = GPT2Config()
    config.model_type = "llama"
    with pytest.raises(ValueError, match="model_type='llama'"):
        flops_per_token(config, 16, 0)
