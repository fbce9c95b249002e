# SPDX-License-Identifier: Apache-2.0
"""Render the numbers in docs/benchmarks.md and docs/experiments/*.md from the recorded runs in
benchmarks/results/*.json (speed and memory) and experiments/results/*.json (quality).

    python benchmarks/render.py           # rewrite the marked regions of every page
    python benchmarks/render.py --check   # exit 1 if a page is not what the results render to

The pages' prose is written by hand; only the regions `<!-- benchmark:SCRIPT.PART -->` ...
`<!-- /benchmark:SCRIPT.PART -->` (`experiment:` on the experiments' pages) come from `RESULTS/SCRIPT.json`, RESULTS
being the page's folder of recorded runs (`PAGES`). PART is `command` (the command that ran), `machine` (where it
ran), the name of one of the result's `tables`, or that of one of its `text` groups (lines the script derived from its
numbers, such as a goal's verdict). Imports nothing heavy, so the docs test and this script stay fast. The benchmark
and experiment scripts share it (and `_common.py`): one renderer for both folders.
"""

import argparse
import json
import re
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_PATH = REPO_ROOT / "docs" / "benchmarks.md"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
EXPERIMENT_RESULTS_DIR = REPO_ROOT / "experiments" / "results"
EXPERIMENT_DOCS = REPO_ROOT / "docs" / "experiments"

REGION = re.compile(
    r"<!-- (?P<kind>benchmark|experiment):(?P<name>[\w.]+) -->\n.*?<!-- /(?P=kind):(?P=name) -->", re.DOTALL
)

# Anything that opens or closes a region, well named or not: a name REGION cannot match would be left unrendered.
MARKER = re.compile(r"<!-- /?(?:benchmark|experiment):(?P<name>[^ ]*) -->")


def pages() -> dict[Path, Path]:
    """Every rendered page and the folder of recorded runs its regions come from."""
    experiment_pages = sorted(EXPERIMENT_DOCS.glob("*.md"))
    return {DOCS_PATH: RESULTS_DIR, **dict.fromkeys(experiment_pages, EXPERIMENT_RESULTS_DIR)}


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


def render(text: str, results: dict[str, dict], results_dir: Path = RESULTS_DIR) -> str:
    """`text` with every marked region replaced by what the results (read from `results_dir`) say; a region naming
    a missing result or part is an error, so that a renamed table cannot leave stale numbers behind, and so is a
    region whose name REGION cannot match (a result file named with a `-`), which would be left as it is."""
    for marker in MARKER.finditer(text):
        if not re.fullmatch(r"[\w.]+", marker["name"]):
            raise ValueError(
                f"docs region {marker['name']!r}: a region is named SCRIPT.PART, letters, digits, _ and . only "
                "(name the result file so)"
            )

    def replace(match: re.Match) -> str:
        kind, name = match["kind"], match["name"]
        script, _, part = name.partition(".")
        if script not in results:
            raise KeyError(f"docs region {name}: no {results_dir.relative_to(REPO_ROOT)}/{script}.json")
        return f"<!-- {kind}:{name} -->\n{render_part(results[script], part)}\n<!-- /{kind}:{name} -->"

    return REGION.sub(replace, text)


def render_docs(check: bool = False) -> list[Path]:
    """Rewrite every page from its results (or with `check`, only compare); returns the pages that were not
    current."""
    stale = []
    for page, results_dir in pages().items():
        text = page.read_text()
        rendered = render(text, load_results(results_dir), results_dir)
        if rendered != text:
            stale.append(page)
            if not check:
                page.write_text(rendered)
                print(f"rendered {page.relative_to(REPO_ROOT)} from {results_dir.relative_to(REPO_ROOT)}")
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the pages are up to date")
    args = parser.parse_args()
    stale = render_docs(check=args.check)
    if args.check and stale:
        names = ", ".join(str(page.relative_to(REPO_ROOT)) for page in stale)
        sys.exit(f"{names} out of date: run python benchmarks/render.py")


if __name__ == "__main__":
    main()
