"""The compose deployment for real: docker/compose.yaml's images built, its stack up, one run through it.

``make test-compose`` runs this module. It installs docker.io and mmdebstrap when missing, starts
``dockerd`` (host networking only) unless one answers already, builds every image from a local
Debian base, starts the stack with ``tests/compose/compose.override.yaml`` (images and networking
only), uploads generated PDFs to the S3 stand-in, triggers ``olmocr_ingest`` through the REST API,
reads the published manifest and outputs from the store, logs in to the UI and opens the "OCR runs"
page in headless Chromium, then ``docker compose down -v`` must leave nothing but the cache
(tests/compose/stack.py says what that is). A broken Dockerfile line, compose variable or health
check fails the build or ``up --wait``, and so the tier.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from olmocr_testkit import tier_record
from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import AirflowApi, wait_until
from olmocr_testkit.pdfgen import page_line
from tests.compose.stack import (
    BUCKET,
    Leftovers,
    Snapshot,
    Stack,
    compose_command,
    engine_and_base,
    remove_work_dir,
)
from tests.deployment.published import converted, documents, statuses
from tests.fixtures.browser import launched_chromium

pytestmark = [pytest.mark.compose, pytest.mark.browser, pytest.mark.timeout(3600)]

DAG = "olmocr_ingest"
ONE_SHOT = {"airflow-init", "s3-users", "s3-init"}
# Services running the images docker/Dockerfile builds (the others are the tier's stand-ins).
OUR_IMAGES = {
    "airflow-init",
    "s3-init",
    "cpu-engine",
    *(f"airflow-{c}" for c in ("apiserver", "scheduler", "dag-processor", "triggerer", "worker")),
}
LONG_RUNNING = {
    "postgres",
    "redis",
    "minio",
    "cpu-engine",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # make test checks afterwards that this happened once in its run (tier_record).
    tier_record.record(tier_record.START, "compose")
    with engine_and_base():
        before = Snapshot.take()
        stack = Stack(compose=compose_command())
        stack.write_env_file()
        failure: str | None = None
        try:
            stack.build()
            stack.up()
            yield stack
        finally:
            try:
                stack.down()
            except AssertionError as error:
                failure = str(error)
            leftovers = Leftovers.between(before, Snapshot.take())
            leftovers.remove()
            remove_work_dir(stack)
            print(f"compose tier timings (s): {stack.timings}")
        if failure:
            pytest.fail(f"docker compose down failed: {failure}")
        assert leftovers == Leftovers(set(), set(), set(), set()), f"left behind after down -v: {leftovers}"


@pytest.fixture(scope="module")
def api(stack: Stack) -> AirflowApi:
    return AirflowApi(stack.api_url, "admin", stack.admin_password)


@pytest.fixture(scope="module")
def bucket(stack: Stack) -> Bucket:
    return Bucket(stack.s3_url, BUCKET)


@pytest.fixture(scope="module")
def run(api: AirflowApi, bucket: Bucket) -> dict[str, Any]:
    """One REST-triggered run of the ingest DAG over two uploaded PDFs, into the default output."""
    # Under compose.yaml's OLMOCR_INPUT_URI: the workers refuse inputs outside it (OLMOCR_ALLOWED_INPUTS).
    # Unpausing makes the scheduler run the last hourly interval too, which these newer PDFs are not in.
    prefix = f"input/compose-{uuid.uuid4().hex[:6]}/"
    wanted = {
        bucket.put_pdf(f"{prefix}alpha.pdf", pages=2, doc_id=201): 201,
        bucket.put_pdf(f"{prefix}nested/beta.pdf", pages=1, doc_id=202): 202,
    }
    # The DAG is parsed by the dag-processor after start; it is paused at creation.
    wait_until(lambda: api.request("GET", f"/api/v2/dags/{DAG}").status_code == 200, 300, 3, what=f"{DAG} parsed")
    api.set_paused(DAG, False)
    output = bucket.uri("output/")  # compose.yaml's OLMOCR_OUTPUT_URI, which the OCR runs page reads
    response = api.trigger(DAG, {"input_uri": bucket.uri(prefix), "output_uri": output})
    assert response.status_code == 200, response.text
    finished = api.wait_for_run(DAG, response.json()["dag_run_id"], timeout=900)
    manifest = bucket.manifest(output, DAG, finished["dag_run_id"])
    return {"run": finished, "manifest": manifest, "wanted": wanted, "prefix": prefix}


def test_every_service_is_up_on_the_host_network_and_binds_loopback_only(stack: Stack) -> None:
    containers = {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in stack.containers()}

    assert set(containers) == LONG_RUNNING | ONE_SHOT
    for name in ONE_SHOT:
        assert containers[name]["State"]["Status"] == "exited" and containers[name]["State"]["ExitCode"] == 0, name
    for name in LONG_RUNNING:
        assert containers[name]["State"]["Health"]["Status"] == "healthy", name
    for name, container in containers.items():
        assert container["HostConfig"]["NetworkMode"] == "host", name
    # Our images run as their own unprivileged users, every process of them.
    for name in OUR_IMAGES & LONG_RUNNING:
        root = psutil.Process(containers[name]["State"]["Pid"])
        uids = {process.uids().real for process in [root, *root.children(recursive=True)]}
        assert 0 not in uids, f"{name} runs a process as root"
    listening = set()
    for name in LONG_RUNNING:
        root = psutil.Process(containers[name]["State"]["Pid"])
        for process in [root, *root.children(recursive=True)]:
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    listening.add((name, connection.laddr.ip, connection.laddr.port))
    outside = {entry for entry in listening if not ipaddress.ip_address(entry[1]).is_loopback}
    assert not outside, f"listening beyond loopback: {sorted(outside)}"
    ports = {
        int(port) for key, port in stack.variables.items() if key.endswith("_PORT") and key != "MINIO_CONSOLE_PORT"
    }
    assert ports <= {port for _, _, port in listening}, "a service does not listen on the port its variable names"


def test_services_talk_only_to_the_stacks_own_ports(stack: Stack, run: dict[str, Any]) -> None:
    """A misspelled port variable falls back to its default (5432, 6379, ...), where the host's own
    PostgreSQL or Redis may answer: every connection our containers hold must be to or from a port the
    tier gave the stack. Checked after a run, with the database, broker and store connections open."""
    ports = {int(port) for key, port in stack.variables.items() if key.endswith("_PORT")}
    containers = {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in stack.containers()}
    foreign = set()
    for name in OUR_IMAGES & LONG_RUNNING:
        root = psutil.Process(containers[name]["State"]["Pid"])
        for process in [root, *root.children(recursive=True)]:
            for connection in process.net_connections(kind="inet"):
                if connection.raddr and connection.laddr.port not in ports and connection.raddr.port not in ports:
                    foreign.add((name, f"{connection.raddr.ip}:{connection.raddr.port}"))
    assert not foreign, f"connections to ports the stack was not given: {sorted(foreign)}"


def test_rest_triggered_run_converts_the_uploaded_pdfs(run: dict[str, Any], bucket: Bucket) -> None:
    manifest, wanted = run["manifest"], run["wanted"]

    assert run["run"]["state"] == "success", run["run"]
    assert run["run"]["triggered_by"] == "rest_api"
    assert manifest is not None, "the run published no manifest"
    assert set(documents(manifest)) == set(wanted), statuses(manifest)
    assert converted(manifest) == sorted(wanted), statuses(manifest)
    assert manifest["model"] == "olmocr-cpu-tesseract"
    assert manifest["counts"]["pages"] == 3
    # Tesseract in the CPU-engine container read each page's own text line, in page order.
    for source, doc in documents(manifest).items():
        markdown = bucket.read_bytes(doc["outputs"]["markdown"]).decode()
        lines = [page_line(wanted[source], page) for page in range(1, doc["pages"] + 1)]
        assert all(line in markdown for line in lines), (source, markdown)
        assert [markdown.index(line) for line in lines] == sorted(markdown.index(line) for line in lines)
    # s3-init created the bucket and uploaded the repository's sample PDFs.
    samples = {"input/annual-report.pdf", "input/rotated-memo.pdf", "input/nested/Price List.PDF"}
    assert samples <= set(bucket.keys("input/"))


def test_ui_login_and_the_ocr_runs_page(stack: Stack, run: dict[str, Any], tmp_path: Path) -> None:
    run_id = run["run"]["dag_run_id"]
    with launched_chromium() as browser:
        page = browser.new_page()
        page.goto(f"{stack.api_url}/auth/login/")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", stack.admin_password)
        page.locator("[type=submit]").first.click()
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=120_000)
        # The plugin's page inside the UI (its nav entry's url_route) and the page itself.
        page.goto(f"{stack.api_url}/plugin/ocr-runs")
        frame = page.frame_locator("iframe").first
        frame.get_by_text(run_id).first.wait_for(timeout=120_000)
        page.screenshot(path=str(tmp_path / "ocr-runs.png"))
        response = page.goto(f"{stack.api_url}/olmocr/")
        assert response is not None and response.status == 200
        assert run_id in page.content()


def test_init_created_the_convert_pool_and_the_one_reserved_for_high_priority_runs(api: AirflowApi) -> None:
    pools = {pool["name"]: pool["slots"] for pool in api.ok("GET", "/api/v2/pools")["pools"]}
    # The stack's OLMOCR_VLLM_POOL_SLOTS (2, stack.py) and compose.yaml's default reserve of 1.
    assert (pools.get("olmocr_vllm"), pools.get("olmocr_vllm_high")) == (2, 1), pools


def test_the_api_refuses_a_wrong_password(stack: Stack) -> None:
    response = httpx.post(f"{stack.api_url}/auth/token", json={"username": "admin", "password": "wrong"}, timeout=60)

    assert response.status_code in (400, 401, 403), response.text


def test_redis_answers_no_one_without_its_password(stack: Stack) -> None:
    with socket.create_connection(("127.0.0.1", int(stack.variables["REDIS_PORT"])), timeout=30) as redis:
        redis.sendall(b"PING\r\n")
        answer = redis.recv(256)
    assert answer.startswith(b"-NOAUTH"), answer


def test_airflow_holds_the_buckets_account_and_no_secret_is_on_a_command_line(stack: Stack) -> None:
    """MinIO's root password reaches only MinIO and s3-users; no process of the stack shows a secret in
    its command line (ps shows command lines to every user of the host)."""
    root_password = stack.variables["MINIO_ROOT_PASSWORD"]
    containers = {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in stack.containers()}
    holders = {name for name, c in containers.items() if any(root_password in env for env in c["Config"]["Env"])}
    assert holders == {"minio", "s3-users"}, holders
    worker_env = dict(entry.split("=", 1) for entry in containers["airflow-worker"]["Config"]["Env"])
    assert worker_env["AWS_ACCESS_KEY_ID"] == stack.variables["OLMOCR_S3_ACCESS_KEY_ID"]
    assert worker_env["AWS_ACCESS_KEY_ID"] != stack.variables["MINIO_ROOT_USER"]
    secret_names = ("PASSWORD", "SECRET", "SECRET_KEY", "SECRET_ACCESS_KEY", "FERNET_KEY")
    secrets = [value for key, value in stack.variables.items() if key.endswith(secret_names)]
    assert len(secrets) == 8, sorted(key for key in stack.variables if key.endswith(secret_names))
    shown = set()
    for name in LONG_RUNNING:
        root = psutil.Process(containers[name]["State"]["Pid"])
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                command_line = " ".join(process.cmdline())
                shown |= {(name, process.pid) for secret in secrets if secret in command_line}
    assert not shown, f"a secret is on the command line of {sorted(shown)}"
