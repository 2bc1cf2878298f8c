"""The provider package as Airflow sees it, and the task glue the DAGs share (``provider.flow`` and below).

The task bodies run in this process with a hand-built context (``tests.task_context``) that states the
run type, data interval and triggering asset events: what the tasks make of them. That the scheduler,
a backfill and the triggerer give real runs exactly these is tested in ``tests/deployment/``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset, RetryAction
from airflow.sdk.exceptions import AirflowFailException, ParamValidationError, TaskDeferred

from olmocr_tasks.core.errors import (
    ConfigurationError,
    ServerMisconfigured,
    ServerNotReady,
    ServerUnavailable,
    StorageError,
)
from olmocr_tasks.core.formats import FORMATS, ordered_formats
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.manifest import DocumentEntry, Manifest
from olmocr_tasks.provider import flow, hooks, run_requests, tasks
from olmocr_tasks.provider import params as dag_params
from olmocr_tasks.provider.operators import CheckVllmServerOperator
from olmocr_tasks.provider.triggers import VllmReadyTrigger
from olmocr_tasks.run.planning import batch_label
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.storage.store import ObjectInfo, Storage
from olmocr_testkit.airflow_env import REPO_ROOT, aws_connection, base_env
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.manifests import load_whole
from tests.fixtures.s3 import DUMMY_KEY, DUMMY_SECRET, REGION
from tests.task_context import RunTasks, context

H = datetime(2026, 3, 1, 10, tzinfo=UTC)
H1 = datetime(2026, 3, 1, 11, tzinfo=UTC)
H0 = datetime(2026, 3, 1, 9, tzinfo=UTC)


def test_airflow_lists_the_provider_and_its_connection_type(tmp_path: Path) -> None:
    """What Admin → Providers and the connection form are built from, in a fresh Airflow process."""
    script = """
import json
from airflow.providers_manager import ProvidersManager
pm = ProvidersManager()
print(json.dumps({
    "providers": {name: info.version for name, info in pm.providers.items()},
    "hooks": {k: v.hook_class_name for k, v in pm.hooks.items() if v is not None},
    "behaviours": sorted(pm.field_behaviours),
    "widgets": sorted(pm.connection_form_widgets),
}))
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=base_env(tmp_path),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "olmocr-airflow" in report["providers"]
    assert report["hooks"]["olmocr_vllm"] == "olmocr_tasks.provider.hooks.VllmHook"
    assert "olmocr_vllm" in report["behaviours"]
    assert {"extra__olmocr_vllm__model", "extra__olmocr_vllm__replicas"} <= set(report["widgets"])
    hedging = {f"extra__olmocr_vllm__{name}" for name in ("hedge_requests", "hedge_min_delay_s", "hedge_multiple")}
    assert hedging <= set(report["widgets"])


# ------------------------------------------------------------------------------- run resolution


@pytest.mark.parametrize(
    ("scope", "run_type", "interval", "expected"),
    [
        # One interval of lookback by default: late and multipart uploads are seen by the next run.
        ("auto", "scheduled", (H, H1), (H0, H1)),
        ("interval", "scheduled", (H, H1), (H0, H1)),
        # Only scheduled runs look back: a backfill lists after the fact, and its runs of adjacent
        # intervals run at once (overlapping windows would convert one PDF twice).
        ("auto", "backfill", (H, H1), (H, H1)),
        ("auto", "manual", (H, H1), (None, None)),
        ("auto", "asset_triggered", (None, None), (None, None)),
        ("auto", "manual", (None, None), (None, None)),
        ("auto", "scheduled", (H, H), (None, None)),
        ("interval", "manual", (H, H1), (H, H1)),
        ("all", "scheduled", (H, H1), (None, None)),
    ],
)
def test_resolve_window(scope: str, run_type: str, interval: tuple[Any, Any], expected: tuple[Any, Any]) -> None:
    assert run_requests.resolve_window(scope, run_type, *interval) == expected


def test_the_lookback_is_counted_in_intervals() -> None:
    assert run_requests.resolve_window("auto", "scheduled", H, H1, 0) == (H, H1)
    assert run_requests.resolve_window("auto", "scheduled", H, H1, 2.5) == (H0 - (H1 - H) * 1.5, H1)
    assert run_requests.resolve_window("auto", "backfill", H, H1, 2.5) == (H, H1)


@pytest.mark.parametrize("interval", [(None, None), (H, H)])
def test_interval_scope_without_an_interval_is_a_clear_error(interval: tuple[Any, Any]) -> None:
    with pytest.raises(ConfigurationError, match="needs a data interval"):
        run_requests.resolve_window("interval", "asset_triggered", *interval)


def test_unknown_scope_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="scope must be one of"):
        run_requests.resolve_window("yesterday", "manual", None, None)


@pytest.fixture
def vllm_conn(monkeypatch: pytest.MonkeyPatch) -> None:
    value = {"conn_type": "olmocr_vllm", "host": "vllm.test", "port": 8000, "extra": {"model": "m/1"}}
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", json.dumps(value))


