"""``olmocr-tasks convert`` as a user runs it: a real process, its exit codes and what it prints."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import boto3
import pytest

from olmocr_testkit import imagegen, pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import FAST_CLI, cli_command, cli_env, run_cli
from tests.fixtures.client import requests_for
from tests.fixtures.manifests import load_whole


def test_converts_a_folder_exit_0_then_nothing_to_do(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "a.pdf", pdfgen.text_pdf(2, doc_id=1))
    pdfgen.write_pdf(tmp_path / "in" / "deep" / "B.Pdf", pdfgen.text_pdf(1, doc_id=2))
    out = tmp_path / "out"
    first = run_cli("convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", "first", *FAST_CLI)
    assert first.returncode == 0, first.stderr
    assert "converted 2, failed 0" in first.stdout
    assert (out / "markdown" / "a.md").is_file() and (out / "markdown" / "deep" / "B.md").is_file()
    manifest = load_whole(str(out / "manifests" / "first.json"))
    assert manifest["counts"]["pages"] == 3
    # Not a terminal: periodic log lines and one summary, never a line per request.
    assert "converting " in first.stderr and "finished: documents 2/2" in first.stderr
    assert "HTTP Request" not in first.stderr

    second = run_cli("convert", str(tmp_path / "in"), str(out), "--server", standin.url, *FAST_CLI)
    assert second.returncode == 0
    assert "converted 0, failed 0, skipped 0, already converted 2" in second.stdout


def test_formats_choose_what_a_folder_of_scans_converts(tmp_path: Path, standin: StandinServer) -> None:
    inbox, out = tmp_path / "in", tmp_path / "out"
    pdfgen.write_pdf(inbox / "letter.pdf", pdfgen.text_pdf(1, doc_id=4))
    (inbox / "Scan.TIF").write_bytes(imagegen.multipage_tiff(5, 2))
    (inbox / "page.png").write_bytes(imagegen.encode(imagegen.page_image(6), "PNG"))
    args = ["convert", str(inbox), str(out), "--server", standin.url, *FAST_CLI]
    scans = run_cli(*args, "--formats", "tif", "--run-id", "scans")
    assert scans.returncode == 0, scans.stderr
    assert "converted 1, failed 0" in scans.stdout and (out / "markdown" / "Scan.md").is_file()
    everything = run_cli(*args, "--run-id", "all")
    assert everything.returncode == 0, everything.stderr
    assert "converted 2, failed 0, skipped 0, already converted 1" in everything.stdout
    # The page-image pixel limit is the CLI's to set: the 850 x 1100 page is over 900,000 pixels.
    small = run_cli(*args, "--run-id", "small", "--reprocess", "--formats", "png", "--max-image-pixels", "900000")
    assert small.returncode == 1 and "converted 0, failed 1" in small.stdout
    (failed,) = load_whole(str(out / "manifests" / "small.json"))["documents"]
    assert failed["error_class"] == "too_large" and "850 x 1100 = 935,000 pixels" in failed["error"]


def test_single_file_and_no_markdown(tmp_path: Path, standin: StandinServer) -> None:
    pdf = pdfgen.write_pdf(tmp_path / "one.pdf", pdfgen.text_pdf(1, doc_id=3))
    result = run_cli("convert", str(pdf), str(tmp_path / "out"), "--server", standin.url, "--no-markdown", *FAST_CLI)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "dolma" / "one.jsonl").is_file()
    assert not (tmp_path / "out" / "markdown").exists()


def test_failed_documents_over_the_budget_exit_1_and_the_manifest_carries_the_verdict(
    tmp_path: Path, standin: StandinServer
) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "good.pdf", pdfgen.text_pdf(1, doc_id=1))
    pdfgen.write_pdf(tmp_path / "in" / "locked.pdf", pdfgen.encrypted_pdf())
    result = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", "over", *FAST_CLI
    )
    assert result.returncode == 1
    assert "locked.pdf: encrypted" in result.stdout and "converted 1, failed 1" in result.stdout
    problem = "1 of 2 documents failed (50.0%), over the budget of 5.0%"
    assert f"error budget exceeded: {problem}" in result.stdout
    # Judged as an Airflow run's publish task judges it, with the default budget.
    manifest = load_whole(str(tmp_path / "out" / "manifests" / "over.json"))
    assert manifest["error_budget"] == {"max_document_error_rate": 0.05, "exceeded": True, "problems": [problem]}
    assert manifest["airflow_run"] is None


def test_failed_documents_within_the_budget_exit_0(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "good.pdf", pdfgen.text_pdf(1, doc_id=1))
    pdfgen.write_pdf(tmp_path / "in" / "locked.pdf", pdfgen.encrypted_pdf())
    result = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", "within",
        "--max-document-error-rate", "0.5", *FAST_CLI,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "locked.pdf: encrypted" in result.stdout and "within the error budget (50.0%" in result.stdout
    manifest = load_whole(str(tmp_path / "out" / "manifests" / "within.json"))
    assert manifest["error_budget"] == {"max_document_error_rate": 0.5, "exceeded": False, "problems": []}
    assert manifest["counts"]["failed"] == 1


def test_a_server_refusing_the_run_part_way_publishes_what_it_reached_and_exits_3(
    tmp_path: Path, standin: StandinServer
) -> None:
    """A key rotated mid-run: the run's unfinished documents are published as not converted, over budget."""
    standin.configure(api_key="key-before", always={"1:1": "hang"})
    pdfgen.write_pdf(tmp_path / "in" / "hung.pdf", pdfgen.text_pdf(1, doc_id=1))
    pdfgen.write_pdf(tmp_path / "in" / "quick.pdf", pdfgen.text_pdf(1, doc_id=2))
    out = tmp_path / "out"
    args = ["convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--api-key-env", "OLMOCR_TEST_KEY"]
    process = subprocess.Popen(
        cli_command(*args, "--run-id", "refused", *FAST_CLI),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env({"OLMOCR_TEST_KEY": "key-before"}),
    )
    # Once the hung page's request is in, the key is rotated: its retry (after the read timeout) is refused.
    deadline = time.monotonic() + 60
    while not any(record.get("fault") == "hang" for record in standin.requests()):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    standin.configure(api_key="key-after")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 3 and "401" in stderr, stderr

    manifest = load_whole(str(out / "manifests" / "refused.json"))
    hung = next(doc for doc in manifest["documents"] if doc["source"].endswith("hung.pdf"))
    assert (hung["status"], hung["error_class"]) == ("failed", "not_converted")
    assert "refused this run" in hung["error"]
    assert manifest["counts"]["not_converted"] >= 1
    verdict = manifest["error_budget"]
    assert verdict["exceeded"] is True
    assert any("were in convert tasks that failed" in problem for problem in verdict["problems"])

    # With the new key the next run converts what the refused one did not.
    standin.configure(always={"1:1": None})
    again = run_cli(*args, *FAST_CLI, env={"OLMOCR_TEST_KEY": "key-after"})
    assert again.returncode == 0, again.stderr
    assert "failed 0" in again.stdout and any(out.glob("**/hung.md")) is not False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-page-error-rate", "2"], "must be between 0 and 1"),
        (["--max-concurrent-requests", "0"], "must be at least 1"),
        (["--api-key-env", "OLMOCR_TEST_UNSET_VARIABLE"], "OLMOCR_TEST_UNSET_VARIABLE is not set"),
        (["--formats", "pdf,gif"], "unknown format 'gif': choose from pdf, png, jpeg, tiff, webp"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "in").mkdir()
    result = run_cli("convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", "http://127.0.0.1:9/v1", *args)
    assert result.returncode == 2 and message in result.stderr


