"""Which failures Airflow retries, shared by every task of the conversion DAGs.

A server that is starting or a storage outage is worth waiting for; anything else (a bug, a
misconfiguration) would fail the same way on every retry, so it fails at once.
"""

from __future__ import annotations

from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule

from olmocr_tasks.core.errors import InfrastructureError, ServerMisconfigured

INFRASTRUCTURE_RETRIES = ExceptionRetryPolicy(
    rules=[
        # Checked first: a rejected API key or a wrong server is an InfrastructureError too, but
        # retrying cannot fix it (convert_body also turns it into AirflowFailException).
        RetryRule(exception=ServerMisconfigured, action=RetryAction.FAIL, reason="server rejects us"),
        RetryRule(exception=InfrastructureError, action=RetryAction.RETRY, reason="server or storage unavailable"),
        RetryRule(
            exception="airflow.sdk.exceptions.AirflowTaskTimeout",
            action=RetryAction.RETRY,
            reason="task timed out",
        ),
    ],
    default=RetryAction.FAIL,
)