@pytest.mark.usefixtures("vllm_conn")
def test_build_request_for_a_scheduled_run_uses_its_interval() -> None:
    ctx = context(
        {"input_uri": "s3://b/in/", "output_uri": "s3://b/out/", "max_concurrent_requests": 7},
        run_type="scheduled",
        interval=(H, H1),
    )
    request = run_requests.build_request(ctx)
    assert (request.modified_after, request.modified_until) == (H0, H1)
    assert request.documents is None
    assert request.run_id == "olmocr_ingest__scheduled__2026-03-01T10:00:00+00:00"
    assert request.settings.server.connection.base_urls == ("http://vllm.test:8000/v1",)
    assert request.settings.server.connection.model == "m/1"
    assert request.settings.server.concurrency.max_concurrent_requests == 7
    assert request.settings.max_page_error_rate == 0.004
    assert request.run_settings == RunSettings(max_document_error_rate=0.05, max_failed_attempts=3)


@pytest.mark.usefixtures("vllm_conn")
def test_build_request_for_an_asset_or_rest_run_without_logical_date() -> None:
    ctx = context({"input_uri": "/data/in", "output_uri": "/data/out"}, run_type="asset_triggered")
    request = run_requests.build_request(ctx)
    assert (request.modified_after, request.modified_until) == (None, None)
    explicit = run_requests.build_request(ctx, documents=["s3://b/in/a b.pdf"])
    assert explicit.documents == ("s3://b/in/a b.pdf",)


@pytest.mark.usefixtures("vllm_conn")
def test_build_request_with_a_documents_param_needs_no_input_and_ignores_the_scope() -> None:
    ctx = context(
        {"input_uri": None, "output_uri": "/o", "documents": ["/d/x.pdf"], "scope": "interval", "reprocess": True}
    )
    request = run_requests.build_request(ctx)
    assert request.documents == ("/d/x.pdf",)
    assert request.reprocess is True
    assert request.modified_after is None


@pytest.mark.usefixtures("vllm_conn")
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"input_uri": "/i", "output_uri": None}, "no output"),
        ({"input_uri": None, "output_uri": "/o"}, "no input"),
        ({"input_uri": "/i", "output_uri": "/o", "scope": "interval"}, "needs a data interval"),
    ],
)
def test_build_request_explains_what_is_missing(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        run_requests.build_request(context(params))


@pytest.mark.usefixtures("vllm_conn")
def test_only_the_deployment_lets_a_run_raise_its_own_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """``priority_class`` high and ``max_concurrent_requests`` above the vLLM connection's are refused
    (not clamped: the run fails at plan, saying which setting allows it) unless the workers have
    ``OLMOCR_ALLOW_HIGH_PRIORITY``; lower classes, ``auto`` and smaller windows stay anyone's."""
    monkeypatch.delenv("OLMOCR_ALLOW_HIGH_PRIORITY", raising=False)
    base = {"input_uri": "s3://b/in/", "output_uri": "s3://b/out/"}
    with pytest.raises(ConfigurationError, match=r"priority_class 'high' is refused.*OLMOCR_ALLOW_HIGH_PRIORITY"):
        run_requests.build_request(context(base | {"priority_class": "high"}))
    with pytest.raises(ConfigurationError, match=r"above the vLLM connection's 64.*OLMOCR_ALLOW_HIGH_PRIORITY"):
        run_requests.build_request(context(base | {"max_concurrent_requests": 65}))
    for chosen in ("low", "normal", "auto"):
        run_requests.build_request(context(base | {"priority_class": chosen}))
    # auto still ranks a run that names its documents high: the class is the deployment's rule.
    named = context(base | {"documents": ["s3://b/in/a.pdf"]})
    assert run_requests.run_priority_class(named) == "high"
    for window in (1, 64):
        request = run_requests.build_request(context(base | {"max_concurrent_requests": window}))
        assert request.settings.server.concurrency.max_concurrent_requests == window

    monkeypatch.setenv("OLMOCR_ALLOW_HIGH_PRIORITY", "true")
    high = run_requests.build_request(context(base | {"priority_class": "high", "max_concurrent_requests": 200}))
    assert high.settings.server.concurrency.max_concurrent_requests == 200
    assert high.settings.server.concurrency.priority == -10
    monkeypatch.setenv("OLMOCR_ALLOW_HIGH_PRIORITY", "perhaps")
    with pytest.raises(ConfigurationError, match="OLMOCR_ALLOW_HIGH_PRIORITY must be true or false"):
        run_requests.build_request(context(base | {"priority_class": "high"}))


def test_a_run_asking_for_high_priority_fails_at_plan_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, vllm_conn: None
) -> None:
    monkeypatch.delenv("OLMOCR_ALLOW_HIGH_PRIORITY", raising=False)
    (tmp_path / "in").mkdir()
    run = RunTasks({"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out"), "priority_class": "high"})
    with pytest.raises(AirflowFailException, match="priority_class 'high' is refused"):
        run.plan()
    assert not (tmp_path / "out").exists()


def _manifest_of(statuses: dict[str, int], not_converted: int = 0) -> Manifest:
    documents = [
        DocumentEntry(source=f"s3://b/{status}-{index}.pdf", status=status)  # type: ignore[arg-type]
        for status, count in statuses.items()
        for index in range(count)
    ]
    documents += [
        DocumentEntry(source=f"s3://b/lost-{index}.pdf", status="failed", error_class="not_converted")
        for index in range(not_converted)
    ]
    return Manifest("r", "2026-03-01T10:00:00Z", "2026-03-01T10:00:01Z", {}, "m", "p", "v", {}, "", "", documents)


