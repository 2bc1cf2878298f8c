"""The parent side of rendering: a pool of worker processes with per-call time limits.

Every PDFium call runs in a worker process (``render_worker``), so a crash or a hang costs one worker
(killed and replaced) and one typed ``RenderError``; it never takes the calling process down or hangs a
caller.

The pool is deliberately independent of any particular event loop: each worker is driven by one
parent thread that does the blocking pipe I/O and enforces the time limit, and results are handed back
to whichever loop asked via ``call_soon_threadsafe``. So one pool can serve several ``asyncio.run``
calls (or threads) in turn, and a caller that is cancelled mid-request still gets its worker's
deadline enforced. This module queues the requests and drives the threads; ``render_slot`` starts, asks
and kills the worker of one position.

The workers are sandboxed as well as isolated: each starts with an allow-listed environment (no cloud
or Airflow credentials reach a process that parses hostile PDFs), limits its own memory and CPU
(``render_worker.sandbox``), and answers in ``render_wire``'s format, which the pool checks against
what each request may return (``render_replies``); nothing a worker sends is unpickled or otherwise executed. A reply
that breaks the format costs the worker its place (``RenderError`` reason "protocol").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import RenderError
from olmocr_tasks.page.render_replies import Decoder, decode_any, decode_nothing, reply_decoders
from olmocr_tasks.page.render_slot import (
    DOCUMENT_ERRORS,
    WORKER_START_TIMEOUT_S,
    WORKER_STOP_GRACE_S,
    Outcome,
    WorkerMain,
    WorkerSlot,
    worker_environment,
)
from olmocr_tasks.page.render_worker import ROTATIONS, PdfInfo, worker_main

__all__ = ["RenderError", "RenderPool", "WorkerMain", "default_render_workers", "worker_environment"]

_RELEASE_TIMEOUT_S = 10.0


def default_render_workers() -> int:
    """One worker per core, minus one for the event loop above two cores, at most 4.

    The event loop needs only a few ms of CPU per page, so on one or two cores a core reserved for it
    would mostly idle while rendering (the CPU-bound part) waits.
    """
    try:
        cores = len(os.sched_getaffinity(0))  # honours container CPU sets, unlike cpu_count()
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores if cores <= 2 else cores - 1))


@dataclass
class _Job:
    kind: str
    args: tuple[Any, ...]
    label: str
    timeout: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    decode: Decoder


class RenderPool:
    """Worker subprocesses that inspect, render and read PDF pages, with per-call time limits.

    Use as ``async with RenderPool() as pool``. Requests go to the first idle worker and queue when all
    are busy. A worker that exceeds ``limits.render_timeout_s`` or dies is killed and replaced; its
    caller gets a ``RenderError``. Document problems surface as the typed ``DocumentError`` subclasses.
    """

    def __init__(
        self,
        workers: int | None = None,
        png_compress_level: int = 1,
        limits: DocumentLimits = DocumentLimits(),  # noqa: B008 - frozen dataclass, safe to share
        nice: int = 0,
        worker_main: WorkerMain = worker_main,
    ) -> None:
        """``nice``: added to the workers' niceness (0 leaves it). Rendering is nearly all of a
        conversion's CPU, so a low-priority run whose workers are niced gives way, on a shared host,
        to the Airflow tasks of a high-priority run and to the Airflow components themselves. The pool
        never changes its own process's niceness (it may run inside a process with other work to do);
        an Airflow convert task, one forked process per attempt, nices itself and passes 0 here
        (``provider.tasks.give_way``).

        ``worker_main``: what each worker process runs (``render_worker.worker_main``); the seam for
        tests that need a worker which hangs or dies on demand."""
        workers = default_render_workers() if workers is None else workers
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if not 0 <= png_compress_level <= 9:
            raise ValueError("png_compress_level must be within 0..9")
        self.workers = workers
        self.png_compress_level = png_compress_level
        self.limits = limits
        if nice < 0:
            raise ValueError("nice must be 0 or more: a process may only lower its own priority")
        self.nice = nice
        self.worker_main = worker_main
        self._cond = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._slots = [
            WorkerSlot(
                index,
                limits=limits,
                nice=nice,
                worker_main=worker_main,
                lock=self._cond,
                closing=lambda: self._closing,
            )
            for index in range(workers)
        ]
        self._started = False
        self._closing = False
        self._closed = False
        self.replacements = 0  # workers killed and restarted so far (timeouts, crashes, protocol errors)
        self.retirements = 0  # workers stopped and restarted in good order (near their CPU limit)
        self._decoders = reply_decoders(limits)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> RenderPool:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self, timeout: float = WORKER_START_TIMEOUT_S) -> None:
        """Start the workers and wait until each has loaded PDFium (blocking; ``async with`` does it)."""
        self._ensure_started()
        for slot in self._slots:
            if not slot.ready.wait(timeout):
                self.close_sync()
                raise RenderError("failed", f"render worker {slot.index} did not start within {timeout:g} s")
            if slot.start_error is not None:
                message = slot.start_error
                self.close_sync()
                raise RenderError("failed", message)

    def _ensure_started(self) -> None:
        with self._cond:
            if self._closing:
                raise RenderError("failed", "render pool is closed")
            if self._started:
                return
            self._started = True
        for slot in self._slots:
            slot.thread = threading.Thread(
                target=self._drive, args=(slot,), name=f"render-worker-{slot.index}", daemon=True
            )
            slot.thread.start()

    async def close(self) -> None:
        """Stop all workers; queued and running calls fail with RenderError. Safe to call twice."""
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Blocking variant of ``close`` for code without an event loop."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            abandoned = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
        for job in abandoned:
            self._settle(job, ("render_error", "failed", "render pool closed"))
        threads = [slot.thread for slot in self._slots if slot.thread is not None]
        # Idle workers stop gracefully; busy ones are killed once the grace period is over so that
        # close() never waits for a long render.
        deadline = time.monotonic() + WORKER_STOP_GRACE_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for slot in self._slots:
            with self._cond:
                process = slot.process
            if process is not None and process.poll() is None:
                process.kill()
        for thread in threads:
            thread.join()
        with self._cond:
            self._closed = True

    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes (for CPU accounting and tests)."""
        with self._cond:
            return [slot.process.pid for slot in self._slots if slot.process is not None]

    # -- public calls ------------------------------------------------------------------------------

    async def inspect(self, path: str) -> PdfInfo:
        """Open the document (a PDF or a page image) at a local path and describe it; raises a DocumentError
        for unusable files."""
        result: PdfInfo = await self._call("inspect", (str(path),), "inspect")
        return result

    async def render_page(
        self, path: str, page_index: int, target_longest_image_dim: int = 1288, rotation: int = 0
    ) -> bytes:
        """Base64 (ASCII bytes) of the page's PNG; ``rotation`` is olmOCR's rotation_correction."""
        if rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation}")
        if target_longest_image_dim < 1:
            raise ValueError("target_longest_image_dim must be positive")
        args = (str(path), page_index, target_longest_image_dim, rotation, self.png_compress_level)
        result: bytes = await self._call("render", args, f"rendering page index {page_index}")
        return result

    async def page_text(self, path: str, page_index: int) -> str:
        """The text layer of one page ("" when the page has none)."""
        # Ahead of queued renders: a text layer decides a fallback page (and with it whether its document
        # is already failed), and renders queued before it may each run to the time limit.
        result: str = await self._call(
            "text", (str(path), page_index), f"reading text of page index {page_index}", urgent=True
        )
        return result

    async def release(self, path: str) -> None:
        """Forget a document in every worker (call when the document is done).

        Idle workers drop it right away; busy ones before their next request. Does not wait.
        """
        with self._cond:
            for slot in self._slots:
                slot.drops.add(str(path))
            self._cond.notify_all()

    async def _call(
        self, kind: str, args: tuple[Any, ...], label: str, timeout: float | None = None, *, urgent: bool = False
    ) -> Any:
        """Ask a worker; its answer is checked by the decoder of ``kind`` (requests that production
        workers refuse, such as the test hooks, accept any JSON value or payload)."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        job = _Job(
            kind=kind,
            args=args,
            label=label,
            timeout=self.limits.render_timeout_s if timeout is None else timeout,
            loop=loop,
            future=loop.create_future(),
            decode=self._decoders.get(kind, decode_any),
        )
        with self._cond:
            if self._closing:
                raise RenderError("failed", "render pool is closed")
            if urgent:
                self._jobs.appendleft(job)
            else:
                self._jobs.append(job)
            self._cond.notify()
        return await job.future

    # -- worker threads ----------------------------------------------------------------------------
    # One parent thread per worker, doing blocking recv with a deadline. Chosen over loop.add_reader
    # because a readable pipe does not mean a whole message has arrived (a large PNG needs several
    # reads, which would block the loop), because the deadline must hold even when the asking
    # coroutine is cancelled or its loop has ended, and because the pool then works from any loop or
    # thread. Pipe reads release the GIL, so the threads cost the event loop nothing measurable.

    def _drive(self, slot: WorkerSlot) -> None:
        try:
            slot.spawn()
            slot.ready.set()
            while True:
                with self._cond:
                    while not self._closing and not self._jobs and not slot.drops:
                        self._cond.wait()
                    if self._closing:
                        break
                    job = self._jobs.popleft() if self._jobs else None
                    drops, slot.drops = slot.drops, set()
                outcome: Outcome | None = None
                if job is None or job.future.cancelled():
                    # Nobody waits for an answer: only let the worker forget released documents.
                    if slot.process is not None:
                        slot.exchange("noop", (), drops, _RELEASE_TIMEOUT_S, "releasing documents", decode_nothing)
                else:
                    outcome = slot.exchange(job.kind, job.args, drops, job.timeout, job.label, job.decode)
                retiring = slot.retire and slot.process is not None
                replacing = slot.process is None
                # Counted before the answer is delivered, so a caller that has it sees the count too.
                with self._cond:
                    if not self._closing:
                        self.retirements += int(retiring)
                        self.replacements += int(replacing)
                if job is not None and outcome is not None:
                    self._settle(job, outcome)
                if self._closing:
                    continue
                # The caller already has its answer; the replacement starts warm for the next one.
                if retiring:
                    slot.retire = False
                    slot.stop()
                    slot.spawn()
                elif replacing:
                    slot.spawn()
        except BaseException as exc:  # never let a driver thread die silently with callers waiting
            slot.start_error = slot.start_error or f"render worker thread failed: {exc!r}"
            slot.ready.set()
            raise
        finally:
            slot.stop()

    @staticmethod
    def _settle(job: _Job, outcome: Outcome) -> None:
        def deliver() -> None:
            if job.future.done():
                return
            status = outcome[0]
            if status == "ok":
                job.future.set_result(outcome[1])
            elif status == "document_error":
                job.future.set_exception(DOCUMENT_ERRORS[outcome[1]](outcome[2]))
            else:
                job.future.set_exception(RenderError(outcome[1], outcome[2]))

        # RuntimeError: the caller's event loop has ended, so nobody is waiting for this answer.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(deliver)
