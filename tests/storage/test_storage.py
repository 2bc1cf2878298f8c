"""Storage against real local folders and a real moto S3 server (through a fault proxy where needed)."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.core.errors import StorageError, UnreadableSourceError
from olmocr_tasks.storage.store import TEMP_SUFFIX, ObjectInfo, ReadLimitExceeded, RetryPolicy, Storage
from olmocr_tasks.storage.uri import is_s3, join_uri, local_path, safe_join, safe_relative_key, split_s3
from tests.fixtures.s3 import DUMMY_SECRET, FaultProxy

# Tiny backoffs keep retry tests fast; botocore's own retries are off so request counts are exact.
FAST = RetryPolicy(max_attempts=4, max_elapsed_s=30, initial_backoff_s=0.01, max_backoff_s=0.05, botocore_attempts=1)
LIST_PAGE = r"list-type=2"


def _fast_storage(proxy: FaultProxy, **policy: Any) -> Storage:
    retry = RetryPolicy(**{**FAST.__dict__, **policy})
    return Storage(proxy.storage_options, retry=retry)


# ----------------------------------------------------------------------------------- helpers


def test_uri_helpers() -> None:
    assert is_s3("s3://b/k") and is_s3("S3://b/k") and not is_s3("/data/x") and not is_s3("file:///x")
    assert split_s3("s3://bucket/a/b.pdf") == ("bucket", "a/b.pdf")
    assert split_s3("s3://bucket") == ("bucket", "")
    with pytest.raises(ValueError):
        split_s3("s3:///key")
    assert local_path("file:///data/in/a%20b.pdf") == "/data/in/a b.pdf"
    assert local_path("file://localhost/data") == "/data"
    assert local_path("relative/x.pdf") == "relative/x.pdf"
    assert join_uri("s3://b/out/", "dolma", "/x.jsonl") == "s3://b/out/dolma/x.jsonl"
    assert join_uri("/out", "", "a") == "/out/a"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("a/b/c.jsonl", "a/b/c.jsonl"),
        ("../../etc/passwd", "etc/passwd"),
        ("/abs/x.md", "abs/x.md"),
        ("a/./b//c", "a/b/c"),
        ("..\\..\\win\\x", ".._.._win_x"),
        ("a\x00b/c\x1fd\x7f", "a_b/c_d_"),
        ("bidi\u202etxt.pdf", "bidi_txt.pdf"),
        ("line\u2028sep", "line_sep"),
        ("full\uff0fwidth", "full_width"),  # NFKC turns U+FF0F into "/"
        ("\uff0e\uff0e/x", "x"),  # fullwidth ".." is still ".."
        ("\u2024\u2024/y", "y"),  # one-dot leaders: NFKC ".."
        ("...", "..."),  # three dots is an ordinary name
        ("", ""),
        ("../..", ""),
    ],
)
def test_safe_relative_key(key: str, expected: str) -> None:
    assert safe_relative_key(key) == expected
    assert safe_relative_key(expected) == expected  # idempotent


def test_safe_relative_key_unicode_and_length() -> None:
    nfd = unicodedata.normalize("NFD", "café/Ångström.pdf")
    assert safe_relative_key(nfd) == unicodedata.normalize("NFC", "café/Ångström.pdf")
    long_name = "é" * 300
    cleaned = safe_relative_key(long_name)
    assert len(cleaned.encode()) <= 200 and cleaned != safe_relative_key("é" * 299)
    assert safe_relative_key("lone\udcffsurrogate") == "lone_surrogate"


def test_safe_join_refuses_to_leave_the_prefix() -> None:
    assert safe_join("s3://b/out", "../../x.md") == "s3://b/out/x.md"
    assert safe_join("/out/", "/etc/passwd") == "/out/etc/passwd"
    for bad in ("", "..", "/", "./.", "\uff0e\uff0e"):
        with pytest.raises(ValueError):
            safe_join("/out", bad)


# ------------------------------------------------------------------------------------- local


@pytest.mark.parametrize("as_file_uri", [False, True])
def test_local_round_trip(tmp_path: Path, as_file_uri: bool) -> None:
    storage = Storage()
    base = f"file://{tmp_path}" if as_file_uri else str(tmp_path)
    uri = join_uri(base, "deep", "er", "doc.bin")
    storage.write_bytes_atomic(uri, b"v1")
    assert (tmp_path / "deep/er/doc.bin").read_bytes() == b"v1"
    assert storage.read_bytes(uri) == b"v1"
    storage.write_bytes_atomic(uri, b"version two")
    info = storage.stat(uri)
    assert info is not None and info.size == 11 and info.etag is None
    assert info.last_modified.tzinfo is not None and info.last_modified.utcoffset().total_seconds() == 0
    assert abs(info.last_modified.timestamp() - os.stat(tmp_path / "deep/er/doc.bin").st_mtime) < 1e-5
    assert storage.exists(uri)
    target = tmp_path / "copy.bin"
    storage.download(uri, target)
    assert target.read_bytes() == b"version two"
    [listed] = list(storage.list_objects(join_uri(base, "deep")))
    assert listed == info
    storage.delete(uri)
    storage.delete(uri)  # deleting twice is fine
    assert not storage.exists(uri)
    assert storage.stat(str(tmp_path / "deep")) is None  # folders are not objects
    assert storage.read_bytes_or_none(uri) is None
    # No temp files left behind by any of it.
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(TEMP_SUFFIX)]


def test_local_open_read_streams_within_its_bound(tmp_path: Path) -> None:
    storage = Storage()
    uri = str(tmp_path / "obj.bin")
    payload = os.urandom(300_000)
    storage.write_bytes_atomic(uri, payload)
    before = storage.requests.counts()["read"]
    with storage.open_read(uri, max_bytes=len(payload)) as stream:
        # Each read returns at most what it asks for: the caller holds one chunk at a time.
        chunks = iter(lambda: stream.read(65_536), b"")
        assert [len(chunk) for chunk in chunks] == [65_536] * 4 + [300_000 - 4 * 65_536]
    assert storage.requests.counts()["read"] - before == 1  # one open is one read request
    with storage.open_read(uri, max_bytes=len(payload)) as stream:
        assert stream.read() == payload
    # One byte past the bound is read, never the rest.
    with storage.open_read(uri, max_bytes=len(payload) - 1) as stream, pytest.raises(ReadLimitExceeded):
        stream.read()
    assert storage.open_read_or_none(str(tmp_path / "missing"), max_bytes=10) is None
    with pytest.raises(UnreadableSourceError):
        storage.open_read(str(tmp_path / "missing"), max_bytes=10)


def test_local_missing_or_unreadable_source(tmp_path: Path) -> None:
    storage = Storage()
    with pytest.raises(UnreadableSourceError, match=r"missing\.pdf"):
        storage.read_bytes(str(tmp_path / "missing.pdf"))
    with pytest.raises(UnreadableSourceError):
        storage.download(str(tmp_path / "missing.pdf"), tmp_path / "out.pdf")
    assert not (tmp_path / "out.pdf").exists()
    with pytest.raises(UnreadableSourceError):
        storage.read_bytes(str(tmp_path))  # a folder
    assert list(storage.list_objects(str(tmp_path / "nowhere"))) == []


def test_local_failed_write_keeps_old_content(tmp_path: Path) -> None:
    storage = Storage()
    uri = str(tmp_path / "state.json")
    storage.write_bytes_atomic(uri, b"old")
    # A payload that fails half-way through the write (str is not bytes).
    with pytest.raises(TypeError):
        storage.write_bytes_atomic(uri, "not bytes")  # type: ignore[arg-type]
    assert (tmp_path / "state.json").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_local_write_killed_mid_way_never_leaves_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    target.write_bytes(b"old")
    new = b"n" * (48 * 1024 * 1024)
    script = (
        "import sys; from olmocr_tasks.storage.store import Storage; "
        "sys.stdout.write('go\\n'); sys.stdout.flush(); "
        f"Storage().write_bytes_atomic({str(target)!r}, b'n' * {len(new)})"
    )
    for delay in (0.0, 0.05, 0.2):
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"go\n"
        time.sleep(delay)
        child.kill()
        child.wait()
        content = target.read_bytes()
        assert content in (b"old", new), f"partial content of {len(content)} bytes"
        # A killed writer may leave its temp file, but listings never show it.
        assert [info.uri for info in Storage().list_objects(str(tmp_path))] == [str(target)]


def test_local_listing_is_streamed_and_skips_links_and_temp_files(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/x.pdf").write_bytes(b"1")
    (tmp_path / "a/y.PDF").write_bytes(b"22")
    (tmp_path / f".z.pdf.1234{TEMP_SUFFIX}").write_bytes(b"partial")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/o.pdf").write_bytes(b"o")
    (tmp_path / "a/link").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "a/loop").symlink_to(tmp_path / "a", target_is_directory=True)
    listing = Storage().list_objects(str(tmp_path / "a"))
    assert isinstance(listing, Iterator)
    found = sorted((info.uri, info.size) for info in listing)
    assert found == [(f"{tmp_path}/a/b/x.pdf", 1), (f"{tmp_path}/a/y.PDF", 2)]


# ---------------------------------------------------------------------------------------- S3


def test_s3_round_trip(s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path) -> None:
    storage = Storage(s3_storage_options)
    uri = f"s3://{s3_bucket}/in/nested/doc.pdf"
    storage.write_bytes_atomic(uri, b"%PDF-1.4 v1", content_type="application/pdf")
    assert storage.read_bytes(uri) == b"%PDF-1.4 v1"
    info = storage.stat(uri)
    assert info is not None and info.size == 11 and info.etag and '"' not in info.etag
    assert info.last_modified.utcoffset().total_seconds() == 0
    assert storage.exists(uri) and not storage.exists(f"s3://{s3_bucket}/in/nested")
    storage.download(uri, tmp_path / "doc.pdf")
    assert (tmp_path / "doc.pdf").read_bytes() == b"%PDF-1.4 v1"
    assert list(storage.list_objects(f"s3://{s3_bucket}/in")) == [info]
    assert list(storage.list_objects(f"s3://{s3_bucket}/i")) == []  # a prefix is a folder
    storage.delete(uri)
    storage.delete(uri)
    assert storage.stat(uri) is None
    assert storage.read_bytes_or_none(uri) is None
    with pytest.raises(UnreadableSourceError, match="NoSuchKey"):
        storage.read_bytes(uri)
    with pytest.raises(UnreadableSourceError):
        storage.download(uri, tmp_path / "gone.pdf")
    assert not (tmp_path / "gone.pdf").exists()


def test_s3_uses_environment_without_options(s3_env: str, s3_bucket: str) -> None:
    storage = Storage()
    uri = f"s3://{s3_bucket}/env/x.txt"
    storage.write_bytes_atomic(uri, b"via AWS_ENDPOINT_URL")
    assert storage.read_bytes(uri) == b"via AWS_ENDPOINT_URL"


def test_s3_storage_survives_pickling(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    storage = Storage(s3_storage_options)
    storage.write_bytes_atomic(f"s3://{s3_bucket}/p", b"1")
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.read_bytes(f"s3://{s3_bucket}/p") == b"1"
    assert "testing-secret-key" not in repr(storage)


def test_options_given_as_a_function_are_asked_for_once_when_s3_is_first_reached(
    s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    """An Airflow task's storage takes the AWS connection's options this way: a run that stays local
    never looks the connection up, and one that reaches S3 looks it up once, batch counters included."""
    asked: list[int] = []

    def options() -> dict[str, Any]:
        asked.append(1)
        return s3_storage_options

    storage = Storage(options)
    storage.write_bytes_atomic(str(tmp_path / "local.txt"), b"local")
    assert storage.read_bytes(str(tmp_path / "local.txt")) == b"local" and asked == []
    storage.write_bytes_atomic(f"s3://{s3_bucket}/lazy", b"1")
    assert storage.counting().read_bytes(f"s3://{s3_bucket}/lazy") == b"1"
    assert asked == [1]
    # Once known, the credentials are scrubbed from what the storage says, as given ones are.
    assert DUMMY_SECRET not in repr(storage) and DUMMY_SECRET in storage.known_secrets()


def test_s3_listing_paginates(s3_bucket: str, s3_fault_proxy: FaultProxy, s3_put_many: Any) -> None:
    s3_put_many(s3_bucket, {f"many/{i:04d}.pdf": b"x" for i in range(1005)})
    s3_put_many(s3_bucket, {"many/folder/": b"", "other/z.pdf": b"z"})
    storage = _fast_storage(s3_fault_proxy)
    keys = [info.uri for info in storage.list_objects(f"s3://{s3_bucket}/many/")]
    assert len(keys) == 1005 and keys == sorted(keys)  # folder marker skipped
    assert s3_fault_proxy.count("GET", LIST_PAGE) == 2


@pytest.mark.parametrize(
    ("method", "path", "action"),
    [
        ("GET", LIST_PAGE, "slowdown"),
        ("GET", r"/obj\.bin$", "slowdown"),
        ("PUT", r"/obj\.bin$", "slowdown"),
        ("GET", r"/obj\.bin$", "error500"),
        ("GET", r"/obj\.bin$", "drop"),
        ("HEAD", r"/obj\.bin$", "slowdown"),
    ],
)
def test_s3_transient_errors_are_retried(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy, method: str, path: str, action: str
) -> None:
    uri = f"s3://{s3_bucket}/dir/obj.bin"
    Storage(s3_storage_options).write_bytes_atomic(uri, b"payload")
    storage = _fast_storage(s3_fault_proxy)
    s3_fault_proxy.add_rule(method=method, path=path, action=action, count=3)
    if method == "PUT":
        storage.write_bytes_atomic(uri, b"payload 2")
        assert Storage(s3_storage_options).read_bytes(uri) == b"payload 2"
    elif method == "HEAD":
        info = storage.stat(uri)
        assert info is not None and info.size == 7
    elif path == LIST_PAGE:
        assert [info.uri for info in storage.list_objects(f"s3://{s3_bucket}/dir")] == [uri]
    else:
        assert storage.read_bytes(uri) == b"payload"
    assert s3_fault_proxy.count(method, path, outcome=action) == 3
    # One clean request at most: botocore's own retry of a dropped connection and s3fs answering a
    # stat from a listing after a failed HEAD can make it zero.
    assert s3_fault_proxy.count(method, path, outcome="forwarded") <= 1


def test_botocore_and_tenacity_layers_multiply_boundedly(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    uri = f"s3://{s3_bucket}/always-throttled"
    Storage(s3_storage_options).write_bytes_atomic(uri, b"x")
    storage = _fast_storage(s3_fault_proxy, max_attempts=2, botocore_attempts=2)
    s3_fault_proxy.add_rule(method="GET", path="always-throttled", action="slowdown")
    with pytest.raises(StorageError, match=r"SlowDown.*after retries"):
        storage.read_bytes(uri)
    assert s3_fault_proxy.count("GET", "always-throttled") == 4  # 2 operations x 2 HTTP attempts


def test_s3_download_recovers_from_dropped_connections(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/big.pdf"
    payload = os.urandom(3 * 1024 * 1024)
    Storage(s3_storage_options).write_bytes_atomic(uri, payload)
    s3_fault_proxy.add_rule(method="GET", path="big.pdf", action="drop", count=2)
    _fast_storage(s3_fault_proxy).download(uri, tmp_path / "big.pdf")
    assert (tmp_path / "big.pdf").read_bytes() == payload
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pdf"]


def test_s3_open_read_streams_and_resumes_a_body_that_broke_off(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    uri = f"s3://{s3_bucket}/stream.bin"
    payload = os.urandom(3 * 1024 * 1024)
    Storage(s3_storage_options).write_bytes_atomic(uri, payload)
    storage = _fast_storage(s3_fault_proxy)
    with storage.open_read(uri, max_bytes=len(payload)) as stream:
        assert len(stream.read(65_536)) <= 65_536
        assert stream.read(0) == b""
    assert s3_fault_proxy.count("GET", "stream.bin") == 1 and storage.requests.counts()["read"] == 1
    assert storage.open_read_or_none(f"s3://{s3_bucket}/missing", max_bytes=10) is None
    with storage.open_read(uri, max_bytes=1_000_000) as stream, pytest.raises(ReadLimitExceeded, match="1,000,000"):
        stream.read()

    # Twice the connection closes half-way through the body: each time the read goes on with a ranged
    # GET of the same version from where it stopped, and the caller sees every byte exactly once.
    s3_fault_proxy.clear()
    s3_fault_proxy.add_rule(method="GET", path="stream.bin", action="cut", count=2)
    with storage.open_read(uri, max_bytes=len(payload)) as stream:
        assert stream.read() == payload
    assert s3_fault_proxy.count("GET", "stream.bin", outcome="cut") == 2
    assert s3_fault_proxy.count("GET", "stream.bin", outcome="forwarded") == 1

    # Replaced between the break and the resume: the read fails rather than mixing two versions.
    s3_fault_proxy.add_rule(method="GET", path="stream.bin", action="cut", count=1)
    with storage.open_read(uri, max_bytes=len(payload)) as stream:
        first = stream.read(1024)
        Storage(s3_storage_options).write_bytes_atomic(uri, os.urandom(len(payload)))
        with pytest.raises(StorageError, match="PreconditionFailed"):
            while stream.read(1024 * 1024):
                pass
    assert first == payload[:1024]


def test_s3_slow_response_times_out_and_is_retried(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    uri = f"s3://{s3_bucket}/slow"
    Storage(s3_storage_options).write_bytes_atomic(uri, b"eventually")
    s3_fault_proxy.add_rule(method="GET", path="/slow", action="delay", delay_s=1.5, count=1)
    storage = _fast_storage(s3_fault_proxy, read_timeout_s=0.5)
    assert storage.read_bytes(uri) == b"eventually"


@pytest.mark.parametrize("action", ["not_found", "denied"])
def test_s3_permanent_source_errors_fail_fast(
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_fault_proxy: FaultProxy,
    action: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri = f"s3://{s3_bucket}/src.pdf"
    Storage(s3_storage_options).write_bytes_atomic(uri, b"%PDF")
    s3_fault_proxy.add_rule(method="GET", path="src.pdf", action=action)
    storage = _fast_storage(s3_fault_proxy, botocore_attempts=3)
    caplog.set_level(logging.WARNING, logger="olmocr_tasks.storage.store")
    with pytest.raises(UnreadableSourceError) as caught:
        storage.read_bytes(uri)
    with pytest.raises(UnreadableSourceError):
        storage.download(uri, tmp_path / "src.pdf")
    # Fast: one request each (no botocore retry) and no backoff sleep (tenacity logs each before it).
    assert s3_fault_proxy.count("GET", "src.pdf") == 2
    assert [record.getMessage() for record in caplog.records if "retrying in" in record.getMessage()] == []
    assert caught.value.error_class == "unreadable"


def test_s3_bad_credentials_are_an_infrastructure_error(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    uri = f"s3://{s3_bucket}/src.pdf"
    Storage(s3_storage_options).write_bytes_atomic(uri, b"%PDF")
    s3_fault_proxy.add_rule(action="invalid_key")
    storage = _fast_storage(s3_fault_proxy)
    with pytest.raises(StorageError, match="InvalidAccessKeyId") as caught:
        storage.read_bytes(uri)
    assert not isinstance(caught.value, UnreadableSourceError)
    assert s3_fault_proxy.count() == 1


def test_s3_error_messages_carry_no_credentials(s3_bucket: str, s3_fault_proxy: FaultProxy) -> None:
    options = s3_fault_proxy.storage_options
    options.update(key="AKIAVERYSECRETKEYID", secret="wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRET")
    endpoint = s3_fault_proxy.url.replace("http://", "http://user:hunter22@")
    options["client_kwargs"] = {**options["client_kwargs"], "endpoint_url": endpoint}
    storage = Storage(options, retry=FAST)
    s3_fault_proxy.add_rule(method="PUT", action="slowdown")
    with pytest.raises(StorageError) as caught:
        storage.write_bytes_atomic(f"s3://{s3_bucket}/x", b"1")
    text = str(caught.value) + repr(storage)
    for secret in ("AKIAVERYSECRETKEYID", "wJalrXUtnFEMI", "hunter22"):
        assert secret not in text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_s3_error_messages_carry_no_credential_from_the_environment(
    s3_bucket: str, s3_fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every variable botocore may hold a credential in, the legacy AWS_SECURITY_TOKEN included; the
    # object key carries the value so the message would show it unless scrubbed.
    monkeypatch.setenv("AWS_SECURITY_TOKEN", "legacy-security-token-value")
    storage = Storage(s3_fault_proxy.storage_options, retry=FAST)
    s3_fault_proxy.add_rule(method="PUT", action="slowdown")
    with pytest.raises(StorageError) as caught:
        storage.write_bytes_atomic(f"s3://{s3_bucket}/legacy-security-token-value/x", b"1")
    assert "legacy-security-token-value" not in str(caught.value)
    assert f"s3://{s3_bucket}/***/x" in str(caught.value)


def test_s3_write_failure_keeps_old_object(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    uri = f"s3://{s3_bucket}/out/state.json"
    Storage(s3_storage_options).write_bytes_atomic(uri, b"old")
    s3_fault_proxy.add_rule(method="PUT", path="state.json", action="drop")
    with pytest.raises(StorageError):
        _fast_storage(s3_fault_proxy, max_attempts=2).write_bytes_atomic(uri, b"new")
    assert Storage(s3_storage_options).read_bytes(uri) == b"old"


def test_s3_large_multipart_write_is_all_or_nothing(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    import boto3

    uri = f"s3://{s3_bucket}/out/big.jsonl"
    chunk = 5 * 1024 * 1024  # S3's smallest part size
    Storage(s3_storage_options).write_bytes_atomic(uri, b"old")
    big = os.urandom(2 * chunk + 1024)
    # Every part upload fails: the object must keep its old content and no upload may linger.
    s3_fault_proxy.add_rule(method="PUT", path=r"partNumber=2", action="error500")
    failing = Storage(s3_fault_proxy.storage_options, retry=FAST, multipart_chunksize=chunk)
    with pytest.raises(StorageError):
        failing.write_bytes_atomic(uri, big)
    assert s3_fault_proxy.count("POST", r"uploads") >= 1  # it really was a multipart upload
    assert Storage(s3_storage_options).read_bytes(uri) == b"old"
    client = boto3.client(
        "s3",
        endpoint_url=s3_storage_options["client_kwargs"]["endpoint_url"],
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    # Without faults the same write goes through whole.
    s3_fault_proxy.clear()
    failing.write_bytes_atomic(uri, big)
    assert Storage(s3_storage_options).read_bytes(uri) == big


@pytest.mark.parametrize("where", ["local", "s3"])
def test_create_exclusive_has_exactly_one_winner(
    where: str, tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    storage = Storage(s3_storage_options)
    base = str(tmp_path) if where == "local" else f"s3://{s3_bucket}/claims"
    uri = join_uri(base, "deep", "owner.json")
    with ThreadPoolExecutor(max_workers=8) as pool:
        won = list(pool.map(lambda n: storage.create_exclusive(uri, f"writer {n}".encode()), range(8)))
    assert won.count(True) == 1
    assert storage.read_bytes(uri) == f"writer {won.index(True)}".encode()
    assert storage.create_exclusive(uri, b"late") is False and storage.read_bytes(uri) != b"late"
    assert [info.uri for info in storage.list_objects(base)] == [uri]


def test_create_exclusive_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a filesystem that refuses hard links the create is still exclusive."""

    def refuse(*_: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    storage = Storage()
    uri = str(tmp_path / "owner.json")
    assert storage.create_exclusive(uri, b"first") is True
    assert storage.create_exclusive(uri, b"second") is False
    assert storage.read_bytes(uri) == b"first" and [p.name for p in tmp_path.iterdir()] == ["owner.json"]


def test_object_info_is_hashable_and_comparable() -> None:
    from datetime import UTC, datetime

    a = ObjectInfo("s3://b/k", 1, "e", datetime(2024, 1, 1, tzinfo=UTC))
    assert {a: 1}[ObjectInfo("s3://b/k", 1, "e", datetime(2024, 1, 1, tzinfo=UTC))] == 1