def test_error_budget_is_judged_from_the_manifest_and_recorded_in_it() -> None:
    ok = _manifest_of({"converted": 96, "failed": 4})
    assert ok.judge_error_budget(0.05) == {"max_document_error_rate": 0.05, "exceeded": False, "problems": []}
    over = _manifest_of({"converted": 90, "failed": 10})
    verdict = over.judge_error_budget(0.05)
    assert verdict["problems"] == ["10 of 100 documents failed (10.0%), over the budget of 5.0%"]
    assert over.to_dict()["error_budget"] == verdict and verdict["exceeded"] is True
    lost = _manifest_of({"converted": 98, "failed": 1}, not_converted=1)
    assert "convert tasks that failed" in lost.judge_error_budget(0.05)["problems"][0]
    assert lost.counts()["not_converted"] == 1
    assert _manifest_of({}).judge_error_budget(0.0)["exceeded"] is False


def test_enforce_reads_the_published_verdict() -> None:
    def ti(summary: dict[str, Any] | None) -> dict[str, Any]:
        return {"ti": SimpleNamespace(xcom_pull=lambda task_ids: summary)}

    verdict = {"max_document_error_rate": 0.05, "exceeded": True, "problems": ["2 of 3 documents failed"]}
    summary = {"manifest": "s3://o/manifests/r.json", "converted": 1, "failed": 2, "skipped": 0}
    with pytest.raises(AirflowFailException, match=r"2 of 3 documents failed .* manifest: s3://o/manifests/r\.json"):
        tasks.enforce_error_budget_body(ti({**summary, "error_budget": verdict}))
    tasks.enforce_error_budget_body(ti({**summary, "error_budget": {**verdict, "exceeded": False, "problems": []}}))
    with pytest.raises(AirflowFailException, match="no manifest was published"):
        tasks.enforce_error_budget_body(ti(None))


def test_event_documents_come_from_the_named_asset_only() -> None:
    def event(key: str) -> SimpleNamespace:
        body = json.dumps(
            {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"}, "object": {"key": key}}}]}
        )
        return SimpleNamespace(
            extra={"from_trigger": True, "payload": {"status": "success", "message_batch": [{"Body": body}]}}
        )

    events = {Asset(name="watched"): [event("a+1.pdf"), event("b.pdf")], Asset(name="other"): [event("c.pdf")]}
    ctx = {"triggering_asset_events": events}
    assert tasks.event_documents_body(ctx, "watched") == ["s3://b/a 1.pdf", "s3://b/b.pdf"]
    assert tasks.event_documents_body(ctx) == ["s3://b/a 1.pdf", "s3://b/b.pdf", "s3://b/c.pdf"]
    assert tasks.event_documents_body({"triggering_asset_events": {}}) == []


def test_storage_options_come_from_the_aws_connection(
    monkeypatch: pytest.MonkeyPatch, moto_server: str, s3_bucket: str
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_server, DUMMY_KEY, DUMMY_SECRET, REGION))
    options = hooks.storage_options()
    assert options["key"] == DUMMY_KEY
    assert options["client_kwargs"] == {"endpoint_url": moto_server, "region_name": REGION}
    storage = hooks.storage_for([f"s3://{s3_bucket}/out/"])
    storage.write_bytes_atomic(f"s3://{s3_bucket}/out/x.json", b"{}")
    assert [info.uri for info in storage.list_objects(f"s3://{s3_bucket}/out/")] == [f"s3://{s3_bucket}/out/x.json"]
    assert DUMMY_SECRET not in repr(storage)


def test_local_uris_never_ask_aws_for_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hooks, "storage_options", lambda *_: pytest.fail("AWS was consulted"))
    source, output = tmp_path / "in", tmp_path / "out"
    storage = hooks.storage_for([str(source), f"file://{output}"])
    # A storage without S3 options that reads and writes both locations.
    assert repr(storage).startswith("Storage(endpoint_url=None,")
    storage.write_bytes_atomic(f"file://{output}/x.json", b"{}")
    storage.write_bytes_atomic(str(source / "a.pdf"), b"%PDF")
    assert (output / "x.json").read_bytes() == b"{}"
    assert storage.read_bytes(str(source / "a.pdf")) == b"%PDF"
    assert [info.uri for info in storage.list_objects(str(source))] == [str(source / "a.pdf")]


@pytest.mark.parametrize(
    ("exception", "action"),
    [
        (ServerUnavailable("down"), RetryAction.RETRY),
        (ServerNotReady("starting"), RetryAction.RETRY),
        (StorageError("503"), RetryAction.RETRY),
        (ServerMisconfigured("HTTP 401"), RetryAction.FAIL),
        (ValueError("bug"), RetryAction.FAIL),
        (ConfigurationError("bad"), RetryAction.FAIL),
    ],
)
def test_tasks_retry_only_infrastructure_failures(exception: Exception, action: RetryAction) -> None:
    policies = [task.kwargs["retry_policy"] for task in (flow.plan, flow.convert, flow.publish_manifest_task)]
    policies.append(CheckVllmServerOperator(task_id="check_server").retry_policy)
    for policy in policies:
        assert policy.evaluate(exception, try_number=1, max_tries=4).action is action


