"""A DAG-level ``on_failure_callback`` that sends the failed run's report through an Airflow notifier.

Configured without editing the DAG: the Airflow Variable ``olmocr_failure_notifier`` (set in the UI,
with ``airflow variables set``, or as the environment variable ``AIRFLOW_VAR_OLMOCR_FAILURE_NOTIFIER``)
holds JSON naming a notifier class and its arguments, e.g. mail through an SMTP connection::

    {"notifier": "airflow.providers.smtp.notifications.smtp.SmtpNotifier",
     "kwargs": {"to": "ocr-team@example.com", "from_email": "airflow@example.com",
                "smtp_conn_id": "smtp_default"}}

Any ``BaseNotifier`` works (Slack, Teams, PagerDuty... from their providers). Its message fields that
the arguments leave out are filled with the report (``olmocr_tasks.location.failure_report``): ``subject`` with
its subject line, ``html_content`` with its HTML, ``text``/``message``/``body`` with its text. Templates
of your own can use ``{{ olmocr_failure.manifest }}``, ``.counts``, ``.error_classes``, ``.text`` etc.
Without the Variable the callback does nothing. Credentials belong in the notifier's connection, never
in the Variable.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from olmocr_tasks.location.failure_report import FailureReport, build_failure_report

log = logging.getLogger(__name__)

NOTIFIER_VARIABLE = "olmocr_failure_notifier"
PUBLISH_TASK_ID = "publish_manifest"
# Notifier message fields filled with the report when the configuration leaves them out.
DEFAULT_FIELDS = {
    "subject": "{{ olmocr_failure.subject }}",
    "html_content": "{{ olmocr_failure.html }}",
    "text": "{{ olmocr_failure.text }}",
    "message": "{{ olmocr_failure.text }}",
    "body": "{{ olmocr_failure.text }}",
}


class NotifierConfigError(ValueError):
    """The ``olmocr_failure_notifier`` Variable does not describe a usable notifier."""


@dataclass(frozen=True)
class NotifierConfig:
    notifier: str  # dotted path of a BaseNotifier subclass
    kwargs: dict[str, Any]


def parse_notifier_config(raw: str | Mapping[str, Any] | None) -> NotifierConfig | None:
    """The Variable's value (JSON text or already parsed); None or empty means notifications are off."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise NotifierConfigError(f"{NOTIFIER_VARIABLE} is not valid JSON: {exc.msg}") from None
    if not isinstance(raw, Mapping):
        raise NotifierConfigError(f"{NOTIFIER_VARIABLE} must be a JSON object")
    notifier, kwargs = raw.get("notifier"), raw.get("kwargs", {})
    if not isinstance(notifier, str) or "." not in notifier:
        raise NotifierConfigError(f'{NOTIFIER_VARIABLE} needs "notifier": the dotted path of a notifier class')
    if not isinstance(kwargs, Mapping):
        raise NotifierConfigError(f'{NOTIFIER_VARIABLE}: "kwargs" must be an object')
    unknown = sorted(set(raw) - {"notifier", "kwargs"})
    if unknown:
        raise NotifierConfigError(f"{NOTIFIER_VARIABLE}: unknown key(s) {', '.join(unknown)}")
    return NotifierConfig(notifier, dict(kwargs))


def make_notifier(config: NotifierConfig) -> Any:
    """Instantiate the configured notifier, its missing message fields pointing at the report."""
    from airflow.sdk import BaseNotifier

    module_name, _, class_name = config.notifier.rpartition(".")
    try:
        notifier_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise NotifierConfigError(f"cannot import notifier {config.notifier}: {exc}") from None
    if not (isinstance(notifier_class, type) and issubclass(notifier_class, BaseNotifier)):
        raise NotifierConfigError(f"{config.notifier} is not an Airflow notifier (BaseNotifier)")
    fields = set(getattr(notifier_class, "template_fields", ()))
    defaults = {name: value for name, value in DEFAULT_FIELDS.items() if name in fields and name not in config.kwargs}
    return notifier_class(**config.kwargs, **defaults)


def report_from_context(context: Mapping[str, Any]) -> FailureReport:
    """The failed run's report from a DAG callback context (in the DAG processor, or ``dag.test``).

    The run's manifest is read first: it is the record of the run and holds the error classes. When
    it cannot be read (never published, storage unreachable), the publish task's XCom summary still
    gives the counts; a run that got neither is reported by its failed task alone.
    """
    ti = context.get("ti")
    summary = _summary_from_manifest(context) or _publish_summary(ti)
    dag_run = context.get("dag_run")
    return build_failure_report(
        dag_id=context["dag"].dag_id,
        run_id=str(context.get("run_id") or getattr(dag_run, "run_id", "")),
        reason=str(context.get("reason") or "failed"),
        failed_task=getattr(ti, "task_id", None),
        publish_summary=summary,
    )


def _summary_from_manifest(context: Mapping[str, Any]) -> dict[str, Any] | None:
    from olmocr_tasks.location.manifest_reader import read_manifest
    from olmocr_tasks.provider.hooks import storage_for
    from olmocr_tasks.provider.run_requests import airflow_run_id

    output_uri = (context.get("params") or {}).get("output_uri")
    if not output_uri or context.get("dag_run") is None:
        return None
    run_id = airflow_run_id(context)  # the publish task wrote its manifest under this id
    try:
        manifest = read_manifest(storage_for([output_uri]), output_uri, run_id)
        if manifest is None:
            return None
        # Schema 3 summaries carry the error classes; older manifests count them from their entries.
        error_classes = manifest.error_classes()
    except Exception as exc:  # the report must still go out, if with less in it
        log.warning("could not read the run manifest of %s: %s", run_id, exc)
        return None
    return {
        "manifest": manifest.uri,
        **manifest.counts(),
        "error_budget": manifest.summary.get("error_budget") or {},
        "error_classes": error_classes,
    }


def _publish_summary(ti: Any) -> Mapping[str, Any] | None:
    if ti is None:
        return None
    try:
        summary = ti.xcom_pull(task_ids=PUBLISH_TASK_ID)
    except Exception as exc:  # e.g. dag.test() runs callbacks without the task supervisor's XCom channel
        log.warning("could not read the %s summary: %s", PUBLISH_TASK_ID, exc)
        return None
    return summary if isinstance(summary, Mapping) else None


def notify_run_failure(context: Mapping[str, Any]) -> None:
    """The DAG's ``on_failure_callback``: send the report with the configured notifier, if any."""
    from airflow.sdk import Variable

    config = parse_notifier_config(Variable.get(NOTIFIER_VARIABLE, default=None))
    if config is None:
        return
    report = report_from_context(context)
    notifier = make_notifier(config)
    notifier_context = {**context, "olmocr_failure": report.template_context()}
    if not hasattr(context.get("dag"), "get_template_env"):
        # dag.test() hands DAG callbacks its serialized DAG, which cannot make a template environment
        # (the DAG processor, where deployed callbacks run, hands the DAG itself): without a DAG the
        # notifier renders in Airflow's sandboxed default environment.
        notifier_context["dag"] = None
    notifier(notifier_context)
    log.info("failure of %s / %s reported through %s", report.dag_id, report.run_id, config.notifier)
