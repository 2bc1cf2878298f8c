"""OpenLineage: the objects a run read and wrote, under OpenLineage's standard dataset names.

The naming is checked on its own (``olmocr_tasks.storage.dataset_names``); a real ``olmocr_ingest`` run on local folders
reports its PDFs, outputs and manifest through the file transport; and manifests of two real CLI runs (local
folders, and S3 on moto) feed a DAG whose mapped convert instances and publish task report through
``olmocr_tasks.provider.lineage``, run with ``dag.test()`` and the OpenLineage provider's file
transport, and the emitted events are read back.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
from pathlib import Path
from typing import Any

import boto3
import pytest

from olmocr_tasks.storage.dataset_names import Lineage, asset_uri, batch_lineage, manifest_lineage
from olmocr_tasks.storage.uri import local_path
from olmocr_testkit import pdfgen
from olmocr_testkit.airflow_env import AirflowEnv
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import run_cli
from tests.fixtures.manifests import load_whole

HOST = socket.gethostname()
FAST = ["--read-timeout", "5", "--outage-window", "3", "--ready-timeout", "3"]


# -- naming ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/in/a b.pdf", "s3://bucket/in/a b.pdf"),
        ("/data/in/a.pdf", "file://host1/data/in/a.pdf"),
        ("file:///data/out/a.md", "file://host1/data/out/a.md"),
        ("/data/in/what?#.pdf", "file://host1/data/in/what%3F%23.pdf"),  # no query or fragment cuts the name
        ("gs://bucket/a.pdf", "gs://bucket/a.pdf"),
    ],
)
def test_asset_uris_follow_openlineage_naming(uri: str, expected: str) -> None:
    assert asset_uri(uri, host="host1") == expected


def test_relative_local_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert asset_uri("in/a.pdf", host="h") == f"file://h{tmp_path}/in/a.pdf"


def _entry(source: str, status: str, **outputs: str) -> dict[str, Any]:
    return {"source": source, "status": status, "outputs": outputs}


def test_batch_lineage_reads_converted_and_failed_writes_only_data_outputs() -> None:
    lineage = batch_lineage(
        [
            _entry("s3://in/a.pdf", "converted", dolma="s3://out/dolma/a.jsonl", markdown="s3://out/markdown/a.md"),
            _entry("s3://in/b.pdf", "failed"),
            _entry("s3://in/c.pdf", "skipped", dolma="s3://out/dolma/c.jsonl"),  # already converted earlier
            _entry("s3://in/d.pdf", "converted", dolma="s3://out/dolma/d.jsonl", record="s3://out/_state/d.json"),
        ]
    )
    assert lineage == Lineage(
        inputs=("s3://in/a.pdf", "s3://in/b.pdf", "s3://in/d.pdf"),
        outputs=("s3://out/dolma/a.jsonl", "s3://out/dolma/d.jsonl", "s3://out/markdown/a.md"),
    )


def test_more_objects_than_airflow_keeps_are_reported_by_their_folders() -> None:
    entries = [
        _entry(f"s3://in/{folder}/{n}.pdf", "converted", dolma=f"s3://out/dolma/{folder}/{n}.jsonl")
        for folder in ("x", "y")
        for n in range(3)
    ]
    lineage = batch_lineage(entries, max_assets=5)
    assert lineage.inputs == ("s3://in/x", "s3://in/y")
    assert lineage.outputs == ("s3://out/dolma/x", "s3://out/dolma/y")
    assert lineage.summarised == ("inputs", "outputs")
    # Even the folders are too many: one common folder per bucket.
    assert batch_lineage(entries, max_assets=1).inputs == ("s3://in",)
    assert batch_lineage(entries, max_assets=6).summarised == ()


def test_manifest_lineage_is_the_manifest_written() -> None:
    assert manifest_lineage("/out/manifests/r.json", host="h") == Lineage(outputs=("file://h/out/manifests/r.json",))


# -- through Airflow and the OpenLineage provider -----------------------------------------------------------

PROBE_DAG = """
import json, os
from datetime import datetime

from airflow.sdk import dag, task

from olmocr_tasks.provider.lineage import report_converted, report_published


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def olmocr_lineage_probe():
    @task
    def convert(batch: str) -> None:
        # What the convert task would hand over: its batch's manifest entries.
        report_converted(json.loads(batch))

    @task
    def publish() -> None:
        report_published(os.environ["PROBE_MANIFEST"])

    convert.expand(batch=json.loads(os.environ["PROBE_BATCHES"])) >> publish()


olmocr_lineage_probe()
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _datasets(event: dict[str, Any], side: str) -> set[tuple[str, str]]:
    return {(dataset["namespace"], dataset["name"]) for dataset in event.get(side, [])}


