"""Airflow provider registration (``apache_airflow_provider`` entry point).

Importing this module must not import Airflow: Airflow calls ``get_provider_info`` while it is still
discovering providers. The hook itself lives in ``olmocr_tasks.provider.hooks``.
"""

from __future__ import annotations

from typing import Any

from olmocr_tasks import __version__
from olmocr_tasks.core.config import ConnectionSettings, HedgeSettings, RetrySettings, TimeoutSettings
from olmocr_tasks.inference.priority import SCHEDULING_POLICIES

CONNECTION_TYPE = "olmocr_vllm"
DEFAULT_CONN_ID = "olmocr_vllm"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "olmocr-airflow",
        "name": "olmOCR on vLLM",
        "description": "Convert PDF collections to markdown with olmOCR served by vLLM.",
        "versions": [__version__],
        "connection-types": [
            {
                "connection-type": CONNECTION_TYPE,
                "hook-class-name": "olmocr_tasks.provider.hooks.VllmHook",
                "hook-name": "olmOCR vLLM",
                "ui-field-behaviour": {
                    "hidden-fields": ["login"],
                    "relabeling": {
                        "password": "API key",
                        "host": "Host (or full base URL)",
                        "schema": "Scheme (http or https)",
                    },
                    "placeholders": {
                        "host": "vllm.internal or https://vllm.example.com/v1",
                        "port": "8000",
                        "password": "optional Bearer token",
                    },
                },
                "conn-fields": {
                    "model": {
                        "label": "Served model name",
                        "description": "Must be listed by GET /v1/models.",
                        "schema": {"type": ["string", "null"], "default": ConnectionSettings.model},
                    },
                    "replicas": {
                        "label": "More replicas",
                        "description": "Comma-separated base URLs of further vLLM replicas (balanced).",
                        "schema": {"type": ["string", "null"]},
                    },
                    "max_concurrent_requests": {
                        "label": "Max in-flight requests per worker",
                        "schema": {"type": ["integer", "null"], "minimum": 1},
                    },
                    "gpu_hour_price": {
                        "label": "GPU hour price",
                        "description": "Price of one GPU hour; run manifests then carry a cost estimate.",
                        "schema": {"type": ["number", "null"], "minimum": 0},
                    },
                    "verify_tls": {
                        "label": "Verify TLS certificates",
                        "schema": {"type": ["boolean", "null"], "default": ConnectionSettings.verify_tls},
                    },
                    "guided_decoding": {
                        "label": "Guided decoding",
                        "description": (
                            "Constrain answers to olmOCR's front matter (olmOCR's --guided_decoding); needs vLLM, "
                            "whose version picks the request field."
                        ),
                        "schema": {"type": ["boolean", "null"], "default": ConnectionSettings.guided_decoding},
                    },
                    "read_timeout_s": {
                        "label": "Read timeout (s)",
                        "description": (
                            f"How long one page may take to answer (default {TimeoutSettings.read_timeout_s:g})."
                        ),
                        "schema": {"type": ["number", "null"], "minimum": 1},
                    },
                    "outage_window_s": {
                        "label": "Outage window (s)",
                        "description": (
                            "Failing this long with no success aborts the task for a retry "
                            f"(default {RetrySettings.outage_window_s:g})."
                        ),
                        "schema": {"type": ["number", "null"], "minimum": 1},
                    },
                    "hedge_requests": {
                        "label": "Hedge slow requests",
                        "description": "Send a second request for a page that outlasts its peers; first answer wins.",
                        "schema": {"type": ["boolean", "null"], "default": HedgeSettings.hedge_requests},
                    },
                    "hedge_min_delay_s": {
                        "label": "Hedge floor (s)",
                        "description": (
                            "Never hedge a request outstanding for less than this "
                            f"(default {HedgeSettings.hedge_min_delay_s:g})."
                        ),
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "hedge_multiple": {
                        "label": "Hedge multiple of p95",
                        "description": (
                            "While vLLM's queue holds requests, hedge after this many times the recent p95 "
                            f"answer time (default {HedgeSettings.hedge_multiple:g})."
                        ),
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                    "scheduling_policy": {
                        "label": "vLLM scheduling policy",
                        "description": (
                            "fcfs (vLLM's default) or priority: set priority when vLLM runs with "
                            "--scheduling-policy priority, and page requests then carry their run's class."
                        ),
                        "schema": {"type": ["string", "null"], "enum": [*SCHEDULING_POLICIES, None]},
                    },
                    "hedge_idle_multiple": {
                        "label": "Hedge multiple of p95, idle server",
                        "description": (
                            "While vLLM's queue is empty, hedge after this many times the recent p95 answer "
                            f"time since it emptied (default {HedgeSettings.hedge_idle_multiple:g})."
                        ),
                        "schema": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    },
                },
            }
        ],
    }
