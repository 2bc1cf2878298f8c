"""Page rendering and text extraction with pypdfium2, isolated in worker subprocesses.

PDFium is not thread-safe and hostile PDFs can crash or hang it, so every PDFium call runs in a small
pool of worker processes. A crash or a hang costs one worker (killed and replaced) and one typed
``RenderError``; it never takes the calling process down or hangs a caller. The parent process never
imports pypdfium2: the module-level helpers that take a ``PdfDocument`` import it lazily.

The pool is deliberately independent of any particular event loop: each worker is driven by one
parent thread that does the blocking pipe I/O and enforces the time limit, and results are handed back
to whichever loop asked via ``call_soon_threadsafe``. So one pool can serve several ``asyncio.run``
calls (or threads) in turn, and a caller that is cancelled mid-request still gets its worker's
deadline enforced.

Image semantics follow olmOCR 0.4.x: the page is rendered so that its longest side is
``target_longest_image_dim`` pixels, honouring the page's ``/Rotate``; a ``rotation`` R is applied like
olmOCR's ``rotation_correction`` (PIL ``Transpose.ROTATE_R``, counter-clockwise) and the PNG is
returned as standard base64.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import io
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import TYPE_CHECKING, Any

from olmocr_tasks import errors
from olmocr_tasks.config import DocumentLimits
from olmocr_tasks.errors import (
    CorruptPdfError,
    DocumentError,
    EmptyDocumentError,
    EncryptedPdfError,
    NotPdfError,
    RenderError,
    TooLargeError,
    UnreadableSourceError,
)

if TYPE_CHECKING:
    import pypdfium2

__all__ = [
    "PdfInfo",
    "RenderError",
    "RenderPool",
    "default_render_workers",
    "open_document_sync",
    "page_text_sync",
    "pdf_info_sync",
    "render_page_png_sync",
    "target_size",
]

# Set to "1" in the environment of the process that creates a pool to let its workers accept the
# test-only request kinds (_sleep, _crash). Tests need a worker that hangs or dies on demand to prove
# the pool survives; keeping those kinds behind an environment switch means no production worker can
# be told to kill itself, whatever a caller passes to the private ``_call``.
TEST_HOOKS_ENV = "OLMOCR_TASKS_RENDER_TEST_HOOKS"

_PDF_HEADER = b"%PDF-"
# PDFium (like Acrobat) accepts a header preceded by junk within the first 1024 bytes.
_HEADER_WINDOW = 1024
_ROTATIONS = (0, 90, 180, 270)
_DOCUMENT_CACHE_SIZE = 8
_WORKER_START_TIMEOUT_S = 60.0
_WORKER_STOP_GRACE_S = 2.0
_RELEASE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class PdfInfo:
    """What a worker learns cheaply when it opens a document."""

    page_count: int
    size_bytes: int
    # PDF version as PDFium reports it (14 for 1.4, 17 for 1.7); None when the header has none.
    pdf_version: int | None
    # The file is encrypted but opened with the empty user password (restrictions only).
    is_encrypted_owner_only: bool


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


def target_size(width_pt: float, height_pt: float, target_longest: int, max_pixels: int) -> tuple[int, int]:
    """Pixel size of a render whose longest side is ``target_longest``, capped at ``max_pixels``.

    Sides are rounded to the nearest pixel (never below 1) so the longest side is exactly the target;
    only a render that would exceed ``max_pixels`` is scaled down as a whole.
    """
    if not (width_pt > 0 and height_pt > 0 and math.isfinite(width_pt) and math.isfinite(height_pt)):
        raise ValueError(f"page has no usable size ({width_pt} x {height_pt} pt)")
    if target_longest < 1:
        raise ValueError("target_longest_image_dim must be positive")
    scale = target_longest / max(width_pt, height_pt)
    width, height = max(1, round(width_pt * scale)), max(1, round(height_pt * scale))
    if width * height > max_pixels:
        shrink = math.sqrt(max_pixels / (width * height))
        width, height = max(1, math.floor(width * shrink)), max(1, math.floor(height * shrink))
    return width, height


# --------------------------------------------------------------------------------------------------
# Synchronous PDFium helpers. They run inside the workers, and the benchmark floor calls them directly
# so that both measure exactly the same rendering work.


def open_document_sync(path: str, limits: DocumentLimits = DocumentLimits()) -> pypdfium2.PdfDocument:  # noqa: B008
    """Open a local PDF with PDFium, turning every way it can be unusable into a typed DocumentError."""
    import pypdfium2
    import pypdfium2.raw as pdfium_c

    try:
        size = os.stat(path).st_size
        with open(path, "rb") as handle:
            head = handle.read(_HEADER_WINDOW)
    except OSError as exc:
        raise UnreadableSourceError(f"cannot read file: {exc.strerror or exc}") from None
    if size == 0:
        raise EmptyDocumentError("file is empty (0 bytes)")
    if size > limits.max_bytes:
        raise TooLargeError(f"file is {size} bytes, the limit is {limits.max_bytes}")
    if _PDF_HEADER not in head:
        raise NotPdfError(f"not a PDF: no {_PDF_HEADER.decode()} header in the first {_HEADER_WINDOW} bytes")

    # The raw call instead of PdfDocument(path): pypdfium2 neither closes a document it rejects for
    # having no pages nor lets us tell "0 pages" from "unparseable" without the error code.
    raw = pdfium_c.FPDF_LoadDocument(os.fsencode(path) + b"\x00", None)
    if not raw:
        code = pdfium_c.FPDF_GetLastError()
        if code == pdfium_c.FPDF_ERR_PASSWORD:
            raise EncryptedPdfError("PDF is encrypted and needs a password to open")
        if code == pdfium_c.FPDF_ERR_SECURITY:
            raise EncryptedPdfError("PDF uses an unsupported encryption handler")
        if code == pdfium_c.FPDF_ERR_FILE:
            raise UnreadableSourceError("PDFium cannot open the file")
        raise CorruptPdfError("PDF is damaged and cannot be parsed")
    pdf = pypdfium2.PdfDocument(raw)
    pages = pdfium_c.FPDF_GetPageCount(raw)
    if pages < 1:
        pdf.close()
        raise EmptyDocumentError("PDF has no pages")
    if pages > limits.max_pages:
        pdf.close()
        raise TooLargeError(f"PDF has {pages} pages, the limit is {limits.max_pages}")
    return pdf


def pdf_info_sync(pdf: pypdfium2.PdfDocument, size_bytes: int) -> PdfInfo:
    import ctypes

    import pypdfium2.raw as pdfium_c

    version = ctypes.c_int(0)
    has_version = pdfium_c.FPDF_GetFileVersion(pdf.raw, ctypes.byref(version))
    return PdfInfo(
        page_count=len(pdf),
        size_bytes=size_bytes,
        pdf_version=version.value if has_version else None,
        # -1 means "no security handler"; any document that got this far opened without a password.
        is_encrypted_owner_only=pdfium_c.FPDF_GetSecurityHandlerRevision(pdf.raw) != -1,
    )


def render_page_png_sync(
    pdf: pypdfium2.PdfDocument,
    page_index: int,
    target_longest_image_dim: int = 1288,
    png_compress_level: int = 1,
    rotation: int = 0,
    max_render_pixels: int = DocumentLimits.max_render_pixels,
) -> bytes:
    """PNG bytes (RGB) of one page, longest side ``target_longest_image_dim``, turned by ``rotation``.

    ``rotation`` is olmOCR's rotation_correction: PIL ``Transpose.ROTATE_<rotation>`` of the upright
    render, i.e. counter-clockwise.
    """
    import ctypes

    import pypdfium2.raw as pdfium_c
    from PIL import Image

    if rotation not in _ROTATIONS:
        raise ValueError(f"rotation must be one of {_ROTATIONS}, got {rotation}")
    page = _get_page(pdf, page_index)
    try:
        # get_size() already accounts for /Rotate, and FPDF_RenderPageBitmap applies it.
        width, height = target_size(*page.get_size(), target_longest_image_dim, max_render_pixels)
        # Our own bitmap and FPDF_RenderPageBitmap rather than PdfPage.render(): render() derives the
        # size with ceil(side * scale), which overshoots the target by a pixel on most page sizes.
        # 3-byte pixels with the reverse-byte-order flag come out as RGB, which Pillow reads directly.
        bitmap = pdfium_c.FPDFBitmap_CreateEx(width, height, pdfium_c.FPDFBitmap_BGR, None, 0)
        if not bitmap:
            raise MemoryError(f"PDFium could not allocate a {width}x{height} bitmap")
        try:
            pdfium_c.FPDFBitmap_FillRect(bitmap, 0, 0, width, height, 0xFFFFFFFF)
            flags = pdfium_c.FPDF_ANNOT | pdfium_c.FPDF_REVERSE_BYTE_ORDER
            pdfium_c.FPDF_RenderPageBitmap(bitmap, page.raw, 0, 0, width, height, 0, flags)
            stride = pdfium_c.FPDFBitmap_GetStride(bitmap)
            buffer = (ctypes.c_ubyte * (stride * height)).from_address(pdfium_c.FPDFBitmap_GetBuffer(bitmap))
            # frombuffer copies RGB into Pillow's own storage, so the bitmap can go right after.
            image = Image.frombuffer("RGB", (width, height), buffer, "raw", "RGB", stride, 1)
        finally:
            pdfium_c.FPDFBitmap_Destroy(bitmap)
    finally:
        page.close()
    if rotation:
        # Turning the pixels in memory (before the one PNG encode) rather than asking PDFium for a
        # rotated render: PDFium rasterises text differently in rotated device space (about a quarter
        # of the pixels of a text page differ), while olmOCR's contract is a transpose of the upright
        # image. The transpose costs a few ms and only happens on rotation retries.
        image = image.transpose(getattr(Image.Transpose, f"ROTATE_{rotation}"))
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=png_compress_level)
    return out.getvalue()


def page_text_sync(pdf: pypdfium2.PdfDocument, page_index: int) -> str:
    """The page's text layer as PDFium extracts it ("" when it has none), with newlines normalised."""
    page = _get_page(pdf, page_index)
    try:
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_bounded()
        finally:
            textpage.close()
    finally:
        page.close()
    # PDFium separates lines with CRLF; the rest of the pipeline (and pdftotext, which olmOCR uses for
    # fallback pages) uses LF.
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")


