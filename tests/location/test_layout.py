"""The output location's layout (``olmocr_tasks.location.layout``): the keys it builds are the ones existing
output locations hold, every key it builds reads back as what it names, and two documents never share one."""

from __future__ import annotations

from itertools import combinations

import pytest

from olmocr_tasks.location.layout import (
    ConversionState,
    OutputLocation,
    PlanFolder,
    claim_successor,
    first_claim_of,
    plan_of_batch,
    safe_run_id,
    shard_path,
    shards_folder,
    summary_path,
)

OUT = "s3://bucket/out/"
SID, FP, TOKEN = "0" * 32, "a" * 16, "b" * 12
SHA = "c" * 64


def test_the_keys_are_the_ones_existing_output_locations_hold() -> None:
    location = OutputLocation(OUT)
    state = location.state("conv")
    plan = location.plan("manual__2026-01-01T00:00:00+00:00", "p-1")
    attempt = plan.attempt("b-0001", 2)
    assert location.outputs("x/Report") == {
        "dolma": "s3://bucket/out/dolma/x/Report.jsonl",
        "markdown": "s3://bucket/out/markdown/x/Report.md",
    }
    assert location.owner_record("report").startswith("s3://bucket/out/_state/output-owners/")
    assert location.owner_record("report").endswith(".json")
    assert state.uri == "s3://bucket/out/_state/conv"
    assert state.description == "s3://bucket/out/_state/conv/conversion.json"
    assert state.done_marker(SID, FP) == f"s3://bucket/out/_state/conv/sources/{SID}/{FP}.done"
    assert state.failure_marker(SID, FP, TOKEN) == f"s3://bucket/out/_state/conv/sources/{SID}/{FP}.failed.{TOKEN}"
    assert state.content(SHA) == f"s3://bucket/out/_state/conv/content/{SHA}.json"
    assert state.page(SHA, 7) == f"s3://bucket/out/_state/conv/pages/{SHA}/00007.json"
    assert state.claim(SID, FP) == f"s3://bucket/out/_state/conv/claims/{SID}/{FP}.claim"
    assert (
        claim_successor(state.claim(SID, FP), "t0") == f"s3://bucket/out/_state/conv/claims/{SID}/{FP}.claim.after-t0"
    )
    assert plan.uri == "s3://bucket/out/_runs/manual__2026-01-01T00_00_00+00_00/p-1"
    assert plan.plan == plan.uri + "/plan.json"
    assert plan.batch("b-0001") == plan.uri + "/batches/b-0001.json"
    assert attempt == plan.uri + "/attempts/b-0001/try-0002"
    assert PlanFolder.started(attempt) == attempt + "/started"
    assert PlanFolder.part(attempt) == attempt + "/part.json"
    assert PlanFolder.entry(attempt, "s3://in/a.pdf").startswith(attempt + "/entries/")
    assert location.manifest("run:1") == "s3://bucket/out/manifests/run_1.json"
    assert shards_folder(location.manifest("run:1")) == "s3://bucket/out/manifests/run_1/"
    assert shard_path("20260101T000000-abc", "dead-letters", 3) == "20260101T000000-abc/dead-letters-00003.jsonl.gz"
    assert summary_path("run_1") == "manifests/run_1.json"


def test_a_run_folder_and_its_manifest_share_the_run_key() -> None:
    location = OutputLocation("/data/out")
    run_id = "scheduled__2026-01-01T00:00:00+00:00"
    run_key = safe_run_id(run_id)
    assert location.plan(run_id, "plan").uri.startswith(location.run_folder(run_key) + "/")
    assert location.manifest(run_id) == location.summary(run_key)
    assert location.summary_key(location.summary(run_key)) == run_key


