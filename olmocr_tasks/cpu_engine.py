"""A local CPU OCR engine that speaks vLLM's OpenAI chat-completions protocol, backed by Tesseract.

``olmocr-tasks serve-cpu`` answers olmOCR page requests with olmOCR's front-matter format so the
DAGs, the CLI and the HTTP client cannot tell it from a vLLM server: only the connection URL
changes. It exists for the demo and for development without a GPU; its text is plain Tesseract
output, clearly below olmOCR's quality (no tables, equations or reading-order model).

The server uses only the standard library plus Pillow so the core package gains no heavy
dependency. Tesseract runs as a subprocess per page; a semaphore bounds how many run at once so a
burst of requests queues (visible as ``vllm:num_requests_waiting`` on ``/metrics``) instead of
oversubscribing the CPUs.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import io
import ipaddress
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

from olmocr_tasks.config import DEFAULT_MODEL
from olmocr_tasks.errors import ConfigurationError

logger = logging.getLogger(__name__)

INSTALL_HINT = "install the tesseract-ocr package: sudo apt-get install tesseract-ocr"
MODEL_MAX_CONTEXT = 16384
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_OSD_MIN_CONFIDENCE = 2.0

# Tesseract language codes the engine can report as olmOCR's ISO 639-1 primary_language.
_ISO_639_1 = {
    "eng": "en",
    "deu": "de",
    "fra": "fr",
    "spa": "es",
    "ita": "it",
    "por": "pt",
    "nld": "nl",
    "swe": "sv",
    "dan": "da",
    "nor": "no",
    "fin": "fi",
    "pol": "pl",
    "ces": "cs",
    "rus": "ru",
    "ukr": "uk",
    "tur": "tr",
    "ell": "el",
    "chi_sim": "zh",
    "chi_tra": "zh",
    "jpn": "ja",
    "kor": "ko",
    "ara": "ar",
    "heb": "he",
    "hin": "hi",
}

_LIST_ITEM = re.compile(r"^(?:[-*\u2022\u00b7\u25aa\u25cf\u2013]\s|\(?\d{1,3}[.)]\s|\(?[a-zA-Z][.)]\s)")


class TesseractNotFoundError(ConfigurationError):
    """The ``tesseract`` binary (or the requested language data) is not installed."""


class RequestError(Exception):
    """A client error answered with an OpenAI-shaped JSON error body."""

    def __init__(
        self, status: HTTPStatus, message: str, error_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param


@dataclass(frozen=True)
class CpuEngineConfig:
    """Everything that shapes one engine instance."""

    served_model_name: str = DEFAULT_MODEL
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


@dataclass(frozen=True)
class PageOcr:
    """Tesseract's reading of one page image."""

    text: str
    rotation_correction: int
    width: int
    height: int


# ---------------------------------------------------------------------------------------------------
# Tesseract


