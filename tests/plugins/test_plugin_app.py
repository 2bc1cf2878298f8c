"""The "OCR runs" pages: list, run page, charts, escaping, lookups, JSON API, S3, and plugin loading."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from olmocr_testkit.airflow_env import aws_connection
from olmocr_testkit.ports import refusing_port
from tests.fixtures.manifests import load_whole
from tests.fixtures.ocr_runs import CLEAN_RUN, DAG_ID, DEAD_LETTER_RUN, FAILING_RUN, XSS, RealRuns, copy_output
from tests.fixtures.s3 import REGION, FaultProxy

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))

from olmocr_runs import charts, create_app  # noqa: E402
from olmocr_runs.access import every_run  # noqa: E402
from olmocr_runs.runs import task_log_href  # noqa: E402


@pytest.fixture
def output(runs: RealRuns, tmp_path: Path) -> Path:
    copy_output(runs, tmp_path)
    return tmp_path


@pytest.fixture
def client(output: Path) -> TestClient:
    return TestClient(create_app(str(output), access=every_run))


def test_list_shows_runs_newest_first_with_status_and_counts(client: TestClient, runs: RealRuns) -> None:
    response = client.get("/")
    assert response.status_code == 200
    page = response.text
    order = [DEAD_LETTER_RUN, FAILING_RUN, CLEAN_RUN, runs.airflow_manifest_run_id]
    positions = [page.index(f">{run_id}<") for run_id in order]
    assert positions == sorted(positions), "runs must be listed newest first by finished_at"
    assert "all converted" in page and "some failed" in page and "failed budget" in page
    assert f'href="/runs/{quote(runs.key(CLEAN_RUN))}"' in page


def test_corrupt_manifest_is_a_note_not_an_error(client: TestClient) -> None:
    page = client.get("/").text
    assert "manifests/broken-run.json could not be read" in page
    assert client.get("/api/runs").json()["total"] == 4


def test_json_api_shows_the_counts_and_verdict_each_run_wrote(client: TestClient, runs: RealRuns) -> None:
    body = client.get("/api/runs").json()
    listed = {run["run_id"]: run for run in body["runs"]}
    for run_id in (CLEAN_RUN, FAILING_RUN, DEAD_LETTER_RUN, runs.airflow_manifest_run_id):
        written = runs.manifest(run_id)["counts"]
        assert {key: listed[run_id]["counts"][key] for key in written} == written
    assert listed[runs.airflow_manifest_run_id]["status"] == "failed_budget"
    # A CLI run's verdict is shown like an Airflow run's: one of its two documents failed.
    assert listed[FAILING_RUN]["status"] == "failed_budget"
    # Nothing was converted, but a dead letter is a problem to look at, not an empty run.
    assert listed[DEAD_LETTER_RUN]["status"] == "some_failed"
    assert listed[CLEAN_RUN]["status"] == "all_converted"
    cost = runs.manifest(CLEAN_RUN)["metrics"]["cost"]
    assert listed[CLEAN_RUN]["estimated_cost"] == cost["estimated_cost"] > 0
    # The run page says what the GPU seconds count (this run polled no /metrics: its wall clock).
    assert cost["basis"] == "wall_clock"
    assert "<dt>counted as</dt><dd>wall clock</dd>" in client.get(f"/runs/{quote(runs.key(CLEAN_RUN))}").text
    assert len(body["notes"]) == 1
    paged = client.get("/api/runs", params={"limit": 1, "offset": 1}).json()
    assert [run["run_id"] for run in paged["runs"]] == [FAILING_RUN]


def test_counts_are_read_as_written_not_recomputed(output: Path, runs: RealRuns) -> None:
    """The page shows the manifest's totals even where the entries would sum to something else."""
    path = output / "manifests" / f"{runs.key(CLEAN_RUN)}.json"
    data = load_whole(str(path))  # written back inline: the schema 2 layout, read alike
    data["counts"]["pages"] = 12345
    data["documents"] = []
    path.write_text(json.dumps(data))
    run = next(
        r
        for r in TestClient(create_app(str(output), access=every_run)).get("/api/runs").json()["runs"]
        if r["key"] == CLEAN_RUN
    )
    assert run["counts"]["pages"] == 12345 and run["counts"]["converted"] == 2


