"""Windowed perplexity, FLOPs per token, paired bootstrap intervals, NLL by window position, and the tables and
plots of the paper's evaluation (Yoshida et al. 2020)."""

from pathlib import Path

from .flops import flops_per_token
from .perplexity import (
    RECURRENT_MODEL_TYPES,
    TokenNLL,
    WindowedPerplexity,
    WindowPrefixed,
    window_schedule,
    windowed_perplexity,
)
from .report import format_table, plot_nll_by_window_position, plot_perplexity_vs_flops, write_report
from .statistics import PairedBootstrap, nll_by_window_position, paired_bootstrap, segment_sums


# Local path of the `evaluate` module wrapping `windowed_perplexity`: `evaluate.load(METRIC_PATH)`.
METRIC_PATH = str(Path(__file__).with_name("windowed_perplexity_metric.py"))

__all__ = [
    "METRIC_PATH",
    "RECURRENT_MODEL_TYPES",
    "PairedBootstrap",
    "TokenNLL",
    "WindowPrefixed",
    "WindowedPerplexity",
    "flops_per_token",
    "format_table",
    "nll_by_window_position",
    "paired_bootstrap",
    "plot_nll_by_window_position",
    "plot_perplexity_vs_flops",
    "segment_sums",
    "window_schedule",
    "windowed_perplexity",
]
