"""How a run judges its documents: the error budget and the dead-letter threshold, with their defaults.

The one owner of these defaults: the CLI's flags, the DAGs' Params and the task glue read them from
``RunSettings`` instead of restating the numbers. What one document's conversion does (pages, page
error rate, the server) is ``olmocr_tasks.core.config.ConversionSettings``.
"""

from __future__ import annotations

from dataclasses import dataclass

from olmocr_tasks.core.errors import ConfigurationError


@dataclass(frozen=True)
class RunSettings:
    """A run's failure rules, judged by the plan (dead letters) and by publishing (the error budget)."""

    # The run fails when more than this share of its own documents failed (``manifest.error_budget_verdict``).
    max_document_error_rate: float = 0.05
    # A source version that failed in this many runs becomes a dead letter instead of being retried.
    max_failed_attempts: int = 3

    def __post_init__(self) -> None:
        rate, attempts = self.max_document_error_rate, self.max_failed_attempts
        if not 0 <= rate <= 1:
            raise ConfigurationError(f"max_document_error_rate must be between 0 and 1, not {rate}")
        if attempts < 1:
            raise ConfigurationError(f"max_failed_attempts must be at least 1, not {attempts}")
