"""Checks shared by the reliability and security tests: what a *reader* of an output prefix sees.

A reader never looks at our temp files or at half-written objects; it lists the prefix (as
``Storage.list_objects`` does, skipping ``.olmocr-tmp`` files), reads Dolma lines, markdown files,
manifests and the ledger under ``_state/``. ``reader_view`` collects exactly that, and
``assert_reader_view_consistent`` states the invariants that must hold after *any* fault, crash
included: every visible Dolma file is one valid JSON line whose pages name the right document, and
every "done" marker points at outputs that exist and hold the recorded bytes.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from olmocr_tasks.core.config import ConversionSettings, DocumentLimits, PageSettings, ServerSettings
from olmocr_tasks.location.manifest import Manifest
from olmocr_tasks.location.manifest_reader import ManifestReader
from olmocr_tasks.storage.store import TEMP_SUFFIX, Storage
from olmocr_tasks.testing import pdfgen

ANSWER = re.compile(r"Stand-in transcription of document (\d+) page (\d+)\.")
REPO_ROOT = Path(__file__).resolve().parents[1]


def quick_settings(
    url: str,
    *,
    read_timeout_s: float = 5.0,
    outage_window_s: float = 5.0,
    max_concurrent_requests: int = 8,
    target_longest_image_dim: int = 512,
    max_page_error_rate: float = 0.004,
    limits: DocumentLimits | None = None,
    **server: Any,
) -> ConversionSettings:
    """Settings with short timeouts and small renders, so a fault costs a second rather than minutes."""
    options: dict[str, Any] = {
        "base_urls": (url,),
        "read_timeout_s": read_timeout_s,
        "connect_timeout_s": 2.0,
        "request_retry_budget_s": 30.0,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.5,
        "outage_window_s": outage_window_s,
        "readiness_timeout_s": 5.0,
        "max_concurrent_requests": max_concurrent_requests,
        **server,
    }
    return ConversionSettings(
        server=ServerSettings(**options),
        page=PageSettings(target_longest_image_dim=target_longest_image_dim),
        limits=limits or DocumentLimits(),
        max_page_error_rate=max_page_error_rate,
    )


def page_answers(text: str) -> list[tuple[int, int]]:
    """(document, page) of every stand-in answer in a text, in order."""
    return [(int(doc), int(page)) for doc, page in ANSWER.findall(text)]


def expected_page_text(doc_id: int, page_number: int, is_fallback: bool) -> str:
    """What a page's text must contain: the stand-in's answer for it, or its own text layer."""
    if is_fallback:
        return pdfgen.page_line(doc_id, page_number)
    return f"Stand-in transcription of document {doc_id} page {page_number}."


@dataclass
class ReaderView:
    """Everything a reader can see under an output prefix."""

    dolma: dict[str, dict[str, Any]] = field(default_factory=dict)  # uri -> record
    markdown: dict[str, bytes] = field(default_factory=dict)  # uri -> content
    done_markers: list[dict[str, Any]] = field(default_factory=list)
    failed_markers: list[dict[str, Any]] = field(default_factory=list)
    # summary uri -> the manifest whole (its shards read through the reader: each must exist)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    # uri -> entries of every manifest shard listed, named by a summary or not (yet)
    manifest_shards: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)


def reader_view(output_uri: str, storage: Storage | None = None) -> ReaderView:
    """List and read the prefix like a consumer would. Malformed objects fail the calling test."""
    storage = storage or Storage()
    view = ReaderView()
    base = output_uri.rstrip("/") + "/"
    for info in storage.list_objects(output_uri):
        relative = info.uri[len(base) :]
        assert not relative.endswith(TEMP_SUFFIX), f"a listing showed a temp file: {info.uri}"
        data = storage.read_bytes(info.uri)
        if relative.startswith("dolma/"):
            assert relative.endswith(".jsonl"), info.uri
            lines = data.split(b"\n")
            assert len(lines) == 2 and lines[1] == b"", f"{info.uri} is not exactly one JSON line"
            view.dolma[info.uri] = json.loads(lines[0])
        elif relative.startswith("markdown/"):
            assert relative.endswith(".md"), info.uri
            view.markdown[info.uri] = data
        elif relative.startswith("manifests/") and relative.endswith(".json") and relative.count("/") == 1:
            view.manifests[info.uri] = ManifestReader.from_bytes(storage, info.uri, data).whole()
        elif relative.startswith("manifests/"):
            assert relative.endswith(".jsonl.gz"), f"not a manifest shard: {info.uri}"
            view.manifest_shards[info.uri] = [json.loads(line) for line in gzip.decompress(data).splitlines()]
        elif relative.startswith("_state/") and "/sources/" in relative:
            record = json.loads(data)
            name = relative.rsplit("/", 1)[-1]
            (view.done_markers if name.endswith(".done") else view.failed_markers).append(record)
        else:
            view.other.append(info.uri)
    return view


def check_record(record: dict[str, Any], doc_id: int | None = None, pages: int | None = None) -> None:
    """A Dolma record is internally consistent and every page names its own document and page."""
    metadata, attributes = record["metadata"], record["attributes"]
    count = metadata["pdf-total-pages"]
    if pages is not None:
        assert count == pages, (metadata["Source-File"], count, pages)
    spans = attributes["pdf_page_numbers"]
    assert [span[2] for span in spans] == list(range(1, count + 1))
    fallback = attributes["is_fallback"]
    assert len(fallback) == count and sum(fallback) == metadata["total-fallback-pages"]
    answers = page_answers(record["text"])
    if doc_id is None and answers:
        doc_id = answers[0][0]
    if doc_id is None:
        return
    for (start, end, number), is_fallback in zip(spans, fallback, strict=True):
        page_text = record["text"][start:end]
        assert expected_page_text(doc_id, number, is_fallback) in page_text, (metadata["Source-File"], number)
        # An answer naming any other page in this span would be a mix-up.
        assert page_answers(page_text) in ([], [(doc_id, number)]), (metadata["Source-File"], number)


def assert_reader_view_consistent(
    output_uri: str, storage: Storage | None = None, *, doc_ids: dict[str, int] | None = None
) -> ReaderView:
    """The invariants that hold after any fault or crash. ``doc_ids`` maps a source file name to its id."""
    storage = storage or Storage()
    view = reader_view(output_uri, storage)
    for uri, record in view.dolma.items():
        name = record["metadata"]["Source-File"].rsplit("/", 1)[-1]
        check_record(record, (doc_ids or {}).get(name))
        markdown = uri.replace("/dolma/", "/markdown/", 1).removesuffix(".jsonl") + ".md"
        if markdown in view.markdown:
            # Markdown is written first, so it is at least as new as its Dolma line; with one answer per
            # page from a deterministic server both hold the same text.
            assert view.markdown[markdown].decode() == record["text"], markdown
    for marker in view.done_markers:
        for kind, uri in marker["outputs"].items():
            if kind == "dolma":
                assert uri in view.dolma, f"done marker of {marker['source']} names missing {uri}"
                assert view.dolma[uri]["metadata"]["source-sha256"] == marker["sha256"], uri
            else:
                assert uri in view.markdown, f"done marker of {marker['source']} names missing {uri}"
    return view


def assert_manifest_matches_outputs(
    manifest: Manifest | ManifestReader | dict[str, Any], storage: Storage | None = None
) -> None:
    """Every document the manifest calls converted or skipped has outputs holding its bytes."""
    storage = storage or Storage()
    if isinstance(manifest, ManifestReader):
        documents = list(manifest.iter_documents())
    elif isinstance(manifest, Manifest):
        documents = [doc.to_dict() for doc in manifest.documents]
    else:
        documents = manifest["documents"]
    for doc in documents:
        # Failed, or left for later (another run held its claim, or it failed recently): no outputs.
        if doc["status"] == "failed" or doc.get("skip_reason") in ("claimed", "retry_later"):
            assert doc["outputs"] == {}, doc["source"]
            continue
        dolma = storage.read_bytes(doc["outputs"]["dolma"])
        record = json.loads(dolma)
        assert record["metadata"]["source-sha256"] == doc["sha256"], doc["source"]
        if doc["status"] == "converted":
            assert record["metadata"]["pdf-total-pages"] == doc["pages"], doc["source"]
        if "markdown" in doc["outputs"]:
            assert storage.read_bytes(doc["outputs"]["markdown"]).decode() == record["text"]


def temp_files(folder: Path) -> list[Path]:
    return [path for path in folder.rglob(f"*{TEMP_SUFFIX}")]


# --------------------------------------------------------------------------------------- processes


# Seconds instead of minutes for the CLI's server timeouts, so failure paths end quickly.
FAST_CLI = ["--read-timeout", "5", "--outage-window", "3", "--ready-timeout", "3"]


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "olmocr_tasks.cli", *args]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(*args), capture_output=True, text=True, timeout=timeout, env=cli_env(env), check=False
    )


def start_cli(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The CLI as a background process; its stdout and stderr go to ``log`` (never a full pipe).

    Its temporary folder is next to the log: a killed process cannot remove its spool folder, and
    the test's own temporary tree is where such leftovers belong.
    """
    spool = log.parent / "spool"
    spool.mkdir(exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(
            cli_command(*args),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=cli_env({"TMPDIR": str(spool), **(env or {})}),
        )


def kill_and_reap(process: subprocess.Popen[bytes], children: Iterable[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL the process, reap it, and return the children still alive after 30 s (should be none).

    30 s is a hang guard, not a speed requirement: the children die with their parent at once.
    """
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    _, alive = psutil.wait_procs(list(children), timeout=30)
    return alive


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


class RssSampler:
    """Peak resident memory of a process and of its children, and which children ran, sampled on a thread."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.parent_peak = 0
        self.child_peak = 0
        self.child_pids: set[int] = set()  # every child seen, e.g. render workers and their replacements
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            try:
                process = psutil.Process(self.pid)
                rss = process.memory_info().rss
                children = process.children(recursive=True)
            except psutil.Error:
                return
            self.parent_peak = max(self.parent_peak, rss)
            self.samples.append((time.monotonic() - started, rss))
            for child in children:
                self.child_pids.add(child.pid)
                with contextlib.suppress(psutil.Error):
                    self.child_peak = max(self.child_peak, child.memory_info().rss)
            self._stop.wait(self.interval_s)