def test_convert_runs_in_the_pool_with_backoff_and_readable_names() -> None:
    kwargs = flow.convert.kwargs
    assert kwargs["pool"] == "olmocr_vllm"
    assert kwargs["retries"] >= 2
    assert kwargs["retry_exponential_backoff"] > 1
    assert kwargs["map_index_template"] == "{{ batch_label }}"


def _source(uri: str) -> SourceDocument:
    return SourceDocument(info=ObjectInfo(uri=uri, size=1, etag=None, last_modified=H), stem="s")


def test_batch_labels() -> None:
    one = [_source("s3://b/inbox/2026/report.pdf")]
    assert batch_label(one, "s3://b/inbox/") == "2026/report.pdf"
    assert batch_label(one, "s3://b/elsewhere/") == "inbox/2026/report.pdf"
    many = [_source(f"/data/in/sub/{name}.pdf") for name in ("a", "m", "z")]
    assert batch_label(many, "/data/in") == "3 documents: a.pdf … z.pdf"
    long = [_source("/in/" + "x" * 300 + ".pdf")]
    assert len(batch_label(long, "/in")) <= 120


def test_params_form() -> None:
    form = dag_params.ingest_params()
    assert list(form) == [
        "input_uri",
        "output_uri",
        "documents",
        "scope",
        "reprocess",
        "lookback_intervals",
        "max_documents",
        "formats",
        "max_page_error_rate",
        "max_document_error_rate",
        "retry_dead_letters",
        "max_failed_attempts",
        "max_concurrent_requests",
        "priority_class",
        "batch_pages",
    ]
    for name, param in form.items():
        assert param.schema.get("title"), name
        assert param.description, name
        assert param.schema.get("section"), name
    assert form["scope"].value == "auto"
    assert form["priority_class"].value == "auto"
    assert form["max_document_error_rate"].value == 0.05
    assert form["max_page_error_rate"].value == 0.004
    # Every format by default; the form offers only the ones we convert, and the run takes them in order.
    assert form["formats"].value == ["pdf", "png", "jpeg", "tiff", "webp"]
    assert form["formats"].resolve(["tiff", "pdf"]) == ["tiff", "pdf"]
    with pytest.raises(ParamValidationError):
        form["formats"].resolve(["gif"])
    assert ordered_formats(["tiff", "pdf"]) == ("pdf", "tiff") and ordered_formats(None) == FORMATS
    events = dag_params.event_params()
    assert "documents" not in events and "scope" not in events
    assert {"output_uri", "reprocess", "max_document_error_rate"} <= set(events)


def test_check_server_fails_fast_on_the_wrong_model(monkeypatch: pytest.MonkeyPatch, standin: StandinServer) -> None:
    value = {"conn_type": "olmocr_vllm", "host": standin.url, "extra": {"model": "other/model"}}
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", json.dumps(value))
    check = CheckVllmServerOperator(task_id="check_server")
    with pytest.raises(AirflowFailException, match="configured model is other/model"):
        check.execute({})
    value["extra"] = {"model": standin.model}
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", json.dumps(value))
    assert standin.model in check.execute({})


def test_check_server_defers_to_the_trigger_while_the_server_is_down(
    monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    value = {"conn_type": "olmocr_vllm", "host": f"http://127.0.0.1:{closed_port}/v1"}
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", json.dumps(value))
    monkeypatch.setenv("OLMOCR_SERVER_READY_TIMEOUT", "600")
    check = CheckVllmServerOperator(task_id="check_server")
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        check.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, VllmReadyTrigger) and deferred.value.method_name == "execute_complete"
    assert trigger.conn_id == "olmocr_vllm"
    # The deadline is absolute, OLMOCR_SERVER_READY_TIMEOUT after the check (serialized with the trigger).
    assert before + 600 <= trigger.serialize()[1]["deadline"] <= time.time() + 600
    # What the resumed task makes of the trigger's events.
    assert check.execute_complete({}, {"status": "ready", "models": ["m"], "not_ready": []}) == ["m"]
    with pytest.raises(AirflowFailException, match="HTTP 401"):
        check.execute_complete({}, {"status": "misconfigured", "message": "HTTP 401"})
    with pytest.raises(ServerNotReady) as timed_out:
        check.execute_complete({}, {"status": "timeout", "message": "refused"})
    assert check.retry_policy.evaluate(timed_out.value, try_number=1, max_tries=2).action is RetryAction.RETRY


@pytest.mark.parametrize("raw", ["soon", "0", "-5"])
def test_a_bad_ready_timeout_fails_the_check_saying_so(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", json.dumps({"conn_type": "olmocr_vllm", "host": "vllm"}))
    monkeypatch.setenv("OLMOCR_SERVER_READY_TIMEOUT", raw)
    with pytest.raises(AirflowFailException, match="OLMOCR_SERVER_READY_TIMEOUT"):
        CheckVllmServerOperator(task_id="check_server").execute({})


def _sparse_pdfs(folder: Path, count: int, size: int) -> None:
    # Planning reads listings only, so sparse files of the right size stand in for large PDFs.
    folder.mkdir()
    for index in range(count):
        with open(folder / f"big-{index}.pdf", "wb") as handle:
            handle.truncate(size)


class _TaskInstance(SimpleNamespace):
    """The ``ti`` of a task context: its try number and the XComs it pushes."""

    def __init__(self, try_number: int = 1) -> None:
        super().__init__(try_number=try_number, pushed={})

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return None


@pytest.mark.usefixtures("vllm_conn")
def test_plan_gives_large_documents_their_own_instance(tmp_path: Path) -> None:
    _sparse_pdfs(tmp_path / "in", 3, 3 * 1024 * 1024)
    ti = _TaskInstance()
    ctx = context({"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")}, ti=ti)
    descriptors = tasks.plan_body(ctx)
    assert sorted(d["label"] for d in descriptors) == ["big-0.pdf", "big-1.pdf", "big-2.pdf"]
    assert [d["batch"] for d in descriptors] == ["b00000", "b00001", "b00002"]
    assert {d["plan"] for d in descriptors} == {ti.pushed[tasks.PLAN_ID_XCOM]}


