"""Real long documents that exist on every machine: the Python standard library's own source files."""

import sysconfig
from collections.abc import Iterator
from pathlib import Path


def python_stdlib_root() -> Path:
    """Directory of the running interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def python_stdlib_files(min_chars: int = 1) -> list[Path]:
    """Top-level standard library modules (`*.py` directly under the stdlib directory), sorted by name.

    Sorted and top-level only so that the same interpreter version always gives the same documents in the same
    order, whatever else is installed. Files shorter than `min_chars` characters are skipped.
    """
    root = python_stdlib_root()
    files = sorted(root.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"No Python sources found in the standard library directory {root}")
    return [f for f in files if f.stat().st_size >= min_chars]


def python_stdlib_documents(min_chars: int = 1, limit: int | None = None) -> Iterator[tuple[str, str]]:
    """Yield `(name, text)` for standard library modules, one document per file."""
    for path in python_stdlib_files(min_chars)[:limit]:
        yield path.name, path.read_text(encoding="utf-8", errors="replace")
