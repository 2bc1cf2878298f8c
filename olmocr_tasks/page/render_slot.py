"""One render worker position of the pool: the process filling it, started, asked, judged and killed here.

``render_pool`` decides which request goes to which position and when a position's worker is replaced;
this module does it for one position. A worker is a fresh interpreter running ``render_worker`` with an
allow-listed environment; one request and its answer go over a socket pair in ``render_wire``'s format
within a deadline, and the answer is judged against what the request may return. A timeout, a death or
a reply that breaks the format kills the worker and leaves the position empty.
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

import olmocr_tasks
from olmocr_tasks.core import errors
from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import DocumentError, TooLargeError
from olmocr_tasks.page.render_replies import Decoder
from olmocr_tasks.page.render_wire import (
    MAX_MESSAGE_CHARS,
    MAX_TEXT_BYTES,
    ProtocolError,
    png_payload_bound,
    read_message,
    write_message,
)

WORKER_START_TIMEOUT_S = 60.0
WORKER_STOP_GRACE_S = 2.0

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

# What a request came to: ("ok", value), ("document_error", class name, message) or
# ("render_error", reason, message).
Outcome = tuple[Any, ...]
DOCUMENT_ERRORS: dict[str, type[DocumentError]] = {cls.__name__: cls for cls in errors.DOCUMENT_ERROR_CLASSES}


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``environ`` that a render worker starts with."""
    return {
        name: value
        for name, value in environ.items()
        if name in _INHERITED_VARIABLES or name.startswith(_INHERITED_PREFIXES)
    }


