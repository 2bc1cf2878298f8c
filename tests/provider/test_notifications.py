"""Failure notifications: the report of a failed run, and its delivery by an Airflow notifier.

The report (``olmocr_tasks.location.failure_report``) is checked on its own; then a real ``olmocr_ingest`` run
over its error budget is run with ``dag.test()``, its ``on_failure_callback`` configured only through
an Airflow Variable and an SMTP connection (environment variables), and the mail is read from a local
SMTP server (aiosmtpd on 127.0.0.1).
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from olmocr_tasks.location.failure_report import build_failure_report
from olmocr_tasks.location.manifest import DocumentEntry, error_class_counts
from olmocr_tasks.provider.notifications import NotifierConfigError, make_notifier, parse_notifier_config
from olmocr_testkit import pdfgen
from olmocr_testkit.airflow_env import AirflowEnv
from tests.fixtures.manifests import load_whole

SMTP_NOTIFIER = "airflow.providers.smtp.notifications.smtp.SmtpNotifier"


# -- the report -------------------------------------------------------------------------------------------

SUMMARY = {
    "manifest": "s3://bucket/out/manifests/olmocr_ingest__manual_1.json",
    "run_id": "olmocr_ingest__manual_1",
    "documents": 5,
    "converted": 2,
    "failed": 3,
    "skipped": 0,
    "not_converted": 0,
    "dead_letters": 1,
    "pages": 9,
    "error_classes": {"corrupt_pdf": 2, "<script>x</script>": 1},
    "error_budget": {"exceeded": True, "problems": ["3 of 5 documents failed (60.0%), over the budget of 5.0%"]},
}


def test_error_classes_are_counted_from_failed_entries() -> None:
    documents = [
        DocumentEntry(source="a", status="failed", error_class="corrupt_pdf"),
        DocumentEntry(source="b", status="failed", error_class="too_large"),
        DocumentEntry(source="c", status="failed", error_class="corrupt_pdf"),
        DocumentEntry(source="d", status="converted"),
        DocumentEntry(source="e", status="failed"),
    ]
    assert error_class_counts(documents) == {"corrupt_pdf": 2, "too_large": 1, "unknown": 1}


def test_report_names_run_manifest_counts_classes_and_problems() -> None:
    report = build_failure_report("olmocr_ingest", "manual_1", "task_failure", failed_task="enforce_error_budget",
                                  publish_summary=SUMMARY)  # fmt: skip
    assert report.subject == "olmOCR run failed: olmocr_ingest / manual_1 (3 of 5 documents failed)"
    text = report.text
    for expected in (
        "Manifest: s3://bucket/out/manifests/olmocr_ingest__manual_1.json",
        "Failed: 3",
        "Dead letters: 1",
        "Failed task: enforce_error_budget",
        "Error classes: corrupt_pdf: 2, <script>x</script>: 1",
        "Problem: 3 of 5 documents failed (60.0%), over the budget of 5.0%",
    ):
        assert expected in text, text
    assert "<script>" not in report.html and "&lt;script&gt;x&lt;/script&gt;: 1" in report.html


def test_report_of_a_run_that_never_published() -> None:
    report = build_failure_report("olmocr_ingest", "manual_2", "task_failure", failed_task="check_server")
    assert "Manifest: none: the run failed before its manifest was published" in report.text
    assert report.subject.endswith("(task_failure)") and report.counts == {} and report.error_classes == {}


def test_manifest_link_never_carries_a_password() -> None:
    summary = {**SUMMARY, "manifest": "https://user:hunter2@minio.example/out/manifests/r.json"}
    report = build_failure_report("d", "r", "task_failure", publish_summary=summary)
    assert "hunter2" not in report.text + report.html


# -- the configuration --------------------------------------------------------------------------------------


def test_no_variable_means_no_notifications() -> None:
    assert parse_notifier_config(None) is None and parse_notifier_config("  ") is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"kwargs": {}}', '"notifier"'),
        ('{"notifier": "SmtpNotifier"}', '"notifier"'),
        (json.dumps({"notifier": SMTP_NOTIFIER, "kwargs": []}), '"kwargs"'),
        (json.dumps({"notifier": SMTP_NOTIFIER, "to": "x"}), "unknown key"),
    ],
)
def test_bad_configurations_say_what_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(NotifierConfigError, match=message):
        parse_notifier_config(raw)


def test_only_airflow_notifiers_are_accepted() -> None:
    for path, message in (("json.JSONDecoder", "not an Airflow notifier"), ("no_such_module.Thing", "cannot import")):
        config = parse_notifier_config(json.dumps({"notifier": path}))
        assert config is not None
        with pytest.raises(NotifierConfigError, match=message):
            make_notifier(config)


def test_message_fields_default_to_the_report_unless_configured() -> None:
    config = parse_notifier_config({"notifier": SMTP_NOTIFIER, "kwargs": {"to": "a@example.com", "subject": "Mine"}})
    assert config is not None
    notifier = make_notifier(config)
    assert notifier.subject == "Mine"
    assert notifier.html_content == "{{ olmocr_failure.html }}"


# -- through Airflow: dag.test(), the callback, an SMTP server ----------------------------------------------


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], bytes]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 OK"


class _BoundController(Controller):
    """aiosmtpd's threaded SMTP server on a socket bound here to port 0 and kept bound until it serves.

    A port picked by binding and closing a probe could be taken by another process before the server
    binds it; this one is never released in between.
    """

    def __init__(self, handler: Any, sock: socket.socket) -> None:
        self._sock = sock
        super().__init__(handler, hostname="127.0.0.1", port=sock.getsockname()[1])

    def _create_server(self) -> Any:
        return self.loop.create_server(self._factory_invoker, sock=self._sock, ssl=self.ssl_context)


@pytest.fixture
def smtp_server() -> Iterator[tuple[int, _Inbox]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    inbox = _Inbox()
    controller = _BoundController(inbox, sock)
    controller.start()
    try:
        yield controller.port, inbox
    finally:
        controller.stop()
        sock.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_failed_ingest_run_mails_its_report_through_the_configured_notifier(
    airflow_env: AirflowEnv, smtp_server: tuple[int, _Inbox], tmp_path: Path
) -> None:
    port, inbox = smtp_server
    pdfgen.write_pdf(tmp_path / "in" / "good.pdf", pdfgen.text_pdf(1, doc_id=1))
    (tmp_path / "in" / "broken.pdf").write_bytes(pdfgen.not_a_pdf())
    output = tmp_path / "out"
    airflow = airflow_env.with_env(
        # The whole configuration: a Variable naming the notifier, a connection for it; the DAG is as shipped.
        AIRFLOW_VAR_OLMOCR_FAILURE_NOTIFIER=json.dumps(
            {"notifier": SMTP_NOTIFIER, "kwargs": {"to": "ocr-team@example.com", "smtp_conn_id": "smtp_notify"}}
        ),
        AIRFLOW_CONN_SMTP_NOTIFY=json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": port,
                "extra": {
                    "from_email": "airflow@example.com",
                    "disable_ssl": True,
                    "disable_tls": True,
                    "retry_limit": 0,
                    "timeout": 30,
                },
            }
        ),
    )
    # One of two documents fails: over the default 5% budget, so enforce_error_budget fails the run.
    result = airflow.dag_test("olmocr_ingest", conf={"input_uri": str(tmp_path / "in"), "output_uri": str(output)})
    assert result.state == "failed", result.tail()
    (manifest_path,) = (output / "manifests").glob("olmocr_ingest__*.json")
    manifest = load_whole(str(manifest_path))
    (failed,) = [doc for doc in manifest["documents"] if doc["status"] == "failed"]

    assert len(inbox.messages) == 1, result.tail()
    sender, recipients, raw = inbox.messages[0]
    assert (sender, recipients) == ("airflow@example.com", ["ocr-team@example.com"])
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert message["Subject"] == f"olmOCR run failed: olmocr_ingest / {result.run_id} (1 of 2 documents failed)"
    body = message.get_body(preferencelist=("html",)).get_content()
    assert str(manifest_path) in body  # the link to this run's manifest
    assert f"<th align=left>Failed</th><td>{manifest['counts']['failed']}</td>" in body
    assert f"{failed['error_class']}: 1" in body
    assert "<th align=left>Failed task</th><td>enforce_error_budget</td>" in body
