"""Two overlapping scheduled runs list the same fresh PDFs: each is converted once (issue 24).

The deployment schedules ``olmocr_ingest`` every minute with the default lookback of one interval, so
the run of the interval ending at ``tick`` and the run of the next interval both list a PDF uploaded
just before ``tick`` (the second through its lookback). With the GPU as the bottleneck the first is
still converting when the second plans and converts: the stand-in serves ``CAPACITY`` requests at a
time and answers each page of this test's documents after ``SLOW_S`` seconds (its per-page "slow"
fault; other documents are answered as usual), so their pages take rounds, as behind a saturated
vLLM. Once one run's convert instances have all ended (the run that found the documents claimed), the
test ends the slowness (``slow_s`` 0 applies to pages in service too) and the converting run finishes
at once: the overlap lasts as long as the machine needs, not a fixed time sized for a loaded one. The
scheduler makes both runs itself, as in production; the test only uploads, waits and reads what was
published.

The shape is chosen for what else the deployment does. Two documents: the plan gives each its own
convert instance, so the first run holds two of the pool's three slots and the second run's
instances get the third in turn (with three documents the second run would wait for a slot until
the first had finished, and find them converted, not claimed). Short answers in rounds rather than
one long answer: a page request unanswered for a quarter of the read timeout is hedged (a second
request, which the count below would see), while a request waiting in a busy server's queue is not.

Why two scheduled runs rather than a reconciliation run beside an S3-event run: the overlap of a
backlogged schedule is where duplicate work costs most (it doubles exactly when capacity is short),
and it goes through the data-interval listing with lookback, which no other deployment test runs
concurrently. The overlap is asserted from event order (the stand-in's arrival and answer times of the
converting run's requests around the other run's planning), not assumed from the latency.
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from olmocr_tasks.location.layout import safe_run_id
from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import converted, documents, only, sources, statuses
from tests.deployment.schedule import (
    MINUTE,
    RUN_TIMEOUT_S,
    interval,
    now,
    plan_started,
    run_ending,
    scheduled_runs,
)

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
EVENTS_DAG = "olmocr_s3_events"
ENDED = ("success", "failed", "skipped", "upstream_failed", "removed")
# The stand-in answers this many requests at a time, each page of this test's documents after SLOW_S:
# 40 pages would take 10 rounds, about 200 s. The next run is created a minute after the first and had
# tried both documents 80 s after the first run's first request on a quiet machine (the first run's
# last answer came 170 s later with 32 pages); the rest is room for a loaded one. The test ends the
# slowness as soon as that run is done, so a quiet machine does not wait out the room.
CAPACITY = 4
SLOW_S = 20.0
# name -> (doc_id, pages): doc ids no other deployment test uses, so the stand-in counts only ours.
WANTED = {"a.pdf": (243, 20), "deeper/b.pdf": (244, 20)}


def _page_requests(deployment: Deployment, since: int, doc_ids: set[int]) -> list[dict[str, Any]]:
    return [
        record
        for record in deployment.standin.requests(since=since)
        if record.get("marker") and record["marker"]["doc_id"] in doc_ids
    ]


def _manifests_since(deployment: Deployment, bucket: Bucket, since: datetime) -> list[dict[str, Any]]:
    """The manifests every run of the DAGs started since ``since`` published to the DAGs' output."""
    found = []
    for dag_id in (DAG, EVENTS_DAG):
        for run in deployment.api.dag_runs(dag_id, start_date_gte=since.isoformat()):
            manifest = bucket.manifest(deployment.output_uri, dag_id, run["dag_run_id"])
            if manifest is not None:
                found.append(manifest)
    return found


