"""The benchmark corpus: generated text PDFs of mixed sizes, cached under ``bench/results/corpus/``.

Pages are US Letter with a heading line and 24-48 lines of body text in two fonts, so that rendering
and PNG encoding cost what a real text page costs (a blank page renders in half the time). The set of
documents is drawn from a seeded RNG: many short documents, some long ones and one very long one,
so that the engine has to interleave pages of documents of very different lengths.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CORPUS_ROOT = RESULTS_DIR / "corpus"
_LAYOUT_VERSION = 1


@dataclass(frozen=True)
class CorpusSpec:
    """How many documents of which lengths; ``min_pages`` is topped up with short documents."""

    name: str
    huge_pages: int
    long_documents: int
    long_range: tuple[int, int]
    short_documents: int
    short_range: tuple[int, int]
    min_pages: int


FULL = CorpusSpec("full", huge_pages=150, long_documents=16, long_range=(20, 50), short_documents=83,
                  short_range=(1, 5), min_pages=1000)  # fmt: skip
# About five minutes of a GPU-like server (64 x 20-40 s, ~2.1 pages/s): bench/hung_requests.py --regime gpu.
MEDIUM = CorpusSpec("medium", huge_pages=100, long_documents=10, long_range=(20, 40), short_documents=60,
                    short_range=(1, 5), min_pages=600)  # fmt: skip
QUICK = CorpusSpec("quick", huge_pages=60, long_documents=4, long_range=(20, 30), short_documents=25,
                   short_range=(1, 5), min_pages=200)  # fmt: skip


@dataclass(frozen=True)
class Corpus:
    folder: Path
    documents: tuple[tuple[str, int], ...]  # (file name, pages)

    @property
    def pages(self) -> int:
        return sum(pages for _, pages in self.documents)

    def paths(self) -> list[Path]:
        return [self.folder / name for name, _ in self.documents]

    def describe(self) -> dict[str, object]:
        sizes = sorted(pages for _, pages in self.documents)
        return {
            "folder": self.folder.name,
            "documents": len(self.documents),
            "pages": self.pages,
            "largest": sizes[-1],
            "median": sizes[len(sizes) // 2],
            "bytes": sum(path.stat().st_size for path in self.paths()),
        }


def _plan(spec: CorpusSpec, seed: int, body_lines: tuple[int, int]) -> list[tuple[int, int]]:
    """(pages, body lines) per document, in a shuffled order."""
    rng = random.Random(seed)
    lengths = [spec.huge_pages]
    lengths += [rng.randint(*spec.long_range) for _ in range(spec.long_documents)]
    lengths += [rng.randint(*spec.short_range) for _ in range(spec.short_documents)]
    while sum(lengths) < spec.min_pages:
        lengths.append(rng.randint(*spec.short_range))
    rng.shuffle(lengths)
    return [(pages, rng.randint(*body_lines)) for pages in lengths]


def _write(folder: Path, documents: list[tuple[str, int, int]]) -> None:
    # Imported here: the test generator needs reportlab, which only corpus building uses.
    from olmocr_testkit.pdfgen import text_pdf

    folder.mkdir(parents=True, exist_ok=True)
    for doc_id, (name, pages, body_lines) in enumerate(documents, start=1):
        (folder / name).write_bytes(text_pdf(pages, doc_id, body_lines=body_lines))


def _load_or_build(folder: Path, documents: list[tuple[str, int, int]]) -> Corpus:
    index = folder / "corpus.json"
    wanted = {"version": _LAYOUT_VERSION, "documents": documents}
    try:
        cached = json.loads(index.read_text())
    except (OSError, ValueError):
        cached = None
    if cached != json.loads(json.dumps(wanted)) or not all((folder / name).is_file() for name, *_ in documents):
        _write(folder, documents)
        index.write_text(json.dumps(wanted))
    return Corpus(folder, tuple((name, pages) for name, pages, _ in documents))


def mixed_corpus(seed: int = 1, quick: bool = False, light: bool = False, spec: CorpusSpec | None = None) -> Corpus:
    """The main corpus for ``seed``: ≥ 1,000 pages in ≥ 100 documents (≈ 230 pages with ``quick``).

    ``light``: the same documents with only 2-6 body lines per page, a quarter of the rendering cost;
    for experiments about the server's queue, which need the server (not our CPU) to be the limit.
    """
    spec = spec or (QUICK if quick else FULL)
    body_lines = (2, 6) if light else (24, 48)
    plan = _plan(spec, seed, body_lines)
    documents = [(f"doc{index:03d}.pdf", pages, lines) for index, (pages, lines) in enumerate(plan)]
    suffix = "-light" if light else ""
    return _load_or_build(CORPUS_ROOT / f"{spec.name}-seed{seed}{suffix}", documents)


def single_document(pages: int, body_lines: int = 40) -> Corpus:
    """A folder holding one document of ``pages`` pages (for the memory-versus-length comparison)."""
    return _load_or_build(CORPUS_ROOT / f"single-{pages}", [(f"long{pages:04d}.pdf", pages, body_lines)])


def split(corpus: Corpus, parts: int, root: Path) -> list[Corpus]:
    """Distribute the documents into ``parts`` folders of copies with nearly equal page counts."""
    chunks: list[list[tuple[str, int]]] = [[] for _ in range(parts)]
    # Longest first, each to the part with the fewest pages: the parts end up nearly equal.
    for name, pages in sorted(corpus.documents, key=lambda item: -item[1]):
        min(chunks, key=lambda chunk: sum(p for _, p in chunk)).append((name, pages))
    result = []
    for index, chunk in enumerate(chunks):
        folder = root / f"part{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, _ in chunk:
            copy = folder / name
            if not copy.exists():
                shutil.copyfile(corpus.folder / name, copy)
        result.append(Corpus(folder, tuple(chunk)))
    return result


def subset(corpus: Corpus, every: int, root: Path) -> Corpus:
    """Every ``every``-th document (by name), copied into ``root``: the same mix of sizes, fewer pages."""
    chosen = [item for index, item in enumerate(sorted(corpus.documents)) if index % every == 0]
    root.mkdir(parents=True, exist_ok=True)
    for name, _ in chosen:
        if not (root / name).exists():
            shutil.copyfile(corpus.folder / name, root / name)
    return Corpus(root, tuple(chosen))
