"""Run transformers' common test mixins on every family and write the counts, our skips and the mixins' own skip
reasons into docs/conformance.md (between its `conformance:start` / `conformance:end` markers).

Build the test tree first (tests/hf_common/README.md), then from the repository root:

    python utils/conformance_report.py                 # run every spec (a few minutes each), write the doc
    python utils/conformance_report.py --reuse         # re-render from the last runs' junit.xml files
    python utils/conformance_report.py --only recurrent_decoder_spec   # run these specs, reuse the others' runs
"""

import argparse
import importlib
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[1]
HARNESS = REPO_ROOT.parent / "shared" / "tools" / "hf_common_tests" / "run.sh"
SPEC_DIR = REPO_ROOT / "tests" / "hf_common"
DOC = REPO_ROOT / "docs" / "conformance.md"
START, END = "<!-- conformance:start -->", "<!-- conformance:end -->"
# The spec modules of tests/hf_common run, by the name the doc gives what each covers.
SPECS = {
    "recurrent GPT-2": "recurrent_gpt2_spec",
    "recurrent Llama": "recurrent_llama_spec",
    "Transformer-XL": "transformer_xl_spec",
    "I-BERT": "inductive_bert_spec",
    "core over Llama": "recurrent_decoder_spec",
    "core over Qwen3": "recurrent_decoder_qwen3_spec",
    "core over GPT-2": "recurrent_decoder_gpt2_spec",
}
# Worse outcomes win when a test appears more than once (subtests add rows).
RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


@dataclass
class Outcomes:
    counts: Counter = field(default_factory=Counter)
    skips: dict[str, str] = field(default_factory=dict)  # test -> first line of its skip reason
    failures: dict[str, str] = field(default_factory=dict)


def run_family(spec: str, run_dir: Path, workers: int) -> None:
    env = {
        **os.environ,
        "SPEC_PATH": str(SPEC_DIR),
        "VENV": "",
        "RUN_DIR": str(run_dir),
        "WORKERS": str(workers),
        "PYTHONPATH": str(REPO_ROOT / "src"),
    }
    print(f"running {spec} -> {run_dir}", flush=True)
    subprocess.run(["bash", str(HARNESS), spec], env=env, check=False, stdout=subprocess.DEVNULL)


def read_outcomes(run_dir: Path) -> Outcomes:
    junit = run_dir / "junit.xml"
    if not junit.exists():
        raise SystemExit(f"{junit} does not exist: the run did not get as far as a report (see {run_dir}/pytest.log)")
    outcome: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        result, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                result = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip()
                break
        if name not in outcome or RANK[result] > RANK[outcome[name][0]]:
            outcome[name] = (result, message)
    found = Outcomes()
    for name, (result, message) in outcome.items():
        found.counts[result] += 1
        first_line = next((line for line in message.splitlines() if line.strip()), "")
        if result == "skipped":
            found.skips[name] = first_line
        elif result in ("failed", "error"):
            found.failures[name] = first_line
    return found


def general_reason(reason: str) -> str:
    """A skip reason without the family's class names, so that the same reason reads the same for every family."""
    if re.search(r"is skipped: `[^`]+` is not in `self.pipeline_model_mapping`", reason):
        return "pipeline task the family does not map (`pipeline_model_mapping`)"
    reason = re.sub(r"<class '[\w.]+'>", "the model class", reason)
    reason = re.sub(
        r"\b(RecurrentGPT2|RecurrentLlama|RecurrentDecoder|TransformerXL|IBert)\w*", "the model class", reason
    )
    return reason.replace("|", "\\|")


def render(outcomes: dict[str, Outcomes]) -> str:
    families = list(outcomes)
    lines = [
        "| family | passed | failed | skipped | of which ours |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    our_skips = {family: importlib.import_module(SPECS[family]).__dict__.get("skip_tests", {}) for family in families}
    for family, found in outcomes.items():
        failed = found.counts["failed"] + found.counts["error"]
        lines.append(
            f"| {family} | {found.counts['passed']} | {failed} | {found.counts['skipped']} | {len(our_skips[family])} |"
        )
    lines += ["", "### The skips we add, and why", ""]
    for family in families:
        for test, reason in our_skips[family].items():
            lines.append(f"- {family}, `{test}`: {reason}.")
    failures = [(family, test, error) for family in families for test, error in outcomes[family].failures.items()]
    if failures:
        lines += ["", "### Failures", ""]
        lines += [f"- {family}, `{test}`: {error}" for family, test, error in failures]
    lines += [
        "",
        "### The mixins' own skips",
        "",
        "The mixins skip these themselves, from the model's declared capabilities or the machine (no GPU, optional",
        "libraries not installed); tests per reason:",
        "",
        "| reason | " + " | ".join(families) + " |",
        "| --- |" + " ---: |" * len(families),
    ]
    reasons: dict[str, Counter] = {}
    for family in families:
        ours = set(our_skips[family])
        for test, reason in outcomes[family].skips.items():
            if test not in ours:
                reasons.setdefault(general_reason(reason), Counter())[family] += 1
    for reason, per_family in sorted(reasons.items(), key=lambda item: -sum(item[1].values())):
        lines.append(f"| {reason} | " + " | ".join(str(per_family[family] or "") for family in families) + " |")
    return "\n".join(lines)


def write_doc(section: str) -> None:
    text = DOC.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{DOC} has no {START} ... {END} markers to write between")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    DOC.write_text(f"{before}{START}\n{section}\n{END}{after}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-root", type=Path, default=Path("/tmp/hf_common_runs"), help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="read the last runs instead of running again")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(SPECS.values()),
        help="run only these specs and read the last runs of the others (the shared CPUs make a full run slow)",
    )
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per run")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(SPEC_DIR))
    outcomes = {}
    for family, spec in SPECS.items():
        run_dir = args.run_root / spec
        if not args.reuse and (args.only is None or spec in args.only):
            run_family(spec, run_dir, args.workers)
        outcomes[family] = read_outcomes(run_dir)
        counts = outcomes[family].counts
        print(
            f"{family}: {counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
            f"{counts['skipped']} skipped"
        )
    write_doc(render(outcomes))
    print(f"wrote {DOC.relative_to(REPO_ROOT)}")
    return 0 if all(not found.failures for found in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
