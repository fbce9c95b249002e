"""Windowed perplexity, FLOPs per token and the tables and plots of the paper's evaluation (Yoshida et al. 2020)."""

from pathlib import Path

from .flops import flops_per_token
from .perplexity import RECURRENT_MODEL_TYPES, WindowedPerplexity, window_schedule, windowed_perplexity
from .report import format_table, plot_perplexity_vs_flops


# Local path of the `evaluate` module wrapping `windowed_perplexity`: `evaluate.load(METRIC_PATH)`.
METRIC_PATH = str(Path(__file__).with_name("windowed_perplexity_metric.py"))

__all__ = [
    "METRIC_PATH",
    "RECURRENT_MODEL_TYPES",
    "WindowedPerplexity",
    "flops_per_token",
    "format_table",
    "plot_perplexity_vs_flops",
    "window_schedule",
    "windowed_perplexity",
]
