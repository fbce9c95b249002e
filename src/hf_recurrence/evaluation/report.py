"""The paper's results table (Tables 1-2) and its perplexity-against-FLOPs plot (Figure 5) from evaluation rows.

A row is a dict with at least `model` (a name) and the fields of `WindowedPerplexity.to_dict()`; other keys are
ignored, so callers can add their own (training loss, tokens seen).
"""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..outputs import write_atomically


# (row key, column header, format) of the table, in order; word perplexity only where some row has it.
TABLE_COLUMNS = (
    ("model", "Model", "{}"),
    ("window_size", "Window", "{}"),
    ("overlap", "Overlap", "{}"),
    ("perplexity", "Perplexity", "{:.2f}"),
    ("word_perplexity", "Word perplexity", "{:.2f}"),
    ("num_tokens", "Tokens", "{:,}"),
    ("flops_per_token", "FLOPs/token", "{:.3g}"),
)

MARKERS = "osD^vP*X"
LINE_STYLES = ("-", "--", ":", "-.")


def format_table(rows: Sequence[dict]) -> str:
    """A Markdown table of `rows`, one line each in the given order (the paper's Tables 1-2 layout)."""
    if not rows:
        raise ValueError("format_table needs at least one row, got none")
    columns = [
        column
        for column in TABLE_COLUMNS
        if column[0] != "word_perplexity" or any(row.get("word_perplexity") is not None for row in rows)
    ]
    lines = [
        "| " + " | ".join(header for _, header, _ in columns) + " |",
        "| " + " | ".join("---" if key == "model" else "---:" for key, _, _ in columns) + " |",
    ]
    for row in rows:
        cells = ["–" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(
    output_dir: Path,
    rows: Sequence[dict],
    summary: Sequence[str] = (),
    *,
    finished: bool,
    sections: Sequence[str] = (),
    **header,
) -> str:
    """Write `results.json` (`finished`, `header`'s fields, then `rows`) and `results.md` (the table of `rows`, then
    each of `sections`, Markdown such as another table, then one bullet per `summary` line) to `output_dir`; return
    the table. Every command that evaluates writes its report
    this way, after each evaluation with `finished=False` (so a later failure loses nothing finished, and the files
    say that more rows were to come), and once more with `finished=True` at the end. Each file is replaced
    atomically: a run killed mid-write, or a full disk, leaves the previous complete version."""
    table = format_table(rows)
    write_atomically(
        output_dir / "results.json", json.dumps({"finished": finished, **header, "rows": list(rows)}, indent=2) + "\n"
    )
    unfinished = "" if finished else "Unfinished run: the rows so far.\n\n"
    body = "\n\n".join([table, *(section for section in sections if section)]) + "\n"
    write_atomically(
        output_dir / "results.md",
        unfinished + body + ("\n" + "".join(f"- {line}\n" for line in summary) if summary else ""),
    )
    return table


def plot_perplexity_vs_flops(rows: Sequence[dict], path: str | Path, notes: Sequence[str] = ()) -> Path:
    """Plot perplexity against FLOPs per token (the paper's Figure 5) and save it to `path` (PNG, PDF, SVG...).

    One colour and marker per model; within a model one line style per window size, through its overlaps in order of cost,
    each point annotated with its overlap. `notes`: lines written under the plot (e.g. the comparisons behind the
    points). Needs matplotlib (`pip install hf-recurrence[eval]`); no display is used.
    """
    # Imported here so that the rest of the evaluation package works without matplotlib installed.
    from matplotlib.figure import Figure

    if not rows:
        raise ValueError("plot_perplexity_vs_flops needs at least one row, got none")
    missing = [row.get("model") for row in rows if row.get("flops_per_token") is None]
    if missing:
        raise ValueError(f"Rows without flops_per_token cannot be plotted: models {sorted(set(map(str, missing)))}")
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    models = list(dict.fromkeys(row["model"] for row in rows))
    for index, model in enumerate(models):
        color, marker = f"C{index % 10}", MARKERS[index % len(MARKERS)]
        windows = sorted({row["window_size"] for row in rows if row["model"] == model})
        for window in windows:
            points = sorted(
                (row for row in rows if row["model"] == model and row["window_size"] == window),
                key=lambda row: row["flops_per_token"],
            )
            label = model if len(windows) == 1 else f"{model}, window {window}"
            axes.plot(
                [p["flops_per_token"] for p in points],
                [p["perplexity"] for p in points],
                color=color,
                marker=marker,
                label=label,
                linestyle=LINE_STYLES[windows.index(window) % len(LINE_STYLES)],
            )
            for point in points:
                axes.annotate(
                    f"o={point['overlap']}",
                    (point["flops_per_token"], point["perplexity"]),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                    color=color,
                )
    if notes:
        # Under the x label, inside the figure's layout (which grows to make room for it).
        axes.annotate(
            "\n".join(notes),
            (0, 0),
            xycoords="axes fraction",
            xytext=(0, -36),
            textcoords="offset points",
            fontsize=7,
            va="top",
        )
    return _label_and_save(
        axes, "FLOPs per token", "Perplexity", "Perplexity against evaluation cost (o = overlap in tokens)", path
    )


def plot_nll_by_window_position(arms: Mapping[str, Sequence[float]], path: str | Path) -> Path:
    """Plot each arm's mean NLL against the position inside the window and save it to `path` (PNG, PDF, SVG...).

    `arms` maps a name (e.g. "baseline", "recurrent", "control") to its NLL per position `0 .. T-1`, e.g. from
    [`nll_by_window_position`]; NaN positions (none predicted) leave gaps. A recurrent model's gain over the baseline
    should sit at the window starts. Needs matplotlib (`pip install hf-recurrence[eval]`); no display is used.
    """
    from matplotlib.figure import Figure

    if not arms:
        raise ValueError("plot_nll_by_window_position needs at least one arm, got none")
    lengths = {name: len(values) for name, values in arms.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"Every arm needs one value per window position; got lengths {lengths}")
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for index, (name, values) in enumerate(arms.items()):
        values = [float(value) for value in values]
        axes.plot(range(len(values)), values, color=f"C{index % 10}", linestyle=LINE_STYLES[index % 4], label=name)
    return _label_and_save(
        axes, "Position inside the window", "Mean NLL (nats)", "NLL by position inside the window", path
    )


def _label_and_save(axes, xlabel: str, ylabel: str, title: str, path: str | Path) -> Path:
    """Label the axes the way every plot of this module is labelled, then save their figure to `path`."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    path = Path(path)
    axes.figure.savefig(path, dpi=150)
    return path