def test_budget_verdict_comes_from_the_manifest(output: Path, runs: RealRuns) -> None:
    """The verdict the CLI run published is shown as written: the page never judges the budget again."""
    path = output / "manifests" / f"{runs.key(FAILING_RUN)}.json"
    data = load_whole(str(path))  # written back inline: the schema 2 layout, read alike
    verdict = data["error_budget"]
    assert (verdict["max_document_error_rate"], verdict["exceeded"]) == (0.05, True)
    assert verdict["problems"] == ["1 of 2 documents failed (50.0%), over the budget of 5.0%"]
    client = TestClient(create_app(str(output), access=every_run))
    assert client.get(f"/api/runs/{runs.key(FAILING_RUN)}").json()["error_budget"] == verdict
    assert f"Error budget exceeded: {verdict['problems'][0]}" in client.get(f"/runs/{runs.key(FAILING_RUN)}").text
    # A manifest whose verdict says "within budget" shows its failure as "some failed", whatever the counts.
    data["error_budget"] = {"max_document_error_rate": 0.5, "exceeded": False, "problems": []}
    path.write_text(json.dumps(data))
    statuses = {
        run["run_id"]: run["status"]
        for run in TestClient(create_app(str(output), access=every_run)).get("/api/runs").json()["runs"]
    }
    assert statuses[FAILING_RUN] == "some_failed"


def test_api_run_returns_manifest(client: TestClient, output: Path, runs: RealRuns) -> None:
    key = runs.key(runs.airflow_manifest_run_id)
    body = client.get(f"/api/runs/{key}").json()
    whole = load_whole(str(output / "manifests" / f"{key}.json"))
    # The summary as stored, the entries not inline: they are paged by the documents endpoint.
    assert "documents" not in body and "dead_letters" not in body
    summary = {k: v for k, v in whole.items() if k not in ("documents", "dead_letters")}
    assert {k: body[k] for k in summary} == summary
    assert body["run_id"] == runs.airflow_manifest_run_id and body["airflow_run"]["dag_id"] == DAG_ID
    assert body["document_count"] == len(whole["documents"]) == 4 and body["dead_letter_count"] == 0
    assert body["documents_api"] == f"/api/runs/{quote(key, safe='')}/documents"
    first = client.get(body["documents_api"], params={"limit": 3}).json()
    assert first["documents"] == whole["documents"][:3] and first["total"] == 4
    rest = client.get(first["next"]).json()
    assert rest["documents"] == whole["documents"][3:] and rest["next"] is None
    dead = client.get(body["documents_api"], params={"kind": "dead_letters"}).json()
    assert dead["dead_letters"] == [] and dead["total"] == 0
    assert client.get("/api/runs/nope").status_code == 404


def test_run_page_cards_charts_and_failures(client: TestClient, runs: RealRuns) -> None:
    response = client.get(f"/runs/{runs.key(runs.airflow_manifest_run_id)}")
    assert response.status_code == 200
    page = response.text
    manifest = runs.manifest(runs.airflow_manifest_run_id)
    assert f">{manifest['counts']['pages']:,}<" in page
    assert manifest["prompt_version"] in page and manifest["model"] in page
    assert page.count("<svg") == 4
    for title in ("Pages converted over time", "Page latency distribution", "Failures by error class"):
        assert title in page
    assert "Accepted attempt per page" in page
    assert "not_pdf" in page and "no %PDF- header" in page
    assert "over the budget of 5.0%" in page
    # Log links use the Airflow 3 UI form, with /mapped/N for the mapped convert instances.
    run_id = quote(runs.airflow_run_id, safe="")
    assert f'href="/dags/{DAG_ID}/runs/{run_id}/tasks/convert/mapped/0?try_number=1"' in page


def test_dead_letters_are_listed(client: TestClient, runs: RealRuns) -> None:
    page = client.get(f"/runs/{runs.key(DEAD_LETTER_RUN)}").text
    section = page[page.index('id="dead-letters"') :]
    assert str(runs.cli_input / "corrupt.pdf") in section and "not_pdf" in section


def _rows(page: str, table_id: str) -> list[str]:
    table = page[page.index(f'aria-labelledby="{table_id}"') :]
    body = table[table.index("<tbody>") : table.index("</tbody>")]
    return body.split("<tr>")[1:]


