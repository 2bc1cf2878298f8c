"""A run reads only what its allow-list allows, resolved, document by document (``storage.access``).

Real runs through planning and the engine (the render pool, the vLLM stand-in): a symbolic link in an
input folder that leads out is reported as that document's failure ``outside_allowed``, never opened,
and no document goes missing from the manifest; the convert step checks again just before it opens
a file, so a link swapped after planning and a URI planted in a batch file are refused the same way.
The stand-in names the document each page came from, so "never opened" is checked on what it saw.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from olmocr_tasks.core.config import ConversionSettings
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.run.pipeline import convert_batch, run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.access import AccessPolicy
from olmocr_tasks.storage.store import ObjectInfo, Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.client import fast_server_settings
from tests.fixtures.plans import plan_held_whole

OK_DOC, SECRET_DOC = 11, 66


def _layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    inbox, out, tenant_b = tmp_path / "inbox", tmp_path / "out", tmp_path / "tenant-b"
    inbox.mkdir()
    tenant_b.mkdir()
    (inbox / "ok.pdf").write_bytes(pdfgen.text_pdf(1, OK_DOC))
    (tenant_b / "secret.pdf").write_bytes(pdfgen.text_pdf(1, SECRET_DOC))
    return inbox, out, tenant_b


API_KEY = "sk-canary-key-8731"


def _request(standin: StandinServer, inbox: Path, out: Path, run_id: str, **fields: object) -> RunRequest:
    return RunRequest(
        input_uri=str(inbox),
        output_uri=str(out),
        run_id=run_id,
        settings=ConversionSettings(server=fast_server_settings(standin, max_concurrent_requests=4, api_key=API_KEY)),
        access=AccessPolicy(inputs=(str(inbox),), outputs=(str(out),)),
        **fields,  # type: ignore[arg-type]
    )


def _documents_seen(standin: StandinServer) -> set[int]:
    return {record["marker"]["doc_id"] for record in standin.requests() if record.get("marker")}


def test_a_link_out_of_the_input_folder_is_a_failed_document_never_opened(
    tmp_path: Path, standin: StandinServer
) -> None:
    inbox, out, tenant_b = _layout(tmp_path)
    (inbox / "x.pdf").symlink_to(tenant_b / "secret.pdf")  # inbox/x.pdf -> /srv/tenantB/secret.pdf
    (inbox / "alias.pdf").symlink_to(inbox / "ok.pdf")  # a link that stays inside is an ordinary file

    manifest, _ = run_conversion(_request(standin, inbox, out, "links"), Storage())

    entries = {Path(entry["source"]).name: entry for entry in manifest.iter_documents()}
    assert set(entries) == {"ok.pdf", "x.pdf", "alias.pdf"}, "every listed document is in the manifest"
    assert entries["x.pdf"]["status"] == "failed" and entries["x.pdf"]["error_class"] == "outside_allowed"
    assert "symbolic link" in entries["x.pdf"]["error"] and "tenant-b" not in entries["x.pdf"]["error"]
    # The link that stays inside is the same file as ok.pdf: one is converted, the other its duplicate.
    assert {entries["ok.pdf"]["status"], entries["alias.pdf"]["status"]} == {"converted", "skipped"}
    assert _documents_seen(standin) == {OK_DOC}, "the secret's pages never reached the server"
    assert not any("secret" in path.name or path.name.startswith("x.") for path in out.rglob("*.md"))

    # Named, the same: the run is not refused as a whole, the link is that document's failure.
    named = _request(standin, inbox, out, "named", documents=(str(inbox / "x.pdf"),), reprocess=True)
    manifest, _ = run_conversion(named, Storage())
    [entry] = list(manifest.iter_documents())
    assert (entry["status"], entry["error_class"]) == ("failed", "outside_allowed")
    assert _documents_seen(standin) == {OK_DOC}


def test_convert_checks_again_before_it_opens_a_link_swapped_after_planning(
    tmp_path: Path, standin: StandinServer
) -> None:
    inbox, out, tenant_b = _layout(tmp_path)
    link = inbox / "later.pdf"
    link.symlink_to(inbox / "ok.pdf")
    request = _request(standin, inbox, out, "swap", reprocess=True)
    storage = Storage()
    plan = plan_held_whole(request, storage)
    assert sorted(Path(source.uri).name for source in plan.sources) == ["later.pdf", "ok.pdf"]

    link.unlink()
    link.symlink_to(tenant_b / "secret.pdf")  # swapped between the plan and the convert task
    result = convert_batch(request, storage, "b00000", plan.sources, check_ready=True)

    by_name = {Path(entry.source).name: entry for entry in result.entries}
    assert by_name["later.pdf"].error_class == "outside_allowed"
    assert by_name["ok.pdf"].status == "converted"
    assert SECRET_DOC not in _documents_seen(standin)


def test_uris_planted_in_a_batch_file_are_refused_by_the_convert_step(tmp_path: Path, standin: StandinServer) -> None:
    """A batch file is data the convert task reads back: whoever could edit it must not choose what the
    worker opens (another tenant's file, a ``file://`` URI whose ``%2F`` and ``..`` would climb out)."""
    inbox, out, tenant_b = _layout(tmp_path)
    (inbox / "d%2Fd%2Fd").mkdir()  # a folder whose name a careless decoder would read as three
    request = _request(standin, inbox, out, "tampered", reprocess=True)
    storage = Storage()
    folder = request.run_folder(storage)

    def source(uri: str) -> SourceDocument:
        return SourceDocument(info=ObjectInfo(uri, 100, None, datetime.now(UTC)), stem=Path(uri).stem)

    planted = [
        source(str(inbox / "ok.pdf")),
        source(str(tenant_b / "secret.pdf")),
        source(f"file://{inbox}/d%2Fd%2Fd/../../tenant-b/secret.pdf"),
        source("s3://other-tenant/inbox/payroll.pdf"),
    ]
    folder.write_batch("b00000", planted)
    result = convert_batch(request, storage, "b00000", folder.read_batch("b00000"), plan_id=folder.plan_id)

    outcome = {entry.source: (entry.status, entry.error_class) for entry in result.entries}
    assert outcome[str(inbox / "ok.pdf")] == ("converted", None)
    assert outcome[str(tenant_b / "secret.pdf")] == ("failed", "outside_allowed")
    assert outcome["s3://other-tenant/inbox/payroll.pdf"] == ("failed", "outside_allowed")
    # Decoded once, for the check and the open alike: inbox/d/d/d/../../tenant-b → inbox/tenant-b, which
    # does not exist. Opened raw it would have been ../tenant-b/secret.pdf, the other tenant's file.
    assert outcome[f"file://{inbox}/d%2Fd%2Fd/../../tenant-b/secret.pdf"] == ("failed", "unreadable")
    assert _documents_seen(standin) == {OK_DOC}


def test_errors_are_recorded_without_secrets(
    tmp_path: Path, standin: StandinServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unforeseen error's raw text goes into the manifest and the ledger redacted: the engine's known
    secrets (the API key) and anything shaped like one (a URL's password, a signed URL's signature)."""
    from olmocr_tasks.run import spool

    inbox, out, _ = _layout(tmp_path)
    (inbox / "ok.pdf").unlink()
    (inbox / "boom.pdf").write_bytes(pdfgen.text_pdf(1, OK_DOC))

    async def explode(self: object, source: SourceDocument) -> str:
        raise RuntimeError(
            f"boom with key {API_KEY} at https://user:pa/ss@vllm/v1 and "
            "https://b.s3.amazonaws.com/k?X-Amz-Signature=deadbeefcafe&X-Amz-Credential=AKIAEXAMPLE"
        )

    monkeypatch.setattr(spool.Spool, "localise", explode)
    manifest, _ = run_conversion(_request(standin, inbox, out, "internal"), Storage())

    [entry] = manifest.documents
    assert entry.error_class == "internal_error" and entry.error is not None and "boom" in entry.error
    for secret in ("pa/ss", "deadbeefcafe", "AKIAEXAMPLE", API_KEY):
        assert secret not in entry.error
    # Nothing the run wrote in plain text holds them either (ledger markers, parts, the summary).
    written = b"".join(path.read_bytes() for path in out.rglob("*") if path.is_file() and path.suffix != ".gz")
    for secret in (b"pa/ss", b"deadbeefcafe", b"AKIAEXAMPLE", API_KEY.encode()):
        assert secret not in written
