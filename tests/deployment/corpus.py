"""What the deployment tests put into S3 and read back: generated PDFs in, manifests and outputs out.

Every check reads what a run *published* (the manifest under ``OUTPUT/manifests/`` and the outputs it
names), never task return values.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from pypdf import PdfReader, PdfWriter

from olmocr_tasks.manifest_reader import read_manifest
from olmocr_tasks.storage import Storage
from tests.fixtures.s3 import DUMMY_KEY, DUMMY_SECRET, REGION
from tests.pdfgen import text_pdf


def padded_pdf(pages: int, doc_id: int, min_bytes: int = 0) -> bytes:
    """``text_pdf`` grown to at least ``min_bytes`` by an incompressible attachment (not rendered).

    Batching packs small files together; a large file gets a convert instance of its own.
    """
    data = text_pdf(pages, doc_id)
    if len(data) >= min_bytes:
        return data
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.add_attachment("padding.bin", random.Random(doc_id).randbytes(min_bytes - len(data)))
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


class Bucket:
    """One bucket on the moto server, through boto3 over HTTP (and moto's backend for LastModified)."""

    def __init__(self, endpoint_url: str, name: str) -> None:
        import boto3

        options = {
            "endpoint_url": endpoint_url,
            "region_name": REGION,
            "aws_access_key_id": DUMMY_KEY,
            "aws_secret_access_key": DUMMY_SECRET,
        }
        self.name = name
        self.s3 = boto3.client("s3", **options)
        self.sqs = boto3.client("sqs", **options)
        # Manifests are read as any reader reads them: through olmocr_tasks' reader and storage.
        self.storage = Storage(
            {
                "key": DUMMY_KEY,
                "secret": DUMMY_SECRET,
                "client_kwargs": {"endpoint_url": endpoint_url, "region_name": REGION},
            }
        )

    def uri(self, key: str) -> str:
        return f"s3://{self.name}/{key}"

    def put_pdf(
        self,
        key: str,
        *,
        pages: int = 1,
        doc_id: int = 1,
        last_modified: datetime | None = None,
        min_bytes: int = 0,
    ) -> str:
        """Upload a generated PDF whose pages carry ``doc_id``'s marker; optionally backdate it.

        S3 gives no way to set LastModified; the moto server runs in this process, so its stored
        object is backdated directly, as if it had been uploaded then.
        """
        self.s3.put_object(Bucket=self.name, Key=key, Body=padded_pdf(pages, doc_id, min_bytes))
        if last_modified is not None:
            self.backdate(key, last_modified)
        return self.uri(key)

    def backdate(self, key: str, when: datetime) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        stored = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(self.name, key)
        assert stored is not None, key
        # moto keeps naive UTC datetimes.
        stored.last_modified = when.astimezone(UTC).replace(tzinfo=None)

    def last_modified(self, key: str) -> datetime:
        return self.s3.head_object(Bucket=self.name, Key=key)["LastModified"]

    def read_bytes(self, uri: str) -> bytes:
        bucket, key = split_s3(uri)
        return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    def exists(self, uri: str) -> bool:
        bucket, key = split_s3(uri)
        return "Contents" in self.s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)

    def manifest(self, output_uri: str, dag_id: str, run_id: str) -> dict[str, Any] | None:
        """The published manifest of one Airflow run, whole (entries inline), or None when there is none (yet)."""
        manifest = read_manifest(self.storage, output_uri, f"{dag_id}__{run_id}")
        return None if manifest is None else manifest.whole()

    def keys(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


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


def statuses(manifest: dict[str, Any]) -> dict[str, str]:
    """Each document's status (and why it was skipped or failed), for assertion messages."""
    return {
        doc["source"]: " ".join(filter(None, [doc["status"], doc.get("skip_reason"), doc.get("error_class")]))
        for doc in manifest["documents"]
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
