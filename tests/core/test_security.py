"""Security: secrets never leak, TLS is verified, hostile names stay inside the output prefix, and the
servers we start listen on loopback only.

The canary test plants unique fake secrets (an API key the stand-in requires, AWS credentials moto
accepts without checking, a password in a server URL), drives the CLI and the engine through failures,
retries, a 401, an outage and failing documents with DEBUG logging, and then searches *everything* the
runs left behind: their output, every object in the bucket, every file under the test's folder, the
summaries a task would return through XCom and the text of the exceptions raised.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import ssl
import threading
import time
import traceback
import unicodedata
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import ServerNotReady
from olmocr_tasks.run.batching import BatchingRule
from olmocr_tasks.run.pipeline import convert_batch, run_conversion
from olmocr_tasks.run.planning import plan_batches
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.airflow_env import AirflowEnv, aws_connection, vllm_connection
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import run_cli, start_cli
from tests.fixtures.manifests import load_whole
from tests.fixtures.reader_view import assert_manifest_matches_outputs, assert_reader_view_consistent, quick_settings
from tests.fixtures.s3 import DUMMY_KEY, DUMMY_SECRET, REGION, FaultProxy
from tests.task_context import RunTasks

FAST = ["--read-timeout", "3", "--outage-window", "3", "--ready-timeout", "3", "--target-longest-image-dim", "512"]


# ------------------------------------------------------------------------------------------ canaries


def all_bucket_objects(bucket: str) -> Iterator[tuple[str, bytes]]:
    client = boto3.client("s3")
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            yield item["Key"], client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()


def assert_nowhere(canaries: dict[str, str], places: dict[str, bytes | str]) -> None:
    for where, content in places.items():
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        for name, canary in canaries.items():
            assert canary.encode() not in data, f"the {name} leaked into {where}"


@pytest.mark.slow
def test_canary_secrets_appear_nowhere_a_run_leaves_anything(
    tmp_path: Path,
    standin: StandinServer,
    s3_env: str,
    s3_bucket: str,
    s3_fault_proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = uuid.uuid4().hex[:12]
    canaries = {
        "API key": f"sk-canary-api-{token}",
        "AWS secret key": f"canary-aws-secret-{token}",
        "AWS session token": f"canary-aws-session-{token}",
        "URL password": f"canary-url-password-{token}",
    }
    # moto accepts any credentials; botocore signs with them and sends the session token as a header.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canaries["AWS secret key"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", canaries["AWS session token"])
    monkeypatch.setenv("OLMOCR_CANARY_KEY", canaries["API key"])
    client = boto3.client("s3")
    for doc_id in (1, 2, 3):
        client.put_object(Bucket=s3_bucket, Key=f"in/doc{doc_id}.pdf", Body=pdfgen.text_pdf(2, doc_id=doc_id))
    client.put_object(Bucket=s3_bucket, Key="in/locked.pdf", Body=pdfgen.encrypted_pdf())
    client.put_object(Bucket=s3_bucket, Key="in/broken.pdf", Body=pdfgen.truncated_pdf())
    # The CLI reaches S3 only through the fault proxy, so storage retries are logged too.
    s3_fault_proxy.add_rule(action="slowdown", share=0.15, seed=7)
    s3_fault_proxy.add_rule(action="error500", count=2)
    cli_env = {"AWS_ENDPOINT_URL": s3_fault_proxy.url}
    standin.configure(api_key=canaries["API key"], fault_rates={"500": 0.1, "429": 0.1, "garbage": 0.1, "drop": 0.05})
    source, target = f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out"
    key = ["--api-key-env", "OLMOCR_CANARY_KEY"]
    verbose = ["--log-level", "DEBUG"]
    outputs: dict[str, bytes | str] = {}

    # 1. The server answers 401 (no key sent): a clear refusal, before any work.
    unauthorized = run_cli(*verbose, "convert", source, target, "--server", standin.url, *FAST, env=cli_env)
    assert unauthorized.returncode == 3 and "401" in unauthorized.stderr
    # 2. Faults on both sides, retries, two documents that fail: exit 1 with everything recorded.
    faulty = run_cli(
        *verbose, "convert", source, target, "--server", standin.url, *key, "--run-id", "faulty", *FAST, env=cli_env
    )
    assert faulty.returncode == 1, faulty.stderr[-3000:]
    assert "locked.pdf: encrypted" in faulty.stdout and "broken.pdf: corrupt" in faulty.stdout
    assert "retrying" in faulty.stderr and "botocore" in faulty.stderr  # the DEBUG firehose really ran
    # 3. The key stops working mid-run: the server answers 401 to completions.
    standin.configure(latency_s=0.3, fault_rates={})
    midrun_log = tmp_path / "midrun.log"
    midrun = start_cli(
        *verbose, "convert", source, f"{target}-midrun", "--server", standin.url, *key, *FAST,
        "--max-concurrent-requests", "1",  # one page at a time, so pages remain after the key changes
        env={**cli_env, "OLMOCR_CANARY_KEY": canaries["API key"]}, log=midrun_log,
    )  # fmt: skip
    seen = len(standin.requests())
    deadline = time.monotonic() + 60
    while len(standin.requests()) <= seen and time.monotonic() < deadline:
        time.sleep(0.02)
    standin.configure(api_key=f"sk-rotated-{token}")
    assert midrun.wait(timeout=60) == 3
    outputs["mid-run 401 log"] = midrun_log.read_bytes()
    assert b"401" in outputs["mid-run 401 log"]
    # 4. A server URL carrying a password, and nothing listening there.
    down_url = f"http://olmocr:{canaries['URL password']}@127.0.0.1:9/v1"
    down = run_cli(*verbose, "convert", source, target, "--server", down_url, *key, *FAST, env=cli_env)
    assert down.returncode == 3 and "unavailable" in down.stderr and "http://***@127.0.0.1:9/v1" in down.stderr

    # 5. In-process, the way an Airflow task runs it: plan, batch, manifest; XCom gets the summaries.
    standin.configure(api_key=canaries["API key"], latency_s=0.0)
    caplog.set_level(logging.DEBUG, logger="olmocr_tasks")
    caplog.set_level(logging.DEBUG, logger="httpx")
    settings = quick_settings(standin.url, api_key=canaries["API key"])
    request = RunRequest(source, f"{target}-task", "task-run", settings=settings)
    storage = Storage()
    folder = request.run_folder(storage, "p1-task")
    batches = plan_batches(request, storage, folder, BatchingRule())
    outputs["XCom of the plan"] = json.dumps(batches)
    for batch in batches:
        sources = folder.read_batch(batch["batch"])
        xcom = convert_batch(request, storage, batch["batch"], sources, plan_id=folder.plan_id, try_number=1).summary
        outputs[f"XCom of batch {batch['batch']}"] = json.dumps(xcom)
    published = publish_run(request, storage, folder, folder.read_plan())
    outputs["XCom of the publish"] = json.dumps(published.summary())
    outputs["manifest object"] = json.dumps(published.reader(storage).whole())
    outputs["repr of the settings"] = repr(settings) + repr(settings.server) + json.dumps(settings.public_dict())
    broken = RunRequest(source, f"{target}-broken", "x", settings=quick_settings(down_url, api_key=canaries["API key"]))
    with pytest.raises(ServerNotReady) as raised:
        run_conversion(broken, storage)
    outputs["exception text"] = "".join(traceback.format_exception(raised.value))
    outputs["captured logs"] = caplog.text

    for name, result in {"401": unauthorized, "faulty": faulty, "down": down}.items():
        outputs[f"stdout of the {name} run"] = result.stdout
        outputs[f"stderr of the {name} run"] = result.stderr
    for key_name, data in all_bucket_objects(s3_bucket):
        outputs[f"s3://{s3_bucket}/{key_name}"] = data
    for path in tmp_path.rglob("*"):
        if path.is_file():
            outputs[str(path)] = path.read_bytes()
    assert any("/out/manifests/faulty.json" in where for where in outputs)
    assert any("/_state/" in where for where in outputs) and any("/_runs/" in where for where in outputs)
    assert_nowhere(canaries, outputs)
    # The session token really was in the DEBUG output, and the CLI's log filter blanked it.
    assert "x-amz-security-token:***" in faulty.stderr


# ----------------------------------------------------------------------------------------------- TLS


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own authority (so it can also be trusted explicitly)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "olmocr-airflow test server")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "server.pem", folder / "server.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class TlsFront:
    """HTTPS on loopback in front of the plain-HTTP stand-in: TLS is terminated, bytes are piped.

    ``connections`` counts TCP connections, a refused handshake included (TLS starts after the count).
    """

    def __init__(self, upstream_port: int, cert: Path, key: Path) -> None:
        self._upstream_port = upstream_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)
        self.port = 0
        self.connections = 0

    def start(self) -> TlsFront:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await writer.start_tls(self._context)
        except (ConnectionError, ssl.SSLError):
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


@pytest.fixture
def https_standin(tmp_path: Path, standin: StandinServer) -> Iterator[tuple[TlsFront, Path]]:
    cert, key = self_signed_certificate(tmp_path)
    # The client refusing our certificate makes asyncio log the failed handshake; that is the point.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    front = TlsFront(standin.port, cert, key).start()
    try:
        yield front, cert
    finally:
        front.stop()
        logging.getLogger("asyncio").setLevel(logging.NOTSET)


def test_tls_certificates_are_verified_by_default(tmp_path: Path, https_standin: tuple[TlsFront, Path]) -> None:
    front, cert = https_standin
    assert ServerSettings().connection.verify_tls is True
    pdfgen.write_pdf(tmp_path / "in" / "a.pdf", pdfgen.text_pdf(1, doc_id=1))
    args = ["convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", front.url, *FAST]
    env = {"SSL_CERT_FILE": "", "SSL_CERT_DIR": ""}

    # Long enough for many readiness probes, one a second, if the refusal were taken for "starting";
    # without adaptive concurrency no /metrics poller connects, so every connection is a probe.
    untrusted = run_cli(*args, "--run-id", "untrusted", "--ready-timeout", "20", "--no-adaptive-concurrency", env=env)
    assert untrusted.returncode == 3, untrusted.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr or "certificate verify failed" in untrusted.stderr
    assert "--insecure" in untrusted.stderr  # the message says what to do about it
    # A certificate problem does not go away by waiting: the first refused handshake ends the run,
    # no readiness probe is tried again until --ready-timeout.
    assert front.connections == 1
    assert not (tmp_path / "out" / "dolma").exists()

    # The same server is accepted once its certificate is trusted: verification, not a blanket refusal.
    trusted = run_cli(*args, "--run-id", "trusted", env={"SSL_CERT_FILE": str(cert)})
    assert trusted.returncode == 0, trusted.stderr
    insecure = run_cli(*args, "--run-id", "insecure", "--insecure", "--reprocess", env=env)
    assert insecure.returncode == 0, insecure.stderr
    manifest = load_whole(str(tmp_path / "out" / "manifests" / "insecure.json"))
    assert manifest["settings"]["server"]["verify_tls"] is False  # an insecure run says so in its manifest


# --------------------------------------------------------------------------------------- path safety

# Names a hostile uploader could choose; each is a distinct object and must stay a distinct output.
HOSTILE_LOCAL_NAMES = [
    "back\\..\\..\\slash.pdf",
    "ctl\x01\x1b.pdf",
    "line\nbreak.pdf",
    "bidi\u202egpj.pdf",
    unicodedata.normalize("NFD", "nfd-café.pdf"),
    "....pdf",
    " spaced .pdf",
    "fullwidth\uff0fslash.pdf",
]
HOSTILE_S3_KEYS = [
    "in/../../x.pdf",
    "in/x.pdf",  # what the key above would clobber if "../.." were merely dropped
    "in/../escape.pdf",
    "in//abs/y.pdf",
    "in/./dot.pdf",
    "in/dot.pdf",
    "in/back\\..\\..\\z.pdf",
    "in/ctl\x01\x7f.pdf",
    "in/nul\x00.pdf",
    "in/" + unicodedata.normalize("NFD", "nfd-café.pdf"),
]


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def test_hostile_local_names_write_only_under_the_output_prefix(tmp_path: Path, standin: StandinServer) -> None:
    inbox, out = tmp_path / "box" / "in", tmp_path / "box" / "out"
    doc_ids = {}
    for doc_id, name in enumerate(HOSTILE_LOCAL_NAMES, start=1):
        pdfgen.write_pdf(inbox / name, pdfgen.text_pdf(1, doc_id=doc_id))
        doc_ids[name] = doc_id
    outside = pdfgen.write_pdf(tmp_path / "elsewhere" / "deep" / "outside.pdf", pdfgen.text_pdf(1, doc_id=40))
    before = files_under(tmp_path)
    settings = quick_settings(standin.url)
    manifest, _ = run_conversion(RunRequest(str(inbox), str(out), "../../../escape run", settings=settings), Storage())
    # Explicit documents outside the input folder, named through "..", follow olmOCR's rule for them.
    climbing = str(inbox / ".." / ".." / "elsewhere" / "deep" / "outside.pdf")
    explicit, _ = run_conversion(
        RunRequest(str(inbox), str(out), "/abs/run", settings=settings, documents=(climbing,)), Storage()
    )

    written = files_under(tmp_path) - before
    assert written and all(out in path.parents for path in written), sorted(map(str, written - set(out.rglob("*"))))
    assert (out / "manifests" / "escape_run.json").is_file() and (out / "manifests" / "abs_run.json").is_file()
    documents = manifest.documents + explicit.documents
    assert [doc.status for doc in documents] == ["converted"] * (len(HOSTILE_LOCAL_NAMES) + 1)
    dolma = [Path(doc.outputs["dolma"]) for doc in documents]
    assert len(set(dolma)) == len(dolma), "two sources share an output"
    assert outside.is_file()
    assert_manifest_matches_outputs(manifest)
    assert_manifest_matches_outputs(explicit)
    assert_reader_view_consistent(str(out))


def test_hostile_s3_keys_write_only_under_the_output_prefix(
    s3_env: str, s3_bucket: str, standin: StandinServer
) -> None:
    client = boto3.client("s3")
    for doc_id, key in enumerate(HOSTILE_S3_KEYS, start=1):
        client.put_object(Bucket=s3_bucket, Key=key, Body=pdfgen.text_pdf(1, doc_id=doc_id))
    request = RunRequest(f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out", "..", settings=quick_settings(standin.url))
    manifest, uri = run_conversion(request, Storage())

    assert [doc.status for doc in manifest.documents] == ["converted"] * len(HOSTILE_S3_KEYS)
    assert uri == f"s3://{s3_bucket}/out/manifests/run.json"
    keys = [key for key, _ in all_bucket_objects(s3_bucket)]
    written = [key for key in keys if key not in HOSTILE_S3_KEYS]
    for key in written:
        assert key.startswith("out/"), key
        parts = key.split("/")
        assert "" not in parts and "." not in parts and ".." not in parts, key
        assert not any(unicodedata.category(char) == "Cc" or char == "\\" for char in key), key
    dolma = [doc.outputs["dolma"] for doc in manifest.documents]
    assert len(set(dolma)) == len(dolma), "two sources share an output"
    assert_manifest_matches_outputs(manifest)
    assert_reader_view_consistent(f"s3://{s3_bucket}/out")


# ------------------------------------------------------------------------------------------ loopback


def test_servers_listen_on_loopback_by_default() -> None:
    from olmocr_tasks.cli import build_parser
    from olmocr_tasks.servers.cpu_engine import create_cpu_engine
    from olmocr_testkit.standin.__main__ import parse_args as standin_args

    parser = build_parser()
    assert parser.parse_args(["serve-cpu"]).host == "127.0.0.1"
    assert parser.parse_args(["serve-vllm"]).host == "127.0.0.1"
    assert standin_args([])[0].host == "127.0.0.1"
    engine = create_cpu_engine()  # binds (without serving) where serve-cpu would
    try:
        assert engine.server_address[0] == "127.0.0.1"
    finally:
        engine.server_close()
    with StandinServer() as server:  # the fixture's default, as the tests use it
        assert ipaddress.ip_address(server.core.host).is_loopback
        assert server.url.startswith("http://127.0.0.1:")


# ------------------------------------------------------------------ the allow-list, through Airflow


def _files_under(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()] if folder.exists() else []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_pointed_outside_the_allowed_folders_fails_before_reading_or_writing(
    airflow_env: AirflowEnv, tmp_path: Path
) -> None:
    inbox, out, private = tmp_path / "inbox", tmp_path / "out", tmp_path / "private"
    inbox.mkdir()
    private.mkdir()
    (inbox / "ok.pdf").write_bytes(pdfgen.text_pdf(1, 81))
    (private / "payroll.pdf").write_bytes(pdfgen.text_pdf(1, 82))
    # The deployment configures its locations; the allow-lists default to them.
    airflow = airflow_env.with_env(
        OLMOCR_INPUT_URI=str(inbox), OLMOCR_OUTPUT_URI=str(out), OLMOCR_ALLOWED_INPUTS=None, OLMOCR_ALLOWED_OUTPUTS=None
    )
    conf = {"documents": [str(inbox / "ok.pdf"), f"{inbox}/../private/payroll.pdf"]}
    result = airflow.dag_test("olmocr_ingest", conf=conf)
    assert result.state == "failed", result.tail()
    assert f"input '{inbox}/../private/payroll.pdf' is not allowed" in result.output
    states = airflow.task_states("olmocr_ingest", result.run_id or "")
    assert states[("plan", -1)] == "failed"
    assert not any(task == "convert" and state == "success" for (task, _), state in states.items())
    assert _files_under(out) == [], "nothing may be written for a refused run"

    # The same through the output Param: refused with the offending URI, nothing written there.
    elsewhere = tmp_path / "elsewhere"
    result = airflow.dag_test("olmocr_ingest", conf={"input_uri": str(inbox), "output_uri": str(elsewhere)})
    assert result.state == "failed" and f"output '{elsewhere}' is not allowed" in result.output
    assert _files_under(elsewhere) == [] and _files_under(out) == []


ALLOW_LIST_VARIABLES = ("OLMOCR_ALLOWED_INPUTS", "OLMOCR_ALLOWED_OUTPUTS", "OLMOCR_INPUT_URI", "OLMOCR_OUTPUT_URI")


def test_a_worker_without_an_allow_list_reads_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A deployment that configures neither ``OLMOCR_ALLOWED_*`` nor ``OLMOCR_INPUT_URI`` /
    ``OLMOCR_OUTPUT_URI`` on its workers (a hand-made or Helm one): every task refuses, naming the
    setting, before it reads or writes anything; ``*`` opens a side, but only when said."""
    from airflow.sdk.exceptions import AirflowFailException

    from olmocr_tasks.provider import tasks

    for name in ALLOW_LIST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", vllm_connection("http://127.0.0.1:9/v1", "m/1"))
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    (inbox / "a.pdf").write_bytes(pdfgen.text_pdf(1, 85))
    for params in (
        {"input_uri": str(inbox), "output_uri": str(out)},
        {"output_uri": str(out), "documents": ["/etc/passwd", "s3://finance/payroll.pdf"]},
    ):
        run = RunTasks(params)
        with pytest.raises(AirflowFailException, match="OLMOCR_ALLOWED_INPUTS") as caught:
            run.plan()
        assert "OLMOCR_INPUT_URI" in str(caught.value)
        # The later tasks refuse too (a worker that lost its settings, a cleared task on another host).
        with pytest.raises(AirflowFailException, match="no input locations are allowed"):
            tasks.convert_body(run.ctx("convert"), {"plan": "p1-0a1b2c3d", "batch": "b00000", "documents": 1})
        run.xcom["plan", tasks.PLAN_ID_XCOM] = "p1-0a1b2c3d"
        with pytest.raises(AirflowFailException, match="no input locations are allowed"):
            run.publish()
    assert not out.exists(), "nothing may be written on a worker without an allow-list"

    # Inputs said, outputs not: still closed, on the side left unsaid.
    monkeypatch.setenv("OLMOCR_ALLOWED_INPUTS", str(inbox))
    with pytest.raises(AirflowFailException, match="OLMOCR_ALLOWED_OUTPUTS"):
        RunTasks({"input_uri": str(inbox), "output_uri": str(out)}).plan()
    assert not out.exists()

    # "*" said explicitly: anywhere, as before.
    monkeypatch.setenv("OLMOCR_ALLOWED_OUTPUTS", "*")
    assert [batch["documents"] for batch in RunTasks({"input_uri": str(inbox), "output_uri": str(out)}).plan()] == [1]