def test_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("convert", str(tmp_path / "nope"), str(tmp_path / "out"), "--server", "http://127.0.0.1:9/v1")
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_server_unavailable_exit_3_and_the_api_key_never_printed(tmp_path: Path, standin: StandinServer) -> None:
    secret = "sk-canary-7d1f0c55b2"
    standin.configure(api_key=secret)
    pdfgen.write_pdf(tmp_path / "in" / "a.pdf", pdfgen.text_pdf(1, doc_id=1))
    env = {"OLMOCR_TEST_KEY": secret}
    ok = run_cli(
        "--log-level", "DEBUG", "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url,
        "--api-key-env", "OLMOCR_TEST_KEY", *FAST_CLI, env=env,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    wrong = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out2"), "--server", standin.url, *FAST_CLI,
    )  # fmt: skip
    assert wrong.returncode == 3 and "401" in wrong.stderr
    standin.refuse_for(None)
    down = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out3"), "--server", standin.url,
        "--api-key-env", "OLMOCR_TEST_KEY", *FAST_CLI, env=env,
    )  # fmt: skip
    assert down.returncode == 3 and "unavailable" in down.stderr
    for result in (ok, wrong, down):
        assert secret not in result.stdout + result.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path


def test_s3_input_and_output(s3_env: str, s3_bucket: str, tmp_path: Path, standin: StandinServer) -> None:
    client = boto3.client("s3")
    client.put_object(Bucket=s3_bucket, Key="inbox/a b.pdf", Body=pdfgen.text_pdf(2, doc_id=1))
    client.put_object(Bucket=s3_bucket, Key="inbox/x/Y.PDF", Body=pdfgen.text_pdf(1, doc_id=2))
    client.put_object(Bucket=s3_bucket, Key="inbox/notes.txt", Body=b"not a pdf, not discovered")
    result = run_cli(
        "convert", f"s3://{s3_bucket}/inbox/", f"s3://{s3_bucket}/out", "--server", standin.url,
        "--run-id", "s3run", *FAST_CLI,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    keys = {item["Key"] for item in client.list_objects_v2(Bucket=s3_bucket, Prefix="out/")["Contents"]}
    assert {"out/markdown/a b.md", "out/markdown/x/Y.md", "out/dolma/a b.jsonl", "out/manifests/s3run.json"} <= keys
    body = client.get_object(Bucket=s3_bucket, Key="out/markdown/a b.md")["Body"].read().decode()
    assert "document 1 page 1" in body and "document 1 page 2" in body


def test_engine_tuning_flags_reach_the_run(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "a.pdf", pdfgen.text_pdf(3, doc_id=1))
    result = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", "tuned",
        "--no-adaptive-concurrency", "--render-workers", "2", "--max-concurrent-requests", "5", *FAST_CLI,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    settings = json.loads((tmp_path / "out" / "manifests" / "tuned.json").read_text())["settings"]
    assert settings["render_workers"] == 2
    assert settings["server"]["adaptive_concurrency"] is False
    assert settings["server"]["max_concurrent_requests"] == 5
    assert settings["server"]["hedge_requests"] is True


def test_hedge_flags_reach_the_run_and_a_hung_page_is_answered_by_its_hedge(
    tmp_path: Path, standin: StandinServer
) -> None:
    # The last page's first request is accepted and never answered; with the floor lowered, its hedge
    # answers long before the read timeout would.
    standin.configure(scripts={"1:25": ["hang"]})
    pdfgen.write_pdf(tmp_path / "in" / "long.pdf", pdfgen.text_pdf(25, doc_id=1))
    result = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", "hedged",
        "--hedge-min-delay", "0.2", "--hedge-multiple", "2.5", "--read-timeout", "60", "--outage-window", "60",
        "--ready-timeout", "5", "--max-concurrent-requests", "8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = load_whole(str(tmp_path / "out" / "manifests" / "hedged.json"))
    server = manifest["settings"]["server"]
    assert (server["hedge_requests"], server["hedge_min_delay_s"], server["hedge_multiple"]) == (True, 0.2, 2.5)
    # The hung page was answered on its first attempt (a retry after the read timeout would be a 26th),
    # by its hedge: a second request for it. On a loaded machine a slow page may be hedged as well.
    assert manifest["documents"][0]["attempts"] == 25 and manifest["counts"]["fallback_pages"] == 0
    assert len(requests_for(standin, 1, 25)) == 2
    assert manifest["counts"]["hedged"] == manifest["documents"][0]["hedged"] >= 1

    switched_off = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out2"), "--server", standin.url, "--run-id", "off",
        "--no-hedging", "--max-documents", "1", *FAST_CLI,
    )  # fmt: skip
    assert switched_off.returncode == 0, switched_off.stderr
    off = load_whole(str(tmp_path / "out2" / "manifests" / "off.json"))
    assert off["settings"]["server"]["hedge_requests"] is False and off["counts"]["hedged"] == 0


