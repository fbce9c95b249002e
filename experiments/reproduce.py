"""The main job's results in docs/experiments/reproduce.md: `hf-recurrence reproduce` (Yoshida et al. 2020, Tables 1-2, Figure 5).

Runs `hf-recurrence reproduce` with its default preset (or the flags given after `--`), then records its table, the
paper's two claims and the decomposition of the recurrent model's gain (learned constant: control vs baseline;
carried context: recurrent vs control; with intervals) checked on the numbers, and the wall time
(experiments/results/reproduce.json), and with `--write-docs` copies the perplexity-vs-FLOPs plot into docs/.
`--results-dir DIR` records a finished run instead.

    python experiments/reproduce.py --write-docs [-- extra reproduce flags]
"""

from pathlib import Path

import _common as bench

from hf_recurrence.cli import main as cli_main
from hf_recurrence.experiments.reproduction import decomposed_findings, decomposition_cells


IMAGE = bench.REPO_ROOT / "docs" / "images" / "reproduce_perplexity_vs_flops.png"


def main() -> None:
    args = bench.run_or_render_parser(__doc__, __file__, threads=2, runs="`hf-recurrence reproduce`").parse_args()
    bench.setup(0, args.threads)
    if args.results_dir is None:
        bench.trainer_device(args, "`hf-recurrence reproduce` picks its device and dtype itself")
    command = ["reproduce", *args.extra]

    def run(results_dir: Path) -> None:
        if cli_main([*command, "--output_dir", str(results_dir)]) != 0:
            raise SystemExit(2)  # the command printed why

    report, machine = bench.run_or_render(args, run, {"perplexity_vs_flops.png": IMAGE})
    settings = report["settings"]
    text = {
        "run": [f"`{' '.join(['hf-recurrence', *command])}` — {report['minutes']:.1f} minutes. {args.note}".rstrip()],
        "settings": [
            f"Settings: windows {list(settings['window_sizes'])}, blocks of {settings['block_tokens']} tokens, batch",
            f"{settings['batch_size']} blocks, {settings['max_steps']} steps per model, learning rate "
            f"{settings['learning_rate']}.",
        ],
        "claims": [f"- {line}" for line in decomposed_findings(report["rows"], report["comparisons"])],
    }
    headers, cells = decomposition_cells(report["comparisons"])
    tables = {
        "perplexity": bench.perplexity_table(report["rows"]),
        "decomposition": bench.table(headers, cells, align=["right"] * len(headers)),
    }
    rendered = args.results_dir is not None
    bench.write_results(args, machine, tables, report, text, rendered_from_results_dir=rendered)


if __name__ == "__main__":
    main()