@pytest.mark.parametrize(
    ("plan_id", "batch_key"),
    [
        ("p1-0a1b2c3d\n", "b00000"),  # a final newline: what "^...$" lets through
        ("../../../elsewhere", "b00000"),
        ("p1-0a1b2c3d", "b00000/../../../plan"),
        ("p1-0a1b2c3d", ""),
        (None, "b00000"),
        ("p" * 65, "b00000"),
    ],
)
def test_convert_and_publish_refuse_names_from_xcom_that_are_not_safe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plan_id: Any, batch_key: Any
) -> None:
    """The batch descriptor and the plan id reach convert and publish through XCom, which more than the
    plan task can write: a plan id or batch key is used only if it is a safe name, else the task fails
    without retries, before it reads anything."""
    from airflow.sdk.exceptions import AirflowFailException

    from olmocr_tasks.provider import tasks

    monkeypatch.setenv("OLMOCR_ALLOWED_INPUTS", str(tmp_path / "inbox"))
    monkeypatch.setenv("OLMOCR_ALLOWED_OUTPUTS", str(tmp_path / "out"))
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", vllm_connection("http://127.0.0.1:9/v1", "m/1"))
    run = RunTasks({"input_uri": str(tmp_path / "inbox"), "output_uri": str(tmp_path / "out")})
    batch = {"plan": plan_id, "batch": batch_key, "label": "x", "documents": 1}
    with pytest.raises(AirflowFailException, match=r"refused (plan id|batch key)"):
        tasks.convert_body(run.ctx("convert"), batch)
    if batch_key == "b00000":
        run.xcom["plan", tasks.PLAN_ID_XCOM] = plan_id if plan_id is not None else 7
        with pytest.raises(AirflowFailException, match="refused plan id"):
            run.publish()
    assert not (tmp_path / "out").exists()