def _converts_ended(deployment: Deployment, run_id: str) -> bool:
    """Every mapped convert instance of the run has ended for good (before expansion there is none; an
    instance waiting for its retry has not)."""
    instances = [ti for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    return bool(instances) and all(ti["map_index"] >= 0 and ti["state"] in ENDED for ti in instances)


def _end_slowness_after_one_run_converted(deployment: Deployment, ends: tuple[datetime, ...]) -> None:
    """Wait until the convert instances of one of the runs ending at ``ends`` have all ended (the run
    that found the documents claimed: the other holds them, its pages slow), then answer the held
    pages at once."""

    def one_ended() -> bool:
        runs = [run for run in scheduled_runs(deployment) if interval(run)[1] in ends]
        return any(_converts_ended(deployment, run["dag_run_id"]) for run in runs)

    wait_until(one_ended, RUN_TIMEOUT_S, 3, what="one overlapping run's convert instances ended")
    deployment.standin.configure(slow_s=0)


def _row(page: str, source: str) -> str:
    """The text of the documents table's row naming ``source`` (exactly one)."""
    rows = [row for row in page.split("<tr")[1:] if f">{source}<" in row]
    assert len(rows) == 1, (source, rows)
    return re.sub(r"<[^>]+>", " ", rows[0])


def test_two_overlapping_scheduled_runs_convert_each_fresh_pdf_once(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, scheduled_prefix: str
) -> None:
    own = bucket.uri(scheduled_prefix)
    doc_ids = {doc_id for doc_id, _ in WANTED.values()}
    pages = sum(count for _, count in WANTED.values())
    slow = {f"{doc_id}:{page}": "slow" for doc_id, count in WANTED.values() for page in range(1, count + 1)}
    # Put back by the tier's autouse fixture (stand-in reset), however the test ends.
    deployment.standin.configure(capacity=CAPACITY, slow_s=SLOW_S, always=slow)
    since = deployment.standin.stats()["total"]
    started = now()

    # Upload well inside one interval (S3 dates to the second, rounded down).
    while not 2 <= now().second < 50:
        time.sleep(1)
    tick = now().replace(second=0, microsecond=0) + MINUTE
    wanted = {
        bucket.put_pdf(f"{scheduled_prefix}{name}", pages=count, doc_id=doc_id): doc_id
        for name, (doc_id, count) in WANTED.items()
    }
    for uri in wanted:
        assert tick - MINUTE < bucket.last_modified(uri.removeprefix(f"s3://{bucket.name}/")) <= tick

    # The run of (tick - 1 min, tick] lists them in its interval, the next one through its lookback.
    _end_slowness_after_one_run_converted(deployment, (tick, tick + MINUTE))
    first = run_ending(deployment, tick)
    second = run_ending(deployment, tick + MINUTE)
    assert interval(second)[0] == tick
    runs = {run["dag_run_id"]: run for run in (first, second)}
    manifests = {run_id: bucket.manifest(deployment.output_uri, DAG, run_id) for run_id in runs}
    assert all(manifest is not None for manifest in manifests.values()), "a run published no manifest"
    own_manifests = {run_id: only(manifest, own) for run_id, manifest in manifests.items()}

    # Both list every one of them, once each (lists, not dicts: a repeat fails here).
    for run_id, manifest in own_manifests.items():
        assert sources(manifest) == sorted(wanted), (run_id, statuses(manifest))
        documents(manifest)
    # One run converted them all, the other found them claimed by it: left for later, not failed.
    converters = [run_id for run_id, manifest in own_manifests.items() if converted(manifest)]
    assert len(converters) == 1, {run_id: statuses(manifest) for run_id, manifest in own_manifests.items()}
    (converter,) = converters
    (other,) = set(runs) - {converter}
    assert converted(own_manifests[converter]) == sorted(wanted), statuses(own_manifests[converter])
    holder = manifests[converter]["run_id"]
    for source, entry in documents(own_manifests[other]).items():
        assert (entry["status"], entry.get("skip_reason"), entry.get("claimed_by")) == (
            "skipped",
            "claimed",
            holder,
        ), (source, entry)
    assert manifests[other]["counts"]["claimed"] >= len(wanted)
    # Claimed documents are outside the error budget: both runs are green.
    assert [runs[run_id]["state"] for run_id in (converter, other)] == ["success", "success"], [
        manifest["error_budget"] for manifest in manifests.values()
    ]

    # Exactly once across every manifest published meanwhile, whichever run wrote it.
    everywhere = [
        source
        for manifest in _manifests_since(deployment, bucket, started)
        for source in converted(only(manifest, own))
    ]
    assert sorted(everywhere) == sorted(wanted), Counter(everywhere)

    # Each page was asked for once: at most 1.05 x the pages in requests.
    requests = _page_requests(deployment, since, doc_ids)
    asked = Counter((record["marker"]["doc_id"], record["marker"]["page_number"]) for record in requests)
    assert len(asked) == pages, asked
    assert len(requests) <= 1.05 * pages, asked

    # The runs really overlapped: the converting run had sent its first page request, and not yet had
    # its last one answered, when the other run started planning, and still when the other run's
    # convert instances had finished (both clocks are this machine's). The ``claimed`` entries say the
    # same from the claims' side: the holder was live when the other run tried each document.
    planned = plan_started(deployment, runs[other])
    assert planned is not None
    first_sent = min(datetime.fromtimestamp(record["arrival"], UTC) for record in requests)
    last_answered = max(datetime.fromtimestamp(record["finished"], UTC) for record in requests)
    claiming = {entry["task"]["map_index"] for entry in documents(own_manifests[other]).values()}
    others = [
        ti
        for ti in deployment.api.task_instances(DAG, other)
        if ti["task_id"] == "convert" and ti["map_index"] in claiming
    ]
    assert len(others) == len(claiming) and all(ti["end_date"] for ti in others), others
    other_done = max(datetime.fromisoformat(ti["end_date"]) for ti in others)
    assert first_sent < planned < other_done < last_answered, (first_sent, planned, other_done, last_answered)

    # The OCR runs page (the plugin in the api-server) says who holds each document.
    key = safe_run_id(manifests[other]["run_id"])
    page = httpx.get(
        f"{deployment.cluster.api_url}/olmocr/runs/{key}",
        headers={"Authorization": f"Bearer {deployment.api.token}"},
        timeout=60,
    )
    assert page.status_code == 200, page.text[:500]
    text = html.unescape(page.text)
    assert f"{manifests[other]['counts']['claimed']} claimed by other runs" in " ".join(text.split()), text
    for source in wanted:
        note = " ".join(_row(text, source).split())
        assert "skipped" in note and f"claimed by run {holder}: that run converts it" in note, note
