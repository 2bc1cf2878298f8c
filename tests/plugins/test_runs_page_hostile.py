"""A tampered or oversized manifest is an "unreadable manifest" on every page and API route, never a 500.

Anyone who can write the output location can write a summary or a shard. Each case here publishes a
real manifest (``ManifestWriter``) and then damages it in one way; the run page, the run's JSON, its
documents and a document's text each answer with "Unreadable manifest" (422), the list with a note,
and no route with a 500 (the test client reports server errors as responses, not exceptions).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from olmocr_tasks.location.manifest import DocumentEntry, ManifestWriter
from olmocr_tasks.location.manifest_reader import read_manifest
from olmocr_tasks.storage.store import Storage
from tests.fixtures.manifests import manifest_header
from tests.fixtures.ocr_runs import PLUGINS  # noqa: F401  (puts plugins/ on sys.path)

from olmocr_runs import create_app  # isort: skip
from olmocr_runs.access import every_run  # isort: skip

RUN = "tampered"
MIB = 1024 * 1024
ROUTES = (f"/runs/{RUN}", f"/api/runs/{RUN}", f"/api/runs/{RUN}/documents", f"/runs/{RUN}/documents/0/markdown")


def _publish(output: Path) -> tuple[Path, Path]:
    """A run of three converted documents (their markdown written); its summary and its one shard."""
    writer = ManifestWriter(Storage(), str(output), RUN)
    for index in range(3):
        markdown = output / "markdown" / f"doc-{index}.md"
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(f"# document {index}\n")
        writer.add(
            DocumentEntry(
                source=f"s3://archive/in/doc-{index}.pdf",
                status="converted",
                pages=2,
                seconds=1.5,
                outputs={"markdown": str(markdown)},
                page_latencies_s=[0.5, 0.7],
                accepted_attempt_histogram={"1": 2},
            )
        )
    writer.commit(manifest_header(str(output), RUN))
    reader = read_manifest(Storage(), str(output), RUN)
    assert reader is not None
    (shard,) = reader.shard_uris("documents")
    return Path(reader.uri), Path(shard)


def _edit(summary: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(summary.read_text())
    change(data)
    summary.write_text(json.dumps(data))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for name in parents:
            data = data[name]
        data[last] = value

    return change


def _replace_text(summary: Path, old: str, new: str) -> None:
    """Edit the summary as text: for literals ``json.dumps`` does not write (NaN, Infinity, 400 digits)."""
    text = summary.read_text()
    assert old in text
    summary.write_text(text.replace(old, new, 1))


def _gzip_bomb(summary: Path, shard: Path) -> None:
    # 8 MiB of zeros compress to about 8 KB; the shard bound is set to 1 MiB below.
    shard.write_bytes(gzip.compress(b"\0" * (8 * MIB)))


def _oversized_summary(summary: Path, shard: Path) -> None:
    _edit(summary, _set("padding", "x" * (128 * 1024)))  # the bound is set to 64 KiB below


def _huge_integer(summary: Path, shard: Path) -> None:
    _edit(summary, _set("overview.failure_classes", {"corrupt": 7}))
    _replace_text(summary, '"corrupt": 7', '"corrupt": ' + "9" * 400)


def _infinity_and_nan(summary: Path, shard: Path) -> None:
    _edit(summary, _set("metrics.elapsed_s", 12.5))
    _replace_text(summary, '"elapsed_s": 12.5', '"elapsed_s": NaN, "pages_per_second": Infinity')


def _entries_null(summary: Path, shard: Path) -> None:
    _edit(summary, _set("entries", None))


def _huge_progress_point(summary: Path, shard: Path) -> None:
    _edit(summary, lambda data: data["overview"]["progress"]["points"].append([3, 1e308, 6]))


def _wrong_types(summary: Path, shard: Path) -> None:
    _edit(summary, _set("overview.failed.first", 5))
    _edit(summary, _set("entries.documents.count", "three"))


def _nan_in_an_entry(summary: Path, shard: Path) -> None:
    lines = gzip.decompress(shard.read_bytes()).splitlines()
    lines[0] = lines[0].replace(b'"seconds": 1.5', b'"seconds": NaN')
    shard.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))


CASES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "gzip bomb shard": (_gzip_bomb, "decompresses to more than 1,048,576 bytes"),
    "oversized summary": (_oversized_summary, "larger than 65,536 bytes"),
    "400-digit integer in failure_classes": (_huge_integer, "beyond 64 bits"),
    "Infinity and NaN": (_infinity_and_nan, "NaN is not a number a manifest holds"),
    "entries null": (_entries_null, "is not an object"),
    "progress point of 1e308": (_huge_progress_point, "beyond 64 bits"),
    "wrong types": (_wrong_types, "summary field"),
    "NaN in a shard entry": (_nan_in_an_entry, "NaN is not a number a manifest holds"),
}


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("OLMOCR_MAX_SHARD_BYTES", str(MIB))
    monkeypatch.setenv("OLMOCR_MAX_SUMMARY_BYTES", str(64 * 1024))
    return TestClient(create_app(str(tmp_path / "out"), access=every_run), raise_server_exceptions=False)


def test_an_intact_run_is_served_on_every_route(tmp_path: Path, client: TestClient) -> None:
    _publish(tmp_path / "out")
    for route in ROUTES:
        assert client.get(route).status_code == 200, route
    assert client.get(ROUTES[-1]).text == "# document 0\n"


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_manifest_is_unreadable_never_a_server_error(tmp_path: Path, client: TestClient, case: str) -> None:
    tamper, reason = CASES[case]
    tamper(*_publish(tmp_path / "out"))

    listing = client.get("/")
    assert listing.status_code == 200
    shard_case = case in ("gzip bomb shard", "NaN in a shard entry")
    # A damaged summary leaves the run out of the list with a note; a damaged shard is found on opening.
    assert (f"manifests/{RUN}.json could not be read" in listing.text) is not shard_case
    for route in ROUTES:
        if shard_case and route == f"/api/runs/{RUN}":
            continue  # the run's summary is intact: it is served, and says nothing of the shard
        response = client.get(route)
        assert response.status_code == 422, (route, response.status_code, response.text[:500])
        assert "Unreadable manifest" in response.text, route
        assert reason in response.text, (route, response.text[:500])


def test_a_document_output_past_its_bound_is_not_read_whole(
    tmp_path: Path, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _publish(tmp_path / "out")
    monkeypatch.setenv("OLMOCR_MAX_OUTPUT_BYTES", "8")
    response = client.get(ROUTES[-1])
    assert response.status_code == 413
    assert "larger than 8 bytes (OLMOCR_MAX_OUTPUT_BYTES)" in response.text
