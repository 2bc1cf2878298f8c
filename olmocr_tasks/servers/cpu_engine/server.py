"""The CPU engine's HTTP server: vLLM's OpenAI routes (``/v1/models``, ``/v1/chat/completions``),
``/health``, ``/version`` and ``/metrics`` over the standard library's threading HTTP server.

Tesseract runs as a subprocess per page; a semaphore bounds how many run at once so a burst of
requests queues (visible as ``vllm:num_requests_waiting`` on ``/metrics``) instead of oversubscribing
the CPUs.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.vllm_metrics import CONTENT_TYPE, Metric, ServerMetrics, render_vllm_metrics
from olmocr_tasks.servers.cpu_engine.chat import PageRequest, RequestError, completion_body, parse_chat_request
from olmocr_tasks.servers.cpu_engine.tesseract import DEFAULT_OSD_MIN_CONFIDENCE, Tesseract

logger = logging.getLogger(__name__)

# The engine answers under its own name, never olmOCR's: outputs are recorded (and later skipped as
# already converted) under the model that produced them, and Tesseract's text is not olmOCR's.
CPU_ENGINE_MODEL = "olmocr-cpu-tesseract"
MODEL_MAX_CONTEXT = 16384
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class CpuEngineConfig:
    """Everything that shapes one engine instance."""

    served_model_name: str = CPU_ENGINE_MODEL
    api_key: str | None = field(default=None, repr=False)
    max_concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    tesseract_binary: str = "tesseract"
    lang: str = "eng"
    detect_rotation: bool = True
    # OSD's confidence grows with the amount of text; below this a page is reported upright because a
    # false "rotated" sends the client into rotation retries that only make things worse.
    osd_min_confidence: float = DEFAULT_OSD_MIN_CONFIDENCE
    page_timeout_s: float = 120.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


class _Metrics:
    """Counters published in vLLM's metric names so the adaptive client can read them unchanged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.success_by_reason: Counter[str] = Counter()
        self.errors = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.page_seconds = 0.0

    def render(self, model: str) -> str:
        with self.lock:
            state = ServerMetrics(
                model=model,
                running=self.running,
                waiting=self.waiting,
                prompt_tokens=self.prompt_tokens,
                generation_tokens=self.generation_tokens,
                success_by_reason=dict(self.success_by_reason),
            )
            labels = (("model_name", model),)
            own = [
                Metric(
                    "olmocr_cpu_engine_errors_total", "counter", "Pages Tesseract failed on.", ((labels, self.errors),)
                ),
                Metric(
                    "olmocr_cpu_engine_page_seconds_total",
                    "counter",
                    "Seconds spent in Tesseract.",
                    ((labels, self.page_seconds),),
                ),
            ]
        return render_vllm_metrics(state, own)


