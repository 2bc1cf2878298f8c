"""A run is resolved once, by ``plan``, and kept with its plan; convert and publish work from it.

``plan`` resolves the DAG run's Params, the vLLM connection and the deployment's environment into the
run it writes beside the plan (``run.json``, no secret); each later task reads it back once, over one
storage, one run folder and one ledger (``olmocr_tasks.run.planned``). The task bodies run in this
process with a hand-built context (``tests.task_context``), ``convert`` as a worker runs it: its
``pre_execute`` (``limit_convert_time``) first, then its body, with one context.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.run_folders import RunFolder
from olmocr_tasks.provider import run_requests, tasks
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.airflow_env import aws_connection, vllm_connection
from olmocr_testkit.standin.server import StandinServer
from tests.task_context import RunTasks

API_KEY = "conn-secret-api-key"
URL_PASSWORD = "url-secret-password"
REPLICA_PASSWORD = "replica-secret-password"
AWS_SECRET = "aws-secret-access-key-value"


def _one_document(tmp_path: Path) -> dict[str, Any]:
    pdfgen.write_pdf(tmp_path / "in" / "d.pdf", pdfgen.text_pdf(2, doc_id=1))
    return {"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")}


def _resolved_run_file(tmp_path: Path, run: RunTasks) -> Path:
    (path,) = (tmp_path / "out" / "_runs").glob(f"*/{run.xcom['plan', tasks.PLAN_ID_XCOM]}/run.json")
    return path


def test_the_plan_keeps_the_resolved_run_without_any_secret_of_the_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API key, passwords in the server's URLs and the AWS connection's secret never reach the run
    folder; a later task reads the key and the URLs from the connection when it uses them."""
    server = f"https://planner:{URL_PASSWORD}@vllm.test/v1"
    replica = f"https://replica:{REPLICA_PASSWORD}@vllm2.test/v1"
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", vllm_connection(server, "m/1", API_KEY, replicas=replica))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection("http://127.0.0.1:9", "AKIAKEY", AWS_SECRET))
    run = RunTasks(_one_document(tmp_path) | {"max_concurrent_requests": 7})
    run.plan()

    written = _resolved_run_file(tmp_path, run).read_text()
    for secret in (API_KEY, URL_PASSWORD, REPLICA_PASSWORD, AWS_SECRET):
        assert secret not in written
    record = json.loads(written)
    assert record["schema"] == 1
    assert record["settings"]["server"]["connection"]["model"] == "m/1"
    assert record["settings"]["server"]["concurrency"]["max_concurrent_requests"] == 7
    assert "api_key" not in record["settings"]["server"]["connection"]

    planned = tasks.planned_run(run.ctx("convert"), run.xcom["plan", tasks.PLAN_ID_XCOM]).request
    connection = planned.settings.server.connection
    assert connection.api_key == API_KEY
    assert connection.base_urls == (server, replica)
    assert planned.settings.server.concurrency.max_concurrent_requests == 7


@pytest.fixture
def keyed_standin(monkeypatch: pytest.MonkeyPatch, standin: StandinServer) -> StandinServer:
    """The stand-in requiring an API key, and the vLLM connection naming it with that key."""
    standin.configure(api_key="first-key")
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", vllm_connection(standin.url, standin.model, "first-key"))
    return standin


def test_convert_works_from_the_run_as_planned_and_reads_only_the_key_at_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed_standin: StandinServer
) -> None:
    """Params, the vLLM connection and the environment change after plan: convert keeps the plan's model,
    request window and limits, and takes the connection's (rotated) key."""
    run = RunTasks(_one_document(tmp_path))
    (batch,) = run.plan()
    # Everything a re-resolution would pick up changes mid-run; the key is rotated on both sides.
    run.params["max_concurrent_requests"] = 1
    run.params["max_page_error_rate"] = 0.5
    monkeypatch.setenv("OLMOCR_MAX_DOCUMENT_PAGES", "1")
    keyed_standin.configure(api_key="second-key")
    monkeypatch.setenv(
        "AIRFLOW_CONN_OLMOCR_VLLM",
        vllm_connection(keyed_standin.url, "some/other-model", "second-key", read_timeout_s=1),
    )

    ctx = run.ctx("convert", map_index=0)
    planned = tasks.planned_run(ctx, batch["plan"]).request
    assert planned.settings.server.connection.model == keyed_standin.model
    assert planned.settings.server.connection.api_key == "second-key"
    assert planned.settings.server.concurrency.max_concurrent_requests == 64
    assert planned.settings.server.timeouts.read_timeout_s == 300.0
    assert planned.settings.max_page_error_rate == 0.004
    assert planned.settings.limits == DocumentLimits()
    summary = tasks.convert_body(ctx, batch)
    # Two pages of a two-page document: the plan's page cap (a re-read environment would fail it).
    assert (summary["converted"], summary["pages"]) == (1, 2)
    assert run.publish()["converted"] == 1


@pytest.fixture
def constructions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How often each location object is built, the resolved run read, and the run resolved from Params."""
    counted: Counter[str] = Counter()

    def counting(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counted[label] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counting(Storage, "__init__", "Storage")
    counting(RunFolder, "__init__", "RunFolder")
    counting(Ledger, "__init__", "Ledger")
    counting(RunFolder, "read_resolved_run", "resolved run read")
    counting(run_requests, "build_request", "resolved from Params")
    counting(tasks, "build_request", "resolved from Params")
    yield counted


def test_a_convert_and_a_publish_each_read_the_run_once_and_open_each_location_object_once(
    tmp_path: Path, standin: StandinServer, monkeypatch: pytest.MonkeyPatch, constructions: Counter[str]
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", vllm_connection(standin.url, standin.model))
    run = RunTasks(_one_document(tmp_path))
    (batch,) = run.plan()
    assert constructions["resolved from Params"] == 1
    constructions.clear()

    # As a worker runs a convert instance: its pre_execute, then its body, with one context.
    ctx = run.ctx("convert", map_index=0)
    ctx["task"] = SimpleNamespace(op_kwargs={"batch": batch}, execution_timeout=None)
    tasks.limit_convert_time(ctx)
    assert tasks.convert_body(ctx, batch)["converted"] == 1
    once = {"Storage": 1, "RunFolder": 1, "Ledger": 1, "resolved run read": 1}
    assert constructions == Counter(once)

    constructions.clear()
    assert run.publish()["converted"] == 1
    assert constructions == Counter(once)
