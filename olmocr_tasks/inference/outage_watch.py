"""The event-loop side of the outage breaker: its timers, its probes, and the moment it opens.

``outage.OutageBreaker`` decides, from the outcomes it is told, without I/O or an event loop. Hung
requests and backoff sleeps produce no outcomes, so something must wake the breaker when a decision
falls due, run the probes it asks for, and tell every waiting request when it opens: that is
``OutageWatch``. How to probe the server is the caller's (``probe``), so the watch can be driven by
any coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from olmocr_tasks.inference.outage_policy import OutageBreaker

# Fired just after a decision is due, so the breaker's clock has passed it when it looks.
_TIMER_SLACK_S = 0.001


class OutageWatch:
    """Keeps an ``OutageBreaker`` deciding on time and announces its opening.

    ``probe()`` asks whether the server is up although requests fail: it returns None when it
    answered, else why it did not. ``describe`` turns an exception the probe raised (a bug) into
    a message for the breaker; the breaker must never be left waiting for a verdict.
    Call ``watch()`` after each outcome fed to the breaker.
    """

    def __init__(
        self,
        breaker: OutageBreaker,
        probe: Callable[[], Awaitable[str | None]],
        describe: Callable[[BaseException], str] = repr,
    ) -> None:
        self.breaker = breaker
        self._probe = probe
        self._describe = describe
        self._opened: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._closed = False

    def opened(self) -> asyncio.Future[None]:
        """A future that completes when the breaker opens (at once if it is open)."""
        if self._opened is None:
            self._opened = asyncio.get_running_loop().create_future()
            if self.breaker.is_open:
                self._opened.set_result(None)
        return self._opened

    def watch(self) -> None:
        """Keep a timer on the breaker's next decision, start a probe it asks for, announce its opening."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.breaker.is_open:
            if self._opened is not None and not self._opened.done():
                self._opened.set_result(None)
            return
        self._start_probe_if_due()
        delay = self.breaker.next_check_in()
        if delay is None or self._closed:
            return
        # Outside an event loop (a synchronous caller) there is nothing to wake.
        with contextlib.suppress(RuntimeError):
            self._timer = asyncio.get_running_loop().call_later(delay + _TIMER_SLACK_S, self._due)

    async def aclose(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._probe_task = self._probe_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _due(self) -> None:
        self._timer = None
        self.breaker.check()
        self.watch()

    def _start_probe_if_due(self) -> None:
        if self._closed or not self.breaker.probe_due():
            return
        self.breaker.probe_started()
        self._probe_task = asyncio.get_running_loop().create_task(self._run_probe(), name="olmocr-outage-probe")

    async def _run_probe(self) -> None:
        try:
            failure = await self._probe()
        except Exception as exc:  # a bug here must not leave the breaker waiting for a verdict
            self.breaker.probe_failed(self._describe(exc))
        else:
            if failure is None:
                self.breaker.probe_answered()
            else:
                self.breaker.probe_failed(failure)
        finally:
            self._probe_task = None
        self.watch()
