"""The main job's results in docs/benchmarks.md: `hf-recurrence reproduce` (Yoshida et al. 2020, Tables 1-2, Figure 5).

Runs `hf-recurrence reproduce` with its default preset (or the flags given after `--`), then writes its table, the
paper's two claims checked on the numbers, the wall time and the perplexity-vs-FLOPs plot into docs/benchmarks.md.
`--results-dir DIR` renders a finished run instead of running one.

    python benchmarks/reproduce.py --write-docs [-- extra reproduce flags]
"""

from pathlib import Path

from _common import REPO_ROOT, run_or_render, run_or_render_arguments, setup, trainer_device, write_section

from hf_recurrence.cli import main as cli_main
from hf_recurrence.evaluation import format_table
from hf_recurrence.reproduction import findings


IMAGE = REPO_ROOT / "docs" / "images" / "reproduce_perplexity_vs_flops.png"
# The paper's numbers for the two claims (Table 2, PG-19, windows of 300 tokens; Table 1, WikiText-103).
PAPER = (
    "PG-19: recurrent 155.3 vs baseline 172.3 at overlap 0 (-10%); WikiText-103: 27.7 vs 29.0 (-4.5%); recurrent at "
    "overlap 0 about as good as the baseline at overlap 30 of 300 (10% of the window)."
)


def main() -> None:
    args = run_or_render_arguments(__doc__.split("\n\n")[0], threads=2, runs="`hf-recurrence reproduce`")
    setup(0, args.threads)
    if args.results_dir is None:
        trainer_device(args, "`hf-recurrence reproduce` picks its device and dtype itself")
    command = ["reproduce", *args.extra]

    def run(results_dir: Path) -> None:
        if cli_main([*command, "--output_dir", str(results_dir)]) != 0:
            raise SystemExit(2)  # the command printed why

    report, where = run_or_render(args, run, {"perplexity_vs_flops.png": IMAGE})
    if args.write_docs:
        write_section("reproduce", docs_section(" ".join(["hf-recurrence", *command]), report, where, args.note))


def docs_section(command: str, report: dict, run: str, note: str) -> str:
    rows = report["rows"]
    settings = report["settings"]
    claims = "\n".join(f"- {line}" for line in findings(rows))
    return f"""## Reproduction of the recurrence paper (`hf-recurrence reproduce`)

The project's main job: from the embedded default GPT-2 (`{Path(report["source"]).name}`), a plain baseline and a
recurrent GPT-2 fine-tuned with the stock `Trainer` at equal steps on the same tokens (the standard library's train
modules), then evaluated on the held-out test modules with windowed perplexity. See
[guides/reproduce.md](guides/reproduce.md) for the protocol.

`{command}` — {report["minutes"]:.1f} minutes. {note}

{run}

Settings: windows {list(settings["window_sizes"])}, blocks of {settings["block_tokens"]} tokens, batch
{settings["batch_size"]} blocks, {settings["max_steps"]} steps per model, learning rate {settings["learning_rate"]}.

{format_table(rows)}

The paper's claims checked on these numbers:

{claims}

Paper: {PAPER}

![perplexity vs FLOPs per token](images/{IMAGE.name})
"""


if __name__ == "__main__":
    main()
