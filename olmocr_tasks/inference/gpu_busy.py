"""GPU-busy seconds of one batch, measured from vLLM's ``/metrics`` (issue 12, item 9).

Wall-clock time is a poor cost basis: a run's server idles while pages render or storage is slow, and
runs sharing one server each pay for all of it. Instead, the client's metrics polls (``backpressure``)
feed a ``GpuBusyMeter``, which integrates the time each replica had a request running and charges
this client the share of it that its own requests caused, by tokens:

    busy    = sum of (t_i - t_(i-1)) over polls i whose sample has ``vllm:num_requests_running`` > 0
    share   = min(1, own prompt+completion tokens / server's increase of
                     ``vllm:prompt_tokens_total`` + ``vllm:generation_tokens_total``), both over the span
    charged = sum over replicas of busy x share   (share 1 when a replica lacks the token counters)

Every convert process (an Airflow instance, the CLI) measures its own share, so shares of concurrent
batches add up to the server's busy time instead of counting it once per batch.

Sampling error: a sample stands for the whole interval before it, so each switch between idle and
busy is placed up to one poll interval late; the busy time is off by at most one interval per switch,
and a burst shorter than an interval between two polls is missed (or counted as a whole interval).
The token share is exact up to tokens the server spent on requests whose answers this client never
read (a losing hedge it cancelled), which lower the share slightly. Pure: the caller passes the times.
What it yields, ``GpuBusy``, is a plain value (``olmocr_tasks.core.gpu_busy``) that the run folder and
the manifest store.
"""

from __future__ import annotations

from collections.abc import Hashable

from olmocr_tasks.core.gpu_busy import GpuBusy
from olmocr_tasks.inference.vllm_metrics import ServerSample


class _ReplicaMeter:
    """The integration for one replica's samples, and the tokens this client spent there."""

    def __init__(self) -> None:
        self.samples = 0
        self.busy_s = 0.0
        self.server_tokens = 0.0
        self.counters_missing = False
        self.own_tokens = 0
        self.answered = False
        self._last_at = 0.0
        self._last_tokens: float | None = None

    def observe(self, at: float, sample: ServerSample) -> None:
        tokens = sample.processed_tokens
        if self.samples:
            if sample.queue.running > 0:
                self.busy_s += max(0.0, at - self._last_at)
            if tokens is None or self._last_tokens is None:
                self.counters_missing = True
            else:
                # A counter that went down belongs to a restarted server, which counts from zero again.
                self.server_tokens += tokens - self._last_tokens if tokens >= self._last_tokens else tokens
        elif tokens is None:
            self.counters_missing = True
        self.samples += 1
        self._last_at, self._last_tokens = at, tokens

    def count_own(self, tokens: int) -> None:
        self.answered = True
        # Tokens answered before the first sample are already in the server's baseline, not in its increase.
        if self.samples:
            self.own_tokens += tokens

    def share(self) -> float:
        if self.counters_missing:
            return 1.0
        if self.server_tokens <= 0:
            # Busy without counted tokens (a long prefill still running for someone): ours only if we sent any.
            return 1.0 if self.own_tokens > 0 else 0.0
        return min(1.0, self.own_tokens / self.server_tokens)


class GpuBusyMeter:
    """Integrates one client's metrics samples into the GPU-busy seconds it is charged (module docstring).

    ``observe`` takes each replica's samples as the poller reads them, ``count_tokens`` each answer this
    client read. After ``stop`` further samples are ignored; ``interrupt`` says polling ended before the
    work did, which makes the result unmeasured.
    """

    def __init__(self) -> None:
        self._replicas: dict[Hashable, _ReplicaMeter] = {}
        self._stopped = False
        self._interrupted = False

    def observe(self, replica: Hashable, at: float, sample: ServerSample) -> None:
        if not self._stopped:
            self._meter(replica).observe(at, sample)

    def count_tokens(self, replica: Hashable, tokens: int) -> None:
        if not self._stopped:
            self._meter(replica).count_own(tokens)

    def interrupt(self) -> None:
        if not self._stopped:
            self._interrupted = True

    def stop(self) -> None:
        self._stopped = True

    def result(self) -> GpuBusy:
        """Seconds charged so far; measured when every replica this client got answers from was sampled
        over a span (two samples or more) and polling was never interrupted."""
        meters = self._replicas.values()
        spanned = [meter for meter in meters if meter.samples >= 2]
        measured = (
            bool(spanned) and not self._interrupted and all(meter.samples >= 2 for meter in meters if meter.answered)
        )
        return GpuBusy(sum(meter.busy_s * meter.share() for meter in spanned), measured)

    def _meter(self, replica: Hashable) -> _ReplicaMeter:
        meter = self._replicas.get(replica)
        if meter is None:
            meter = self._replicas[replica] = _ReplicaMeter()
        return meter