class WorkerSlot:
    """One worker position: the thread that drives it (the pool's) and the process currently filling it.

    ``lock`` is the pool's: it guards ``process`` and ``conn`` against the pool reading them (worker
    PIDs, closing), and ``closing()``, read under it, says whether the pool is closing.
    """

    def __init__(
        self,
        index: int,
        *,
        limits: DocumentLimits,
        nice: int,
        worker_main: WorkerMain,
        lock: threading.Condition,
        closing: Callable[[], bool],
    ) -> None:
        self.index = index
        self._limits = limits
        self._nice = nice
        self._worker_main = worker_main
        self._lock = lock
        self._closing = closing
        self._max_payload = max(png_payload_bound(limits.max_render_pixels), MAX_TEXT_BYTES)
        self.process: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.drops: set[str] = set()
        # The worker asked to be replaced, or is near its lifetime CPU limit: stop it after this answer.
        self.retire = False
        self.ready = threading.Event()
        self.start_error: str | None = None
        self.thread: threading.Thread | None = None

    def spawn(self) -> None:
        """Start a worker process for the slot; on failure record why and leave the slot empty."""
        parent_end, child_end = socket.socketpair()
        limits_json = json.dumps(dataclasses.asdict(self._limits))
        # The worker is a fresh interpreter started by subprocess (never fork: the parent has threads).
        # subprocess rather than multiprocessing.Process: it works inside daemonic processes, where
        # some executors run tasks and multiprocessing refuses to start children, and it does not
        # re-import the parent's __main__. The package root goes first on sys.path so a source
        # checkout works without installation.
        package_root = str(Path(olmocr_tasks.__file__).resolve().parent.parent)
        module, name = self._worker_main.__module__, self._worker_main.__name__
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            f"from {module} import {name}; "
            f"{name}(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))"
        )
        fd = child_end.fileno()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", code, package_root, str(fd), limits_json, str(os.getpid()), str(self._nice)],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=worker_environment(os.environ),
            )
        except OSError as exc:
            parent_end.close()
            child_end.close()
            self.start_error = f"cannot start a render worker: {exc}"
            return
        # Our copy of the child's end must go, or a dead child would never read as EOF.
        child_end.close()
        with self._lock:
            self.process, self.conn = process, parent_end
            closing = self._closing()
        if closing:
            self.kill()
            return
        try:
            hello, _ = read_message(parent_end, max_payload=0, deadline=time.monotonic() + WORKER_START_TIMEOUT_S)
            if hello.get("status") == "refused":
                self.kill()
                self.start_error = f"render worker refused to start: {_message(hello)}"
                return
            if hello.get("status") != "ready":
                raise ProtocolError(f"unexpected greeting {hello!r}")
        except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
            status = _describe(self.kill())
            self.start_error = f"render worker did not start ({exc}, {status}); see its stderr"
            return
        self.start_error = None

    def exchange(
        self,
        kind: str,
        args: tuple[Any, ...],
        drops: set[str],
        timeout: float,
        label: str,
        decode: Decoder,
    ) -> Outcome:
        """Send one request to the slot's worker and wait for the answer within ``timeout``.

        On a timeout, a dead worker or a reply that breaks the protocol the process is killed and
        reaped and the slot left empty.
        """
        if self.process is None:
            self.spawn()
            if self.process is None:
                return ("render_error", "crashed", self.start_error or "render worker unavailable")
        conn = self.conn
        assert conn is not None
        deadline = time.monotonic() + timeout
        try:
            conn.settimeout(timeout)
            write_message(conn, {"kind": kind, "args": list(args), "drops": sorted(drops)})
            header, payload = read_message(conn, max_payload=self._max_payload, deadline=deadline)
            outcome = self._judge(header, payload, decode)
        except TimeoutError:
            self.kill()
            return ("render_error", "timeout", f"{label}: no result within {timeout:g} s, worker killed")
        except ProtocolError as exc:
            self.kill()
            return ("render_error", "protocol", f"{label}: the render worker broke the protocol ({exc}), worker killed")
        except (EOFError, OSError):
            code = self.kill(grace=WORKER_STOP_GRACE_S)
            if self._closing():
                return ("render_error", "failed", "render pool closed")
            return self._death(label, code)
        return outcome

    def _judge(self, header: dict[str, Any], payload: bytes, decode: Decoder) -> Outcome:
        """The outcome a well-formed reply stands for; ProtocolError for anything else."""
        cpu_s = header.get("cpu_s")
        if type(cpu_s) not in (int, float) or not 0 <= cpu_s < math.inf:
            raise ProtocolError(f"cpu_s is {cpu_s!r}, not a number of seconds")
        retire = header.get("retire", False)
        if type(retire) is not bool:
            raise ProtocolError(f"retire is {retire!r}, not true or false")
        # Retired before its next request could meet the lifetime limit mid-page.
        self.retire = retire or cpu_s + self._limits.render_timeout_s >= self._limits.render_worker_cpu_s
        status = header.get("status")
        if status == "ok":
            return ("ok", decode(header, payload))
        if payload:
            raise ProtocolError(f"a {status} reply carries a payload")
        if status == "document_error":
            error = header.get("error")
            if error not in DOCUMENT_ERRORS:
                raise ProtocolError(f"unknown document error {error!r}")
            return ("document_error", error, _message(header))
        if status == "render_error" and header.get("reason") == "failed":
            return ("render_error", "failed", _message(header))
        raise ProtocolError(f"unexpected reply status {status!r}")

    def _death(self, label: str, code: int | None) -> Outcome:
        """The outcome of a request whose worker died under it, by how the worker ended."""
        if code == -signal.SIGABRT:
            # PDFium aborts when an allocation fails, and allocations fail once the worker reaches its
            # address-space limit: a page (or a document being opened) that needs more memory than a
            # worker may have. Retrying would only repeat it, so the document fails.
            limit = self._limits.render_memory_bytes
            return (
                "document_error",
                TooLargeError.__name__,
                f"{label} stopped the render worker (SIGABRT, as PDFium ends when it needs more than the "
                f"worker's memory limit of {limit:,} bytes); worker replaced",
            )
        if code == -signal.SIGXCPU:
            return ("render_error", "timeout", f"{label}: the render worker used up its CPU time limit, worker killed")
        return ("render_error", "crashed", f"{label}: render worker died ({_describe(code)})")

    def kill(self, grace: float = 0.0) -> int | None:
        """Kill and reap the slot's process (after ``grace`` seconds to end by itself); its exit code."""
        with self._lock:
            process, conn = self.process, self.conn
            self.process, self.conn = None, None
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

    def stop(self) -> None:
        """Ask the worker to stop, give it a moment, then make sure it is gone."""
        with self._lock:
            process, conn = self.process, self.conn
        if process is None:
            return
        if conn is not None and process.poll() is None:
            try:
                conn.settimeout(WORKER_STOP_GRACE_S)
                write_message(conn, {"kind": "stop", "args": [], "drops": []})
                process.wait(WORKER_STOP_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


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
