"""The parent side of rendering: a pool of worker processes with per-call time limits.

Every PDFium call runs in a worker process (``render_worker``), so a crash or a hang costs one worker
(killed and replaced) and one typed ``RenderError``; it never takes the calling process down or hangs a
caller.

The pool is deliberately independent of any particular event loop: each worker is driven by one
parent thread that does the blocking pipe I/O and enforces the time limit, and results are handed back
to whichever loop asked via ``call_soon_threadsafe``. So one pool can serve several ``asyncio.run``
calls (or threads) in turn, and a caller that is cancelled mid-request still gets its worker's
deadline enforced.

The workers are sandboxed as well as isolated: each starts with an allow-listed environment (no cloud
or Airflow credentials reach a process that parses hostile PDFs), limits its own memory and CPU
(``render_worker.sandbox``), and answers in ``render_wire``'s format, which the pool checks against
what each request may return; nothing a worker sends is unpickled or otherwise executed. A reply
that breaks the format costs the worker its place (``RenderError`` reason "protocol").
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import olmocr_tasks
from olmocr_tasks.core import errors
from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import DocumentError, RenderError, TooLargeError
from olmocr_tasks.page.render_wire import (
    MAX_MESSAGE_CHARS,
    MAX_TEXT_BYTES,
    PNG_SIGNATURE,
    ProtocolError,
    png_payload_bound,
    read_message,
    write_message,
)
from olmocr_tasks.page.render_worker import ROTATIONS, PdfInfo, worker_main

__all__ = ["RenderError", "RenderPool", "WorkerMain", "default_render_workers", "worker_environment"]

_WORKER_START_TIMEOUT_S = 60.0
_WORKER_STOP_GRACE_S = 2.0
_RELEASE_TIMEOUT_S = 10.0

# A worker process's entry point: ``(fd, limits_json, parent_pid, nice)``, a module-level function the
# fresh interpreter imports by its module and name.
WorkerMain = Callable[[int, str, int, int], None]

# What a worker inherits from the environment: enough to find Python, its packages and a temporary
# folder, in the caller's locale. Nothing else: a task process holds AWS_*, AIRFLOW__*, API keys and
# connection URIs, none of which a PDF parser needs, and a PDFium exploit would read them first.
_INHERITED_VARIABLES = frozenset(
    {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TMP", "TEMP", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH"}
)
_INHERITED_PREFIXES = ("LC_",)


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``environ`` that a render worker starts with."""
    return {
        name: value
        for name, value in environ.items()
        if name in _INHERITED_VARIABLES or name.startswith(_INHERITED_PREFIXES)
    }


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


# Checks what a worker answered to a request of one kind: (header, payload) -> the caller's value, or
# ProtocolError. The header's status is already "ok".
_Decoder = Callable[[dict[str, Any], bytes], Any]


@dataclass
class _Job:
    kind: str
    args: tuple[Any, ...]
    label: str
    timeout: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    decode: _Decoder


@dataclass
class _Slot:
    """One worker position: the thread that drives it and the process currently filling it."""

    index: int
    process: subprocess.Popen[bytes] | None = None
    conn: socket.socket | None = None
    drops: set[str] = dataclasses.field(default_factory=set)
    # The worker asked to be replaced, or is near its lifetime CPU limit: stop it after this answer.
    retire: bool = False
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    start_error: str | None = None
    thread: threading.Thread | None = None