@pytest.mark.usefixtures("vllm_conn")
def test_plan_packs_documents_within_max_map_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _sparse_pdfs(tmp_path / "in", 5, 3 * 1024 * 1024)
    output = tmp_path / "out"
    run_dir = output / "_runs" / "olmocr_ingest__manual__2026-03-01T10_00_00+00_00"
    # What an earlier planning of the same run left must not reach this plan's manifest.
    (run_dir / "p1-00000000" / "attempts" / "b00007" / "try-0001").mkdir(parents=True)
    (run_dir / "p1-00000000" / "attempts" / "b00007" / "try-0001" / "part.json").write_text("[]")
    monkeypatch.setattr(run_requests, "max_map_length", lambda: 2)
    ti = _TaskInstance(try_number=2)

    descriptors = tasks.plan_body(context({"input_uri": str(tmp_path / "in"), "output_uri": str(output)}, ti=ti))

    assert 1 <= len(descriptors) <= 2
    assert sum(d["documents"] for d in descriptors) == 5
    packed = [d for d in descriptors if d["documents"] > 1]
    assert packed
    assert all(re.fullmatch(r"\d+ documents: big-\d\.pdf … big-\d\.pdf", d["label"]) for d in packed)
    assert len(json.dumps(descriptors)) < 500
    plan_id = ti.pushed[tasks.PLAN_ID_XCOM]
    assert plan_id.startswith("p2-")
    assert not [path for path in (run_dir / "p1-00000000").rglob("*") if path.is_file()]
    batch_files = sorted(path.name for path in (run_dir / plan_id / "batches").iterdir())
    assert batch_files == [f"{d['batch']}.json" for d in descriptors]
    listed = [
        item["uri"]
        for d in descriptors
        for item in json.loads((run_dir / plan_id / "batches" / f"{d['batch']}.json").read_text())
    ]
    assert sorted(listed) == sorted(str(tmp_path / "in" / f"big-{i}.pdf") for i in range(5))


@pytest.fixture
def standin_conn(monkeypatch: pytest.MonkeyPatch, standin: StandinServer) -> StandinServer:
    extra = {"model": standin.model, "gpu_hour_price": 3.6}
    monkeypatch.setenv(
        "AIRFLOW_CONN_OLMOCR_VLLM", json.dumps({"conn_type": "olmocr_vllm", "host": standin.url, "extra": extra})
    )
    return standin


def test_a_retried_convert_task_reports_its_batch_and_only_runs_that_converted_announce(
    tmp_path: Path, standin_conn: StandinServer
) -> None:
    from olmocr_testkit import pdfgen

    for doc_id in (1, 2):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(2, doc_id=doc_id))
    run = RunTasks({"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")})
    batches = run.plan()
    for index, batch in enumerate(batches):
        first = tasks.convert_body(run.ctx("convert", try_number=1, map_index=index), batch)
        # Airflow retries the instance (its first try was thought lost after it had converted its batch).
        retry = tasks.convert_body(run.ctx("convert", try_number=2, map_index=index), batch)
        assert (
            (first["converted"], first["pages"])
            == (retry["converted"], retry["pages"])
            == (batch["documents"], 2 * batch["documents"])
        )
    summary = run.publish()
    manifest = load_whole(summary["manifest"])
    assert manifest["counts"]["converted"] == 2 and manifest["counts"]["pages"] == 4
    assert {doc["task"]["try_number"] for doc in manifest["documents"]} == {1}
    # The connection's GPU-hour price reaches the manifest of an Airflow run.
    assert manifest["metrics"]["cost"]["gpu_hour_price"] == 3.6
    # Each batch's part carries the GPU-busy seconds its convert process measured from /metrics (the
    # retry carrying its first try's forward), so publish charges those rather than the wall clock.
    assert manifest["gpu_busy"]["measured"] and manifest["metrics"]["cost"]["basis"] == "vllm_metrics_busy"
    ((asset, extra),) = run.outlets[tasks.OUTPUTS_ALIAS].added
    assert asset == tasks.OUTPUTS_ASSET and extra["converted"] == 2 and extra["manifest"] == summary["manifest"]

    nothing_new = RunTasks(run.params, run_type="scheduled")
    # Nothing to convert is still one (empty) batch: a mapped task expanded to nothing is skipped,
    # and Airflow does not map it again when such a run is cleared.
    (empty,) = nothing_new.plan()
    assert (empty["documents"], empty["label"]) == (0, "nothing to convert")
    no_op = tasks.convert_body(nothing_new.ctx("convert", map_index=0), empty)
    assert (no_op["converted"], no_op["failed"], no_op["pages"]) == (0, 0, 0)
    published = nothing_new.publish()
    assert published["converted"] == 0 and published["already_converted"] == 2
    assert Path(published["manifest"]).is_file()
    assert nothing_new.outlets[tasks.OUTPUTS_ALIAS].added == []