def test_run_page_lists_every_document_with_its_outputs_and_log(runs: RealRuns) -> None:
    client = TestClient(create_app(str(runs.output), access=every_run))
    manifest = runs.manifest(runs.airflow_manifest_run_id)
    key = runs.key(runs.airflow_manifest_run_id)
    rows = _rows(client.get(f"/runs/{key}").text, "documents")
    assert len(rows) == len(manifest["documents"]) == 4
    run_id = quote(runs.airflow_run_id, safe="")
    for index, (row, doc) in enumerate(zip(rows, manifest["documents"], strict=True)):
        assert f">{doc['status']}<" in row and f">{doc['pages']:,}<" in row
        assert f">{doc['input_tokens']:,}<" in row and f">{doc['output_tokens']:,}<" in row
        task = doc["task"]
        link = f"/dags/{DAG_ID}/runs/{run_id}/tasks/convert/mapped/{task['map_index']}?try_number={task['try_number']}"
        assert f'href="{link}"' in row
        for kind in ("markdown", "dolma"):
            assert (f'href="/runs/{quote(key)}/documents/{index}/{kind}"' in row) is (kind in doc["outputs"])
    converted = [i for i, doc in enumerate(manifest["documents"]) if doc["status"] == "converted"]
    assert len(converted) == 2
    for index in converted:
        doc = manifest["documents"][index]
        markdown = client.get(f"/runs/{key}/documents/{index}/markdown")
        assert markdown.status_code == 200 and markdown.headers["content-type"].startswith("text/plain")
        assert markdown.headers["x-content-type-options"] == "nosniff"
        assert markdown.text == Path(doc["outputs"]["markdown"]).read_text()
        dolma = json.loads(client.get(f"/runs/{key}/documents/{index}/dolma").text)
        assert dolma["metadata"]["Source-File"] == doc["source"]


def test_output_links_serve_only_what_the_manifest_names_below_the_output(tmp_path: Path, runs: RealRuns) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(runs.output, copy)
    key = runs.key(CLEAN_RUN)
    path = copy / "manifests" / f"{key}.json"
    data = load_whole(str(path))  # written back inline: the schema 2 layout, read alike
    outputs = [doc["outputs"] for doc in data["documents"]]
    outputs[0]["markdown"] = outputs[0]["markdown"].replace(str(runs.output), str(copy))
    # A manifest naming files outside the output location does not make the page serve them.
    outputs[0]["dolma"] = str(runs.clean_input / "annual-report.pdf")
    outputs[1]["markdown"] = f"{copy}/../clean-inbox/memo.pdf"
    path.write_text(json.dumps(data))
    client = TestClient(create_app(str(copy), access=every_run))
    assert client.get(f"/runs/{key}/documents/0/markdown").status_code == 200
    assert client.get(f"/runs/{key}/documents/0/dolma").status_code == 403
    assert client.get(f"/runs/{key}/documents/1/markdown").status_code == 403
    for link in (
        f"/runs/{key}/documents/9/markdown",
        f"/runs/{key}/documents/0/manifest",
        "/runs/nope/documents/0/dolma",
    ):
        assert client.get(link).status_code == 404, link


def test_trigger_and_data_interval_of_the_run(client: TestClient, runs: RealRuns) -> None:
    manifest = runs.manifest(runs.airflow_manifest_run_id)
    assert manifest["airflow_run"]["run_type"] == "manual"
    page = client.get(f"/runs/{runs.key(runs.airflow_manifest_run_id)}").text
    start, end = (
        datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M:%S UTC") for stamp in runs.airflow_data_interval
    )
    assert "Trigger: <strong>manual (UI or REST API)</strong>" in page
    assert f"data interval {start} → {end}" in page
    assert "Trigger: <strong>command line</strong>" in client.get(f"/runs/{runs.key(CLEAN_RUN)}").text
    listed = {run["run_id"]: run["trigger"] for run in client.get("/api/runs").json()["runs"]}
    assert listed[runs.airflow_manifest_run_id] == "manual (UI or REST API)" and listed[CLEAN_RUN] == "command line"