@pytest.mark.slow
def test_convert_instances_and_publish_emit_their_datasets(
    airflow_home: AirflowEnv, standin: StandinServer, s3_env: str, s3_bucket: str, tmp_path: Path
) -> None:
    # Two real runs: local folders, and S3 on moto.
    pdfgen.write_pdf(tmp_path / "in" / "one.pdf", pdfgen.text_pdf(1, doc_id=1))
    (tmp_path / "in" / "broken.pdf").write_bytes(pdfgen.not_a_pdf())
    local = run_cli("convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", "l",
                    *FAST)  # fmt: skip
    assert local.returncode == 1, local.stderr  # the broken file failed, and said so
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="inbox/two.pdf", Body=pdfgen.text_pdf(1, doc_id=2))
    remote = run_cli("convert", f"s3://{s3_bucket}/inbox/", f"s3://{s3_bucket}/out", "--server", standin.url,
                     "--run-id", "s", *FAST)  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    local_docs = load_whole(str(tmp_path / "out" / "manifests" / "l.json"))["documents"]
    s3_manifest = f"s3://{s3_bucket}/out/manifests/s.json"
    s3_docs = load_whole(s3_manifest)["documents"]

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "lineage_probe.py").write_text(textwrap.dedent(PROBE_DAG))
    events_file = tmp_path / "openlineage.jsonl"
    airflow = airflow_home.with_env(
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(events_file), "append": True}),
        AIRFLOW__OPENLINEAGE__NAMESPACE="olmocr-test",
        PROBE_BATCHES=json.dumps([json.dumps(local_docs), json.dumps(s3_docs)]),
        PROBE_MANIFEST=s3_manifest,
    )
    result = airflow.dag_test("olmocr_lineage_probe")
    assert result.succeeded, result.tail()

    complete = {}
    for event in _events(events_file):
        if event["eventType"] == "COMPLETE" and event["job"]["name"].startswith("olmocr_lineage_probe."):
            instance = event["run"]["facets"]["airflow"]["taskInstance"]
            complete[(event["job"]["name"].split(".", 1)[1], instance.get("map_index"))] = event
    assert set(complete) == {("convert", 0), ("convert", 1), ("publish", None)}, sorted(complete)
    assert all(event["job"]["namespace"] == "olmocr-test" for event in complete.values())

    local_ns = f"file://{HOST}"
    converted, broken = (tmp_path / "in" / "one.pdf"), (tmp_path / "in" / "broken.pdf")
    local_in = {(local_ns, str(converted)), (local_ns, str(broken))}
    local_out = {(local_ns, str(tmp_path / "out" / "dolma" / "one.jsonl")),
                 (local_ns, str(tmp_path / "out" / "markdown" / "one.md"))}  # fmt: skip
    s3_ns = f"s3://{s3_bucket}"
    s3_in = {(s3_ns, "inbox/two.pdf")}
    s3_out = {(s3_ns, "out/dolma/two.jsonl"), (s3_ns, "out/markdown/two.md")}
    # dag.test() runs every task in one process, whose lineage collector keeps what earlier tasks
    # reported (a deployed task runs in a process of its own): each event must hold its own task's
    # objects, and the convert instance that ran first none of the other's. Which runs first is
    # dag.test's choice, so the order is read from the events.
    own = {0: (local_in, local_out), 1: (s3_in, s3_out)}
    first, second = sorted(own, key=lambda index: complete[("convert", index)]["eventTime"])
    earlier, later = complete[("convert", first)], complete[("convert", second)]
    # The instance that ran first reports exactly its own objects; the later one exactly its own
    # besides whatever the shared collector still held of the first.
    assert (_datasets(earlier, "inputs"), _datasets(earlier, "outputs")) == own[first]
    carried_in, carried_out = own[first]
    assert (_datasets(later, "inputs") - carried_in, _datasets(later, "outputs") - carried_out) == own[second]
    publish = complete[("publish", None)]
    carried = local_out | s3_out
    assert _datasets(publish, "outputs") - carried == {(s3_ns, "out/manifests/s.json")}
    assert _datasets(publish, "inputs") <= local_in | s3_in, "publish reads no PDF of its own"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ingest_run_reports_its_pdfs_outputs_and_manifest(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    inbox, output = tmp_path / "in", tmp_path / "out"
    pdfgen.write_pdf(inbox / "one.pdf", pdfgen.text_pdf(1, doc_id=3))
    pdfgen.write_pdf(inbox / "sub" / "two.pdf", pdfgen.text_pdf(2, doc_id=4))
    (inbox / "broken.pdf").write_bytes(pdfgen.not_a_pdf())
    events_file = tmp_path / "openlineage.jsonl"
    airflow = airflow_env.with_env(
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(events_file), "append": True}),
        AIRFLOW__OPENLINEAGE__NAMESPACE="olmocr-test",
    )
    conf = {"input_uri": str(inbox), "output_uri": str(output), "max_document_error_rate": 1.0}
    result = airflow.dag_test("olmocr_ingest", conf=conf)
    assert result.succeeded, result.tail()
    (manifest_path,) = (output / "manifests").glob("olmocr_ingest__*.json")
    documents = load_whole(str(manifest_path))["documents"]
    assert sorted(doc["status"] for doc in documents) == ["converted", "converted", "failed"]

    complete: dict[str, list[dict[str, Any]]] = {}
    for event in _events(events_file):
        if event["eventType"] == "COMPLETE" and event["job"]["name"].startswith("olmocr_ingest."):
            complete.setdefault(event["job"]["name"].split(".", 1)[1], []).append(event)
    assert {"convert", "publish_manifest"} <= set(complete), sorted(complete)  # other tasks report no datasets
    converted_in = set().union(*(_datasets(event, "inputs") for event in complete["convert"]))
    converted_out = set().union(*(_datasets(event, "outputs") for event in complete["convert"]))

    local_ns = f"file://{HOST}"
    # Exactly every PDF the run read, the failed one too; the Dolma and markdown objects of those it converted.
    assert converted_in == {
        (local_ns, str(path)) for path in (inbox / "one.pdf", inbox / "sub" / "two.pdf", inbox / "broken.pdf")
    }
    written = {
        (local_ns, os.path.abspath(local_path(doc["outputs"][kind])))
        for doc in documents
        if doc["status"] == "converted"
        for kind in ("dolma", "markdown")
    }
    assert len(written) == 4 and written == converted_out
    assert {Path(name).suffix for _, name in written} == {".jsonl", ".md"}
    (published,) = complete["publish_manifest"]
    # dag.test runs every task in one process, whose collector may still hold what convert reported.
    assert _datasets(published, "outputs") - converted_out == {(local_ns, str(manifest_path))}
