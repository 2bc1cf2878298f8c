"""What the deployment tests read back from a run's published manifest (``Bucket.manifest``).

Every check reads what a run *published* (the manifest under ``OUTPUT/manifests/`` and the outputs it
names), never task return values.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from olmocr_testkit.bucket import Bucket


def sources(manifest: dict[str, Any]) -> list[str]:
    """Every source the manifest lists, sorted, with repeats: compare it to ``sorted(wanted)``.

    A list, not a set: a document listed twice is a document counted twice, and an "exactly once"
    check must see it.
    """
    return sorted(doc["source"] for doc in manifest["documents"])


def documents(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The manifest's documents by source URI; a source listed more than once fails the test here.

    A dict keeps one entry per source, so every caller would otherwise miss a repeat.
    """
    listed = sources(manifest)
    repeated = sorted({source for source in listed if listed.count(source) > 1})
    assert not repeated, f"the manifest lists these sources more than once: {repeated}"
    return {doc["source"]: doc for doc in manifest["documents"]}


def _status_line(doc: dict[str, Any], *, error: bool = False) -> str:
    """A document's status and why it was skipped or failed (with ``error``, its error text too)."""
    parts = [doc["status"], doc.get("skip_reason"), doc.get("error_class"), doc.get("error") if error else None]
    return " ".join(filter(None, parts))


def statuses(manifest: dict[str, Any]) -> dict[str, str]:
    """Each document's status (and why it was skipped or failed), for assertion messages."""
    return {doc["source"]: _status_line(doc) for doc in manifest["documents"]}


def not_converted(manifest: dict[str, Any]) -> dict[str, str]:
    """Each document not converted, by file name, with its status and error text: an assertion message.

    pytest shortens a long message, so ``statuses`` of a whole run hides the one document that matters;
    this keeps only the others, with the error text that names the step or the run holding its claim.
    """
    return {
        doc["source"].rsplit("/", 1)[-1]: _status_line(doc, error=True)
        for doc in manifest["documents"]
        if doc["status"] != "converted"
    }


def converted(manifest: dict[str, Any]) -> list[str]:
    """The converted sources, sorted, with repeats (compare to ``sorted(wanted)``)."""
    return sorted(doc["source"] for doc in manifest["documents"] if doc["status"] == "converted")


def only(manifest: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The manifest with only the documents under ``prefix`` (a test's own), repeats kept.

    Runs of the DAGs' default input (scheduled runs, backfills without Params) also list and re-drive
    other tests' PDFs there, so a test asserts exactly about its own prefix, not about the whole run.
    """
    return {**manifest, "documents": [doc for doc in manifest["documents"] if doc["source"].startswith(prefix)]}


def assert_outputs_name_their_pages(bucket: Bucket, manifest: dict[str, Any], doc_ids: dict[str, int]) -> None:
    """Every converted document's markdown holds the stand-in's transcription of each of its own pages."""
    for source, doc in documents(manifest).items():
        if doc["status"] != "converted":
            continue
        markdown = bucket.read_bytes(doc["outputs"]["markdown"]).decode()
        for page in range(1, doc["pages"] + 1):
            assert f"document {doc_ids[source]} page {page}" in markdown, (source, page)


def union_converted(manifests: Iterable[dict[str, Any]]) -> list[str]:
    """Every converted source across manifests, with repeats (a repeat is a document converted twice)."""
    return sorted(source for manifest in manifests for source in converted(manifest))