def test_a_cleared_run_never_maps_fewer_convert_instances_than_its_previous_pass(
    tmp_path: Path, standin_conn: StandinServer
) -> None:
    # Airflow 3.3 marks a cleared run's convert instances beyond the previous pass's length REMOVED and
    # never maps them again: a pass shorter than the last would strand the batches of a later, longer one.
    from olmocr_testkit import pdfgen

    for doc_id in (1, 2, 3):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    params = {"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out"), "batch_pages": 1}
    run = RunTasks(params)
    first = run.plan()
    assert [batch["documents"] for batch in first] == [1, 1, 1]
    for index, batch in enumerate(first):
        tasks.convert_body(run.ctx("convert", map_index=index), batch)
    run.publish()
    # The run is cleared and planned again: nothing is left to convert, yet it maps as many instances.
    again = run.plan()
    assert [batch["documents"] for batch in again] == [0, 0, 0]
    assert len({batch["plan"] for batch in again} | {batch["plan"] for batch in first}) == 2
    assert run.xcom["plan", tasks.PLAN_ID_XCOM] == again[0]["plan"]
    for index, batch in enumerate(again):
        assert tasks.convert_body(run.ctx("convert", try_number=2, map_index=index), batch)["converted"] == 0
    published = run.publish()
    assert (published["converted"], published["already_converted"]) == (0, 3)


def test_backfill_runs_plan_only_their_own_interval_and_scheduled_runs_look_back(
    tmp_path: Path, standin_conn: StandinServer
) -> None:
    from olmocr_testkit import pdfgen

    inbox = tmp_path / "in"
    for name, modified in (("first.pdf", H0 + timedelta(minutes=30)), ("second.pdf", H + timedelta(minutes=30))):
        pdfgen.write_pdf(inbox / name, pdfgen.text_pdf(1, doc_id=len(name)))
        os.utime(inbox / name, (modified.timestamp(), modified.timestamp()))
    params = {"input_uri": str(inbox), "output_uri": str(tmp_path / "out"), "lookback_intervals": 1}

    def planned(run_type: str, interval: tuple[datetime, datetime]) -> list[str]:
        run = RunTasks(params, run_type=run_type, interval=interval)
        run.plan()
        plan_id = run.xcom["plan", tasks.PLAN_ID_XCOM]
        folder = tasks.planned_run(run.ctx("publish_manifest"), plan_id).folder
        batches = folder.read_plan().batch_keys
        return sorted(Path(source.uri).name for key in batches for source in folder.read_batch(key))

    # Backfill runs of adjacent intervals run at the same time: each lists only its own interval.
    assert planned("backfill", (H0, H)) == ["first.pdf"]
    assert planned("backfill", (H, H1)) == ["second.pdf"]
    # A scheduled run also lists the interval before its own (a late upload the last run missed).
    assert planned("scheduled", (H, H1)) == ["first.pdf", "second.pdf"]


def test_a_rejected_api_key_fails_the_convert_task_without_retries(tmp_path: Path, standin_conn: StandinServer) -> None:
    from olmocr_testkit import pdfgen

    pdfgen.write_pdf(tmp_path / "in" / "d.pdf", pdfgen.text_pdf(1, doc_id=1))
    run = RunTasks({"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")})
    (batch,) = run.plan()
    standin_conn.configure(api_key="rotated-while-the-run-was-queued")
    with pytest.raises(AirflowFailException, match=r"rejected this task: .*HTTP 401"):
        tasks.convert_body(run.ctx("convert"), batch)
    # The manifest says why the document was not converted, and it stays for later runs to retry.
    (entry,) = load_whole(run.publish()["manifest"])["documents"]
    assert (entry["status"], entry["error_class"]) == ("failed", "not_converted")
    assert "refused this run" in entry["error"] and "HTTP 401" in entry["error"]


def test_convert_refuses_a_server_that_does_not_serve_the_connections_model(
    tmp_path: Path, standin_conn: StandinServer
) -> None:
    # The idempotency key is the model: output of another model must not be filed under this one. plan
    # runs beside check_server and needs no server; each convert instance checks the model before a page.
    from olmocr_testkit import pdfgen

    pdfgen.write_pdf(tmp_path / "in" / "d.pdf", pdfgen.text_pdf(1, doc_id=1))
    run = RunTasks({"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")})
    (batch,) = run.plan()
    connection_model = standin_conn.model
    assert standin_conn.configure(model="olmocr-cpu-tesseract")["model"] != connection_model
    requests_before = standin_conn.stats()["total"]
    with pytest.raises(AirflowFailException, match=r"rejected this task: .*olmocr-cpu-tesseract"):
        tasks.convert_body(run.ctx("convert"), batch)
    assert standin_conn.stats()["total"] == requests_before, "a page was sent to the wrong model"
    assert not (tmp_path / "out" / "markdown").exists()


