"""What runs inside a render worker process: PDFium calls and the loop that answers the pool.

PDFium is not thread-safe and hostile PDFs can crash or hang it, so every PDFium call runs in a worker
process that ``render_pool.RenderPool`` starts, feeds and replaces (the parent side). The parent never
imports pypdfium2: the helpers here import it lazily, so the pool can import this module for
``PdfInfo`` and the worker's entry point.

The worker is also a sandbox (``sandbox``): it starts with no credentials in its environment (the pool
passes an allow-list), caps its own address space (``DocumentLimits.render_memory_bytes``) and CPU time
(``render_worker_cpu_s`` for its life, ``render_timeout_s`` per request), and answers in
``render_wire``'s format, which carries JSON and raw bytes and nothing the pool would execute. A request
that runs out of memory in Python is answered as ``too_large`` and the worker asks to be retired; one
that runs out inside PDFium ends the worker (PDFium aborts), which the pool reports the same way.

Image documents (PNG, JPEG, TIFF, WebP) take the same path: the worker tells them from PDFs by their
content and hands them to ``image_pages``, which answers the same requests with the same limits.

Image semantics follow olmOCR 0.4.x: the page is rendered so that its longest side is
``target_longest_image_dim`` pixels, honouring the page's ``/Rotate``; a ``rotation`` R is applied like
olmOCR's ``rotation_correction`` (PIL ``Transpose.ROTATE_R``, counter-clockwise); the PNG goes back as
raw bytes and the pool hands callers its standard base64.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import math
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import (
    CorruptPdfError,
    DocumentError,
    EmptyDocumentError,
    EncryptedPdfError,
    NotPdfError,
    TooLargeError,
    TooManyPagesError,
    UnreadableSourceError,
    UnsupportedFormatError,
)
from olmocr_tasks.core.formats import FORMATS, IMAGE_FORMATS, file_format
from olmocr_tasks.page.geometry import ROTATIONS, target_size
from olmocr_tasks.page.image_pages import ImageDocument, open_image_document
from olmocr_tasks.page.render_wire import MAX_TEXT_BYTES, read_message, write_message

if TYPE_CHECKING:
    import pypdfium2

__all__ = [
    "ROTATIONS",
    "PageRequests",
    "PdfInfo",
    "open_any_document",
    "open_document_sync",
    "page_text_sync",
    "pdf_info_sync",
    "render_page_png_sync",
    "target_size",
    "worker_main",
]

_PDF_HEADER = b"%PDF-"
# PDFium (like Acrobat) accepts a header preceded by junk within the first 1024 bytes.
_HEADER_WINDOW = 1024
_DOCUMENT_CACHE_SIZE = 8


@dataclass(frozen=True)
class PdfInfo:
    """What a worker learns cheaply when it opens a document."""

    page_count: int
    size_bytes: int
    # PDF version as PDFium reports it (14 for 1.4, 17 for 1.7); None when the header has none.
    pdf_version: int | None
    # The file is encrypted but opened with the empty user password (restrictions only).
    is_encrypted_owner_only: bool


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
        raise TooManyPagesError(f"PDF has {pages} pages, the limit is {limits.max_pages}")
    return pdf


def open_any_document(path: str, size_bytes: int, limits: DocumentLimits) -> tuple[Any, PdfInfo]:
    """Open a PDF (PDFium) or a page image (``image_pages``), whichever its content is.

    The content decides, not the name: the worker is handed temporary paths. Whether the content fits
    the document's name and the run's formats was settled before (``core.formats.check_format``).
    """
    if size_bytes == 0:
        raise EmptyDocumentError("file is empty (0 bytes)")
    if size_bytes > limits.max_bytes:
        raise TooLargeError(f"file is {size_bytes} bytes, the limit is {limits.max_bytes}")
    detected = file_format(path)
    if detected in IMAGE_FORMATS:
        image = open_image_document(path, detected, limits)
        return image, PdfInfo(len(image), size_bytes, pdf_version=None, is_encrypted_owner_only=False)
    if detected != "pdf":
        raise UnsupportedFormatError(
            f"the content is {detected}, not a format this converts ({', '.join(FORMATS)})", detected=detected
        )
    pdf = open_document_sync(path, limits)
    return pdf, pdf_info_sync(pdf, size_bytes)


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

    if rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation}")
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
# The request loop.


class PageRequests:
    """The requests a worker answers, over its open documents: a small LRU so consecutive pages do not
    reopen the file. A document is a PDF (PDFium) or an image (``image_pages``), by its content.
    Tests that need a worker which hangs or dies on demand subclass it (``handle``) and start the pool
    with their own ``worker_main``; production workers know only these kinds."""

    def __init__(self, limits: DocumentLimits) -> None:
        self.limits = limits
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
        pdf, info = open_any_document(path, stat.st_size, self.limits)
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
        """The answer to one request: bytes or str travel as the reply's payload, anything else (JSON
        values, a ``PdfInfo``) in its header."""
        if kind == "inspect":
            return self.document(args[0])[1]
        if kind == "render":
            path, page_index, target, rotation, level = args
            pdf, _ = self.document(path)
            if isinstance(pdf, ImageDocument):
                return pdf.render_png(page_index, target, level, rotation, self.limits.max_render_pixels)
            return render_page_png_sync(pdf, page_index, target, level, rotation, self.limits.max_render_pixels)
        if kind == "text":
            path, page_index = args
            pdf, _ = self.document(path)
            if isinstance(pdf, ImageDocument):
                return ""  # an image has no text layer
            return page_text_sync(pdf, page_index)
        if kind == "noop":
            return None
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


def sandbox(limits: DocumentLimits) -> None:
    """Cap this process: its address space, its lifetime CPU, and no core files.

    Called once everything the worker needs is imported, so the limits bound the work on documents.
    RLIMIT_AS rather than RLIMIT_DATA: PDFium's large buffers come from mmap as well as the heap, and
    this PDFium build reserves no large address ranges up front (the worker sits at ~100 MiB). No core
    files: a worker ended by its memory or CPU limit would otherwise write one the size of its memory.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    at_rest = _address_space_bytes()
    if at_rest is not None and at_rest >= limits.render_memory_bytes:
        raise SandboxError(
            f"render_memory_bytes ({limits.render_memory_bytes:,}) is below what a render worker takes "
            f"before any document ({at_rest:,} bytes)"
        )
    resource.setrlimit(resource.RLIMIT_AS, (limits.render_memory_bytes, limits.render_memory_bytes))
    lifetime = math.ceil(limits.render_worker_cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (lifetime, lifetime))


