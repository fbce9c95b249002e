"""The recurrence claim on a real pretrained decoder in docs/experiments/long_books.md: `hf-recurrence reproduce --preset smollm2`
(SmolLM2-135M-Instruct) or `--preset gemma3` (Gemma 3 270M base), on Jane Austen's novels.

Runs the book reproduction of `--preset` (baseline, recurrent, control and shuffled arms, with the flags given after
`--`), then records its table, the bootstrap intervals, the issue's three goals checked on them, the NLL by window
position and the training budget and time (`--output-json`), and with `--write-docs` copies both plots into
docs/images, named after the result file. `--results-dir DIR` records a finished run instead: give it the `--preset`
and the flags that run was started with, so that the recorded command is the one that ran.

    python experiments/reproduce_books.py --preset gemma3 --write-docs [-- extra reproduce flags]
"""

from pathlib import Path

import _common as bench

from hf_recurrence.cli import main as cli_main
from hf_recurrence.commands.reproduce import BOOK_PRESETS
from hf_recurrence.experiments.book_reproduction import describe_comparisons, goals, name_probe_line
from hf_recurrence.experiments.memory_gate3 import gate3_goals
from hf_recurrence.experiments.reproduction import findings


PLOTS = ("perplexity_vs_flops.png", "nll_by_window_position.png")
# Window positions whose mean NLL the section lists (the rest are in the plot and results.json).
POSITIONS = (0, 1, 2, 4, 8, 16, 32, 64)


def main() -> None:
    parser = bench.run_or_render_parser(__doc__, __file__, threads=2, runs="`hf-recurrence reproduce`")
    parser.add_argument("--preset", choices=sorted(BOOK_PRESETS), default="smollm2", help="the book preset to run")
    args = parser.parse_args()
    bench.setup(0, args.threads)
    if args.results_dir is None:
        bench.trainer_device(
            args,
            f"`hf-recurrence reproduce --preset {args.preset}` picks its device and dtype itself",
        )
    command = ["reproduce", "--preset", args.preset, *args.extra]

    def run(results_dir: Path) -> None:
        if cli_main([*command, "--output_dir", str(results_dir)]) != 0:
            raise SystemExit(2)  # the command printed why

    report, machine = bench.run_or_render(args, run, docs_images(args.output_json))
    comparisons = report["comparisons"]
    checked = goals(comparisons, report.get("carried_gain_lost_when_shuffled")) + findings(report["rows"])
    text = {
        "run": [
            f"`{' '.join(['hf-recurrence', *command])}` — {report['minutes']:.1f} minutes in all. {args.note}".rstrip()
        ],
        "intervals": [f"- {line}" for line in describe_comparisons(comparisons)],
        "goals": [f"- {line}" for line in checked],
        # Issue 39's gate 3 (a run with --memory): its goals, and the words the previous window read, met again.
        "memory_goals": [f"- {line}" for line in gate3_goals(report)],
        "carried_tokens": [carried_tokens_line(report["carried_tokens"])],
        # A run with --probe_fraction: each trained arm's name recall on the validation book.
        "name_probe": [f"- {name_probe_line(arm, scores)}" for arm, scores in report.get("name_probe", {}).items()],
    }
    tables = {
        "perplexity": bench.perplexity_table(report["rows"]),
        "positions": position_table(report["nll_by_window_position"]),
    }
    rendered = args.results_dir is not None
    bench.write_results(args, machine, tables, report, text, rendered_from_results_dir=rendered)


def carried_tokens_line(carried: dict) -> str:
    """How many tokens were carried (a word the previous window read, met before the current window reads it), and
    every read's mean NLL on them."""
    means = ", ".join(f"{arm} {nll:.3f}" for arm, nll in carried["nll"].items())
    return (
        f"{carried['tokens']:,} carried tokens ({carried['share']:.1%} of the predicted tokens)"
        + (f"; mean NLL on them: {means}" if means else "")
        + "."
    )


def docs_images(output_json: Path) -> dict[str, Path]:
    """Where `--write-docs` copies the run's plots: named after its result file (reproduce_gemma3_lora_test.json ->
    docs/images/gemma3_lora_test_*.png), so that every recorded run keeps its own."""
    prefix = output_json.stem.removeprefix("reproduce_")
    return {plot: bench.REPO_ROOT / "docs" / "images" / f"{prefix}_{plot}" for plot in PLOTS}


def position_table(by_position: dict[str, list[float | None]]) -> dict:
    """Mean NLL at a few window positions, one column per arm, and the recurrent arm's gain over each."""
    arms = list(by_position)
    rows = []
    for position in POSITIONS:
        if position >= len(by_position[arms[0]]):
            continue
        values = {arm: by_position[arm][position] for arm in arms}
        gain = values.get("recurrent@0"), values.get("control@0")
        difference = "–" if None in gain else f"{gain[0] - gain[1]:+.3f}"
        rows.append([position, *("–" if v is None else f"{v:.3f}" for v in values.values()), difference])
    headers = ["position", *(arm.split("@")[0] for arm in arms), "recurrent - control"]
    return bench.table(headers, rows, align=["right"] * len(headers))


if __name__ == "__main__":
    main()
