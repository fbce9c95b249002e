"""Real long documents that exist on every machine: the Python standard library's own source files."""

import sysconfig
import zlib
from collections.abc import Iterator, Sequence
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


STDLIB_SPLITS = ("train", "validation", "test")


def stdlib_split_of(name: str) -> str:
    """The split a standard library module belongs to, from a checksum of its file name.

    About 5% of modules are validation and 5% test. The assignment depends only on the name, so a module stays in its
    split on every machine and Python version, and held-out documents never leak into training.
    """
    bucket = zlib.crc32(name.encode()) % 20
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def stdlib_split(split: str, min_chars: int = 1) -> list[tuple[str, str]]:
    """`(name, text)` of the standard library modules in `split` ("train", "validation" or "test"), split by file."""
    if split not in STDLIB_SPLITS:
        raise ValueError(f"split must be one of {STDLIB_SPLITS}, got split={split!r}")
    return [(name, text) for name, text in python_stdlib_documents(min_chars) if stdlib_split_of(name) == split]


def read_documents(files: Sequence[str | Path] | None, split: str) -> list[tuple[str, str]]:
    """`(name, text)` of the given UTF-8 text files, one document each, or else of the stdlib modules of `split`."""
    if files:
        return [(Path(f).name, Path(f).read_text(encoding="utf-8")) for f in files]
    return stdlib_split(split)