def _get_page(pdf: pypdfium2.PdfDocument, page_index: int) -> Any:
    count = len(pdf)
    if not 0 <= page_index < count:
        raise IndexError(f"page index {page_index} is out of range (document has {count} pages)")
    return pdf.get_page(page_index)


# --------------------------------------------------------------------------------------------------
# Worker process side.


class _WorkerState:
    """Open documents of one worker: a small LRU so consecutive pages do not reopen the file."""

    def __init__(self, limits: DocumentLimits, test_hooks: bool) -> None:
        self.limits = limits
        self.test_hooks = test_hooks
        # path -> (stat identity, document, info). The identity catches a file replaced under the same
        # name (temporary download paths get reused).
        self.documents: collections.OrderedDict[str, tuple[tuple[int, int, int], Any, PdfInfo]] = (
            collections.OrderedDict()
        )

    def document(self, path: str) -> tuple[Any, PdfInfo]:
        try:
            stat = os.stat(path)
        except OSError as exc:
            self.drop(path)
            raise UnreadableSourceError(f"cannot read file: {exc.strerror or exc}") from None
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        cached = self.documents.get(path)
        if cached is not None and cached[0] == identity:
            self.documents.move_to_end(path)
            return cached[1], cached[2]
        self.drop(path)
        pdf = open_document_sync(path, self.limits)
        info = pdf_info_sync(pdf, stat.st_size)
        self.documents[path] = (identity, pdf, info)
        while len(self.documents) > _DOCUMENT_CACHE_SIZE:
            _, (_, old, _) = self.documents.popitem(last=False)
            old.close()
        return pdf, info

    def drop(self, path: str) -> None:
        cached = self.documents.pop(path, None)
        if cached is not None:
            cached[1].close()

    def close(self) -> None:
        for path in list(self.documents):
            self.drop(path)

    def handle(self, kind: str, args: tuple[Any, ...]) -> Any:
        if kind == "inspect":
            return self.document(args[0])[1]
        if kind == "render":
            path, page_index, target, rotation, level = args
            pdf, _ = self.document(path)
            png = render_page_png_sync(pdf, page_index, target, level, rotation, self.limits.max_render_pixels)
            return base64.b64encode(png)
        if kind == "text":
            path, page_index = args
            return page_text_sync(self.document(path)[0], page_index)
        if kind == "noop":
            return None
        if self.test_hooks and kind == "_sleep":
            if len(args) > 1:
                # A file the test waits for instead of guessing when the worker is inside the call.
                open(args[1], "w").close()
            time.sleep(args[0])
            return None
        if self.test_hooks and kind == "_crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.test_hooks and kind == "_pid":
            return os.getpid()
        raise ValueError(f"unknown request kind {kind!r}")


