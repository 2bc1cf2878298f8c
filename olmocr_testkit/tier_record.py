"""The record ``make test`` checks after its run: every solo tier ran in one process, its deployment started once.

``make test`` (``scripts/run-tests.sh``) runs each solo tier (tests carrying the tier's marker, such as
``deployment``) as a pytest process of its own beside the rest of the suite, because the tier's tests
share one expensive package-scoped fixture. It names a file in ``OLMOCR_TIER_RECORD``; the tests of a
solo tier (``tests/conftest.py``), the deployment harness and the compose tier's stack at each start
append one JSON line to it, with their process id. ``python -m olmocr_testkit.tier_record FILE``
then fails when a tier's tests ran in more than one process (two deployments on a 2-core machine,
module fixtures run twice) or a tier started its
deployment more than once. Without the variable (a plain ``pytest`` run) nothing is recorded.

The script also says which tiers' processes passed (``--ran TIER``): each must have recorded its tests,
so a run whose recording was lost (the hook removed, the variable not passed on: an empty record)
fails instead of passing unchecked. In a run of the whole suite (``--whole-suite``) each of those that
starts a deployment (``DEPLOYMENT_TIERS``) must have recorded that start, exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RECORD_ENV = "OLMOCR_TIER_RECORD"
TEST = "test"
START = "start"
# Tiers whose tests share a deployment they start once per run (tests/deployment's cluster, tests/compose's stack).
DEPLOYMENT_TIERS = ("deployment", "compose")


def record(kind: str, tier: str, **details: Any) -> None:
    """Append one line (``kind``: TEST or START) for this process to the record, when one is kept."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "tier": tier, "pid": os.getpid(), **details}) + "\n"
    # One write on an O_APPEND descriptor: lines of concurrent processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def problems(entries: Iterable[dict[str, Any]], *, ran: Iterable[str] = (), whole_suite: bool = False) -> list[str]:
    """What the record shows went wrong: a tier in several processes, a deployment started several times,
    a tier that passed (``ran``) without recording its tests, or (``whole_suite``) its deployment's start."""
    pids: dict[str, set[int]] = defaultdict(set)
    starts: dict[str, int] = defaultdict(int)
    tests: dict[str, int] = defaultdict(int)
    for entry in entries:
        pids[entry["tier"]].add(entry["pid"])
        if entry["kind"] == START:
            starts[entry["tier"]] += 1
        elif entry["kind"] == TEST:
            tests[entry["tier"]] += 1
    found = []
    for tier in sorted(set(ran)):
        if tests[tier] == 0:
            found.append(f"the {tier} tier passed but recorded no test: the record cannot show it ran in one process")
        elif whole_suite and tier in DEPLOYMENT_TIERS and starts[tier] == 0:
            found.append(f"the {tier} tier passed but recorded no start of its deployment")
    for tier, tier_pids in sorted(pids.items()):
        if len(tier_pids) > 1:
            found.append(f"the {tier} tier ran in {len(tier_pids)} processes ({sorted(tier_pids)}), not one")
    for tier, count in sorted(starts.items()):
        if count > 1:
            found.append(f"the {tier} tier started its deployment {count} times, not once")
    return found


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(entries: list[dict[str, Any]]) -> str:
    tiers = sorted({entry["tier"] for entry in entries})
    parts = []
    for tier in tiers:
        mine = [entry for entry in entries if entry["tier"] == tier]
        tests = sum(entry["kind"] == TEST for entry in mine)
        starts = sum(entry["kind"] == START for entry in mine)
        pids = sorted({entry["pid"] for entry in mine})
        parts.append(f"{tier}: {tests} tests in process {', '.join(map(str, pids))}, deployment started {starts}x")
    return "; ".join(parts) or "no solo-tier test ran"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m olmocr_testkit.tier_record", description=__doc__)
    parser.add_argument("record", help="the JSON-lines record the tiers appended to")
    parser.add_argument("--ran", action="append", default=[], metavar="TIER", help="a tier whose process passed")
    parser.add_argument("--whole-suite", action="store_true", help="the run was the whole suite (no selection)")
    args = parser.parse_args(argv)
    entries = read(Path(args.record))
    found = problems(entries, ran=args.ran, whole_suite=args.whole_suite)
    for problem in found:
        print(f"error: {problem} (record: {args.record})", file=sys.stderr)
    print(f"solo tiers: {summary(entries)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
