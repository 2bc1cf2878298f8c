"""The DAGs on a real Airflow: DagBag integrity, structure, and whole manual runs with ``dag.test()``.

Runs go through ``olmocr_testkit.airflow_env`` (one subprocess per DAG run, SQLite metadata DB, the vLLM
stand-in, S3 on the moto server) and are judged by what they leave behind: the manifest and outputs
they publish, the run's state, task states and XCom sizes in the metadata DB, asset events.

``dag.test`` creates manual runs only, and these tests use it for what a manual run shows: the task
graph end to end, the outputs asset event, error budgets, a documents list, a wrong model. The
other trigger paths run through a real scheduler, triggerer and Celery workers in ``tests/deployment/``:
scheduled runs and their data interval in ``test_scheduled.py``, backfills (each interval its own PDFs,
a second backfill converting nothing, the ``reprocess`` Param) in ``test_backfill.py`` and
``test_ui_backfill.py``, S3 notifications through SQS in ``test_events.py``, REST-triggered runs in
``test_rest_trigger.py``. What the tasks make of a run type, an interval or triggering events (the
lookback, re-driving an earlier interval's failures, event documents into the plan) is tested on the
task bodies in ``test_provider.py``.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from olmocr_tasks.location.layout import safe_run_id
from olmocr_tasks.storage.store import Storage
from olmocr_testkit.airflow_env import REPO_ROOT, AirflowEnv, DagTestResult, base_env
from olmocr_testkit.pdfgen import not_a_pdf, text_pdf
from tests.fixtures.manifests import load_whole
from tests.fixtures.s3 import DUMMY_KEY, DUMMY_SECRET, REGION

# Beyond a few KB an XCom is carrying data, not references.
MAX_XCOM_BYTES = 4096


# ----------------------------------------------------------------------------------- integrity

_DAGBAG_REPORT = """
import json, os
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
events = bag.dags.get("olmocr_s3_events")
assets = list(events.timetable.asset_condition.objects) if events else []
watcher = assets[0].watchers[0] if assets else None
ingest = bag.dags.get("olmocr_ingest")
print(json.dumps({
    "errors": {path: str(error) for path, error in bag.import_errors.items()},
    "dags": sorted(bag.dags),
    "schedule": ingest.timetable.expression if ingest else None,
    "max_active_runs": ingest.max_active_runs if ingest else None,
    "convert_retry_delay_s": ingest.get_task("convert").retry_delay.total_seconds() if ingest else None,
    # MessageQueueTrigger(scheme="sqs") must resolve to the amazon provider's trigger.
    "trigger": type(watcher.trigger.trigger).__name__ if watcher else None,
    "queue": watcher.trigger.trigger.sqs_queue if watcher else None,
}))
"""


def _dagbag_report(env: dict[str, str], cwd: Path) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", _DAGBAG_REPORT],
        # Airflow's 30 s import timeout is a hang guard; on a loaded 2-core machine importing the DAG
        # files (Airflow, the providers) has taken longer, and the test is about what they define.
        env={"AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "240"} | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_retry_delay_that_is_no_number_is_an_import_error_naming_the_setting(tmp_path: Path) -> None:
    report = _dagbag_report(base_env(tmp_path) | {"OLMOCR_CONVERT_RETRY_DELAY": "soon"}, tmp_path)
    assert "olmocr_ingest" not in report["dags"]
    assert any(
        "OLMOCR_CONVERT_RETRY_DELAY must be a number of seconds, not 'soon'" in error
        for error in report["errors"].values()
    ), report["errors"]


@pytest.mark.parametrize("configured", [False, True], ids=["defaults", "configured"])
def test_dagbag_imports_every_dag_without_errors(tmp_path: Path, configured: bool) -> None:
    env = base_env(tmp_path)
    if configured:
        env |= {
            "OLMOCR_SQS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/123456789012/pdf-events",
            "OLMOCR_SCHEDULE": "*/15 * * * *",
            "OLMOCR_MAX_ACTIVE_RUNS": "5",
            "OLMOCR_CONVERT_RETRY_DELAY": "7.5",
        }
    report = _dagbag_report(env, tmp_path)
    assert report["errors"] == {}
    assert report["dags"] == ["olmocr_ingest", "olmocr_maintenance", "olmocr_s3_events"]
    assert report["trigger"] == "SqsSensorTrigger"
    if configured:
        assert report["schedule"] == "*/15 * * * *"
        assert report["max_active_runs"] == 5
        assert report["convert_retry_delay_s"] == 7.5
        assert report["queue"].endswith("/pdf-events")
    else:
        assert report["schedule"] == "0 * * * *"
        assert report["max_active_runs"] == 2
        assert report["convert_retry_delay_s"] == 60
        assert "set-OLMOCR_SQS_QUEUE_URL" in report["queue"]


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag


def _downstream(dag: Any) -> dict[str, set[str]]:
    return {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}


def test_ingest_dag_structure(dagbag: Any) -> None:
    from airflow.sdk import CronDataIntervalTimetable, TriggerRule

    dag = dagbag.dags["olmocr_ingest"]
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.catchup is False

    def upstream(task_id: str) -> set[str]:
        return set(dag.get_task(task_id).get_flat_relative_ids(upstream=True))

    # What the graph must guarantee, read from the DAG itself rather than a copy of its edges: plan
    # (which needs no server) runs beside check_server, nothing that talks to the server or publishes
    # runs before it answers, and the budget is judged last, on the published manifest.
    assert sorted(task.task_id for task in dag.roots) == ["check_server", "plan"]
    assert [task.task_id for task in dag.leaves] == ["enforce_error_budget"]
    assert all(
        "check_server" in upstream(task.task_id) for task in dag.tasks if task.task_id not in ("check_server", "plan")
    )
    assert upstream("enforce_error_budget") == {task.task_id for task in dag.tasks} - {"enforce_error_budget"}
    # convert fans out over what plan returns: one instance per planned batch.
    convert = dag.get_task("convert")
    assert [task.task_id for task in convert.iter_mapped_dependencies()] == ["plan"]
    # publish reads every convert instance's part, and waits for plan directly, not only through
    # convert: a cleared run whose convert had mapped to nothing must not publish an earlier pass's plan.
    assert dag.get_task("publish_manifest").upstream_task_ids == {"plan", "convert"}
    # Deferrable: waits for a starting vLLM in the triggerer, not in a worker slot.
    assert type(dag.get_task("check_server")).__name__ == "CheckVllmServerOperator"
    assert convert.pool == "olmocr_vllm"
    # Summaries travel as one XCom row per task instance, not one per key of the dict.
    assert convert.multiple_outputs is False
    assert dag.get_task("publish_manifest").multiple_outputs is False
    assert convert.map_index_template == "{{ batch_label }}"
    assert dag.get_task("publish_manifest").trigger_rule == TriggerRule.ALL_DONE
    assert dag.get_task("enforce_error_budget").trigger_rule == TriggerRule.ALL_DONE
    # An alias: publish announces on the olmocr_outputs asset only when it converted something.
    assert [outlet.name for outlet in dag.get_task("publish_manifest").outlets] == ["olmocr_outputs_published"]
    assert dag.params["scope"] == "auto"


def test_event_dag_shares_the_conversion_tasks(dagbag: Any) -> None:
    ingest, events = dagbag.dags["olmocr_ingest"], dagbag.dags["olmocr_s3_events"]
    assert _downstream(events) == _downstream(ingest)
    for task_id in _downstream(ingest):
        task = ingest.get_task(task_id)
        same = getattr(task, "python_callable", type(task))
        assert getattr(events.get_task(task_id), "python_callable", type(events.get_task(task_id))) is same
    (asset,) = events.timetable.asset_condition.objects
    (watcher,) = asset.watchers
    assert type(watcher.trigger).__name__ == "MessageQueueTrigger"
    assert watcher.trigger.scheme == "sqs"
    assert watcher.trigger.kwargs["aws_conn_id"] == "aws_default"


# ------------------------------------------------------------------------------------ DAG runs


def _check(result: DagTestResult, expect_success: bool = True) -> None:
    assert result.succeeded is expect_success, f"run {result.state} (exit {result.returncode}):\n{result.tail()}"


def _read_manifest(storage: Storage, output_uri: str, dag_id: str, result: DagTestResult) -> dict[str, Any]:
    assert result.run_id
    uri = f"{output_uri.rstrip('/')}/manifests/{safe_run_id(f'{dag_id}__{result.run_id}')}.json"
    return load_whole(uri, storage)


def _by_source(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {doc["source"]: doc for doc in manifest["documents"]}


def _assert_small_xcom(airflow: AirflowEnv, run_ids: list[str | None]) -> None:
    sizes = [row for row in airflow.xcom_sizes() if row[1] in run_ids]
    assert sizes, "the runs pushed no XCom at all"
    too_big = [row for row in sizes if row[4] > MAX_XCOM_BYTES]
    assert not too_big, too_big


def _asset_events(airflow: AirflowEnv, name: str) -> list[dict[str, Any]]:
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        rows = db.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id",
            (name,),
        ).fetchall()
    return [json.loads(extra) if extra else {} for (extra,) in rows]


def _put(bucket: str, endpoint: str, objects: dict[str, bytes]) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=DUMMY_KEY,
        aws_secret_access_key=DUMMY_SECRET,
    )
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_manual_run_on_s3_announces_its_outputs_and_a_run_with_nothing_new_announces_nothing(
    airflow_env: AirflowEnv, moto_server: str, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    _put(
        s3_bucket,
        moto_server,
        {
            "inbox/a.pdf": text_pdf(2, 1),
            "inbox/nested/B.PDF": text_pdf(1, 2),
            "inbox/notes.txt": b"not a pdf",
        },
    )
    conf = {"input_uri": f"s3://{s3_bucket}/inbox/", "output_uri": f"s3://{s3_bucket}/out/"}
    # Scope "auto" of a manual run: everything under the input.
    first = airflow_env.dag_test("olmocr_ingest", conf=conf)
    _check(first)
    storage = Storage(s3_storage_options)
    manifest = _read_manifest(storage, conf["output_uri"], "olmocr_ingest", first)
    docs = _by_source(manifest)
    assert set(docs) == {f"s3://{s3_bucket}/inbox/a.pdf", f"s3://{s3_bucket}/inbox/nested/B.PDF"}
    assert {doc["status"] for doc in docs.values()} == {"converted"}
    assert manifest["counts"]["pages"] == 3
    assert storage.exists(f"s3://{s3_bucket}/out/markdown/a.md")
    assert storage.exists(f"s3://{s3_bucket}/out/markdown/nested/B.md")
    entry = docs[f"s3://{s3_bucket}/inbox/a.pdf"]
    assert entry["task"]["dag_id"] == "olmocr_ingest"
    assert entry["task"]["task_id"] == "convert"
    assert entry["task"]["run_id"] == first.run_id
    # The outputs asset announces the manifest to downstream DAGs.
    (event,) = [
        e for e in _asset_events(airflow_env, "olmocr_outputs") if e.get("run_id", "").endswith(first.run_id or "")
    ]
    assert event["manifest"].endswith(".json")
    assert event["converted"] == 2

    # A second manual run right after: everything is already converted.
    again = airflow_env.dag_test("olmocr_ingest", conf=conf)
    _check(again)
    manifest = _read_manifest(storage, conf["output_uri"], "olmocr_ingest", again)
    assert manifest["documents"] == []
    assert manifest["counts"]["already_converted"] == 2
    states = airflow_env.task_states("olmocr_ingest", again.run_id or "")
    # Nothing to convert still maps convert once (an empty batch): a run cleared later maps it again.
    assert states[("convert", 0)] == "success"
    assert states[("publish_manifest", -1)] == "success"
    # A run that converted nothing wakes no downstream DAG.
    events = _asset_events(airflow_env, "olmocr_outputs")
    assert [e for e in events if e.get("run_id", "").endswith(again.run_id or "")] == []
    assert states[("enforce_error_budget", -1)] == "success"
    _assert_small_xcom(airflow_env, [first.run_id, again.run_id])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_explicit_documents_list_converts_only_those(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    for doc_id, name in enumerate(("wanted.pdf", "other.pdf"), start=21):
        (inbox / name).write_bytes(text_pdf(1, doc_id))
    missing = str(inbox / "missing.pdf")
    conf = {
        "input_uri": str(inbox),
        "output_uri": str(output),
        "documents": [str(inbox / "wanted.pdf"), missing],
        # The missing document is one failure in two: allow it, this test is about selection.
        "max_document_error_rate": 1.0,
    }
    result = airflow_env.dag_test("olmocr_ingest", logical_date=None, conf=conf)
    _check(result)
    docs = _by_source(_read_manifest(Storage(), str(output), "olmocr_ingest", result))
    assert set(docs) == {str(inbox / "wanted.pdf"), missing}
    assert docs[str(inbox / "wanted.pdf")]["status"] == "converted"
    assert docs[missing]["status"] == "failed"
    assert not (output / "markdown" / "other.md").exists()
    # Each convert instance set its own execution_timeout from its batch before it ran.
    assert "time limit of this attempt" in result.output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_run_over_its_error_budget_fails_after_publishing_the_manifest(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    (inbox / "good.pdf").write_bytes(text_pdf(1, 41))
    (inbox / "bad-1.pdf").write_bytes(not_a_pdf())
    (inbox / "bad-2.pdf").write_bytes(not_a_pdf())
    result = airflow_env.dag_test("olmocr_ingest", conf={"input_uri": str(inbox), "output_uri": str(output)})
    _check(result, expect_success=False)
    assert result.state == "failed"
    manifest = _read_manifest(Storage(), str(output), "olmocr_ingest", result)
    assert manifest["counts"]["converted"] == 1
    assert manifest["counts"]["failed"] == 2
    assert {doc["error_class"] for doc in manifest["documents"] if doc["status"] == "failed"} == {"not_pdf"}
    assert manifest["error_budget"]["exceeded"] is True
    assert manifest["error_budget"]["max_document_error_rate"] == 0.05
    states = airflow_env.task_states("olmocr_ingest", result.run_id or "")
    assert states[("publish_manifest", -1)] == "success"
    assert states[("enforce_error_budget", -1)] == "failed"
    # Document failures are recorded, not raised: every convert instance succeeded.
    assert {state for (task, _), state in states.items() if task == "convert"} == {"success"}
    assert "over the budget of 5.0%" in result.output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_server_serving_another_model_fails_the_run_at_once(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "a.pdf").write_bytes(text_pdf(1, 51))
    conn = json.loads(airflow_env.env["AIRFLOW_CONN_OLMOCR_VLLM"])
    conn["extra"]["model"] = "someone/else"
    airflow = airflow_env.with_env(AIRFLOW_CONN_OLMOCR_VLLM=json.dumps(conn))
    conf = {"input_uri": str(tmp_path / "inbox"), "output_uri": str(tmp_path / "out")}
    result = airflow.dag_test("olmocr_ingest", conf=conf)
    _check(result, expect_success=False)
    states = airflow.task_states("olmocr_ingest", result.run_id or "")
    # A configuration error is not retried: one try, nothing is converted, and the run is red. plan ran
    # beside check_server, so the manifest lists the discovered document as not converted, with why.
    assert states[("check_server", -1)] == "failed"
    assert states[("plan", -1)] == "success"
    assert {state for (task, _), state in states.items() if task == "convert"} == {"upstream_failed"}
    assert states[("enforce_error_budget", -1)] == "failed"
    assert "configured model is someone/else" in result.output
    assert not (tmp_path / "out" / "markdown").exists()
    assert states[("publish_manifest", -1)] == "success"
    (manifest,) = (tmp_path / "out" / "manifests").glob("*.json")
    (entry,) = load_whole(str(manifest))["documents"]
    assert (entry["status"], entry["error_class"]) == ("failed", "not_converted")
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        (tries,) = db.execute(
            "SELECT try_number FROM task_instance WHERE run_id = ? AND task_id = 'check_server'", (result.run_id,)
        ).fetchone()
    assert tries == 1
