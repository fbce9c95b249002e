"""Every fenced Python block of README.md and docs/**/*.md runs (transformers' md-doctest idea).

Blocks of one file run in order in one namespace, so a page can build on its earlier blocks. A block preceded by
`<!-- test: skip -->` is not run (for commands that need the Hub or a GPU); say why next to it.
"""

import doctest
import importlib
import re
from pathlib import Path

import pytest

from .common import REPO_ROOT


PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(<!--\s*test:\s*skip\s*-->\s*\n)?```python\n(.*?)```", re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    return [m.group(2) for m in BLOCK.finditer(page.read_text()) if not m.group(1)]


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc_test__"}
    for number, block in enumerate(python_blocks(page), start=1):
        code = compile(block, f"{page.name} block {number}", "exec")
        exec(code, namespace)


# Every file of every model folder (the role files beside configuration_* and modeling_* too), each with an example.
MODEL_MODULES = sorted(
    path for path in (REPO_ROOT / "src" / "hf_recurrence" / "models").glob("*/*.py") if path.name != "__init__.py"
)


@pytest.mark.parametrize("path", MODEL_MODULES, ids=lambda p: p.name)
def test_docstring_examples_run(path):
    module_name = f"hf_recurrence.models.{path.parent.name}.{path.stem}"
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module_name} has no docstring example"
    assert result.failed == 0
