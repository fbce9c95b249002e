"""Check that every `# Copied from hf_recurrence.models...` block still equals its original.

The model folders must stay self-contained (each is uploaded alone as Hub remote code), so code shared between
families is copied, not imported; this check is what keeps the copies from drifting (transformers has the same one,
`utils/check_copies.py`). A marker sits on the line(s) just above a function, method or class:

    # Copied from hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder.RecurrentDecoderState.detach with RecurrentDecoder->TransformerXL

and names the original by its module and qualified name; `with A->B, C->D` lists plain-text replacements applied to
the original before comparing. The block (decorators included) must equal the original's, indentation aside.

Usage: `python utils/check_copies.py` (exit status 1 and one line per drifted or broken copy);
`python utils/check_copies.py --fix` rewrites every drifted copy from its original (after changing an original).
"""

import ast
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOT = REPO_ROOT / "src"
MODELS = SOURCE_ROOT / "hf_recurrence" / "models"
MARKER = re.compile(r"^\s*# Copied from (hf_recurrence\.models\.[\w.]+)(?: with (.+))?$")


@dataclass
class Copy:
    path: Path
    line: int  # 1-based line of the marker
    original: str  # dotted name: module path, then qualified name
    replacements: list[tuple[str, str]]


def find_copies(path: Path) -> list[Copy]:
    copies = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = MARKER.match(text)
        if match:
            pairs = [pair.split("->") for pair in match.group(2).split(",")] if match.group(2) else []
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError(f"{path}:{number}: replacements must read `with A->B, C->D`, got {match.group(2)!r}")
            copies.append(Copy(path, number, match.group(1), [(a.strip(), b.strip()) for a, b in pairs]))
    return copies


def _definitions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """Every function and class with its qualified name (`Class.method`), outermost first."""
    found = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.append((prefix + node.name, node))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return found


def _block(lines: list[str], node: ast.AST) -> str:
    """The source of `node`, decorators included, dedented."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))


def _split_name(dotted: str) -> tuple[Path, str]:
    """(file of the module, qualified name inside it) of a dotted `hf_recurrence.models...` name."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = SOURCE_ROOT.joinpath(*parts[:cut]).with_suffix(".py")
        if path.is_file():
            return path, ".".join(parts[cut:])
    raise ValueError(f"no module file for {dotted}")


def _expected_and_block(copy: Copy) -> tuple[str | None, str, ast.AST | None, list[str]]:
    """(what the copy should read, or None with the problem; the problem; the copied definition; the file's lines)."""
    path = copy.path.relative_to(REPO_ROOT) if copy.path.is_relative_to(REPO_ROOT) else copy.path
    where = f"{path}:{copy.line}"
    lines = copy.path.read_text().splitlines()
    # The block is the first definition starting below the marker (and its continuation comment lines).
    below = [node for _, node in _definitions(ast.parse("\n".join(lines))) if _first_line(node) > copy.line]
    if not below:
        return None, f"{where}: no function or class below the `Copied from` marker", None, lines
    block = min(below, key=_first_line)
    between = lines[copy.line : _first_line(block) - 1]
    if any(not line.strip().startswith("#") for line in between):
        return None, f"{where}: the marker must sit directly above the copied definition", None, lines
    try:
        original_path, name = _split_name(copy.original)
    except ValueError as error:
        return None, f"{where}: {error}", None, lines
    original_lines = original_path.read_text().splitlines()
    originals = dict(_definitions(ast.parse("\n".join(original_lines))))
    if name not in originals:
        return None, f"{where}: {copy.original} does not exist", None, lines
    expected = _block(original_lines, originals[name])
    for old, new in copy.replacements:
        expected = expected.replace(old, new)
    drift = f"{where}: differs from {copy.original}" + (
        f" with {', '.join(f'{a}->{b}' for a, b in copy.replacements)}" if copy.replacements else ""
    )
    return expected, drift, block, lines


def check_copy(copy: Copy) -> str | None:
    """None if the copy equals its original, else what is wrong."""
    expected, problem, block, lines = _expected_and_block(copy)
    if expected is None or _block(lines, block) != expected:
        return problem
    return None


def fix_copy(copy: Copy) -> bool:
    """Rewrite a drifted copy from its original; True if the file changed."""
    expected, _, block, lines = _expected_and_block(copy)
    if expected is None or _block(lines, block) == expected:
        return False
    first = _first_line(block)
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    replacement = [indent + line if line else line for line in expected.splitlines()]
    copy.path.write_text("\n".join([*lines[: first - 1], *replacement, *lines[block.end_lineno :]]) + "\n")
    return True


def _first_line(node: ast.AST) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def check_all(root: Path = MODELS) -> tuple[int, list[str]]:
    """(number of copies checked, problems) over every Python file under `root`."""
    copies = [copy for path in sorted(root.rglob("*.py")) for copy in find_copies(path)]
    return len(copies), [problem for problem in map(check_copy, copies) if problem]


def fix_all(root: Path = MODELS) -> int:
    """Rewrite drifted copies until none is left (each rewrite moves the lines below it); returns how many."""
    fixed = 0
    while True:
        copies = [copy for path in sorted(root.rglob("*.py")) for copy in find_copies(path)]
        changed = next((copy for copy in copies if fix_copy(copy)), None)
        if changed is None:
            return fixed
        fixed += 1


def main() -> int:
    if "--fix" in sys.argv[1:]:
        print(f"{fix_all()} copies rewritten from their originals")
    count, problems = check_all()
    for problem in problems:
        print(problem)
    print(f"{count} `Copied from` blocks checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