def _die_with_parent(parent_pid: int) -> None:
    """Have Linux SIGKILL this worker when its parent dies.

    A worker waiting for requests notices a dead parent as EOF, but one stuck inside PDFium would
    live on as an orphan burning CPU (e.g. after the task process is SIGKILLed by a scheduler).
    """
    if sys.platform != "linux":
        return
    import ctypes

    try:
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)


def _worker_main(fd: int, limits_json: str, parent_pid: int = 0, nice: int = 0) -> None:
    """Entry point of a worker process: answer requests on the inherited connection until EOF."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice > 0:
        # A low-priority run's rendering yields the CPU to everything else on the host (see RenderPool).
        os.nice(nice)
    if parent_pid:
        _die_with_parent(parent_pid)
    conn = Connection(fd)
    limits = DocumentLimits(**json.loads(limits_json))
    # Loaded before announcing readiness: a broken installation fails the start, not the first page,
    # and the first page does not pay for the imports.
    import pypdfium2  # noqa: F401
    from PIL import Image, PngImagePlugin  # noqa: F401

    state = _WorkerState(limits, test_hooks=os.environ.get(TEST_HOOKS_ENV) == "1")
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                kind, args, drops = conn.recv()
            except (EOFError, OSError):
                break  # the parent went away
            for path in drops:
                state.drop(path)
            if kind == "stop":
                break
            try:
                reply: tuple[Any, ...] = ("ok", state.handle(kind, args))
            except DocumentError as exc:
                reply = ("document_error", type(exc).__name__, str(exc))
            except Exception as exc:
                reply = ("render_error", "failed", f"{type(exc).__name__}: {exc}")
            conn.send(reply)
    finally:
        state.close()
        conn.close()


# --------------------------------------------------------------------------------------------------
# Parent side.


@dataclass
class _Job:
    kind: str
    args: tuple[Any, ...]
    label: str
    timeout: float
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass
class _Slot:
    """One worker position: the thread that drives it and the process currently filling it."""

    index: int
    process: subprocess.Popen[bytes] | None = None
    conn: Connection | None = None
    drops: set[str] = dataclasses.field(default_factory=set)
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
    ) -> None:
        """``nice``: added to the workers' niceness (0 leaves it). Rendering is nearly all of a
        conversion's CPU, so a low-priority run whose workers are niced gives way, on a shared host,
        to the Airflow tasks of a high-priority run and to the Airflow components themselves; the
        converting process keeps its own niceness, as an Airflow task runner may run other tasks later."""
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
        self._cond = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._slots = [_Slot(index) for index in range(workers)]
        self._started = False
        self._closing = False
        self._closed = False
        self.replacements = 0  # workers killed and restarted so far (timeouts and crashes)

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
        """Open the PDF at a local path and describe it; raises a DocumentError for unusable files."""
        result: PdfInfo = await self._call("inspect", (str(path),), "inspect")
        return result

    async def render_page(
        self, path: str, page_index: int, target_longest_image_dim: int = 1288, rotation: int = 0
    ) -> bytes:
        """Base64 (ASCII bytes) of the page's PNG; ``rotation`` is olmOCR's rotation_correction."""
        if rotation not in _ROTATIONS:
            raise ValueError(f"rotation must be one of {_ROTATIONS}, got {rotation}")
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
        self._ensure_started()
        loop = asyncio.get_running_loop()
        job = _Job(
            kind=kind,
            args=args,
            label=label,
            timeout=self.limits.render_timeout_s if timeout is None else timeout,
            loop=loop,
            future=loop.create_future(),
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
                if job is None or job.future.cancelled():
                    # Nobody waits for an answer: only let the worker forget released documents.
                    if slot.process is not None:
                        self._exchange(slot, "noop", (), drops, _RELEASE_TIMEOUT_S, "releasing documents")
                else:
                    self._settle(job, self._exchange(slot, job.kind, job.args, drops, job.timeout, job.label))
                if slot.process is None and not self._closing:
                    # The caller already has its answer; the replacement starts warm for the next one.
                    with self._cond:
                        self.replacements += 1
                    self._spawn(slot)
        except BaseException as exc:  # never let a driver thread die silently with callers waiting
            slot.start_error = slot.start_error or f"render worker thread failed: {exc!r}"
            slot.ready.set()
            raise
        finally:
            self._stop_process(slot)

    def _spawn(self, slot: _Slot) -> None:
        """Start a worker process for the slot; on failure record why and leave the slot empty."""
        parent_end, child_end = Pipe(duplex=True)
        limits_json = json.dumps(dataclasses.asdict(self.limits))
        # The worker is a fresh interpreter started by subprocess (never fork: the parent has threads).
        # subprocess rather than multiprocessing.Process: it works inside daemonic processes, where
        # some executors run tasks and multiprocessing refuses to start children, and it does not
        # re-import the parent's __main__. The package root goes first on sys.path so a source
        # checkout works without installation.
        package_root = str(Path(__file__).resolve().parent.parent)
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from olmocr_tasks.rendering import _worker_main; "
            "_worker_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))"
        )
        fd = child_end.fileno()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", code, package_root, str(fd), limits_json, str(os.getpid()), str(self.nice)],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
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
            if not parent_end.poll(_WORKER_START_TIMEOUT_S):
                raise TimeoutError(f"no answer within {_WORKER_START_TIMEOUT_S:g} s")
            hello = parent_end.recv()
            if hello[0] != "ready":
                raise RuntimeError(f"unexpected greeting {hello!r}")
        except (OSError, EOFError, TimeoutError, RuntimeError) as exc:
            status = self._kill(slot)
            slot.start_error = f"render worker did not start ({exc}, {status}); see its stderr"
            return
        slot.start_error = None

    def _exchange(
        self, slot: _Slot, kind: str, args: tuple[Any, ...], drops: set[str], timeout: float, label: str
    ) -> _Outcome:
        """Send one request to the slot's worker and wait for the answer within ``timeout``.

        On a timeout or a dead worker the process is killed and reaped and the slot left empty.
        """
        if slot.process is None:
            self._spawn(slot)
            if slot.process is None:
                return ("render_error", "crashed", slot.start_error or "render worker unavailable")
        conn = slot.conn
        assert conn is not None
        try:
            conn.send((kind, args, sorted(drops)))
            if not conn.poll(timeout):
                self._kill(slot)
                return ("render_error", "timeout", f"{label}: no result within {timeout:g} s, worker killed")
            return tuple(conn.recv())
        except (EOFError, OSError):
            status = self._kill(slot)
            if self._closing:
                return ("render_error", "failed", "render pool closed")
            return ("render_error", "crashed", f"{label}: render worker died ({status})")

    def _kill(self, slot: _Slot) -> str:
        """Kill and reap the slot's process; describe how it ended."""
        with self._cond:
            process, conn = slot.process, slot.conn
            slot.process, slot.conn = None, None
        if conn is not None:
            conn.close()
        if process is None:
            return "no process"
        if process.poll() is None:
            process.kill()
        code = process.wait()
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def _stop_process(self, slot: _Slot) -> None:
        with self._cond:
            process, conn = slot.process, slot.conn
        if process is None:
            return
        if conn is not None and process.poll() is None:
            try:
                conn.send(("stop", (), []))
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
                job.future.set_exception(_DOCUMENT_ERRORS.get(outcome[1], CorruptPdfError)(outcome[2]))
            else:
                job.future.set_exception(RenderError(outcome[1], outcome[2]))

        # RuntimeError: the caller's event loop has ended, so nobody is waiting for this answer.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(deliver)