def test_search_finds_a_document_in_every_run(client: TestClient, runs: RealRuns) -> None:
    page = client.get("/", params={"q": "CORRUPT"}).text
    rows = _rows(page, "matches")
    # The failing run converted it and failed; the rerun set it aside as a dead letter (not a document).
    assert len(rows) == 1 and FAILING_RUN in rows[0] and str(runs.cli_input / "corrupt.pdf") in rows[0]
    assert "not_pdf" in rows[0]
    rows = _rows(client.get("/", params={"q": "scan-"}).text, "matches")
    assert len(rows) == 2 and all(runs.airflow_manifest_run_id in row for row in rows)
    assert all("/documents/" in row and "/markdown" in row for row in rows)
    assert "No document of any run" in client.get("/", params={"q": "nothing-like-this"}).text
    assert XSS not in client.get("/", params={"q": XSS}).text


def test_progress_chart_ticks_are_whole_pages(client: TestClient, runs: RealRuns) -> None:
    page = client.get(f"/runs/{runs.key(runs.airflow_manifest_run_id)}").text
    svg = page[page.index("Pages converted over time") :]
    svg = svg[: svg.index("</svg>")]
    # Tick labels right of the y axis are text-anchor="end"; every one is a whole number.
    ticks = re.findall(r'text-anchor="end"[^>]*>([^<]+)<', svg)
    assert len(ticks) == 5 and all(tick.isdigit() for tick in ticks), ticks