class SandboxError(Exception):
    """The worker cannot put its limits in place; it tells the pool why instead of starting."""


def arm_cpu_limit(budget_s: float) -> float:
    """Let the next request use at most ``budget_s`` more CPU seconds (SIGXCPU ends the worker then);
    returns the CPU seconds used so far.

    The soft limit moves with each request because the worker is long-lived: a fixed soft limit would
    end a healthy worker after enough pages. The hard limit (its lifetime, ``sandbox``) never moves, so
    a worker that raises its own soft limit still meets it; the pool retires workers before that.
    """
    used = cpu_seconds()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used + budget_s)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    return used


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _address_space_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def worker_main(
    fd: int,
    limits_json: str,
    parent_pid: int = 0,
    nice: int = 0,
    requests: Callable[[DocumentLimits], PageRequests] = PageRequests,
) -> None:
    """Entry point of a worker process: answer requests on the inherited socket until EOF."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice > 0:
        # A low-priority run's rendering yields the CPU to everything else on the host (see RenderPool).
        os.nice(nice)
    if parent_pid:
        _die_with_parent(parent_pid)
    conn = socket.socket(fileno=fd)
    limits = DocumentLimits(**json.loads(limits_json))
    # Loaded before announcing readiness: a broken installation fails the start, not the first page,
    # and the first page does not pay for the imports.
    import pypdfium2  # noqa: F401
    from PIL import Image, PngImagePlugin  # noqa: F401

    Image.init()  # every image reader Pillow has (JPEG, TIFF, WebP...), loaded before the limits

    try:
        sandbox(limits)
    except (SandboxError, OSError, ValueError) as exc:
        write_message(conn, {"status": "refused", "message": str(exc)})
        conn.close()
        return
    state = requests(limits)
    write_message(conn, {"status": "ready", "pid": os.getpid()})
    try:
        while True:
            try:
                request, _ = read_message(conn, max_payload=0)
            except (EOFError, OSError):
                break  # the parent went away
            kind, args, drops = request["kind"], tuple(request["args"]), request["drops"]
            for path in drops:
                state.drop(path)
            if kind == "stop":
                break
            arm_cpu_limit(limits.render_timeout_s)
            header, payload = _answer(state, kind, args)
            header["cpu_s"] = round(cpu_seconds(), 3)
            write_message(conn, header, payload)
    finally:
        state.close()
        conn.close()


def _answer(state: PageRequests, kind: str, args: tuple[Any, ...]) -> tuple[dict[str, Any], bytes]:
    try:
        value = state.handle(kind, args)
    except DocumentError as exc:
        return {"status": "document_error", "error": type(exc).__name__, "message": str(exc)}, b""
    except MemoryError:
        # Python (or Pillow) could not allocate within the address-space limit. The worker may hold
        # half-built state now, so it asks to be replaced once this answer is delivered.
        message = f"needs more memory than a render worker may use ({state.limits.render_memory_bytes:,} bytes)"
        return {"status": "document_error", "error": TooLargeError.__name__, "message": message, "retire": True}, b""
    except Exception as exc:
        return {"status": "render_error", "reason": "failed", "message": f"{type(exc).__name__}: {exc}"}, b""
    if isinstance(value, bytes):
        return {"status": "ok", "value": None, "payload": "bytes"}, value
    if isinstance(value, str):
        text = value.encode("utf-8", "replace")
        if len(text) > MAX_TEXT_BYTES:
            message = f"a text layer of {len(text):,} bytes is over the limit of {MAX_TEXT_BYTES:,}"
            return {"status": "document_error", "error": TooLargeError.__name__, "message": message}, b""
        return {"status": "ok", "value": None, "payload": "text"}, text
    if isinstance(value, PdfInfo):
        return {"status": "ok", "value": dataclasses.asdict(value)}, b""
    return {"status": "ok", "value": value}, b""
