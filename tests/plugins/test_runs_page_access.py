"""The OCR runs pages in a real api-server honour Airflow's authorisation, DAG by DAG.

Three FAB users over the same runs (one Airflow run of ``olmocr_ingest``, three CLI runs): ``reader``
may read ``olmocr_ingest``, ``outsider`` only another DAG, ``admin`` is FAB's Admin. The outsider
neither sees the Airflow run in the list nor opens its page, its summary, its documents or a
document's text (403); the reader does (200) but sees no CLI run; the admin sees everything.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.fixtures.api_server import FabApiServer, fab_api_server
from tests.fixtures.ocr_runs import CLEAN_RUN, DAG_ID, DEAD_LETTER_RUN, FAILING_RUN, RealRuns, copy_output

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, runs: RealRuns) -> Iterator[FabApiServer]:
    output = tmp_path_factory.mktemp("ocr-output")
    copy_output(runs, output)
    users = {"reader": [DAG_ID], "outsider": ["some_other_dag"], "admin": None}
    home = tmp_path_factory.mktemp("fab-airflow")
    with fab_api_server(home, users, OLMOCR_OUTPUT_URI=str(output)) as running:
        yield running


def _listed(client: httpx.Client) -> list[str]:
    response = client.get("/olmocr/api/runs")
    assert response.status_code == 200, response.text
    return [run["run_id"] for run in response.json()["runs"]]


def _run_paths(runs: RealRuns, run_id: str, index: int = 0) -> list[str]:
    key = quote(runs.key(run_id), safe="")
    return [
        f"/olmocr/runs/{key}",
        f"/olmocr/api/runs/{key}",
        f"/olmocr/api/runs/{key}/documents",
        f"/olmocr/runs/{key}/documents/{index}/markdown",
    ]


def _converted_index(client: httpx.Client, runs: RealRuns, run_id: str) -> int:
    """The position of a document of ``run_id`` with markdown, as the documents API lists it."""
    response = client.get(f"/olmocr/api/runs/{quote(runs.key(run_id), safe='')}/documents")
    assert response.status_code == 200, response.text
    return next(i for i, doc in enumerate(response.json()["documents"]) if (doc.get("outputs") or {}).get("markdown"))


def test_a_user_sees_only_the_runs_of_dags_they_may_read(server: FabApiServer, runs: RealRuns) -> None:
    airflow_run = runs.airflow_manifest_run_id
    cli_runs = {CLEAN_RUN, FAILING_RUN, DEAD_LETTER_RUN}
    with server.client("reader") as reader, server.client("outsider") as outsider, server.client("admin") as admin:
        index = _converted_index(reader, runs, airflow_run)

        assert _listed(outsider) == []
        listing = outsider.get("/olmocr/")
        assert listing.status_code == 200 and airflow_run not in listing.text
        assert "could not be read" not in listing.text  # notes about unreadable manifests name no DAG
        for path in _run_paths(runs, airflow_run, index):
            assert outsider.get(path).status_code == 403, path

        assert _listed(reader) == [airflow_run]
        for path in _run_paths(runs, airflow_run, index):
            assert reader.get(path).status_code == 200, path
        text = reader.get(_run_paths(runs, airflow_run, index)[-1]).text
        assert text.strip()  # the document's markdown itself
        # Runs of no DAG are for operators (OLMOCR_RUNS_CLI_READERS' default).
        for path in _run_paths(runs, CLEAN_RUN):
            assert reader.get(path).status_code == 403, path

        assert set(_listed(admin)) == {airflow_run, *cli_runs}
        assert "manifests/broken-run.json could not be read" in admin.get("/olmocr/").text
        for path in _run_paths(runs, CLEAN_RUN, _converted_index(admin, runs, CLEAN_RUN)):
            assert admin.get(path).status_code == 200, path


def test_the_openapi_document_needs_sign_in(server: FabApiServer) -> None:
    with server.client(None) as anonymous, server.client("outsider") as outsider:
        assert anonymous.get("/olmocr/api/openapi.json").status_code == 401
        assert anonymous.get("/olmocr/api/runs").status_code == 401
        document = outsider.get("/olmocr/api/openapi.json")
        assert document.status_code == 200 and "/api/runs" in document.json()["paths"]


def test_plugin_refuses_an_unknown_cli_readers_setting(tmp_path: Path) -> None:
    """A misspelt ``OLMOCR_RUNS_CLI_READERS`` is refused, not read as "everyone"."""
    import subprocess
    import sys

    from tests.fixtures.ocr_runs import PLUGINS

    code = "import olmocr_runs_plugin as p; p.cli_readers()"
    env = {"OLMOCR_RUNS_CLI_READERS": "everybody", "PYTHONPATH": str(PLUGINS), "AIRFLOW_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "OLMOCR_RUNS_CLI_READERS must be one of operators, signed_in" in result.stderr