def test_default_run_ids_are_unique_within_a_second_and_sort_by_start_time() -> None:
    from datetime import UTC, datetime

    from olmocr_tasks.cli import default_run_id

    same_second = datetime(2026, 12, 1, 1, 2, 3, tzinfo=UTC)
    ids = {default_run_id(same_second) for _ in range(50)}
    assert len(ids) == 50
    assert all(run_id.startswith("cli-20261201T010203Z-") for run_id in ids)
    later = default_run_id(datetime(2026, 12, 1, 1, 2, 4, tzinfo=UTC))
    assert max(ids) < later


def test_two_cli_runs_without_a_run_id_keep_both_manifests(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "a.pdf", pdfgen.text_pdf(1, doc_id=1))
    for _ in range(2):
        result = run_cli("convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, *FAST_CLI)
        assert result.returncode == 0, result.stderr
    manifests = [json.loads(path.read_text()) for path in (tmp_path / "out" / "manifests").glob("cli-*.json")]
    assert len(manifests) == 2
    # Run ids sort by start time to the second; two runs within one second differ only in their random
    # suffix, so the order of the runs is read from the manifests themselves.
    manifests.sort(key=lambda manifest: manifest["started_at"])
    assert [manifest["counts"]["converted"] for manifest in manifests] == [1, 0]
