"""A bucket on a moto S3 server, through boto3 over HTTP: generated PDFs in, published manifests out.

Used by the deployment tests, the compose tests and ``bench/mapping.py``. Manifests are read as any
reader reads them, through ``olmocr_tasks``' reader and storage. Needs the ``test`` extra (moto, pypdf).
"""

from __future__ import annotations

import io
import random
from datetime import UTC, datetime
from typing import Any

from pypdf import PdfReader, PdfWriter

from olmocr_tasks.location.manifest_reader import read_manifest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit.pdfgen import text_pdf

REGION = "us-east-1"
# moto accepts any credentials; these name themselves so they are never mistaken for real ones.
DUMMY_KEY = "testing-access-key"
DUMMY_SECRET = "testing-secret-key"


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
