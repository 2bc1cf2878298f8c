"""The "OCR runs" pages: list, run page, charts, escaping, lookups, JSON API, S3, and plugin loading."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from olmocr_tasks.manifest import DocumentEntry, Manifest, manifest_uri

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))

from olmocr_runs import charts, create_app  # noqa: E402
from olmocr_runs.runs import task_log_href  # noqa: E402

XSS = "<script>alert(1)</script>"
DAG_ID = "olmocr_convert"
BUSY_RUN = "manual__2025-06-01T10:00:00+00:00"
CLEAN_RUN = "scheduled__2025-06-02T00:00:00+00:00"
BUDGET_RUN = "manual__2025-05-30T08:00:00+00:00"


def _converted(rng: random.Random, index: int, run_id: str) -> DocumentEntry:
    pages = rng.randint(1, 30)
    latencies = [round(rng.uniform(2.0, 14.0), 3) for _ in range(pages)]
    retried = rng.randint(0, min(2, pages))
    fallback = 1 if index % 17 == 0 else 0
    return DocumentEntry(
        source=f"s3://acme-scans/2025/batch-{index // 10:02d}/doc-{index:04d}.pdf",
        status="converted",
        size=rng.randint(80_000, 9_000_000),
        sha256=f"{index:064x}",
        pages=pages,
        fallback_pages=fallback,
        input_tokens=pages * rng.randint(1400, 1700),
        output_tokens=pages * rng.randint(500, 1300),
        attempts=pages + retried,
        seconds=round(sum(latencies) / 4, 3),
        outputs={"dolma": "s3://acme-out/dolma/part-0000.jsonl", "markdown": f"s3://acme-out/md/doc-{index:04d}.md"},
        page_latencies_s=latencies,
        accepted_attempt_histogram={"1": pages - retried, **({"2": retried} if retried else {})},
        server_input_tokens=pages * 1600,
        server_output_tokens=pages * 900,
        task={
            "dag_id": DAG_ID,
            "run_id": run_id,
            "task_id": "convert_batch",
            "map_index": index // 10,
            "try_number": 1,
        },
    )


def _failed(source: str, error_class: str, error: str, task: dict[str, Any] | None, index: int) -> DocumentEntry:
    return DocumentEntry(
        source=source,
        status="failed",
        size=1_234_567,
        sha256=f"{index + 9000:064x}",
        error_class=error_class,
        error=error,
        pages=0,
        attempts=8,
        seconds=42.5,
        failed_attempts=1,
        task=task,
    )


def build_manifests() -> list[Manifest]:
    """Three runs: one with failures, dead letters and hostile text; one clean; one over budget."""
    rng = random.Random(7)
    busy_docs = [_converted(rng, i, BUSY_RUN) for i in range(40)]
    hostile = _failed(
        f"s3://acme-scans/2025/{XSS}.pdf",
        "PdfRenderError",
        f"{XSS} pdfium could not render page 3",
        {"dag_id": DAG_ID, "run_id": BUSY_RUN, "task_id": "convert_batch", "map_index": 4, "try_number": 2},
        1,
    )
    timeout = _failed(
        "s3://acme-scans/2025/big-scan.pdf",
        "ServerUnavailable",
        "no successful request for 180 s",
        {"dag_id": DAG_ID, "run_id": BUSY_RUN, "task_id": "convert_document", "map_index": -1},
        2,
    )
    skipped = DocumentEntry(source="s3://acme-scans/2025/empty.pdf", status="skipped", skip_reason="zero pages")
    dead = DocumentEntry.from_dict({**hostile.to_dict(), "failed_attempts": 3})
    busy = Manifest(
        run_id=BUSY_RUN,
        started_at="2025-06-01T10:00:00.000Z",
        finished_at="2025-06-01T10:20:00.000Z",
        server={"base_urls": ["http://ocr:***@vllm.internal:8000/v1"], "model": "olmocr", "api_key_set": True},
        model="allenai/olmOCR-2-7B-1025-FP8",
        prompt_version="olmocr-v4-yaml",
        package_version="0.1.0",
        settings={"max_page_error_rate": 0.004, "page": {"max_tokens": 8000}},
        input_uri="s3://acme-scans/2025/",
        output_uri="s3://acme-out/",
        documents=[*busy_docs[:20], hostile, *busy_docs[20:], timeout, skipped],
        dead_letters=[dead],
        already_converted=12,
        gpu_hour_price=2.5,
    )
    clean = Manifest(
        run_id=CLEAN_RUN,
        started_at="2025-06-02T00:00:05.000Z",
        finished_at="2025-06-02T00:03:05.000Z",
        server={"base_urls": ["http://vllm.internal:8000/v1"], "model": "olmocr"},
        model="allenai/olmOCR-2-7B-1025-FP8",
        prompt_version="olmocr-v4-yaml",
        package_version="0.1.0",
        settings={},
        input_uri="s3://acme-scans/2025/",
        output_uri="s3://acme-out/",
        documents=[_converted(rng, i, CLEAN_RUN) for i in range(100, 106)],
    )
    over_budget = Manifest(
        run_id=BUDGET_RUN,
        started_at="2025-05-30T08:00:00.000Z",
        finished_at="2025-05-30T08:01:00.000Z",
        server={},
        model="allenai/olmOCR-2-7B-1025-FP8",
        prompt_version="olmocr-v4-yaml",
        package_version="0.1.0",
        settings={"max_failed_document_rate": 0.1},
        input_uri="s3://acme-scans/2024/",
        output_uri="s3://acme-out/",
        documents=[
            _converted(rng, 200, BUDGET_RUN),
            *(
                _failed(f"s3://acme-scans/2024/bad-{i}.pdf", "CorruptPdf", "no trailer", None, 300 + i)
                for i in range(3)
            ),
        ],
    )
    return [busy, clean, over_budget]


def write_sample_manifests(output: Path) -> list[Manifest]:
    """Write the sample manifests and one corrupt file under ``output/manifests/``."""
    manifests = build_manifests()
    for manifest in manifests:
        target = Path(manifest_uri(str(output), manifest.run_id))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(manifest.to_json())
    (output / "manifests" / "broken-run.json").write_text('{"run_id": "broken", "documents": [')
    return manifests


def key_of(run_id: str) -> str:
    return Path(manifest_uri("x", run_id)).stem


@pytest.fixture
def output(tmp_path: Path) -> Path:
    write_sample_manifests(tmp_path)
    return tmp_path


@pytest.fixture
def client(output: Path) -> TestClient:
    return TestClient(create_app(str(output)))


def test_list_shows_runs_newest_first_with_status_and_counts(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    page = response.text
    positions = [page.index(run_id) for run_id in (CLEAN_RUN, BUSY_RUN, BUDGET_RUN)]
    assert positions == sorted(positions), "runs must be listed newest first by finished_at"
    assert "all converted" in page and "some failed" in page and "failed budget" in page
    assert f'href="/runs/{quote(key_of(BUSY_RUN))}"' in page
    assert "2025-06-01 10:20:00 UTC" in page


def test_corrupt_manifest_is_a_note_not_an_error(client: TestClient) -> None:
    page = client.get("/").text
    assert "manifests/broken-run.json could not be read" in page
    assert client.get("/api/runs").json()["total"] == 3


def test_json_api_lists_counts(client: TestClient) -> None:
    body = client.get("/api/runs").json()
    assert [run["run_id"] for run in body["runs"]] == [CLEAN_RUN, BUSY_RUN, BUDGET_RUN]
    busy = body["runs"][1]
    expected = build_manifests()[0].counts()
    assert busy["counts"]["converted"] == 40 == expected["converted"]
    assert busy["counts"]["failed"] == 2 and busy["counts"]["skipped"] == 1
    assert busy["counts"]["pages"] == expected["pages"]
    assert busy["status"] == "some_failed"
    assert busy["estimated_cost"] == pytest.approx(2.5 * 1200 / 3600, rel=1e-6)
    assert len(body["notes"]) == 1
    paged = client.get("/api/runs", params={"limit": 1, "offset": 1}).json()
    assert [run["run_id"] for run in paged["runs"]] == [BUSY_RUN]


def test_api_run_returns_manifest(client: TestClient) -> None:
    body = client.get(f"/api/runs/{key_of(BUSY_RUN)}").json()
    assert body["run_id"] == BUSY_RUN
    assert client.get("/api/runs/nope").status_code == 404


def test_run_page_cards_charts_and_failures(client: TestClient) -> None:
    response = client.get(f"/runs/{key_of(BUSY_RUN)}")
    assert response.status_code == 200
    page = response.text
    counts = build_manifests()[0].counts()
    assert f"{counts['pages']:,}" in page
    assert "olmocr-v4-yaml" in page and "allenai/olmOCR-2-7B-1025-FP8" in page
    assert page.count("<svg") == 4
    for title in ("Pages converted over time", "Page latency distribution", "Failures by error class"):
        assert title in page
    assert "Accepted attempt per page" in page
    assert "ServerUnavailable" in page and "no successful request for 180 s" in page
    assert "dead letter" in page
    # Log links use the Airflow 3 UI form, with /mapped/N only for mapped task instances.
    assert f'href="/dags/{DAG_ID}/runs/manual__2025-06-01T10%3A00%3A00%2B00%3A00/tasks/convert_batch/mapped/4' in page
    assert "/tasks/convert_document?" not in page and "/tasks/convert_document/mapped" not in page
    assert "/tasks/convert_document" in page


def test_everything_rendered_is_escaped(client: TestClient) -> None:
    for path in ("/", f"/runs/{key_of(BUSY_RUN)}"):
        page = client.get(path).text
        assert XSS not in page
    page = client.get(f"/runs/{key_of(BUSY_RUN)}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; pdfium could not render page 3" in page


def test_secrets_are_not_shown(client: TestClient, output: Path) -> None:
    path = Path(manifest_uri(str(output), CLEAN_RUN))
    data = json.loads(path.read_text())
    data["server"] = {"base_urls": ["http://user:hunter2@vllm:8000/v1"], "api_key": "sk-live-123456"}
    path.write_text(json.dumps(data))
    page = client.get(f"/runs/{key_of(CLEAN_RUN)}").text
    api = client.get(f"/api/runs/{key_of(CLEAN_RUN)}").text
    for text in (page, api):
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
    client = TestClient(create_app(str(output)))
    runs = client.get("/api/runs").json()["runs"]
    assert runs[0]["run_id"] == "future-run"
    assert client.get("/runs/future").status_code == 200


def test_pagination(output: Path) -> None:
    client = TestClient(create_app(str(output)))
    first = client.get("/", params={"per_page": 2}).text
    second = client.get("/", params={"per_page": 2, "page": 2}).text
    assert "page 1 of 2" in first and CLEAN_RUN in first and BUDGET_RUN not in first
    assert BUDGET_RUN in second and CLEAN_RUN not in second


def test_output_location_from_environment(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMOCR_OUTPUT_URI", str(output))
    assert TestClient(create_app()).get("/api/runs").json()["total"] == 3


def test_output_location_from_airflow_variable(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # AIRFLOW_VAR_* is the environment form of an Airflow Variable; the api-server also reads the DB.
    monkeypatch.delenv("OLMOCR_OUTPUT_URI", raising=False)
    monkeypatch.setenv("AIRFLOW_VAR_OLMOCR_OUTPUT_URI", str(output))
    assert TestClient(create_app()).get("/api/runs").json()["total"] == 3


def test_unconfigured_location_explains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLMOCR_OUTPUT_URI", raising=False)
    monkeypatch.delenv("AIRFLOW_VAR_OLMOCR_OUTPUT_URI", raising=False)
    client = TestClient(create_app())
    assert "OLMOCR_OUTPUT_URI" in client.get("/").text
    assert client.get("/api/runs").status_code == 503


def test_empty_location(tmp_path: Path) -> None:
    client = TestClient(create_app(str(tmp_path)))
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


def test_mounted_under_prefix_links_to_airflow_ui(output: Path) -> None:
    from fastapi import FastAPI

    root = FastAPI()
    root.mount("/olmocr", create_app(str(output)))
    page = TestClient(root).get(f"/olmocr/runs/{key_of(BUSY_RUN)}").text
    assert 'href="/olmocr/"' in page
    assert f'href="/dags/{DAG_ID}/runs/' in page


def test_s3_listing(s3_manifests: str) -> None:
    client = TestClient(create_app(s3_manifests))
    body = client.get("/api/runs").json()
    assert [run["run_id"] for run in body["runs"]] == [CLEAN_RUN, BUSY_RUN, BUDGET_RUN]
    assert len(body["notes"]) == 1
    page = client.get(f"/runs/{key_of(BUSY_RUN)}")
    assert page.status_code == 200 and "<svg" in page.text


@pytest.fixture
def s3_manifests(s3_env: str, s3_bucket: str, tmp_path: Path) -> str:
    """The sample manifests uploaded to a moto bucket; the app finds moto through AWS_* variables."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_env)
    write_sample_manifests(tmp_path)
    for path in (tmp_path / "manifests").iterdir():
        s3.put_object(Bucket=s3_bucket, Key=f"prod/manifests/{path.name}", Body=path.read_bytes())
    # Objects elsewhere under the output prefix, or not ending in .json, are never read.
    s3.put_object(Bucket=s3_bucket, Key="prod/markdown/a.md", Body=b"# a")
    s3.put_object(Bucket=s3_bucket, Key="prod/manifests/next.json.olmocr-tmp", Body=b"{")
    return f"s3://{s3_bucket}/prod"


def test_airflow_loads_plugin_and_mounts_app(tmp_path: Path, output: Path) -> None:
    """Airflow's plugin manager loads the plugin from a plugins folder and mounts the app behind auth."""
    script = textwrap.dedent(
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
            "page": page.status_code,
        }, default=str))
        """
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "OLMOCR_OUTPUT_URI": str(output),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert "olmocr_runs" in report["plugins"]
    assert "/olmocr" in report["prefixes"]
    assert {"name": "OCR runs", "href": "/olmocr/", "destination": "nav", "url_route": "ocr-runs"}.items() <= next(
        view for view in report["views"] if view["name"] == "OCR runs"
    ).items()
    # Plugin apps are not guarded by the api-server: the plugin adds Airflow's authentication.
    assert report["anonymous"] == 401
    assert report["status"] == 200 and report["total"] == 3
    assert report["page"] == 200


def test_budget_verdict_written_by_the_publish_task_marks_the_run() -> None:
    from olmocr_runs.runs import run_status

    counts = {"documents": 10, "failed": 1, "dead_letters": 0}
    assert run_status({"error_budget": {"exceeded": True}}, counts) == "failed_budget"
    assert run_status({"error_budget": {"exceeded": False}}, counts) == "some_failed"
