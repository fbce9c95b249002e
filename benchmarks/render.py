# SPDX-License-Identifier: Apache-2.0
"""Render the numbers in docs/benchmarks.md from the recorded runs in benchmarks/results/*.json.

    python benchmarks/render.py           # rewrite the marked regions of docs/benchmarks.md
    python benchmarks/render.py --check   # exit 1 if docs/benchmarks.md is not what the results render to

The page's prose is written by hand; only the regions `<!-- benchmark:SCRIPT.PART -->` ...
`<!-- /benchmark:SCRIPT.PART -->` come from `benchmarks/results/SCRIPT.json`. PART is `command` (the command that
ran), `machine` (where it ran), the name of one of the result's `tables`, or that of one of its `text` groups (lines
the script derived from its numbers, such as a goal's verdict). Imports nothing heavy, so the docs test and this script stay fast.
"""

import argparse
import json
import re
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_PATH = REPO_ROOT / "docs" / "benchmarks.md"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

REGION = re.compile(r"<!-- benchmark:(?P<name>[\w.]+) -->\n.*?<!-- /benchmark:(?P=name) -->", re.DOTALL)


def markdown_table(table: dict) -> str:
    """A table `{"headers": [...], "rows": [[cell, ...], ...]}` (cells as shown), with optional per-column
    `"align"` ("right" or "")."""
    align = table.get("align") or [""] * len(table["headers"])
    rule = "|" + "|".join(" ---: " if a == "right" else " --- " for a in align) + "|"
    lines = ["| " + " | ".join(table["headers"]) + " |", rule]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def load_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    """Every recorded run, by its file name without `.json` (the script's name)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(results_dir.glob("*.json"))}


def render_part(result: dict, part: str) -> str:
    if part == "command":
        return f"`{result['command']}`"
    if part == "machine":
        machine = result["machine"]
        # A run rendered from a finished job's folder describes where it was rendered, not where the job ran.
        label = "Rendered on" if result.get("rendered_from_results_dir") else "Machine"
        at_end = f"; {machine['at_end']}" if machine.get("at_end") else ""
        return f"{label}: {machine['description']}{at_end}."
    if part in result["tables"]:
        return markdown_table(result["tables"][part])
    return "\n".join(result["text"][part])


def render(text: str, results: dict[str, dict]) -> str:
    """`text` with every marked region replaced by what the results say; a region naming a missing result or part
    is an error, so that a renamed table cannot leave stale numbers behind."""

    def replace(match: re.Match) -> str:
        name = match["name"]
        script, _, part = name.partition(".")
        if script not in results:
            raise KeyError(f"docs region {name}: no benchmarks/results/{script}.json")
        return f"<!-- benchmark:{name} -->\n{render_part(results[script], part)}\n<!-- /benchmark:{name} -->"

    return REGION.sub(replace, text)


def render_docs(check: bool = False) -> bool:
    """Rewrite docs/benchmarks.md from the results (or with `check`, only compare); returns whether it was current."""
    text = DOCS_PATH.read_text()
    rendered = render(text, load_results())
    if not check and rendered != text:
        DOCS_PATH.write_text(rendered)
        print(f"rendered {DOCS_PATH.relative_to(REPO_ROOT)} from {RESULTS_DIR.relative_to(REPO_ROOT)}")
    return rendered == text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the page is up to date")
    args = parser.parse_args()
    current = render_docs(check=args.check)
    if args.check and not current:
        sys.exit(f"{DOCS_PATH.relative_to(REPO_ROOT)} is out of date: run python benchmarks/render.py")


if __name__ == "__main__":
    main()