def test_every_state_key_reads_back_as_what_it_names() -> None:
    location = OutputLocation(OUT)
    state = location.state("conv")
    version = f"{SID}/{FP}"
    built = {
        state.done_marker(SID, FP): ("done", version),
        state.failure_marker(SID, FP, TOKEN): ("failed", version),
        state.content(SHA): ("content", SHA),
        state.page(SHA, 3): ("page", SHA),
        state.claim(SID, FP): ("claim", f"{SID}/{FP}.claim"),
        claim_successor(state.claim(SID, FP), "t0"): ("claim", f"{SID}/{FP}.claim.after-t0"),
    }
    for uri, (kind, subject) in built.items():
        key = location.state_key(uri)
        assert key is not None and (key.conversion_key, key.kind, key.subject) == ("conv", kind, subject), uri
    done, failed = state.marker(state.done_marker(SID, FP)), state.marker(state.failure_marker(SID, FP, TOKEN))
    assert done is not None and (done.source_id, done.fingerprint, done.done, done.run_token) == (SID, FP, True, None)
    assert failed is not None and (failed.source_id, failed.fingerprint, failed.done) == (SID, FP, False)
    assert failed.run_token == TOKEN
    assert ConversionState.page_number(state.page(SHA, 123)) == 123
    assert first_claim_of(claim_successor(claim_successor(state.claim(SID, FP), "t0"), "t1")) == state.claim(SID, FP)


@pytest.mark.parametrize(
    "uri",
    [
        OUT + "_state/output-owners/" + "d" * 64 + ".json",
        OUT + "_state/conv/conversion.json",
        OUT + f"_state/conv/sources/{SID}/notes.txt",
        OUT + f"_state/conv/sources/{SID}/deeper/{FP}.done",
        OUT + "dolma/x.jsonl",
    ],
)
def test_what_is_not_a_state_record_reads_as_nothing(uri: str) -> None:
    location = OutputLocation(OUT)
    assert location.state_key(uri) is None
    assert location.state("conv").marker(uri) is None


def test_only_summaries_read_as_runs() -> None:
    location = OutputLocation(OUT)
    summary = location.manifest("r1")
    shard = shards_folder(summary) + shard_path("pub", "documents", 0)
    assert location.summary_key(summary) == "r1"
    for other in (shard, OUT + "manifests/.r1.json.tmp", OUT + "manifests/.hidden.json", OUT + "_runs/r1.json"):
        assert location.summary_key(other) is None


def test_attempt_keys_read_back() -> None:
    plan = OutputLocation(OUT).plan("run", "p-1")
    attempt = plan.attempt("b-7", 12)
    assert plan.attempt_object(PlanFolder.started(attempt)) == ("b-7", 12, "started")
    assert PlanFolder.is_started(plan.attempt_object(PlanFolder.started(attempt))[2])  # type: ignore[index]
    assert PlanFolder.is_part(PlanFolder.part(attempt))
    assert PlanFolder.is_entry(PlanFolder.entry(attempt, "s3://in/a.pdf"))
    assert not PlanFolder.is_entry(PlanFolder.part(attempt))
    assert plan.attempt_object(plan.batch("b-7")) is None
    assert plan_of_batch(plan.batch("b-7")) == plan.uri
    assert plan_of_batch(PlanFolder.part(attempt)) is None


def _keys_of(location: OutputLocation, source_id: str, fingerprint: str, sha256: str, stem: str) -> set[str]:
    state = location.state("conv")
    return {
        *location.outputs(stem).values(),
        location.owner_record(stem),
        state.done_marker(source_id, fingerprint),
        state.failure_marker(source_id, fingerprint, TOKEN),
        state.content(sha256),
        state.page(sha256, 1),
        state.claim(source_id, fingerprint),
        claim_successor(state.claim(source_id, fingerprint), "t0"),
    }


def test_two_documents_never_share_a_key() -> None:
    location = OutputLocation(OUT)
    documents = [
        ("0" * 32, "a" * 16, "c" * 64, "report"),
        ("1" * 32, "a" * 16, "d" * 64, "x/report"),
        ("0" * 32, "b" * 16, "e" * 64, "report~0123456789"),
    ]
    for first, second in combinations(documents, 2):
        assert not _keys_of(location, *first) & _keys_of(location, *second)


def test_two_runs_never_share_a_key() -> None:
    location = OutputLocation(OUT)
    runs = ("manual__1", "manual__2", "scheduled__1")
    keys = {run: {location.plan(run, "p").uri, location.manifest(run)} for run in runs}
    for first, second in combinations(runs, 2):
        assert not keys[first] & keys[second]
