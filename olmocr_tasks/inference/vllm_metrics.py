"""vLLM's ``/metrics`` in Prometheus text: the reader the client polls (queue gauges, token counters) and
the writer our servers use.

The reader and the writer live together so the names, labels and number format the adaptive client
expects are the ones the CPU engine and the test stand-in publish. Pure (no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
SUCCESS_METRIC = "vllm:request_success_total"
PROMPT_TOKENS_METRIC = "vllm:prompt_tokens_total"
GENERATION_TOKENS_METRIC = "vllm:generation_tokens_total"
# The finish reasons vLLM 0.32 labels its success counter with, each present from the start.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class QueueSample:
    """One replica's scheduler state: requests being generated and requests queued behind them."""

    running: float
    waiting: float


@dataclass(frozen=True)
class ServerSample:
    """One reading of a replica's ``/metrics``: its queue, and the tokens it has processed since it
    started (prompt plus generation counters), None when it does not publish both counters."""

    queue: QueueSample
    processed_tokens: float | None


class MetricsFormatError(ValueError):
    """The text is not a Prometheus exposition carrying vLLM's queue gauges."""


def parse_vllm_sample(text: str) -> ServerSample:
    """The queue gauges (required) and the token counters (optional), each summed over its label sets.

    vLLM labels its metrics (``model_name``, and ``engine`` with data parallelism), so one metric can
    appear on several lines; the server's value is their sum.
    """
    totals = _sum_metrics(text, (RUNNING_METRIC, WAITING_METRIC, PROMPT_TOKENS_METRIC, GENERATION_TOKENS_METRIC))
    missing = [name for name in (RUNNING_METRIC, WAITING_METRIC) if name not in totals]
    if missing:
        raise MetricsFormatError(f"metrics lack {', '.join(missing)}")
    queue = QueueSample(running=totals[RUNNING_METRIC], waiting=totals[WAITING_METRIC])
    counters = (PROMPT_TOKENS_METRIC, GENERATION_TOKENS_METRIC)
    tokens = sum(totals[name] for name in counters) if all(name in totals for name in counters) else None
    return ServerSample(queue=queue, processed_tokens=tokens)


def _sum_metrics(text: str, names: Iterable[str]) -> dict[str, float]:
    """The sum over label sets of each of ``names`` that appears in the text (non-finite values count 0)."""
    totals: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for name in names:
            if not line.startswith(name):
                continue
            rest = line[len(name) :]
            if rest[:1] == "{":
                rest = _skip_labels(rest)
            elif rest[:1] not in (" ", "\t"):
                # A longer metric name sharing the prefix (e.g. ..._waiting_by_reason).
                continue
            fields = rest.split()
            if not fields:
                raise MetricsFormatError(f"metric {name} has no value")
            try:
                value = float(fields[0])
            except ValueError:
                raise MetricsFormatError(f"metric {name} has a non-numeric value") from None
            totals[name] = totals.get(name, 0.0) + (value if math.isfinite(value) else 0.0)
    return totals


def _skip_labels(rest: str) -> str:
    """Return what follows a ``{...}`` label block, respecting quoted values that may contain braces."""
    in_quotes = False
    escaped = False
    for index, char in enumerate(rest):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            in_quotes = not in_quotes
        elif char == "}" and not in_quotes:
            return rest[index + 1 :]
    raise MetricsFormatError("unterminated label block")


# ---------------------------------------------------------------------------------------------------
# Writer


@dataclass(frozen=True)
class Metric:
    """One metric family: ``samples`` pairs each label set (in order) with its value."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: tuple[tuple[tuple[tuple[str, str], ...], float], ...]


@dataclass(frozen=True)
class ServerMetrics:
    """What a vLLM-compatible server publishes about one served model."""

    model: str
    running: float
    waiting: float
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    # finish reason ("stop", "length") -> completed requests, as vLLM labels its success counter.
    success_by_reason: Mapping[str, float] = field(default_factory=dict)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{key}="{_escape_label(value)}"' for key, value in pairs) + "}"


def render_metrics(metrics: Iterable[Metric]) -> str:
    """Prometheus text exposition (version 0.0.4) of ``metrics``."""
    lines: list[str] = []
    for metric in metrics:
        lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.kind}"]
        lines += [f"{metric.name}{_labels(labels)} {float(value)}" for labels, value in metric.samples]
    return "\n".join(lines) + "\n"


def vllm_metrics(state: ServerMetrics) -> list[Metric]:
    """The metric families vLLM publishes that olmOCR clients and dashboards read, labelled as vLLM does."""
    # vLLM labels each family with its engine (one per data-parallel rank) and the served model name.
    model = (("engine", "0"), ("model_name", state.model))
    reasons = dict.fromkeys(FINISHED_REASONS, 0.0) | dict(state.success_by_reason)
    return [
        Metric(RUNNING_METRIC, "gauge", "Number of requests in model execution batches.", ((model, state.running),)),
        Metric(WAITING_METRIC, "gauge", "Number of requests waiting to be processed.", ((model, state.waiting),)),
        Metric(
            SUCCESS_METRIC,
            "counter",
            "Count of successfully processed requests.",
            tuple(((model[0], ("finished_reason", reason), model[1]), count) for reason, count in reasons.items()),
        ),
        Metric(PROMPT_TOKENS_METRIC, "counter", "Number of prefill tokens processed.", ((model, state.prompt_tokens),)),
        Metric(
            GENERATION_TOKENS_METRIC,
            "counter",
            "Number of generation tokens processed.",
            ((model, state.generation_tokens),),
        ),
    ]


def render_vllm_metrics(state: ServerMetrics, extra: Iterable[Metric] = ()) -> str:
    """``/metrics`` of a vLLM-compatible server: vLLM's families for ``state``, then ``extra`` ones."""
    return render_metrics([*vllm_metrics(state), *extra])
