"""Every relative link in the repository's Markdown (README, docs, examples, tests) names a file that exists and,
with an anchor, a heading of that file (as GitHub makes anchors), so that moving a page or a section breaks no link."""

import re
from functools import cache
from pathlib import Path

import pytest

from .common import REPO_ROOT


PAGES = sorted(
    path
    for path in [REPO_ROOT / "README.md", *REPO_ROOT.glob("*/**/*.md")]
    if path.relative_to(REPO_ROOT).parts[0] in {"README.md", "docs", "examples", "tests", "benchmarks", "experiments"}
)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    """The page without its code (fenced blocks and inline code), where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", path.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text()), re.MULTILINE):
        name = slug(heading)
        count = seen.get(name, 0)
        seen[name] = count + 1
        found.add(f"{name}-{count}" if count else name)
    return found | set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", path.read_text()))


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading in {path or page.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_every_relative_link_names_a_file_and_heading_that_exist(page):
    assert broken_links(page) == []


def test_the_check_finds_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-heading-with-code) [ok](other.md#twice-1) [ok](#here) `[code](nowhere.md)`\n"
        "[gone](gone.md) [moved](other.md#moved)\n\n## Here\n"
    )
    assert broken_links(page) == ["gone.md: no such file", "other.md#moved: no such heading in other.md"]