class _EngineServer(ThreadingHTTPServer):
    daemon_threads = True
    # Clients open up to max_concurrent_requests connections at once; the default backlog of 5
    # would make the kernel drop SYNs and the client see connect timeouts.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], config: CpuEngineConfig, ocr: Tesseract) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.config = config
        self.ocr = ocr
        self.metrics = _Metrics()
        self.slots = threading.BoundedSemaphore(max(1, config.max_concurrency))
        self.started = int(time.time())
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "olmocr-cpu-engine"
    # Idle keep-alive connections give their thread back after this long.
    timeout = 300
    server: _EngineServer

    def log_message(self, format: str, *args: Any) -> None:
        # No per-request lines: a conversion sends thousands of requests.
        logger.debug("%s " + format, self.address_string(), *args)

    # -- plumbing ---------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _send_error(self, error: RequestError) -> None:
        self._send_json(
            error.status,
            {
                "error": {
                    "message": error.message,
                    "type": error.error_type,
                    "param": error.param,
                    "code": int(error.status),
                }
            },
        )

    def _authorized(self) -> bool:
        key = self.server.config.api_key
        if key is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "chunked request bodies are not supported")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, "invalid Content-Length") from None
        if length < 0 or length > self.server.config.max_body_bytes:
            # The body stays unread, so this connection cannot carry another request.
            self.close_connection = True
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body is too large")
        return self.rfile.read(length)

    # -- routes -----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        config = self.server.config
        if path == "/health":
            self._send_json(HTTPStatus.OK, {"status": "ok"})
        elif path == "/metrics":
            body = self.server.metrics.render(config.served_model_name).encode()
            self._send(HTTPStatus.OK, body, CONTENT_TYPE)
        elif path == "/version":
            self._send_json(HTTPStatus.OK, {"version": f"olmocr-cpu-engine ({self.server.ocr.version})"})
        elif path == "/v1/models":
            if not self._authorized():
                self._send_error(RequestError(HTTPStatus.UNAUTHORIZED, "Unauthorized", "AuthenticationError"))
                return
            model = config.served_model_name
            self._send_json(
                HTTPStatus.OK,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": model,
                            "object": "model",
                            "created": self.server.started,
                            "owned_by": "olmocr-cpu-engine",
                            "root": model,
                            "parent": None,
                            "max_model_len": MODEL_MAX_CONTEXT,
                        }
                    ],
                },
            )
        else:
            self._send_error(RequestError(HTTPStatus.NOT_FOUND, f"no route for GET {path}", "NotFoundError"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            body = self._read_body()
            if path != "/v1/chat/completions":
                raise RequestError(HTTPStatus.NOT_FOUND, f"no route for POST {path}", "NotFoundError")
            if not self._authorized():
                raise RequestError(HTTPStatus.UNAUTHORIZED, "Unauthorized", "AuthenticationError")
            try:
                payload = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise RequestError(HTTPStatus.BAD_REQUEST, "request body is not valid JSON") from None
            request = parse_chat_request(payload, self.server.config.served_model_name)
            self._send_json(HTTPStatus.OK, self._complete(request))
        except RequestError as error:
            self._send_error(error)

    def _complete(self, request: PageRequest) -> dict[str, Any]:
        server = self.server
        metrics = server.metrics
        with metrics.lock:
            metrics.waiting += 1
        server.slots.acquire()
        with metrics.lock:
            metrics.waiting -= 1
            metrics.running += 1
        started = time.monotonic()
        try:
            page = server.ocr.read_page(request.image, request.image_png)
        except Exception as exc:
            with metrics.lock:
                metrics.errors += 1
            logger.warning("Tesseract failed on a page: %s", exc)
            raise RequestError(
                HTTPStatus.INTERNAL_SERVER_ERROR, "OCR failed on this page", "InternalServerError"
            ) from exc
        finally:
            elapsed = time.monotonic() - started
            with metrics.lock:
                metrics.running -= 1
                metrics.page_seconds += elapsed
            server.slots.release()

        body = completion_body(request, page, server.config.lang)
        usage = body["usage"]
        with metrics.lock:
            metrics.success_by_reason[body["choices"][0]["finish_reason"]] += 1
            metrics.prompt_tokens += usage["prompt_tokens"]
            metrics.generation_tokens += usage["completion_tokens"]
        return body


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class CpuEngineHandle:
    """A bound engine: ``url`` is the OpenAI base URL (ends in ``/v1``).

    Either started on a thread (``start_cpu_engine_in_thread``; ``stop()`` shuts it down) or served
    on the caller's thread with ``serve()`` until ``request_stop()`` (the ``serve-cpu`` command).
    """

    def __init__(self, server: _EngineServer, thread: threading.Thread | None = None) -> None:
        self._server = server
        self._thread = thread
        address = server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self.base_url: str = f"http://{_url_host(self.host)}:{self.port}"
        self.url: str = self.base_url + "/v1"
        self.served_model_name: str = server.config.served_model_name

    def log_start(self) -> None:
        logger.info(
            "olmOCR CPU engine (%s, %d concurrent pages) serving %r at %s",
            self._server.ocr.version,
            self._server.config.max_concurrency,
            self.served_model_name,
            self.url,
        )

    def serve(self) -> int:
        """Serve on this thread until ``request_stop()``; returns the exit code (0)."""
        self.log_start()
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()
            self._server.ocr.kill_running()
        return 0

    def request_stop(self, signum: int | None = None) -> None:
        """Make ``serve()`` return; safe from a signal handler on the serving thread."""
        # shutdown() waits for serve_forever, which may run on this very thread: call it elsewhere.
        threading.Thread(target=self._server.shutdown, daemon=True).start()

    def stop(self, timeout: float = 10.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.ocr.kill_running()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> CpuEngineHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def create_cpu_engine(host: str = "127.0.0.1", port: int = 0, **kw: Any) -> _EngineServer:
    """Build and bind the engine without serving yet (wrap it in ``CpuEngineHandle`` to ``serve()``).
    ``kw`` are ``CpuEngineConfig`` fields. Raises ``TesseractNotFoundError`` when Tesseract is not
    installed, ``OSError`` when the address cannot be bound."""
    config = CpuEngineConfig(**kw)
    if config.max_concurrency < 1:
        raise ConfigurationError("max_concurrency must be at least 1")
    ocr = Tesseract(
        binary=config.tesseract_binary,
        lang=config.lang,
        detect_rotation=config.detect_rotation,
        osd_min_confidence=config.osd_min_confidence,
        timeout_s=config.page_timeout_s,
    )
    if not is_loopback_host(host):
        logger.warning(
            "the CPU engine listens on %s, reachable from other machines%s",
            host,
            "" if config.api_key else "; set --api-key-env to require a token",
        )
    return _EngineServer((host, port), config, ocr)


def start_cpu_engine_in_thread(host: str = "127.0.0.1", port: int = 0, **kw: Any) -> CpuEngineHandle:
    """Start the engine on a daemon thread (tests, demo). ``kw`` are ``CpuEngineConfig`` fields:
    ``served_model_name``, ``api_key``, ``max_concurrency``, ``tesseract_binary``, ``lang``,
    ``detect_rotation``, ``osd_min_confidence``, ``page_timeout_s``, ``max_body_bytes``.
    Raises ``TesseractNotFoundError`` when Tesseract is not installed."""
    server = create_cpu_engine(host, port, **kw)
    thread = threading.Thread(target=server.serve_forever, name="olmocr-cpu-engine", daemon=True)
    thread.start()
    handle = CpuEngineHandle(server, thread)
    handle.log_start()
    return handle
