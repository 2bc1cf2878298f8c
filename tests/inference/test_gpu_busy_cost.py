"""The run's cost from GPU-busy seconds read from vLLM's /metrics (issue 12, item 9).

The integration and the token-share attribution are checked with hand-made samples and times; the
whole path (client polls, batch part, manifest) against the stand-in over HTTP, with and without
/metrics.
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.core.gpu_busy import GpuBusy, total_gpu_busy
from olmocr_tasks.inference.gpu_busy import GpuBusyMeter
from olmocr_tasks.inference.vllm_metrics import (
    QueueSample,
    ServerMetrics,
    ServerSample,
    parse_vllm_sample,
    render_vllm_metrics,
)
from olmocr_tasks.location.manifest import DocumentEntry, Manifest
from olmocr_tasks.location.run_folders import RunFolder
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer

GPU_HOUR_PRICE = 3.6


def sample(running: float, tokens: float | None) -> ServerSample:
    return ServerSample(QueueSample(running=running, waiting=0.0), tokens)


def feed(meter: GpuBusyMeter, timeline: list[tuple[float, float, float | None]], replica: str = "r0") -> None:
    """``timeline`` is (time, running, processed tokens) per poll of one replica."""
    for at, running, tokens in timeline:
        meter.observe(replica, at, sample(running, tokens))


# Busy during the polls at 1, 2 and 5 s: the intervals before them (1 + 1 + 2 s) are busy, 4 s in all.
# The server processed 400 tokens over the span.
SERVER_TIMELINE: list[tuple[float, float, float | None]] = [
    (0.0, 0, 1000),
    (1.0, 2, 1100),
    (2.0, 1, 1250),
    (3.0, 0, 1250),
    (5.0, 3, 1400),
]


# ---------------------------------------------------------------------------------------------------
# The integration and the share, pure


def test_a_sample_with_requests_running_counts_the_interval_since_the_previous_sample() -> None:
    meter = GpuBusyMeter()
    feed(meter, SERVER_TIMELINE[:1])
    meter.count_tokens("r0", 400)
    feed(meter, SERVER_TIMELINE[1:])
    assert meter.result() == GpuBusy(4.0, measured=True)


@pytest.mark.parametrize(
    ("own_tokens", "charged_seconds"),
    [(100, 1.0), (200, 2.0), (400, 4.0), (1000, 4.0)],  # a quarter, half, all, and capped at all
)
def test_a_shared_server_is_charged_by_token_share_capped_at_one(own_tokens: int, charged_seconds: float) -> None:
    meter = GpuBusyMeter()
    feed(meter, SERVER_TIMELINE[:2])
    meter.count_tokens("r0", own_tokens)
    feed(meter, SERVER_TIMELINE[2:])
    assert meter.result() == GpuBusy(charged_seconds, measured=True)


def test_concurrent_clients_of_one_server_add_up_to_its_busy_time_instead_of_each_paying_all_of_it() -> None:
    first, second = GpuBusyMeter(), GpuBusyMeter()
    for meter, own_tokens, lag in ((first, 300, 0.0), (second, 100, 0.01)):
        feed(meter, SERVER_TIMELINE[:1])
        meter.count_tokens("r0", own_tokens)
        # Each process polls on its own schedule; here the second reads every sample 10 ms later.
        feed(meter, [(at + lag, running, tokens) for at, running, tokens in SERVER_TIMELINE[1:]])
    charged = first.result().seconds + second.result().seconds
    assert first.result().seconds == pytest.approx(3.0, abs=0.01)
    assert charged == pytest.approx(4.0, abs=0.02)  # the server's busy time, once


def test_without_token_counters_the_busy_time_is_charged_unscaled() -> None:
    meter = GpuBusyMeter()
    feed(meter, [(at, running, None) for at, running, _ in SERVER_TIMELINE[:2]])
    meter.count_tokens("r0", 1)
    feed(meter, [(at, running, None) for at, running, _ in SERVER_TIMELINE[2:]])
    assert meter.result() == GpuBusy(4.0, measured=True)


def test_a_restarted_server_counts_its_tokens_from_zero_and_tokens_before_the_first_sample_are_not_ours() -> None:
    meter = GpuBusyMeter()
    meter.count_tokens("r0", 10_000)  # answered before the baseline: already inside the server's counters
    feed(meter, [(0.0, 0, 5000), (1.0, 1, 5100)])
    meter.count_tokens("r0", 100)
    feed(meter, [(2.0, 1, 100)])  # restarted: 100 tokens since, 200 over the span, half of them ours
    assert meter.result() == GpuBusy(1.0, measured=True)


def test_busy_time_is_summed_over_replicas_each_with_its_own_share() -> None:
    meter = GpuBusyMeter()
    feed(meter, [(0.0, 0, 0)], "a")
    feed(meter, [(0.0, 0, 0)], "b")
    meter.count_tokens("a", 50)
    meter.count_tokens("b", 100)
    feed(meter, [(2.0, 1, 100)], "a")  # 2 s busy, half ours
    feed(meter, [(3.0, 1, 100)], "b")  # 3 s busy, all ours
    assert meter.result() == GpuBusy(4.0, measured=True)


def test_unmeasured_without_samples_for_a_replica_that_answered_or_when_polling_stopped_early() -> None:
    assert not GpuBusyMeter().result().measured  # never polled (adaptive concurrency off)
    unsampled = GpuBusyMeter()
    feed(unsampled, SERVER_TIMELINE, "a")
    unsampled.count_tokens("b", 100)  # a replica without /metrics served some pages
    assert not unsampled.result().measured
    interrupted = GpuBusyMeter()
    feed(interrupted, SERVER_TIMELINE[:1])
    interrupted.count_tokens("r0", 400)
    feed(interrupted, SERVER_TIMELINE[1:])
    interrupted.interrupt()
    assert interrupted.result() == GpuBusy(4.0, measured=False)
    stopped = GpuBusyMeter()
    feed(stopped, SERVER_TIMELINE[:1])
    stopped.count_tokens("r0", 100)
    feed(stopped, SERVER_TIMELINE[1:2])
    stopped.stop()
    feed(stopped, SERVER_TIMELINE[2:])  # polls after the batch ended are not its time
    assert stopped.result() == GpuBusy(1.0, measured=True)


def test_the_token_counters_are_read_from_vllm_metrics_when_published() -> None:
    state = ServerMetrics(model="m", running=2, waiting=1, prompt_tokens=1200, generation_tokens=34)
    assert parse_vllm_sample(render_vllm_metrics(state)) == ServerSample(QueueSample(2.0, 1.0), 1234.0)
    queue_only = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:prompt_tokens_total 5\n"
    assert parse_vllm_sample(queue_only) == ServerSample(QueueSample(1.0, 0.0), None)


# ---------------------------------------------------------------------------------------------------
# Batch reports and the manifest


def test_a_run_is_measured_only_if_every_batch_measured_all_its_attempts(tmp_path: Path) -> None:
    assert total_gpu_busy([]) is None
    assert total_gpu_busy([GpuBusy(1.0, True), GpuBusy(2.0, True)]) == GpuBusy(3.0, True)
    assert total_gpu_busy([GpuBusy(1.0, True), None]) == GpuBusy(1.0, False)

    folder = RunFolder(Storage(), str(tmp_path / "out"), "run", "p1-abc")
    entry = DocumentEntry(source="/in/a.pdf", status="converted", pages=1)
    finished = folder.attempt("b0", 1)
    finished.start()
    finished.write_part([entry], GpuBusy(2.5, measured=True))
    retried = folder.attempt("b0", 2)  # Airflow ran the instance again after its part was written
    retried.start()
    assert retried.carried_gpu_busy == GpuBusy(2.5, measured=True)
    retried.write_part([entry], retried.carried_gpu_busy.plus(GpuBusy(0.0, measured=True)))
    assert _run_gpu_busy(folder) == GpuBusy(2.5, measured=True)

    died = folder.attempt("b1", 1)
    died.start()
    died.write_entry(entry)  # then the worker was killed: what it spent is unknown
    resumed = folder.attempt("b1", 2)
    resumed.start()
    assert not resumed.carried_gpu_busy.measured
    resumed.write_part([entry], resumed.carried_gpu_busy.plus(GpuBusy(1.0, measured=True)))
    assert _run_gpu_busy(folder) == GpuBusy(3.5, measured=False)

    # A part written before the measurement is a bare list of entries: read, and unmeasured.
    legacy = RunFolder(Storage(), str(tmp_path / "out"), "run", "p2-def")
    legacy.attempt("b0", 1).start()
    Path(legacy.attempt("b0", 1).part_uri).write_text(json.dumps([entry.to_dict()]))
    (report,) = legacy.iter_reports()
    assert report.entries == [entry] and report.gpu_busy is None
    assert _run_gpu_busy(legacy) == GpuBusy(0.0, measured=False)


def _run_gpu_busy(folder: RunFolder) -> GpuBusy | None:
    """The run's GPU-busy seconds as publishing sums them: over the latest attempt of every batch."""
    return total_gpu_busy(report.gpu_busy for report in folder.iter_reports())