def test_event_dag_plan_body_refuses_an_event_naming_another_bucket(
    monkeypatch: pytest.MonkeyPatch, moto_server: str, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    """The S3-event DAG's plan task, in-process, with triggering events naming an object outside the inputs.

    S3 notifications reaching a real triggerer are tested in ``tests/deployment/test_events.py``.
    """
    from airflow.sdk.exceptions import AirflowFailException

    client = boto3.client("s3", **_boto_client_options(s3_storage_options))
    client.put_object(Bucket=s3_bucket, Key="inbox/a.pdf", Body=pdfgen.text_pdf(1, 83))
    foreign = f"{s3_bucket}-foreign"
    client.create_bucket(Bucket=foreign)
    client.put_object(Bucket=foreign, Key="inbox/b.pdf", Body=pdfgen.text_pdf(1, 84))
    body = json.dumps(
        {
            "Records": [
                {
                    "eventSource": "aws:s3",
                    "eventName": "ObjectCreated:Put",
                    "s3": {"bucket": {"name": b}, "object": {"key": k}},
                }
                for b, k in ((s3_bucket, "inbox/a.pdf"), (foreign, "inbox/b.pdf"))
            ]
        }
    )
    event = {
        "from_trigger": True,
        "payload": {"status": "success", "message_batch": [{"MessageId": "1", "Body": body}]},
    }
    inbox, out = f"s3://{s3_bucket}/inbox/", f"s3://{s3_bucket}/out/"
    # The deployment configures its locations; the allow-lists default to them.
    monkeypatch.delenv("OLMOCR_ALLOWED_INPUTS")
    monkeypatch.delenv("OLMOCR_ALLOWED_OUTPUTS")
    monkeypatch.setenv("OLMOCR_INPUT_URI", inbox)
    monkeypatch.setenv("OLMOCR_OUTPUT_URI", out)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_server, DUMMY_KEY, DUMMY_SECRET, REGION))
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", vllm_connection("http://127.0.0.1:9/v1", "m/1"))
    run = RunTasks(
        {"input_uri": inbox, "output_uri": out},
        run_type="asset_triggered",
        dag_id="olmocr_s3_events",
        event_asset="olmocr_s3_object_created",
        events=[event],
    )
    with pytest.raises(AirflowFailException, match=f"input 's3://{foreign}/inbox/b.pdf' is not allowed"):
        run.plan()
    assert "Contents" not in client.list_objects_v2(Bucket=s3_bucket, Prefix="out/")


def _boto_client_options(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "aws_access_key_id": options["key"],
        "aws_secret_access_key": options["secret"],
        **options["client_kwargs"],
    }
