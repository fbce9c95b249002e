"""The results table and the perplexity-against-FLOPs plot."""

import pytest

from hf_recurrence.evaluation import format_table, plot_perplexity_vs_flops


ROWS = [
    {"model": "baseline", "window_size": 300, "overlap": 0, "perplexity": 172.25, "num_tokens": 12345,
     "flops_per_token": 1.754e8, "word_perplexity": None, "train_loss": 3.1},
    {"model": "baseline", "window_size": 300, "overlap": 50, "perplexity": 152.64, "num_tokens": 12345,
     "flops_per_token": 2.105e8, "word_perplexity": None},
    {"model": "recurrent", "window_size": 300, "overlap": 0, "perplexity": 155.27, "num_tokens": 12345,
     "flops_per_token": 1.7543e8, "word_perplexity": None},
    {"model": "recurrent", "window_size": 200, "overlap": 0, "perplexity": 160.0, "num_tokens": 12345,
     "flops_per_token": 1.73e8, "word_perplexity": None},
]  # fmt: skip


def test_table_has_one_line_per_row_in_order():
    lines = format_table(ROWS).splitlines()
    assert lines[0] == "| Model | Window | Overlap | Perplexity | Tokens | FLOPs/token |"
    assert lines[2] == "| baseline | 300 | 0 | 172.25 | 12,345 | 1.75e+08 |"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| baseline", "| baseline", "| recurrent", "| recurrent"]


def test_table_shows_word_perplexity_when_a_row_has_it():
    rows = [{**ROWS[0], "word_perplexity": 301.5}, {**ROWS[1], "flops_per_token": None}]
    lines = format_table(rows).splitlines()
    assert "Word perplexity" in lines[0]
    assert lines[2].endswith("| 301.50 | 12,345 | 1.75e+08 |")
    assert lines[3].endswith("| – | 12,345 | – |")


def test_plot_is_written(tmp_path):
    from matplotlib.image import imread

    path = plot_perplexity_vs_flops(ROWS, tmp_path / "plot.png")
    plain = imread(path)
    height, width, _ = plain.shape
    assert width > 500 and height > 300
    # Notes are written under the plot, in the figure's layout: the same size, another picture.
    noted = imread(plot_perplexity_vs_flops(ROWS, tmp_path / "noted.png", notes=["T=32: a note", "T=64: another"]))
    assert noted.shape == plain.shape and (noted != plain).any()


def test_empty_or_unplottable_rows_raise(tmp_path):
    with pytest.raises(ValueError, match="at least one row"):
        format_table([])
    with pytest.raises(ValueError, match="models \\['llama'\\]"):
        plot_perplexity_vs_flops([{**ROWS[0], "model": "llama", "flops_per_token": None}], tmp_path / "p.png")