def _manifest(gpu_busy: GpuBusy | None) -> Manifest:
    return Manifest(
        run_id="r",
        started_at="2026-11-30T10:00:00.000Z",
        finished_at="2026-11-30T10:01:40.000Z",
        server={},
        model="m",
        prompt_version="p",
        package_version="0",
        settings={},
        input_uri="/in",
        output_uri="/out",
        documents=[DocumentEntry(source="/in/a.pdf", status="converted", pages=4)],
        gpu_hour_price=GPU_HOUR_PRICE,
        gpu_busy=gpu_busy,
    )


def test_cost_counts_measured_busy_seconds_else_wall_clock_and_old_manifests_still_read() -> None:
    measured = _manifest(GpuBusy(20.0, measured=True)).metrics()["cost"]
    assert measured == {
        "basis": "vllm_metrics_busy",
        "gpu_hour_price": GPU_HOUR_PRICE,
        "gpu_seconds": 20.0,
        "estimated_cost": 0.02,
        "cost_per_million_pages": 5000.0,
    }
    for unmeasured in (GpuBusy(20.0, measured=False), None):
        cost = _manifest(unmeasured).metrics()["cost"]
        assert (cost["basis"], cost["gpu_seconds"], cost["estimated_cost"]) == ("wall_clock", 100.0, 0.1)

    schema = json.loads(importlib.resources.files("olmocr_tasks").joinpath("schemas/manifest.schema.json").read_text())
    published = json.loads(_manifest(GpuBusy(20.0, measured=True)).to_json())
    jsonschema.validate(published, schema)
    assert Manifest.from_dict(published).to_dict() == published

    # A manifest from before the measurement: no gpu_busy, no basis. It reads, and its cost is wall clock.
    old = json.loads(_manifest(None).to_json())
    del old["gpu_busy"], old["metrics"]["cost"]["basis"]
    jsonschema.validate(old, schema)
    again = Manifest.from_dict(old)
    assert again.gpu_busy is None and again.metrics()["cost"] == {**old["metrics"]["cost"], "basis": "wall_clock"}