def test_each_convert_instance_gets_a_time_limit_from_its_pages_and_the_request_timeouts() -> None:
    from olmocr_tasks.core.config import ConversionSettings, ServerSettings
    from olmocr_tasks.run.pipeline import convert_time_limit

    settings = ConversionSettings(server=ServerSettings(max_concurrent_requests=64))
    one_page = convert_time_limit(1, 1, settings)
    # Every page's eight attempts at the read timeout, plus one outage, the readiness wait and a render limit.
    assert one_page.total_seconds() == 60 + 180 + 120 + 8 * (300 + 10) + 120
    assert convert_time_limit(64, 1, settings) == one_page  # one request window
    assert convert_time_limit(65, 1, settings) - one_page == timedelta(seconds=8 * 310)
    assert convert_time_limit(3000, 40, settings) > convert_time_limit(3000, 1, settings)


@pytest.mark.usefixtures("vllm_conn")
def test_convert_sets_its_own_execution_timeout_before_it_runs(tmp_path: Path) -> None:
    from olmocr_testkit import pdfgen

    pdfgen.write_pdf(tmp_path / "in" / "a.pdf", pdfgen.text_pdf(1, doc_id=1))
    run = RunTasks({"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")})
    (batch,) = run.plan()
    task = SimpleNamespace(op_kwargs={"batch": batch | {"documents": 2, "pages": 130}}, execution_timeout=None)
    ctx = run.ctx("convert") | {"task": task}
    tasks.limit_convert_time(ctx)
    assert task.execution_timeout is not None and task.execution_timeout > timedelta(hours=2)
    assert flow.convert.kwargs["pre_execute"] is tasks.limit_convert_time
    # The settings come from the plan, read once for the attempt: its body works from the same.
    assert ctx[tasks.PLANNED_RUN_KEY].plan_id == batch["plan"]


def test_plan_body_redrives_failures_of_an_earlier_interval(tmp_path: Path, standin_conn: StandinServer) -> None:
    from olmocr_testkit import pdfgen

    inbox, output = tmp_path / "inbox", tmp_path / "out"
    for name, data in (("good.pdf", pdfgen.text_pdf(1, 61)), ("broken.pdf", pdfgen.not_a_pdf())):
        pdfgen.write_pdf(inbox / name, data)
        moment = (H + timedelta(minutes=5)).timestamp()
        os.utime(inbox / name, (moment, moment))
    # No lookback, so the second interval discovers nothing of its own: only re-driving can find broken.pdf.
    params = {
        "input_uri": str(inbox),
        "output_uri": str(output),
        "max_document_error_rate": 1.0,
        "lookback_intervals": 0,
    }
    manifests = []
    for start in (H, H1):
        run = RunTasks(params, run_type="scheduled", interval=(start, start + timedelta(hours=1)))
        run.plan()
        run.convert_all()
        manifests.append(load_whole(run.publish()["manifest"]))
    first, second = ({doc["source"]: doc for doc in manifest["documents"]} for manifest in manifests)
    assert {Path(source).name: doc["status"] for source, doc in first.items()} == {
        "good.pdf": "converted",
        "broken.pdf": "failed",
    }
    (again,) = second.values()
    assert (Path(again["source"]).name, again["error_class"], again["failed_attempts"]) == ("broken.pdf", "not_pdf", 2)


def _s3_event(bucket: str, *messages: list[tuple[str, str]]) -> dict[str, Any]:
    """The ``extra`` of one asset event from the SQS watcher: a batch of messages of S3 records."""

    def body(records: list[tuple[str, str]]) -> str:
        return json.dumps(
            {
                "Records": [
                    {
                        "eventSource": "aws:s3",
                        "eventName": name,
                        "s3": {"bucket": {"name": bucket}, "object": {"key": key}},
                    }
                    for name, key in records
                ]
            }
        )

    batch = [{"MessageId": str(number), "Body": body(records)} for number, records in enumerate(messages)]
    return {"from_trigger": True, "payload": {"status": "success", "message_batch": batch}}


def test_event_dag_plan_body_converts_exactly_the_objects_its_triggering_events_created(
    monkeypatch: pytest.MonkeyPatch,
    standin_conn: StandinServer,
    moto_server: str,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
) -> None:
    from olmocr_testkit import pdfgen

    storage = Storage(s3_storage_options)
    for key, data in {
        "inbox/a b+c.pdf": pdfgen.text_pdf(1, 31),
        "inbox/x.pdf": pdfgen.text_pdf(1, 32),
        "inbox/untouched.pdf": pdfgen.text_pdf(1, 33),
        "inbox/notes.txt": b"text",
    }.items():
        storage.write_bytes_atomic(f"s3://{s3_bucket}/{key}", data)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_connection(moto_server, DUMMY_KEY, DUMMY_SECRET, REGION))
    inbox, output = f"s3://{s3_bucket}/inbox/", f"s3://{s3_bucket}/out/"
    # The deployment configures its locations; the allow-lists default to them.
    monkeypatch.setenv("OLMOCR_INPUT_URI", inbox)
    monkeypatch.setenv("OLMOCR_OUTPUT_URI", output)
    first = _s3_event(
        s3_bucket,
        # S3 URL-encodes keys ("+" is a space); a removal is not a new document.
        [("ObjectCreated:Put", "inbox/a+b%2Bc.pdf"), ("ObjectRemoved:Delete", "inbox/gone.pdf")],
        [],
        [("ObjectCreated:Put", "inbox/a+b%2Bc.pdf"), ("ObjectCreated:Put", "inbox/notes.txt")],
    )
    # S3's test event when notifications are configured names no object.
    first["payload"]["message_batch"][1]["Body"] = json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"})
    second = _s3_event(s3_bucket, [("ObjectCreated:CompleteMultipartUpload", "inbox/x.pdf")])
    run = RunTasks(
        {"input_uri": inbox, "output_uri": output},
        run_type="asset_triggered",
        dag_id="olmocr_s3_events",
        event_asset="olmocr_s3_object_created",
        events=[first, second],
    )
    run.plan()
    run.convert_all()
    manifest = load_whole(run.publish()["manifest"], storage)
    docs = {doc["source"]: doc for doc in manifest["documents"]}
    assert set(docs) == {f"s3://{s3_bucket}/inbox/a b+c.pdf", f"s3://{s3_bucket}/inbox/x.pdf"}
    assert {doc["status"] for doc in docs.values()} == {"converted"}
    # The events are read inside plan: every XCom stays a small reference, whatever the events name.
    assert all(len(json.dumps(value)) < 4096 for value in run.xcom.values())


