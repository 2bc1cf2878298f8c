"""The inference replicas a client spreads its requests over: choice, cool-off and per-replica stats.

Least-outstanding-requests choice; a replica that stops answering is benched for a cool-off that
doubles per repeat, so its requests go to the others until it comes back. Pure bookkeeping: the
caller passes the time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from olmocr_tasks.core.redaction import redact_url
from olmocr_tasks.inference.readiness import ModelsProbe
from olmocr_tasks.inference.vllm_metrics import QueueSample

# A replica that stops accepting connections is skipped for this long (doubling per repeat) while
# its requests go to the others; long enough to stop paying connect errors, short enough to notice
# a restarted replica within a page or two.
COOLOFF_INITIAL_S = 5.0
COOLOFF_MAX_S = 30.0
# Failure kinds that say something about the replica's network path rather than about one request.
NETWORK_FAILURES = frozenset({"connect", "timeout", "transport"})


@dataclass(frozen=True)
class ReplicaStats:
    url: str
    requests: int
    successes: int
    failures: int
    outstanding: int
    cooling_off: bool
    running: float | None
    waiting: float | None


class Replica:
    """One server's URLs and what this process has seen of it."""

    def __init__(self, base_url: str, probe: ModelsProbe, metrics_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.display = redact_url(self.base_url)
        self.completions_url = self.base_url + "/chat/completions"
        self.probe = probe
        self.metrics_url = metrics_url
        self.outstanding = 0
        self.requests = 0
        self.successes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.cooloffs = 0
        self.cool_until = -math.inf
        self.picks = 0
        # Written by the metrics poller (see ``backpressure.MetricsPoller``).
        self.sample: QueueSample | None = None
        self.sample_read_at: float | None = None
        self.metrics_absent = False

    def cooling(self, now: float) -> bool:
        return self.cool_until > now

    def answered(self) -> None:
        """The replica answered (whatever it said): it is reachable again."""
        self.consecutive_failures = 0
        self.cooloffs = 0
        self.cool_until = -math.inf

    def failed(self, kind: str, now: float) -> None:
        self.failures += 1
        self.consecutive_failures += 1
        # A refused connection proves the replica is down; one dropped or slow request does not
        # (a keep-alive race, one poison page), so those need a repeat before the replica is benched.
        if kind in NETWORK_FAILURES and (kind == "connect" or self.consecutive_failures >= 2):
            self.cool_off(now, min(COOLOFF_MAX_S, COOLOFF_INITIAL_S * 2**self.cooloffs))
            self.cooloffs += 1

    def cool_off(self, now: float, seconds: float) -> None:
        self.cool_until = now + seconds

    def stats(self, now: float) -> ReplicaStats:
        return ReplicaStats(
            url=self.display,
            requests=self.requests,
            successes=self.successes,
            failures=self.failures,
            outstanding=self.outstanding,
            cooling_off=self.cooling(now),
            running=self.sample.running if self.sample else None,
            waiting=self.sample.waiting if self.sample else None,
        )


class ReplicaSet:
    """Chooses the replica for each attempt."""

    def __init__(self, replicas: Iterable[Replica]) -> None:
        self._replicas = list(replicas)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._replicas)

    def __len__(self) -> int:
        return len(self._replicas)

    @property
    def outstanding(self) -> int:
        return sum(replica.outstanding for replica in self._replicas)

    def candidates(self, avoid: set[Replica], now: float, *, strict: bool = False) -> list[Replica]:
        """Replicas worth trying now, preferring those not in ``avoid``.

        ``strict`` returns only fresh, not cooling replicas (possibly none): "is there another replica
        to try at once?". Otherwise some replica is always returned.
        """
        ready = [r for r in self._replicas if not r.cooling(now)]
        fresh = [r for r in ready if r not in avoid]
        if strict:
            return fresh
        if fresh:
            return fresh
        if ready:
            return ready
        # Every replica is cooling off: keep probing the one that comes back first.
        return [min(self._replicas, key=lambda r: r.cool_until)]

    def pick(self, avoid: set[Replica], now: float) -> Replica:
        chosen = min(self.candidates(avoid, now), key=lambda r: (r.outstanding, r.consecutive_failures, r.picks))
        chosen.picks += 1
        return chosen

    def stats(self, now: float) -> tuple[ReplicaStats, ...]:
        return tuple(replica.stats(now) for replica in self._replicas)