class Tesseract:
    """Runs the Tesseract binary; one instance is shared by all request threads."""

    def __init__(
        self,
        binary: str = "tesseract",
        lang: str = "eng",
        detect_rotation: bool = True,
        osd_min_confidence: float = DEFAULT_OSD_MIN_CONFIDENCE,
        timeout_s: float = 120.0,
    ) -> None:
        path = shutil.which(binary)
        if path is None:
            raise TesseractNotFoundError(f"the tesseract binary {binary!r} was not found; {INSTALL_HINT}")
        self.binary = path
        self.lang = lang
        self.timeout_s = timeout_s
        self.osd_min_confidence = osd_min_confidence
        # One thread per Tesseract process: its OpenMP default spins every core per process and
        # was ~8x slower per page on a 2-core machine; parallelism comes from our semaphore instead.
        self._env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
        self._children: set[subprocess.Popen[bytes]] = set()
        self._children_lock = threading.Lock()
        self.version = self._read_version()
        available = self._list_langs()
        missing = [code for code in lang.split("+") if code not in available]
        if missing:
            packages = " ".join("tesseract-ocr-" + code.replace("_", "-").lower() for code in missing)
            raise TesseractNotFoundError(
                f"Tesseract language data {'+'.join(missing)!r} is missing: sudo apt-get install {packages}"
            )
        self.osd_available = "osd" in available
        self.detect_rotation = detect_rotation and self.osd_available
        if detect_rotation and not self.osd_available:
            logger.warning("Tesseract OSD data is missing; every page will be reported upright")

    def _read_version(self) -> str:
        proc = subprocess.run([self.binary, "--version"], capture_output=True, timeout=30, env=self._env)
        first = (proc.stdout or proc.stderr).decode("utf-8", "replace").strip().splitlines()
        return first[0] if first else "tesseract"

    def _list_langs(self) -> set[str]:
        proc = subprocess.run([self.binary, "--list-langs"], capture_output=True, timeout=30, env=self._env)
        lines = (proc.stdout + proc.stderr).decode("utf-8", "replace").splitlines()
        return {line.strip() for line in lines if line.strip() and not line.startswith("List of")}

    def _run(self, args: list[str], image_png: bytes) -> subprocess.CompletedProcess[bytes]:
        # Popen instead of subprocess.run so stop() can kill pages still running at shutdown.
        proc = subprocess.Popen(
            [self.binary, "-", "stdout", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
        )
        with self._children_lock:
            self._children.add(proc)
        try:
            stdout, stderr = proc.communicate(image_png, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        finally:
            with self._children_lock:
                self._children.discard(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def kill_running(self) -> None:
        with self._children_lock:
            children = list(self._children)
        for proc in children:
            proc.kill()

    def rotation_correction(self, image_png: bytes) -> int:
        """olmOCR's rotation_correction for the image: 0 when upright or when OSD cannot tell."""
        if not self.detect_rotation:
            return 0
        proc = self._run(["--psm", "0"], image_png)
        if proc.returncode != 0:
            return 0  # "Too few characters": nothing to orient by
        return parse_osd(proc.stdout.decode("utf-8", "replace"), self.osd_min_confidence)

    def recognize(self, image_png: bytes) -> str:
        proc = self._run(["-l", self.lang, "--psm", "3"], image_png)
        if proc.returncode != 0:
            detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError(f"tesseract failed with exit code {proc.returncode}: {detail[-1:]}")
        return proc.stdout.decode("utf-8", "replace")

    def read_page(self, image: Image.Image, image_png: bytes) -> PageOcr:
        correction = self.rotation_correction(image_png)
        if correction:
            # Read the text upright so the answer is useful even if the client ends up accepting it.
            upright = image.transpose(_TRANSPOSE[correction])
            buffer = io.BytesIO()
            upright.save(buffer, format="PNG", compress_level=1)
            image_png = buffer.getvalue()
        text = tidy_text(self.recognize(image_png))
        return PageOcr(text=text, rotation_correction=correction, width=image.width, height=image.height)


_TRANSPOSE = {
    90: Image.Transpose.ROTATE_90,
    180: Image.Transpose.ROTATE_180,
    270: Image.Transpose.ROTATE_270,
}


def parse_osd(output: str, min_confidence: float = DEFAULT_OSD_MIN_CONFIDENCE) -> int:
    """Turn ``tesseract --psm 0`` output into olmOCR's rotation_correction.

    Tesseract's ``Rotate: R`` is the clockwise turn that makes the page upright; olmOCR's value is
    the PIL ``Transpose.ROTATE_*`` (counter-clockwise) that does the same, hence ``(360 - R) % 360``.
    """
    rotate = re.search(r"^Rotate:\s*(\d+)", output, re.MULTILINE)
    confidence = re.search(r"^Orientation confidence:\s*([0-9.]+)", output, re.MULTILINE)
    if rotate is None:
        return 0
    if confidence is not None and float(confidence.group(1)) < min_confidence:
        return 0
    correction = (360 - int(rotate.group(1))) % 360
    return correction if correction in (0, 90, 180, 270) else 0


def tidy_text(raw: str) -> str:
    """Tesseract's lines to markdown paragraphs.

    Tesseract breaks at every printed line; olmOCR answers with one line per paragraph, so lines of a
    paragraph are joined (list items keep their own line) and words hyphenated across a line break are
    rejoined (a compound such as state-of-the-art keeps its hyphens).
    """
    text = raw.replace("\r\n", "\n").replace("\f", "\n")
    paragraphs: list[str] = []
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [re.sub(r"[ \t]+", " ", line).strip() for line in block.split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            continue
        out = lines[0]
        for line in lines[1:]:
            if _LIST_ITEM.match(line):
                out += "\n" + line
                continue
            last_word = out.rsplit(None, 1)[-1] if out.strip() else ""
            if len(last_word) > 2 and last_word.endswith("-") and last_word[-2].isalpha() and line[0].islower():
                # "exam-" + "ple" is one word; "state-of-the-" + "art" keeps its hyphens.
                out = (out[:-1] if last_word.count("-") == 1 else out) + line
            else:
                out += " " + line
        paragraphs.append(out)
    return "\n\n".join(paragraphs)


def primary_language(text: str, lang: str) -> str | None:
    if not any(ch.isalpha() for ch in text):
        return None
    return _ISO_639_1.get(lang.split("+")[0])


def format_answer(page: PageOcr, lang: str) -> str:
    """olmOCR's answer: YAML front matter with the five keys in training order, then the text."""
    language = primary_language(page.text, lang)
    front = (
        "---\n"
        f"primary_language: {language if language else 'null'}\n"
        f"is_rotation_valid: {page.rotation_correction == 0}\n"
        f"rotation_correction: {page.rotation_correction}\n"
        "is_table: False\n"
        "is_diagram: False\n"
        "---\n"
    )
    return front + page.text


def estimate_prompt_tokens(prompt_text: str, width: int, height: int) -> int:
    """Roughly what Qwen2.5-VL would count: 28x28-pixel patches for the image plus ~4 chars a token."""
    image_tokens = max(1, round(width / 28)) * max(1, round(height / 28))
    return image_tokens + math.ceil(len(prompt_text) / 4) + 20


# ---------------------------------------------------------------------------------------------------
# Request parsing


@dataclass(frozen=True)
class PageRequest:
    model: str
    prompt_text: str
    image: Image.Image
    image_png: bytes
    max_tokens: int | None


def parse_chat_request(payload: Any, served_model_name: str) -> PageRequest:
    """Validate an olmOCR-shaped chat completion request; raises ``RequestError`` with 400/404."""
    if not isinstance(payload, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'model' must be a non-empty string", param="model")
    if model != served_model_name:
        raise RequestError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", "NotFoundError", param="model")
    if payload.get("stream"):
        raise RequestError(HTTPStatus.BAD_REQUEST, "streaming is not supported by the CPU engine", param="stream")
    n = payload.get("n", 1)
    if n not in (None, 1):
        raise RequestError(HTTPStatus.BAD_REQUEST, "only n=1 is supported", param="n")
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(HTTPStatus.BAD_REQUEST, "'max_tokens' must be a positive integer", param="max_tokens")
    temperature = payload.get("temperature", 0.0)
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)):
        raise RequestError(HTTPStatus.BAD_REQUEST, "'temperature' must be a number", param="temperature")

    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(HTTPStatus.BAD_REQUEST, "'messages' must be a non-empty list", param="messages")
    texts: list[str] = []
    image_urls: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(HTTPStatus.BAD_REQUEST, "each message needs a 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, "message content must be a string or a list of parts")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image_url":
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, dict) else image_url
                if not isinstance(url, str):
                    raise RequestError(HTTPStatus.BAD_REQUEST, "image_url part without a url")
                image_urls.append(url)
            else:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"unsupported content part type {kind!r}")
    if len(image_urls) != 1:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"exactly one image per request is supported, got {len(image_urls)}")
    image, image_png = _decode_image_url(image_urls[0])
    return PageRequest(
        model=model, prompt_text="\n".join(texts), image=image, image_png=image_png, max_tokens=max_tokens
    )


def _decode_image_url(url: str) -> tuple[Image.Image, bytes]:
    # Only inline data URLs: fetching remote URLs would turn the engine into an SSRF proxy.
    match = re.match(r"data:image/[A-Za-z0-9.+-]+;base64,", url)
    if match is None:
        raise RequestError(HTTPStatus.BAD_REQUEST, "image_url must be a data:image/...;base64, URL")
    try:
        data = base64.b64decode(url[match.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(HTTPStatus.BAD_REQUEST, "image data is not valid base64") from None
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Image.DecompressionBombError:
        raise RequestError(HTTPStatus.BAD_REQUEST, "image is too large") from None
    except Exception:
        raise RequestError(HTTPStatus.BAD_REQUEST, "image could not be decoded") from None
    if image.format != "PNG":
        # Tesseract reads PNG from stdin reliably; re-encode anything else once.
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG", compress_level=1)
        data = buffer.getvalue()
    return image, data


# ---------------------------------------------------------------------------------------------------
# Server


class _Metrics:
    """Counters published in vLLM's metric names so the adaptive client can read them unchanged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.success = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.page_seconds = 0.0

    def render(self, model: str) -> str:
        label = '{model_name="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'
        with self.lock:
            rows = [
                ("vllm:num_requests_running", "gauge", "Pages being read by Tesseract.", self.running),
                ("vllm:num_requests_waiting", "gauge", "Pages waiting for a Tesseract slot.", self.waiting),
                ("vllm:request_success_total", "counter", "Completed requests.", self.success),
                ("vllm:prompt_tokens_total", "counter", "Estimated prompt tokens.", self.prompt_tokens),
                ("vllm:generation_tokens_total", "counter", "Estimated generated tokens.", self.generation_tokens),
                ("olmocr_cpu_engine_errors_total", "counter", "Pages Tesseract failed on.", self.errors),
                ("olmocr_cpu_engine_page_seconds_total", "counter", "Seconds spent in Tesseract.", self.page_seconds),
            ]
        lines: list[str] = []
        for name, kind, help_text, value in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{label} {float(value)}"]
        return "\n".join(lines) + "\n"


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
            self._send(HTTPStatus.OK, body, "text/plain; version=0.0.4; charset=utf-8")
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

        content = format_answer(page, server.config.lang)
        finish_reason = "stop"
        completion_tokens = max(1, math.ceil(len(content) / 4))
        if request.max_tokens is not None and completion_tokens > request.max_tokens:
            # Behave like vLLM running out of budget: cut the answer and say so.
            content = content[: request.max_tokens * 4]
            completion_tokens = request.max_tokens
            finish_reason = "length"
        prompt_tokens = estimate_prompt_tokens(request.prompt_text, page.width, page.height)
        with metrics.lock:
            metrics.success += 1
            metrics.prompt_tokens += prompt_tokens
            metrics.generation_tokens += completion_tokens
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


# ---------------------------------------------------------------------------------------------------
# Public API


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
    """A running engine: ``url`` is the OpenAI base URL (ends in ``/v1``); ``stop()`` shuts it down."""

    def __init__(self, server: _EngineServer, thread: threading.Thread | None) -> None:
        self._server = server
        self._thread = thread
        address = server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self.base_url: str = f"http://{_url_host(self.host)}:{self.port}"
        self.url: str = self.base_url + "/v1"
        self.served_model_name: str = server.config.served_model_name

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
    """Build (and bind) the engine server without serving yet. ``kw`` are ``CpuEngineConfig`` fields."""
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


def _log_start(handle: CpuEngineHandle, server: _EngineServer) -> None:
    logger.info(
        "olmOCR CPU engine (%s, %d concurrent pages) serving %r at %s",
        server.ocr.version,
        server.config.max_concurrency,
        handle.served_model_name,
        handle.url,
    )


def start_cpu_engine_in_thread(host: str = "127.0.0.1", port: int = 0, **kw: Any) -> CpuEngineHandle:
    """Start the engine on a daemon thread (tests, demo). ``kw`` are ``CpuEngineConfig`` fields:
    ``served_model_name``, ``api_key``, ``max_concurrency``, ``tesseract_binary``, ``lang``,
    ``detect_rotation``, ``osd_min_confidence``, ``page_timeout_s``, ``max_body_bytes``.
    Raises ``TesseractNotFoundError`` when Tesseract is not installed."""
    server = create_cpu_engine(host, port, **kw)
    thread = threading.Thread(target=server.serve_forever, name="olmocr-cpu-engine", daemon=True)
    thread.start()
    handle = CpuEngineHandle(server, thread)
    _log_start(handle, server)
    return handle


# ---------------------------------------------------------------------------------------------------
# CLI


def add_serve_cpu_parser(subparsers: Any) -> None:
    """Register ``serve-cpu`` on an ``argparse`` subparsers object; ``args.func(args)`` returns the exit code."""
    parser = subparsers.add_parser(
        "serve-cpu",
        help="serve olmOCR's protocol on the CPU with Tesseract (demo / no GPU; lower quality)",
        description=(
            "Run an OpenAI-compatible server that answers olmOCR page requests with Tesseract OCR. "
            "Point the olmocr_vllm connection (or --server) at the printed URL."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks one)")
    parser.add_argument(
        "--served-model-name", default=DEFAULT_MODEL, help=f"model name to answer to (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--api-key-env", metavar="VAR", help="require 'Authorization: Bearer <value of $VAR>' on /v1 routes"
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=os.cpu_count() or 1,
        help="Tesseract processes at once; further requests wait (default: CPU count)",
    )
    parser.add_argument(
        "--tesseract",
        dest="tesseract_binary",
        default="tesseract",
        help="tesseract binary (default: tesseract on PATH)",
    )
    parser.add_argument("--lang", default="eng", help="Tesseract language(s), e.g. eng or eng+deu (default eng)")
    parser.add_argument(
        "--no-rotation",
        dest="detect_rotation",
        action="store_false",
        help="skip orientation detection (report every page upright)",
    )
    parser.add_argument(
        "--osd-min-confidence",
        type=float,
        default=DEFAULT_OSD_MIN_CONFIDENCE,
        help="minimum Tesseract OSD confidence to report a page as rotated",
    )
    parser.add_argument(
        "--page-timeout",
        dest="page_timeout_s",
        type=float,
        default=120.0,
        help="seconds before a Tesseract run is killed (default 120)",
    )
    parser.set_defaults(func=run_serve_cpu)


def _ensure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_serve_cpu(args: argparse.Namespace) -> int:
    """Handler of ``serve-cpu``: serve until SIGTERM/SIGINT, then return the exit code."""
    _ensure_logging()
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(
                f"error: --api-key-env {args.api_key_env}: that environment variable is empty or unset", file=sys.stderr
            )
            return 2
    try:
        server = create_cpu_engine(
            args.host,
            args.port,
            served_model_name=args.served_model_name,
            api_key=api_key,
            max_concurrency=args.max_concurrency,
            tesseract_binary=args.tesseract_binary,
            lang=args.lang,
            detect_rotation=args.detect_rotation,
            osd_min_confidence=args.osd_min_confidence,
            page_timeout_s=args.page_timeout_s,
        )
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1

    handle = CpuEngineHandle(server, None)

    def _stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever, which runs on this (the main) thread: call it elsewhere.
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    _log_start(handle, server)
    try:
        server.serve_forever()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        server.server_close()
        server.ocr.kill_running()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m olmocr_tasks.cpu_engine serve-cpu ...`` (the same subcommand as ``olmocr-tasks``)."""
    parser = argparse.ArgumentParser(prog="python -m olmocr_tasks.cpu_engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_serve_cpu_parser(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