def test_publish_measures_the_convert_instances_and_the_next_plan_sizes_instances_by_it(
    tmp_path: Path, standin_conn: StandinServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """publish_manifest measures the run's instances from their XCom timings and keeps the result per
    conversion key; the next run's plan sizes its instances by it instead of by the request window."""
    from olmocr_tasks.location.layout import OutputLocation
    from olmocr_tasks.run import instance_costs
    from olmocr_testkit import pdfgen

    monkeypatch.setenv("OLMOCR_CONVERT_SLOTS", "2")
    for name in ("OLMOCR_BATCH_PAGES", "OLMOCR_INSTANCE_OVERHEAD", "OLMOCR_LOW_CLASS_WAVES"):
        monkeypatch.delenv(name, raising=False)
    for doc_id in range(40):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    params = {"input_uri": str(tmp_path / "in"), "output_uri": str(tmp_path / "out")}
    first = RunTasks(params)
    # No measurement yet: the request window (64 pages) makes one wave of the two slots.
    assert [batch["documents"] for batch in first.plan()] == [20, 20]
    # Two slots, each instance 8 ms not converting and 2 s converting 64 pages (a measurable instance
    # fills its request window).
    first.xcom["convert", "return_value"] = [
        {
            "pages": 64,
            "timing": {"started": 1000.0 + 2.008 * turn, "converting_s": 2.0, "ended": 1002.008 + 2.008 * turn},
        }
        for turn in range(2)
        for _slot in range(2)
    ]
    first.publish()
    state = OutputLocation(str(tmp_path / "out")).state(
        run_requests.build_request(first.ctx("publish_manifest")).conversion_key
    )
    costs = instance_costs.load(Storage(), state)
    assert costs is not None
    assert (costs.instances, costs.concurrency, costs.fixed_cost_s, costs.pages_per_s) == (4, 2, 0.008, 32.0)
    # 8 ms may be a twentieth of the slot's time (the default): 0.152 s of converting at 32 pages/s.
    assert costs.min_pages(0.05) == 5
    # 40 pages in waves of 2 slots x 5 pages: 8 instances of 5 documents instead of two of 20.
    sizes = [batch["documents"] for batch in RunTasks(params).plan()]
    assert sizes == [5] * 8, sizes
    # The run's own size and OLMOCR_BATCH_PAGES still win over the measurement.
    # (The same DAG run planned again maps no fewer instances than before: empty ones fill the gap.)
    assert [batch["documents"] for batch in RunTasks(params | {"batch_pages": 10}).plan() if batch["documents"]] == [
        10
    ] * 4
    monkeypatch.setenv("OLMOCR_INSTANCE_OVERHEAD", "1.5")
    with pytest.raises(AirflowFailException, match="OLMOCR_INSTANCE_OVERHEAD"):
        RunTasks(params).plan()


def test_the_batching_rule_caps_waves_only_while_sized_by_the_window_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from olmocr_tasks.run.batching import UNMEASURED_MAX_PAGES, UNMEASURED_MAX_WAVES
    from olmocr_tasks.run.instance_costs import InstanceCosts
    from olmocr_tasks.run.request import RunRequest

    for name in ("OLMOCR_BATCH_PAGES", "OLMOCR_INSTANCE_OVERHEAD", "OLMOCR_LOW_CLASS_WAVES"):
        monkeypatch.delenv(name, raising=False)
    request = RunRequest(input_uri="/in", output_uri="/out", run_id="r")
    window = run_requests.batching_rule({}, request, "normal")
    assert (window.min_pages, window.max_waves, window.max_pages) == (64, UNMEASURED_MAX_WAVES, UNMEASURED_MAX_PAGES)
    measured = run_requests.batching_rule({}, request, "normal", InstanceCosts(2.0, 8.0, 2, 4))
    # 38 s of converting at 8 pages/s.
    assert (measured.min_pages, measured.max_waves, measured.max_pages) == (304, None, None)
    named = run_requests.batching_rule({"batch_pages": 10}, request, "normal")
    assert (named.min_pages, named.max_waves, named.max_pages) == (10, None, None)
    monkeypatch.setenv("OLMOCR_BATCH_PAGES", "32")
    assert run_requests.batching_rule({}, request, "normal").max_waves is None
