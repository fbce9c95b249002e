"""Model folders are self-contained (ARCHITECTURE.md §3): what trust_remote_code copies must import on its own."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .common import SRC_ROOT


MODELS_ROOT = SRC_ROOT / "hf_recurrence" / "models"
FAMILY_DIRS = sorted(p for p in MODELS_ROOT.iterdir() if (p / "__init__.py").exists())
# Every file of a folder, role files (state_*, step_*, generation_*) as much as configuration_* and modeling_*: remote
# code copies each one a checkpoint's code imports.
MODEL_FILES = sorted(f for d in FAMILY_DIRS for f in d.glob("*.py") if f.name != "__init__.py")
# transformers' own hard requirements are installed wherever it is, so remote code may use them: huggingface_hub,
# and safetensors (the state files of the causal families).
ALLOWED_TOP_LEVEL = {"torch", "transformers", "huggingface_hub", "safetensors"} | set(sys.stdlib_module_names)


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    siblings = {p.stem for p in path.parent.glob("*.py")}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.module == "__future__":
                problems.append(f"line {node.lineno}: from __future__ import")
            elif node.level > 1:
                problems.append(f"line {node.lineno}: parent-relative import")
            elif node.level == 1 and (node.module is None or node.module not in siblings):
                problems.append(f"line {node.lineno}: relative import of {node.module!r}, not a sibling file")
            elif node.level == 0 and node.module.split(".")[0] not in ALLOWED_TOP_LEVEL:
                problems.append(f"line {node.lineno}: import from {node.module}")
        elif isinstance(node, ast.Import):
            problems += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] not in ALLOWED_TOP_LEVEL
            ]
    return problems


def test_there_are_model_files():
    assert MODEL_FILES


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.name)
def test_imports_are_allowed(path):
    assert _violations(path) == []


@pytest.mark.parametrize("path", [f for f in MODEL_FILES if f.name.startswith("modeling_")], ids=lambda p: p.name)
def test_model_class_sets_config_class_explicitly(path):
    tree = ast.parse(path.read_text())
    assigned = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for statement in node.body
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Name)
    }
    assert "config_class" in assigned


@pytest.mark.parametrize("family", FAMILY_DIRS, ids=lambda p: p.name)
def test_flat_copy_imports_without_the_package(tmp_path, family):
    package = tmp_path / "copied_family"
    package.mkdir()
    for f in family.glob("*.py"):
        if f.name != "__init__.py":
            shutil.copy(f, package / f.name)
    (package / "__init__.py").write_text("")
    modules = [f.stem for f in package.glob("*.py") if f.stem != "__init__"]
    code = (
        "import sys\nsys.modules['hf_recurrence'] = None\n"
        + "".join(f"import copied_family.{m}\n" for m in modules)
        + "print('IMPORTED')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "IMPORTED" in result.stdout
