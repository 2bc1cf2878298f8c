"""What a notification about a failed run says: which run, why, the manifest, failed counts, error classes.

Built from what the run left behind: the publish task's summary (its XCom: manifest link, counts, the
error-budget verdict and the error classes of the failed documents). A run that failed before it
published has no summary; the report then says so and names the task that failed. Plain text and
HTML renderings; every value in the HTML is escaped (document names and error messages come from
untrusted input). Airflow-free: ``olmocr_tasks.provider.notifications`` sends it with a notifier.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from olmocr_tasks.core.redaction import redact_url
from olmocr_tasks.location.manifest import OUTCOME_COUNT_KEYS


@dataclass(frozen=True)
class FailureReport:
    dag_id: str
    run_id: str
    reason: str
    failed_task: str | None = None
    manifest: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    error_classes: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        failed = self.counts.get("failed")
        detail = f"{failed} of {self.counts.get('documents', 0)} documents failed" if failed else self.reason
        return f"olmOCR run failed: {self.dag_id} / {self.run_id} ({detail})"

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) pairs in reading order; both renderings are made from these."""
        rows = [("DAG", self.dag_id), ("Run", self.run_id), ("Reason", self.reason)]
        if self.failed_task:
            rows.append(("Failed task", self.failed_task))
        rows.append(("Manifest", self.manifest or "none: the run failed before its manifest was published"))
        rows += [
            (name.replace("_", " ").capitalize(), str(self.counts[name]))
            for name in OUTCOME_COUNT_KEYS
            if name in self.counts
        ]
        if self.error_classes:
            rows.append(("Error classes", ", ".join(f"{name}: {count}" for name, count in self.error_classes.items())))
        rows += [("Problem", problem) for problem in self.problems]
        return rows

    @property
    def text(self) -> str:
        return "\n".join(f"{label}: {value}" for label, value in self.lines()) + "\n"

    @property
    def html(self) -> str:
        rows = "".join(
            f"<tr><th align=left>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
            for label, value in self.lines()
        )
        return f"<p>{html.escape(self.subject)}</p><table>{rows}</table>"

    def template_context(self) -> dict[str, Any]:
        """What notifier templates can use as ``{{ olmocr_failure.<name> }}``."""
        return {
            "subject": self.subject,
            "text": self.text,
            "html": self.html,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "reason": self.reason,
            "failed_task": self.failed_task,
            "manifest": self.manifest,
            "counts": dict(self.counts),
            "error_classes": dict(self.error_classes),
            "problems": list(self.problems),
        }


def build_failure_report(
    dag_id: str,
    run_id: str,
    reason: str,
    *,
    failed_task: str | None = None,
    publish_summary: Mapping[str, Any] | None = None,
) -> FailureReport:
    """The report of a failed run from the publish task's summary (None when it never published)."""
    summary = publish_summary or {}
    manifest = summary.get("manifest")
    verdict = summary.get("error_budget") or {}
    return FailureReport(
        dag_id=dag_id,
        run_id=run_id,
        reason=reason or "failed",
        failed_task=failed_task,
        manifest=redact_url(manifest) if manifest else None,
        counts={name: int(summary[name]) for name in OUTCOME_COUNT_KEYS if isinstance(summary.get(name), int)},
        error_classes=dict(summary.get("error_classes") or {}),
        problems=tuple(str(problem) for problem in verdict.get("problems") or ()),
    )