_Outcome = tuple[Any, ...]
_DOCUMENT_ERRORS: dict[str, type[DocumentError]] = {cls.__name__: cls for cls in errors.DOCUMENT_ERROR_CLASSES}


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
        self._slots = [_Slot(index) for index in range(workers)]
        self._started = False
        self._closing = False
        self._closed = False
        self.replacements = 0  # workers killed and restarted so far (timeouts, crashes, protocol errors)
        self.retirements = 0  # workers stopped and restarted in good order (near their CPU limit)
        self._max_payload = max(png_payload_bound(limits.max_render_pixels), MAX_TEXT_BYTES)
        self._decoders: dict[str, _Decoder] = {
            "inspect": self._decode_pdf_info,
            "render": _decode_png,
            "text": _decode_text,
            "noop": _decode_nothing,
        }

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> RenderPool:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self, timeout: float = _WORKER_START_TIMEOUT_S) -> None:
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
        deadline = time.monotonic() + _WORKER_STOP_GRACE_S
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
            decode=self._decoders.get(kind, _decode_any),
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

    def _drive(self, slot: _Slot) -> None:
        try:
            self._spawn(slot)
            slot.ready.set()
            while True:
                with self._cond:
                    while not self._closing and not self._jobs and not slot.drops:
                        self._cond.wait()
                    if self._closing:
                        break
                    job = self._jobs.popleft() if self._jobs else None
                    drops, slot.drops = slot.drops, set()
                outcome: _Outcome | None = None
                if job is None or job.future.cancelled():
                    # Nobody waits for an answer: only let the worker forget released documents.
                    if slot.process is not None:
                        self._exchange(
                            slot, "noop", (), drops, _RELEASE_TIMEOUT_S, "releasing documents", _decode_nothing
                        )
                else:
                    outcome = self._exchange(slot, job.kind, job.args, drops, job.timeout, job.label, job.decode)
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
                    self._stop_process(slot)
                    self._spawn(slot)
                elif replacing:
                    self._spawn(slot)
        except BaseException as exc:  # never let a driver thread die silently with callers waiting
            slot.start_error = slot.start_error or f"render worker thread failed: {exc!r}"
            slot.ready.set()
            raise
        finally:
            self._stop_process(slot)

    def _spawn(self, slot: _Slot) -> None:
        """Start a worker process for the slot; on failure record why and leave the slot empty."""
        parent_end, child_end = socket.socketpair()
        limits_json = json.dumps(dataclasses.asdict(self.limits))
        # The worker is a fresh interpreter started by subprocess (never fork: the parent has threads).
        # subprocess rather than multiprocessing.Process: it works inside daemonic processes, where
        # some executors run tasks and multiprocessing refuses to start children, and it does not
        # re-import the parent's __main__. The package root goes first on sys.path so a source
        # checkout works without installation.
        package_root = str(Path(olmocr_tasks.__file__).resolve().parent.parent)
        module, name = self.worker_main.__module__, self.worker_main.__name__
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            f"from {module} import {name}; "
            f"{name}(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))"
        )
        fd = child_end.fileno()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", code, package_root, str(fd), limits_json, str(os.getpid()), str(self.nice)],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=worker_environment(os.environ),
            )
        except OSError as exc:
            parent_end.close()
            child_end.close()
            slot.start_error = f"cannot start a render worker: {exc}"
            return
        # Our copy of the child's end must go, or a dead child would never read as EOF.
        child_end.close()
        with self._cond:
            slot.process, slot.conn = process, parent_end
            closing = self._closing
        if closing:
            self._kill(slot)
            return
        try:
            hello, _ = read_message(parent_end, max_payload=0, deadline=time.monotonic() + _WORKER_START_TIMEOUT_S)
            if hello.get("status") == "refused":
                self._kill(slot)
                slot.start_error = f"render worker refused to start: {_message(hello)}"
                return
            if hello.get("status") != "ready":
                raise ProtocolError(f"unexpected greeting {hello!r}")
        except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
            status = _describe(self._kill(slot))
            slot.start_error = f"render worker did not start ({exc}, {status}); see its stderr"
            return
        slot.start_error = None

    def _exchange(
        self,
        slot: _Slot,
        kind: str,
        args: tuple[Any, ...],
        drops: set[str],
        timeout: float,
        label: str,
        decode: _Decoder,
    ) -> _Outcome:
        """Send one request to the slot's worker and wait for the answer within ``timeout``.

        On a timeout, a dead worker or a reply that breaks the protocol the process is killed and
        reaped and the slot left empty.
        """
        if slot.process is None:
            self._spawn(slot)
            if slot.process is None:
                return ("render_error", "crashed", slot.start_error or "render worker unavailable")
        conn = slot.conn
        assert conn is not None
        deadline = time.monotonic() + timeout
        try:
            conn.settimeout(timeout)
            write_message(conn, {"kind": kind, "args": list(args), "drops": sorted(drops)})
            header, payload = read_message(conn, max_payload=self._max_payload, deadline=deadline)
            outcome = self._judge(slot, header, payload, decode)
        except TimeoutError:
            self._kill(slot)
            return ("render_error", "timeout", f"{label}: no result within {timeout:g} s, worker killed")
        except ProtocolError as exc:
            self._kill(slot)
            return ("render_error", "protocol", f"{label}: the render worker broke the protocol ({exc}), worker killed")
        except (EOFError, OSError):
            code = self._kill(slot, grace=_WORKER_STOP_GRACE_S)
            if self._closing:
                return ("render_error", "failed", "render pool closed")
            return self._death(label, code)
        return outcome

    def _judge(self, slot: _Slot, header: dict[str, Any], payload: bytes, decode: _Decoder) -> _Outcome:
        """The outcome a well-formed reply stands for; ProtocolError for anything else."""
        cpu_s = header.get("cpu_s")
        if type(cpu_s) not in (int, float) or not 0 <= cpu_s < math.inf:
            raise ProtocolError(f"cpu_s is {cpu_s!r}, not a number of seconds")
        retire = header.get("retire", False)
        if type(retire) is not bool:
            raise ProtocolError(f"retire is {retire!r}, not true or false")
        # Retired before its next request could meet the lifetime limit mid-page.
        slot.retire = retire or cpu_s + self.limits.render_timeout_s >= self.limits.render_worker_cpu_s
        status = header.get("status")
        if status == "ok":
            return ("ok", decode(header, payload))
        if payload:
            raise ProtocolError(f"a {status} reply carries a payload")
        if status == "document_error":
            error = header.get("error")
            if error not in _DOCUMENT_ERRORS:
                raise ProtocolError(f"unknown document error {error!r}")
            return ("document_error", error, _message(header))
        if status == "render_error" and header.get("reason") == "failed":
            return ("render_error", "failed", _message(header))
        raise ProtocolError(f"unexpected reply status {status!r}")

    def _death(self, label: str, code: int | None) -> _Outcome:
        """The outcome of a request whose worker died under it, by how the worker ended."""
        if code == -signal.SIGABRT:
            # PDFium aborts when an allocation fails, and allocations fail once the worker reaches its
            # address-space limit: a page (or a document being opened) that needs more memory than a
            # worker may have. Retrying would only repeat it, so the document fails.
            limit = self.limits.render_memory_bytes
            return (
                "document_error",
                TooLargeError.__name__,
                f"{label} stopped the render worker (SIGABRT, as PDFium ends when it needs more than the "
                f"worker's memory limit of {limit:,} bytes); worker replaced",
            )
        if code == -signal.SIGXCPU:
            return ("render_error", "timeout", f"{label}: the render worker used up its CPU time limit, worker killed")
        return ("render_error", "crashed", f"{label}: render worker died ({_describe(code)})")

    def _kill(self, slot: _Slot, grace: float = 0.0) -> int | None:
        """Kill and reap the slot's process (after ``grace`` seconds to end by itself); its exit code."""
        with self._cond:
            process, conn = slot.process, slot.conn
            slot.process, slot.conn = None, None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        if grace:
            # A worker that closed its end may not have finished dying: let it, so that its exit code
            # says how it ended rather than that we killed it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)
        if process.poll() is None:
            process.kill()
        return process.wait()

    def _stop_process(self, slot: _Slot) -> None:
        with self._cond:
            process, conn = slot.process, slot.conn
        if process is None:
            return
        if conn is not None and process.poll() is None:
            try:
                conn.settimeout(_WORKER_STOP_GRACE_S)
                write_message(conn, {"kind": "stop", "args": [], "drops": []})
                process.wait(_WORKER_STOP_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill(slot)

    @staticmethod
    def _settle(job: _Job, outcome: _Outcome) -> None:
        def deliver() -> None:
            if job.future.done():
                return
            status = outcome[0]
            if status == "ok":
                job.future.set_result(outcome[1])
            elif status == "document_error":
                job.future.set_exception(_DOCUMENT_ERRORS[outcome[1]](outcome[2]))
            else:
                job.future.set_exception(RenderError(outcome[1], outcome[2]))

        # RuntimeError: the caller's event loop has ended, so nobody is waiting for this answer.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(deliver)

    def _decode_pdf_info(self, header: dict[str, Any], payload: bytes) -> PdfInfo:
        value = header.get("value")
        fields = {field.name for field in dataclasses.fields(PdfInfo)}
        if payload or not isinstance(value, dict) or set(value) != fields:
            raise ProtocolError("an inspect reply must be a document description")
        pages, size, version = value["page_count"], value["size_bytes"], value["pdf_version"]
        if type(pages) is not int or not 1 <= pages <= self.limits.max_pages:
            raise ProtocolError(f"page_count {pages!r} is not within 1..{self.limits.max_pages}")
        if type(size) is not int or size < 0:
            raise ProtocolError(f"size_bytes {size!r} is not a size")
        if version is not None and type(version) is not int:
            raise ProtocolError(f"pdf_version {version!r} is not a version")
        if type(value["is_encrypted_owner_only"]) is not bool:
            raise ProtocolError("is_encrypted_owner_only is not true or false")
        return PdfInfo(**value)


def _decode_png(header: dict[str, Any], payload: bytes) -> bytes:
    """Base64 of the PNG the worker sent (checked for the PNG signature only: decoding an untrusted
    image here would bring the attack surface the worker exists to hold into this process)."""
    if header.get("payload") != "bytes" or header.get("value") is not None or not payload.startswith(PNG_SIGNATURE):
        raise ProtocolError("a render reply must be a PNG")
    return base64.b64encode(payload)


def _decode_text(header: dict[str, Any], payload: bytes) -> str:
    if header.get("payload") != "text" or header.get("value") is not None:
        raise ProtocolError("a text reply must be text")
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"a text reply is not UTF-8: {exc}") from None


def _decode_nothing(header: dict[str, Any], payload: bytes) -> None:
    if payload or header.get("value") is not None:
        raise ProtocolError("a reply that carries nothing carries something")


def _decode_any(header: dict[str, Any], payload: bytes) -> Any:
    """For request kinds without a decoder of their own (test hooks): the JSON value, or the payload."""
    return payload if payload else header.get("value")


def _message(header: dict[str, Any]) -> str:
    message = header.get("message")
    if not isinstance(message, str):
        raise ProtocolError(f"message is {type(message).__name__}, not text")
    return message[:MAX_MESSAGE_CHARS]


def _describe(code: int | None) -> str:
    """How a worker ended, from its exit code."""
    if code is None:
        return "no process"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