def test_everything_rendered_is_escaped(client: TestClient, runs: RealRuns) -> None:
    key = runs.key(runs.airflow_manifest_run_id)
    for path in ("/", f"/runs/{key}"):
        page = client.get(path).text
        assert XSS not in page
    page = client.get(f"/runs/{key}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.pdf" in page


def test_secrets_are_not_shown(client: TestClient, output: Path, runs: RealRuns) -> None:
    path = output / "manifests" / f"{runs.key(CLEAN_RUN)}.json"
    data = load_whole(str(path))  # written back inline: the schema 2 layout, read alike
    data["server"] = {"base_urls": ["http://user:hunter2@vllm:8000/v1"], "api_key": "sk-live-123456"}
    path.write_text(json.dumps(data))
    page = client.get(f"/runs/{runs.key(CLEAN_RUN)}")
    api = client.get(f"/api/runs/{runs.key(CLEAN_RUN)}")
    # The run is shown (an error page would hold no secret either), with its server but not its secrets.
    assert page.status_code == api.status_code == 200
    assert CLEAN_RUN in page.text and api.json()["run_id"] == CLEAN_RUN
    assert "vllm:8000" in page.text and "vllm:8000" in api.text
    for text in (page.text, api.text):
        assert "hunter2" not in text and "sk-live-123456" not in text


@pytest.mark.parametrize(
    "path",
    ["/runs/does-not-exist", "/runs/..%2F..%2Fetc%2Fpasswd", "/runs/%2E%2E", "/runs/broken-run/extra"],
)
def test_unknown_or_traversal_ids_are_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "text/html" in response.headers["content-type"]
    assert "not found" in response.text.lower()


def test_corrupt_run_page_explains(client: TestClient) -> None:
    response = client.get("/runs/broken-run")
    assert response.status_code == 422
    assert "could not be read" in response.text


def test_manifest_of_unknown_shape_still_lists(output: Path) -> None:
    (output / "manifests" / "future.json").write_text(
        json.dumps({"schema_version": 9, "run_id": "future-run", "finished_at": "2030-01-01T00:00:00Z", "new": 1})
    )
    client = TestClient(create_app(str(output), access=every_run))
    runs = client.get("/api/runs").json()["runs"]
    assert runs[0]["run_id"] == "future-run"
    assert client.get("/runs/future").status_code == 200


def test_pagination(output: Path) -> None:
    client = TestClient(create_app(str(output), access=every_run))
    first = client.get("/", params={"per_page": 2}).text
    second = client.get("/", params={"per_page": 2, "page": 2}).text
    assert "page 1 of 2" in first and DEAD_LETTER_RUN in first and CLEAN_RUN not in first
    assert CLEAN_RUN in second and DEAD_LETTER_RUN not in second


def test_output_location_from_environment(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMOCR_OUTPUT_URI", str(output))
    assert TestClient(create_app(access=every_run)).get("/api/runs").json()["total"] == 4


def test_output_location_from_airflow_variable(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # AIRFLOW_VAR_* is the environment form of an Airflow Variable; the api-server also reads the DB.
    monkeypatch.delenv("OLMOCR_OUTPUT_URI", raising=False)
    monkeypatch.setenv("AIRFLOW_VAR_OLMOCR_OUTPUT_URI", str(output))
    assert TestClient(create_app(access=every_run)).get("/api/runs").json()["total"] == 4


def test_unconfigured_location_explains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLMOCR_OUTPUT_URI", raising=False)
    monkeypatch.delenv("AIRFLOW_VAR_OLMOCR_OUTPUT_URI", raising=False)
    client = TestClient(create_app(access=every_run))
    assert "OLMOCR_OUTPUT_URI" in client.get("/").text
    assert client.get("/api/runs").status_code == 503


def test_empty_location(tmp_path: Path) -> None:
    client = TestClient(create_app(str(tmp_path), access=every_run))
    assert "No runs yet" in client.get("/").text


def test_task_log_href_forms() -> None:
    task = {"dag_id": "d/x", "run_id": "r 1", "task_id": "t", "map_index": -1}
    assert task_log_href(task) == "/dags/d%2Fx/runs/r%201/tasks/t"
    assert task_log_href({**task, "map_index": 0}, "/airflow") == "/airflow/dags/d%2Fx/runs/r%201/tasks/t/mapped/0"
    assert task_log_href({"dag_id": "d", "run_id": "r"}) is None
    assert task_log_href(None) is None


def test_charts_escape_labels_and_stay_small() -> None:
    svg = charts.bar_chart(f"Failures {XSS}", [(XSS, 2), ("OK & fine", 1)], x_label="<x>", y_label="<y>")
    assert XSS not in svg and "<x>" not in svg and "&lt;script&gt;" in svg and "&amp; fine" in svg
    assert "No failures" in charts.bar_chart("Failures", [], empty_message="No failures")
    many = charts.line_chart("Pages", [(float(i), float(i)) for i in range(50_000)])
    assert many.startswith("<svg") and len(many) < 20_000
    assert charts.histogram_bins([0.4, 2.1, 3.0, 13.9]) == [
        ("0 s", 1),
        ("2 s", 2),
        ("4 s", 0),
        ("6 s", 0),
        ("8 s", 0),
        ("10 s", 0),
        ("12 s", 1),
    ]


def test_mounted_under_prefix_links_to_airflow_ui(output: Path, runs: RealRuns) -> None:
    from fastapi import FastAPI

    root = FastAPI()
    root.mount("/olmocr", create_app(str(output), access=every_run))
    page = TestClient(root).get(f"/olmocr/runs/{runs.key(runs.airflow_manifest_run_id)}").text
    assert 'href="/olmocr/"' in page
    assert f'href="/dags/{DAG_ID}/runs/' in page


def test_s3_listing(s3_manifests: str, runs: RealRuns) -> None:
    client = TestClient(create_app(s3_manifests, access=every_run))
    body = client.get("/api/runs").json()
    assert [run["run_id"] for run in body["runs"]] == [
        DEAD_LETTER_RUN,
        FAILING_RUN,
        CLEAN_RUN,
        runs.airflow_manifest_run_id,
    ]
    assert len(body["notes"]) == 1
    page = client.get(f"/runs/{runs.key(runs.airflow_manifest_run_id)}")
    assert page.status_code == 200 and "<svg" in page.text


@pytest.fixture
def s3_manifests(s3_env: str, s3_bucket: str, output: Path) -> str:
    """The real runs' manifests uploaded to a moto bucket; the app finds moto through AWS_* variables."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_env)
    for path in (output / "manifests").rglob("*"):
        if path.is_file():  # summaries and the shards in their run folders
            key = path.relative_to(output / "manifests").as_posix()
            s3.put_object(Bucket=s3_bucket, Key=f"prod/manifests/{key}", Body=path.read_bytes())
    # Objects elsewhere under the output prefix, below the folder, or not ending in .json, are never read.
    s3.put_object(Bucket=s3_bucket, Key="prod/markdown/a.md", Body=b"# a")
    s3.put_object(Bucket=s3_bucket, Key="prod/manifests/next.json.olmocr-tmp", Body=b"{")
    s3.put_object(Bucket=s3_bucket, Key="prod/manifests/old/other.json", Body=b"{}")
    return f"s3://{s3_bucket}/prod"


# Loads the plugins folder through Airflow's plugin manager into an api-server app, then asks the
# OCR runs API anonymously and signed in, and the list page signed in; prints what it saw as JSON.
_PLUGIN_IN_AIRFLOW = textwrap.dedent(
    """
    import json
    from airflow import plugins_manager, settings
    from airflow.api_fastapi.app import init_auth_manager, init_plugins
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.datamodels.plugins import PluginResponse
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from airflow.models.revoked_token import RevokedToken

    # Token checks consult this one table; creating it is much cheaper than a full db migrate.
    RevokedToken.__table__.create(settings.engine, checkfirst=True)
    plugins, errors = plugins_manager._get_plugins()
    apps, _ = plugins_manager.get_fastapi_plugins()
    views, _ = plugins_manager._get_ui_plugins()
    info = [PluginResponse.model_validate(p).model_dump() for p in plugins_manager.get_plugin_info()]
    root = FastAPI()
    auth = init_auth_manager(root)
    init_plugins(root)
    client = TestClient(root)
    anonymous = client.get("/olmocr/api/runs")
    token = auth.generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    signed_in = client.get("/olmocr/api/runs", headers={"Authorization": f"Bearer {token}"})
    client.cookies.set("_token", token)
    page = client.get("/olmocr/")
    print(json.dumps({
        "plugins": [p.name for p in plugins],
        "errors": errors,
        "prefixes": [a["url_prefix"] for a in apps],
        "views": views,
        "info": info,
        "anonymous": anonymous.status_code,
        "status": signed_in.status_code,
        "total": signed_in.json().get("total"),
        "runs": [run["run_id"] for run in signed_in.json().get("runs", [])],
        "listing_error": signed_in.json().get("error"),
        "page": page.status_code,
    }, default=str))
    """
)


def plugin_in_airflow(tmp_path: Path, **env: str | None) -> dict[str, Any]:
    """What ``_PLUGIN_IN_AIRFLOW`` saw, run in a subprocess with ``env`` over this one's (None removes)."""
    variables = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    variables.update({name: value for name, value in env.items() if value is not None})
    for name in [name for name, value in env.items() if value is None]:
        variables.pop(name, None)
    command = [sys.executable, "-c", _PLUGIN_IN_AIRFLOW]
    result = subprocess.run(command, env=variables, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_airflow_loads_plugin_and_mounts_app(tmp_path: Path, output: Path) -> None:
    """Airflow's plugin manager loads the plugin from a plugins folder and mounts the app behind auth."""
    report = plugin_in_airflow(tmp_path, OLMOCR_OUTPUT_URI=str(output))
    assert report["errors"] == {}
    assert "olmocr_runs" in report["plugins"]
    assert "/olmocr" in report["prefixes"]
    assert {"name": "OCR runs", "href": "/olmocr/", "destination": "nav", "url_route": "ocr-runs"}.items() <= next(
        view for view in report["views"] if view["name"] == "OCR runs"
    ).items()
    # Plugin apps are not guarded by the api-server: the plugin adds Airflow's authentication.
    assert report["anonymous"] == 401
    assert report["status"] == 200 and report["total"] == 4
    assert report["page"] == 200


def test_plugin_reads_s3_with_the_aws_default_connection(
    tmp_path: Path, s3_manifests: str, s3_fault_proxy: FaultProxy, runs: RealRuns
) -> None:
    """The api-server's own AWS environment points elsewhere with other keys; the plugin lists the runs
    through the endpoint and keys of ``aws_default``, as the tasks that wrote them did."""
    connection_key = "aws-default-connection-key"
    with refusing_port() as nowhere:
        report = plugin_in_airflow(
            tmp_path,
            OLMOCR_OUTPUT_URI=s3_manifests,
            AIRFLOW_CONN_AWS_DEFAULT=aws_connection(s3_fault_proxy.url, connection_key, "aws-default-secret", REGION),
            AWS_ACCESS_KEY_ID="ambient-wrong-key",
            AWS_SECRET_ACCESS_KEY="ambient-wrong-secret",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{nowhere}",
        )
    assert report["status"] == 200 and report["listing_error"] is None
    assert report["runs"] == [DEAD_LETTER_RUN, FAILING_RUN, CLEAN_RUN, runs.airflow_manifest_run_id]
    signed_by = {request.access_key for request in s3_fault_proxy.requests}
    assert s3_fault_proxy.requests and signed_by == {connection_key}, signed_by