# ---------------------------------------------------------------------------------------------------
# End to end against the stand-in


def _convert(tmp_path: Path, url: str, run_id: str) -> dict[str, Any]:
    """Convert three two-page PDFs at a price per GPU hour; returns the published manifest."""
    for doc_id in (1, 2, 3):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(2, doc_id=doc_id))
    server = ServerSettings(
        base_urls=(url,),
        read_timeout_s=10.0,
        outage_window_s=5.0,
        readiness_timeout_s=5.0,
        max_concurrent_requests=4,
        # Polls much shorter than a request, so the busy time is sampled many times per request.
        metrics_poll_interval_s=0.05,
    )
    request = RunRequest(
        input_uri=str(tmp_path / "in"),
        output_uri=str(tmp_path / "out"),
        run_id=run_id,
        settings=ConversionSettings(server=server, gpu_hour_price=GPU_HOUR_PRICE),
    )
    manifest, uri = run_conversion(request, Storage())
    assert manifest.counts()["converted"] == 3
    return json.loads(Path(uri).read_text())


def test_a_run_against_a_vllm_server_is_charged_its_busy_seconds_from_metrics(
    tmp_path: Path, standin_factory: Callable[..., StandinServer]
) -> None:
    standin = standin_factory(latency_s=0.5)
    published = _convert(tmp_path, standin.url, "busy")
    cost = published["metrics"]["cost"]
    assert cost["basis"] == "vllm_metrics_busy" and published["gpu_busy"]["measured"] is True
    # The server worked on this run's pages only part of the run (planning, rendering, writing).
    assert 0 < cost["gpu_seconds"] <= published["metrics"]["elapsed_s"]
    assert cost["gpu_seconds"] == published["gpu_busy"]["seconds"]
    assert cost["estimated_cost"] == round(GPU_HOUR_PRICE * cost["gpu_seconds"] / 3600, 6)
    assert Manifest.from_dict(published).metrics()["cost"] == cost


def test_a_server_without_metrics_is_charged_the_wall_clock(
    tmp_path: Path, standin_factory: Callable[..., StandinServer]
) -> None:
    standin = standin_factory(latency_s=0.2, metrics=False)
    published = _convert(tmp_path, standin.url, "plain")
    cost = published["metrics"]["cost"]
    assert cost["basis"] == "wall_clock" and published["gpu_busy"]["measured"] is False
    assert cost["gpu_seconds"] == published["metrics"]["elapsed_s"]
    assert cost["estimated_cost"] == round(GPU_HOUR_PRICE * cost["gpu_seconds"] / 3600, 6)
