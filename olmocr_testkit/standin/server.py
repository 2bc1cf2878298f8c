"""A vLLM stand-in speaking olmOCR's page protocol over real HTTP on 127.0.0.1.

It answers ``POST /v1/chat/completions`` the way a vLLM server running an olmOCR model would, but
with text that names the document and page it actually saw (read from the page identity marker), so
tests can prove no page is ever attributed to the wrong document. Around that it models what makes
a real server hard to talk to: a bounded number of running requests with a waiting queue served in
arrival order, or by the request's ``priority`` under ``scheduling_policy="priority"`` as vLLM does,
``/metrics`` gauges, and injectable faults and outages that behave at the socket level.

Two ways to run it:

* ``StandinServer``: in-process, on a background thread with its own event loop (fixtures).
* ``python -m olmocr_testkit.standin``: a separate process (benchmarks), see ``__main__.py`` here.

All mutable state lives on the server's event loop; the thread wrapper marshals every call onto it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hashlib
import heapq
import io
import itertools
import json
import logging
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from PIL import Image, UnidentifiedImageError

from olmocr_tasks.core.config import DEFAULT_MODEL
from olmocr_tasks.inference.guided import STRUCTURED_OUTPUTS, field_for_version
from olmocr_tasks.inference.vllm_metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from olmocr_tasks.inference.vllm_metrics import ServerMetrics, render_vllm_metrics
from olmocr_tasks.page.protocol import PROMPT_V4, format_front_matter
from olmocr_testkit.page_marker import Marker, read_marker

log = logging.getLogger("olmocr_testkit.standin")

# Faults answered before the request reaches the scheduler: a proxy or an overloaded front end
# rejects them at once, so they never occupy a running slot.
IMMEDIATE_FAULTS = frozenset({"500", "503", "429", "hang", "drop"})
# Faults shaped like model output: they queue and run like a normal generation.
MODEL_FAULTS = frozenset({"garbage", "length", "invalid_rotation", "bad_json", "slow", "overlong"})
FAULTS = IMMEDIATE_FAULTS | MODEL_FAULTS
# "ok" lets a script say "answer normally this time" between faults.
SCRIPT_STEPS = FAULTS | {"ok"}

OUTAGE_MODES = ("refuse", "stall")
CHAT_PATH = "/v1/chat/completions"
DATA_URL_PREFIX = "data:image/png;base64,"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Qwen2.5-VL turns each 28x28 pixel patch into one visual token, after its image processor scaled a
# larger image down to this many pixels (its preprocessor_config's max_pixels, which olmOCR's model keeps).
PIXELS_PER_TOKEN = 28 * 28
MAX_IMAGE_PIXELS = 12_845_056
PROMPT_TEXT_TOKENS = 150
# Prompt text beyond olmOCR's own costs a token per this many characters (English in a BPE tokenizer).
CHARS_PER_TOKEN = 4
# In identify=False mode only this much of the base64 text at each end is hashed.
DIGEST_SPAN = 4096
_PAGE_KEY = re.compile(r"^\d+:\d+$")


@dataclass
class StandinConfig:
    """Everything that shapes the stand-in's answers; all of it can be changed while it runs."""

    model: str = DEFAULT_MODEL
    api_key: str | None = None
    latency_s: float = 0.0
    jitter_s: float = 0.0
    capacity: int = 16
    identify: bool = True
    metrics: bool = True
    seed: int = 0
    # Per-fault probabilities, drawn once per request; their sum must not exceed 1.
    fault_rates: dict[str, float] = field(default_factory=dict)
    # "doc:page" -> faults for that page's successive requests, then normal answers.
    scripts: dict[str, list[str]] = field(default_factory=dict)
    # "doc:page" -> the fault every request for that page gets.
    always: dict[str, str] = field(default_factory=dict)
    slow_s: float = 30.0
    retry_after_s: int = 1
    max_model_len: int = 16384
    # vLLM's --scheduling-policy: "fcfs" serves in arrival order and ignores a request's "priority"
    # (accepted, as vLLM 0.32 does); "priority" serves the waiting queue lowest value first.
    scheduling_policy: str = "fcfs"
    # What GET /version reports (empty: 404, as a server that is not vLLM): clients choose the
    # guided-decoding field by it, and the stand-in honours only the field its version reads, as vLLM.
    vllm_version: str = "0.32.0"
    keep_bodies: int = 5
    log_limit: int = 100_000
    primary_language: str = "en"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def merged(self, patch: dict[str, Any]) -> StandinConfig:
        """A JSON merge patch (RFC 7386 style): mappings merge key by key, ``None`` deletes a key."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(patch) - known)
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        values = self.to_dict()
        for key, value in patch.items():
            if isinstance(values[key], dict) and isinstance(value, dict):
                merged = dict(values[key])
                for sub_key, sub_value in value.items():
                    if sub_value is None:
                        merged.pop(str(sub_key), None)
                    else:
                        merged[str(sub_key)] = sub_value
                values[key] = merged
            else:
                values[key] = value
        config = StandinConfig(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string")
        if self.capacity < 1:
            raise ValueError("capacity must be at least 1")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be fcfs or priority")
        if self.latency_s < 0 or self.jitter_s < 0 or self.slow_s < 0:
            raise ValueError("latency_s, jitter_s and slow_s must not be negative")
        if not isinstance(self.fault_rates, dict):
            raise ValueError("fault_rates must be a mapping of fault name to probability")
        for name, rate in self.fault_rates.items():
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
            if not 0 <= float(rate) <= 1:
                raise ValueError(f"rate of {name!r} must be within 0..1")
        if sum(float(rate) for rate in self.fault_rates.values()) > 1 + 1e-9:
            raise ValueError("fault rates add up to more than 1")
        if not isinstance(self.scripts, dict) or not isinstance(self.always, dict):
            raise ValueError("scripts and always must be mappings keyed by 'doc_id:page_number'")
        for key, steps in self.scripts.items():
            _check_page_key(key)
            if not isinstance(steps, list) or any(step not in SCRIPT_STEPS for step in steps):
                raise ValueError(f"script for {key} must be a list of: {', '.join(sorted(SCRIPT_STEPS))}")
        for key, fault in self.always.items():
            _check_page_key(key)
            if fault not in FAULTS:
                raise ValueError(f"always[{key}] must be one of: {', '.join(sorted(FAULTS))}")


def _check_page_key(key: str) -> None:
    if not _PAGE_KEY.match(key):
        raise ValueError(f"page key {key!r} must look like 'doc_id:page_number'")


class _Scheduler:
    """At most ``capacity`` requests run; the rest wait, like vLLM's scheduler: in arrival order under
    ``fcfs``, and under ``priority`` by the request's ``priority`` (lower first), then arrival. Running
    requests are never preempted."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.max_running = 0
        self.max_waiting = 0
        self._arrivals = itertools.count()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, waiter in self._waiters if not waiter.done())

    async def acquire(self, priority: int = 0) -> None:
        if self.running < self.capacity and self.waiting == 0:
            self._grant()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), waiter))
        self._wake()
        self.max_waiting = max(self.max_waiting, self.waiting)
        try:
            await waiter
        except asyncio.CancelledError:
            # The client went away while queued (vLLM aborts such requests too). If the slot had
            # already been granted, hand it on instead of leaking it; a queued one is dropped lazily.
            if waiter.done() and not waiter.cancelled():
                self.release()
            else:
                waiter.cancel()
                self._wake()
            raise

    def release(self) -> None:
        self.running -= 1
        self._wake()

    def set_capacity(self, capacity: int) -> None:
        self.capacity = capacity
        self._wake()

    def reset_peaks(self) -> None:
        self.max_running = self.running
        self.max_waiting = self.waiting

    def _grant(self) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)

    def _wake(self) -> None:
        while self._waiters and (self.running < self.capacity or self._waiters[0][2].done()):
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                self._grant()
                waiter.set_result(None)


class _BadRequest(Exception):
    def __init__(
        self, status: int, message: str, error_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.param = param


def _error_body(status: int, message: str, error_type: str, param: str | None = None) -> dict[str, Any]:
    # vLLM's current OpenAI-compatible error shape (tests/vllm/test_contract.py compares them).
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def _json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(payload).encode(), status=status, content_type="application/json", headers=headers
    )


def _extract_image(payload: Any) -> tuple[str, int, int]:
    """Check the body has olmOCR's shape; return the base64 image, max_tokens and the prompt's text length."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest(400, "messages must be a non-empty list")
    first = messages[0]
    if not isinstance(first, dict) or first.get("role") != "user":
        raise _BadRequest(400, "messages[0] must be a user message")
    content = first.get("content")
    if not isinstance(content, list) or len(content) != 2:
        raise _BadRequest(400, "messages[0].content must be [text, image_url]")
    text_part, image_part = content
    if not isinstance(text_part, dict) or text_part.get("type") != "text":
        raise _BadRequest(400, "the first content part must be text")
    if not isinstance(text_part.get("text"), str):
        raise _BadRequest(400, "the text part must carry a string")
    if not isinstance(image_part, dict) or image_part.get("type") != "image_url":
        raise _BadRequest(400, "the second content part must be an image_url")
    image_url = image_part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else None
    if not isinstance(url, str) or not url.startswith(DATA_URL_PREFIX):
        raise _BadRequest(400, "image_url.url must be a data:image/png;base64 URL")
    max_tokens = payload.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _BadRequest(400, "max_tokens must be a positive integer")
    temperature = payload.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise _BadRequest(400, "temperature must be a number within 0..2")
    structured = payload.get("structured_outputs")
    if isinstance(structured, dict) and "regex" in structured:
        try:
            re.compile(str(structured["regex"]))
        except re.error as exc:
            raise _BadRequest(400, f"Grammar error: invalid regex {structured['regex']!r}: {exc}") from None
    return url[len(DATA_URL_PREFIX) :], max_tokens, len(text_part["text"])


def _honoured_constraint(payload: dict[str, Any], version: str) -> str | None:
    """The guided-decoding field of the request that this server's vLLM version would apply, if any."""
    try:
        field_read = field_for_version(version)
    except ValueError:
        return None
    value = payload.get(field_read)
    if field_read == STRUCTURED_OUTPUTS:
        return field_read if isinstance(value, dict) and "regex" in value else None
    return field_read if isinstance(value, str) else None


def _png_size_from_base64(b64: str) -> tuple[int, int]:
    """Width and height from the PNG header alone: 32 base64 characters hold the first 24 bytes."""
    try:
        head = base64.b64decode(b64[:32], validate=True)
    except (binascii.Error, ValueError):
        raise _BadRequest(400, "image is not valid base64") from None
    if len(head) < 24 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        raise _BadRequest(400, "image is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _identify(b64: str) -> tuple[str, Marker | None, tuple[int, int]]:
    """Decode the page image: its sha1, its identity marker (if any) and its size."""
    try:
        png = base64.b64decode(b64, validate=True)
        image = Image.open(io.BytesIO(png))
        if image.format != "PNG":
            raise _BadRequest(400, "image is not a PNG")
        marker = read_marker(image)
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError):
        raise _BadRequest(400, "image could not be decoded") from None
    return hashlib.sha1(png).hexdigest(), marker, image.size


def _marker_dict(marker: Marker | None) -> dict[str, int] | None:
    return dataclasses.asdict(marker) if marker is not None else None


class VllmStandin:
    """The stand-in itself. Create and drive it from one event loop (see ``StandinServer``)."""

    def __init__(self, config: StandinConfig | None = None, **overrides: Any) -> None:
        base = config or StandinConfig()
        self._initial = base.merged(overrides) if overrides else base.merged({})
        self.config = self._initial
        self.host = "127.0.0.1"
        self.port = 0
        self.control_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._control_listener: asyncio.AbstractServer | None = None
        self._scheduler = _Scheduler(self.config.capacity)
        # Set while serving; cleared during a stall so every data-plane handler parks on it.
        self._gate: asyncio.Event | None = None
        # Set (and replaced) when ``slow_s`` changes, so "slow" pages in service see the new value.
        self._slow_changed: asyncio.Event | None = None
        self._busy: Counter[Any] = Counter()
        self._outage: dict[str, Any] | None = None
        self._outage_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._reset_state()

    # ----- lifecycle -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def control_url(self) -> str:
        port = self.control_port if self.control_port is not None else self.port
        return f"http://{self.host}:{port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0, control_port: int | None = None) -> None:
        """Listen on ``host:port`` (0 picks a free port). ``control_port`` opens a second listener
        that serves the control API and stays up during a ``refuse`` outage."""
        self.host = host
        self._gate = asyncio.Event()
        self._gate.set()
        self._slow_changed = asyncio.Event()
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._track_busy])
        app.add_routes(
            [
                web.get("/v1/models", self._models),
                web.post(CHAT_PATH, self._chat),
                web.get("/metrics", self._metrics),
                web.get("/health", self._health),
                web.get("/version", self._version),
                web.get("/_control/config", self._control_get_config),
                web.post("/_control/config", self._control_config),
                web.post("/_control/reset", self._control_reset),
                web.get("/_control/stats", self._control_stats),
                web.get("/_control/requests", self._control_requests),
                web.get("/_control/bodies/{index}", self._control_body),
                web.post("/_control/outage", self._control_outage),
                web.post("/_control/resume", self._control_resume),
            ]
        )
        # handler_cancellation: a client that gives up cancels its handler, which is how hung and
        # queued requests learn they are gone (vLLM aborts disconnected requests the same way).
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        self._listener = await self._listen(port)
        self.port = self._listener.sockets[0].getsockname()[1]
        if control_port is not None:
            loop = asyncio.get_running_loop()
            sock = _bound_socket(host, control_port)
            self._control_listener = await loop.create_server(self._runner.server, sock=sock)
            self.control_port = sock.getsockname()[1]

    async def close(self) -> None:
        self._closing = True
        self._cancel_outage_timer()
        for listener in (self._listener, self._control_listener):
            if listener is not None:
                listener.close()
        self._listener = self._control_listener = None
        if self._runner is not None:
            # Hung and stalled requests would otherwise hold shutdown for the full timeout.
            for conn in self._runner.server.connections if self._runner.server else ():
                conn.force_close()
            await self._runner.cleanup()
            self._runner = None

    async def _listen(self, port: int) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + 5.0
        while True:
            try:
                sock = _bound_socket(self.host, port)
                break
            except OSError:
                # Re-listening after a refuse window: the port can be briefly taken by an outgoing
                # connection that the kernel gave the freed ephemeral port to.
                if port == 0 or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        assert self._runner is not None and self._runner.server is not None
        return await loop.create_server(self._runner.server, sock=sock)

    def _main_connections(self) -> list[Any]:
        """Open connections accepted on the data-plane port (not the control listener)."""
        if self._runner is None or self._runner.server is None:
            return []
        found = []
        for protocol in self._runner.server.connections:
            transport = protocol.transport
            sockname = transport.get_extra_info("sockname") if transport is not None else None
            if sockname is not None and sockname[1] == self.port:
                found.append(protocol)
        return found

    # ----- state ------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        self._seq = 0
        self._records: deque[dict[str, Any]] = deque(maxlen=self.config.log_limit)
        self._bodies: list[bytes] = []
        self._outcomes: Counter[str] = Counter()
        self._statuses: Counter[str] = Counter()
        self._endpoint_hits: Counter[str] = Counter()
        self._finish_reasons: Counter[str] = Counter()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._script_progress: dict[str, int] = {}
        self._fault_rng = random.Random(self.config.seed)
        self._jitter_rng = random.Random(self.config.seed + 1)
        self._scheduler.reset_peaks()
        self._started_at = time.time()

    def configure(self, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge ``patch`` into the live config; returns the new config."""
        new = self.config.merged(patch)
        old = self.config
        self.config = new
        if new.capacity != old.capacity:
            self._scheduler.set_capacity(new.capacity)
        if new.seed != old.seed:
            self._fault_rng = random.Random(new.seed)
            self._jitter_rng = random.Random(new.seed + 1)
        if new.log_limit != old.log_limit:
            self._records = deque(self._records, maxlen=new.log_limit)
        if new.slow_s != old.slow_s and self._slow_changed is not None:
            self._slow_changed.set()
            self._slow_changed = asyncio.Event()
        # A page whose script is (re)set starts from its first step again.
        for key in patch.get("scripts") or {}:
            self._script_progress.pop(str(key), None)
        return new.to_dict()

    async def reset(self, keep_config: bool = False) -> None:
        """Forget requests, counters and script progress, end any outage, and (unless
        ``keep_config``) return to the configuration the server started with."""
        await self.resume()
        if not keep_config:
            self.config = self._initial
            self._scheduler.set_capacity(self.config.capacity)
        self._reset_state()

    def stats(self) -> dict[str, Any]:
        return {
            "total": self._seq,
            "by_outcome": dict(self._outcomes),
            "by_status": dict(self._statuses),
            "completed": self._outcomes.get("ok", 0),
            "running": self._scheduler.running,
            "waiting": self._scheduler.waiting,
            "max_running": self._scheduler.max_running,
            "max_waiting": self._scheduler.max_waiting,
            "endpoint_hits": dict(self._endpoint_hits),
            "prompt_tokens": self._prompt_tokens,
            "generation_tokens": self._generation_tokens,
            "scripts_remaining": {
                key: steps[self._script_progress.get(key, 0) :] for key, steps in self.config.scripts.items()
            },
            "outage": dict(self._outage) if self._outage else None,
            "port": self.port,
            "since": self._started_at,
        }

    def requests(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Request records with ``seq >= since`` (copies, so callers cannot disturb the log)."""
        selected = [dict(record) for record in self._records if record["seq"] >= since]
        return selected[:limit] if limit is not None else selected

    def bodies(self) -> list[bytes]:
        return list(self._bodies)

    # ----- outages ----------------------------------------------------------------------------

    async def refuse(self, seconds: float | None = None, drop_inflight: bool = False) -> None:
        """Stop listening so new connections are refused; re-listen on the same port after
        ``seconds`` (or on ``resume``). Kept-alive idle connections are closed too, as a server
        going down would; in-flight requests finish unless ``drop_inflight``."""
        await self.resume()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for protocol in self._main_connections():
            if drop_inflight or protocol not in self._busy:
                protocol.force_close()
            else:
                # Closes the connection once its current response has been sent.
                protocol.close()
        # Transports close in a loop callback; let it run so that, once this returns, no client can
        # still slip a request onto a kept-alive connection that is about to vanish.
        await asyncio.sleep(0)
        self._begin_outage("refuse", seconds)

    def stall(self, seconds: float | None = None) -> None:
        """Keep accepting connections and reading requests but answer nothing (in-flight requests
        included) until ``seconds`` pass or ``resume``; then everything proceeds, like a frozen
        process that is continued."""
        if self._outage is not None and self._outage["mode"] == "refuse":
            raise RuntimeError("resume the refuse outage before stalling")
        assert self._gate is not None
        self._gate.clear()
        self._begin_outage("stall", seconds)

    async def resume(self) -> None:
        self._cancel_outage_timer()
        outage, self._outage = self._outage, None
        if outage is None or self._closing:
            return
        if outage["mode"] == "stall":
            assert self._gate is not None
            self._gate.set()
        elif self._listener is None:
            try:
                self._listener = await self._listen(self.port)
            except OSError as exc:
                # Stay visibly down rather than pretend to serve; stats show why.
                log.error("stand-in could not listen on port %s again: %s", self.port, exc)
                self._outage = {**outage, "until": None, "error": str(exc)}

    def _begin_outage(self, mode: str, seconds: float | None) -> None:
        now = time.time()
        self._outage = {"mode": mode, "since": now, "until": None if seconds is None else now + seconds}
        if seconds is not None:
            loop = asyncio.get_running_loop()
            self._outage_timer = loop.call_later(seconds, lambda: loop.create_task(self.resume()))

    def _cancel_outage_timer(self) -> None:
        if self._outage_timer is not None:
            self._outage_timer.cancel()
            self._outage_timer = None

    # ----- data plane -------------------------------------------------------------------------

    @web.middleware
    async def _track_busy(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # Which connections are mid-request, so a refuse outage can close idle kept-alive ones at
        # once (a client would otherwise reuse them and never see the outage).
        protocol = request.protocol
        self._busy[protocol] += 1
        try:
            return await handler(request)
        finally:
            self._busy[protocol] -= 1
            if self._busy[protocol] <= 0:
                del self._busy[protocol]

    def _authorized(self, request: web.Request) -> bool:
        key = self.config.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def _wait_gate(self) -> None:
        assert self._gate is not None
        if not self._gate.is_set():
            await self._gate.wait()

    async def _health(self, request: web.Request) -> web.Response:
        self._endpoint_hits[request.path] += 1
        await self._wait_gate()
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        self._endpoint_hits[request.path] += 1
        await self._wait_gate()
        if not self.config.vllm_version:
            raise web.HTTPNotFound()
        return _json_response({"version": self.config.vllm_version})

    async def _models(self, request: web.Request) -> web.Response:
        self._endpoint_hits[request.path] += 1
        await self._wait_gate()
        if not self._authorized(request):
            return _json_response({"error": "Unauthorized"}, status=401)
        card = {
            "id": self.config.model,
            "object": "model",
            "created": int(self._started_at),
            "owned_by": "standin",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.max_model_len,
        }
        return _json_response({"object": "list", "data": [card]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self._endpoint_hits[request.path] += 1
        await self._wait_gate()
        if not self.config.metrics:
            raise web.HTTPNotFound()
        state = ServerMetrics(
            model=self.config.model,
            running=self._scheduler.running,
            waiting=self._scheduler.waiting,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            success_by_reason=dict(self._finish_reasons),
        )
        return web.Response(body=render_vllm_metrics(state).encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        config = self.config
        record: dict[str, Any] = {
            "seq": self._seq,
            "arrival": time.time(),
            "model": None,
            "temperature": None,
            "max_tokens": None,
            "priority": 0,
            "guided": None,
            "keys": None,
            "marker": None,
            "image_sha1": None,
            "image_size": None,
            "body_bytes": len(body),
            "body_index": None,
            "fault": None,
            "outcome": None,
            "status": None,
            "finish_reason": None,
            "answer": None,
            "queued": None,
            "started": None,
            "finished": None,
        }
        self._seq += 1
        self._records.append(record)
        if len(self._bodies) < config.keep_bodies:
            record["body_index"] = len(self._bodies)
            self._bodies.append(body)
        try:
            response = await self._answer(request, body, record, config)
            record["status"] = response.status
            return response
        except asyncio.CancelledError:
            if record["outcome"] is None:
                record["outcome"] = "client_gone"
            raise
        finally:
            record["finished"] = time.time()
            self._outcomes[record["outcome"] or "unknown"] += 1
            self._statuses[str(record["status"] or "none")] += 1
            log.debug("standin %s -> %s %s", record["seq"], record["status"], record["outcome"])

    async def _answer(
        self, request: web.Request, body: bytes, record: dict[str, Any], config: StandinConfig
    ) -> web.StreamResponse:
        if not self._authorized(request):
            await self._wait_gate()
            record["outcome"] = "unauthorized"
            return _json_response({"error": "Unauthorized"}, status=401)
        try:
            b64, max_tokens, text_chars = self._read_request(body, record, config)
            marker: Marker | None = None
            if config.identify:
                # PNG decoding takes tens of milliseconds for a full page; a worker thread (Pillow
                # releases the GIL while decoding) keeps the loop answering everyone else meanwhile.
                sha1, marker, (width, height) = await asyncio.to_thread(_identify, b64)
                record["image_sha1"] = sha1
                record["marker"] = _marker_dict(marker)
            else:
                width, height = _png_size_from_base64(b64)
            record["image_size"] = [width, height]
            text_tokens = PROMPT_TEXT_TOKENS + max(0, text_chars - len(PROMPT_V4)) // CHARS_PER_TOKEN
            prompt_tokens = text_tokens + min(width * height, MAX_IMAGE_PIXELS) // PIXELS_PER_TOKEN
            # As vLLM 0.32: only a prompt over the context is refused; max_tokens is capped to what is left.
            # The text is checked before the image's tokens are counted in, each with its own message.
            if text_tokens > config.max_model_len:
                raise _BadRequest(
                    400,
                    f"This model's maximum context length is {config.max_model_len} tokens. However, your "
                    f"prompt contains at least {text_tokens} input tokens, which exceeds this limit even "
                    "without any output tokens. Please reduce the length of the input prompt. "
                    f"(parameter=input_tokens, value={text_tokens})",
                    param="input_tokens",
                )
            if prompt_tokens > config.max_model_len:
                raise _BadRequest(
                    400,
                    f"Input length ({prompt_tokens}) exceeds model's maximum context length ({config.max_model_len}).",
                )
            max_tokens = min(max_tokens, config.max_model_len - prompt_tokens)
        except _BadRequest as exc:
            await self._wait_gate()
            record["outcome"] = "model_not_found" if exc.status == 404 else "bad_request"
            return _json_response(_error_body(exc.status, str(exc), exc.error_type, exc.param), status=exc.status)

        fault = self._choose_fault(marker, config)
        record["fault"] = fault
        await self._wait_gate()

        if fault in IMMEDIATE_FAULTS:
            return await self._immediate_fault(request, fault, record, config)

        record["queued"] = time.time()
        await self._scheduler.acquire(record["priority"] if config.scheduling_policy == "priority" else 0)
        record["started"] = time.time()
        try:
            if fault == "slow":
                await self._serve_slow(record["started"])
            else:
                delay = config.latency_s + (self._jitter_rng.uniform(0, config.jitter_s) if config.jitter_s else 0)
                if delay > 0:
                    await asyncio.sleep(delay)
        finally:
            self._scheduler.release()
        await self._wait_gate()
        return self._completion(record, config, fault, b64, marker, prompt_tokens, max_tokens)

    async def _serve_slow(self, started: float) -> None:
        """Hold a "slow" page until ``slow_s`` after it started, by the live setting: a slow server that
        recovers answers the pages it holds too, so a test can end the slowness when it has seen what it
        waited for (rather than sizing a fixed delay for a loaded machine)."""
        while (remaining := started + self.config.slow_s - time.time()) > 0:
            assert self._slow_changed is not None
            try:
                await asyncio.wait_for(self._slow_changed.wait(), remaining)
            except TimeoutError:
                return

    def _read_request(self, body: bytes, record: dict[str, Any], config: StandinConfig) -> tuple[str, int, int]:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest(400, "request body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise _BadRequest(400, "request body must be a JSON object")
        record["keys"] = list(payload)
        model = payload.get("model")
        record["model"] = model
        record["temperature"] = payload.get("temperature")
        record["max_tokens"] = payload.get("max_tokens")
        if not isinstance(model, str):
            raise _BadRequest(400, "model must be a string")
        if model != config.model:
            raise _BadRequest(
                404, f"The model `{model}` does not exist. Valid aliases: {config.model}.", "NotFoundError", "model"
            )
        priority = payload.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise _BadRequest(400, "priority must be an integer")
        # Under fcfs vLLM 0.32 accepts the field and serves in arrival order regardless.
        record["priority"] = priority
        record["guided"] = _honoured_constraint(payload, config.vllm_version)
        return _extract_image(payload)

    def _choose_fault(self, marker: Marker | None, config: StandinConfig) -> str | None:
        if marker is not None:
            key = f"{marker.doc_id}:{marker.page_number}"
            if key in config.always:
                return config.always[key]
            steps = config.scripts.get(key)
            if steps is not None:
                position = self._script_progress.get(key, 0)
                if position < len(steps):
                    self._script_progress[key] = position + 1
                    step = steps[position]
                    return None if step == "ok" else step
        if config.fault_rates:
            draw = self._fault_rng.random()
            cumulative = 0.0
            for name in sorted(config.fault_rates):
                cumulative += float(config.fault_rates[name])
                if draw < cumulative:
                    return name
        return None

    async def _immediate_fault(
        self, request: web.Request, fault: str, record: dict[str, Any], config: StandinConfig
    ) -> web.StreamResponse:
        record["outcome"] = fault
        if fault == "500":
            return _json_response(
                _error_body(500, "Internal server error (injected)", "InternalServerError"), status=500
            )
        if fault == "503":
            return _json_response(
                _error_body(503, "Service temporarily unavailable (injected)", "ServiceUnavailableError"),
                status=503,
            )
        if fault == "429":
            return _json_response(
                _error_body(429, "Too many requests (injected)", "RateLimitError"),
                status=429,
                headers={"Retry-After": str(config.retry_after_s)},
            )
        if fault == "drop" and request.transport is not None:
            request.transport.close()
        # "hang", and "drop" once the close lands: park until the connection is gone, which
        # cancels this handler (handler_cancellation) or until the server shuts down.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def _completion(
        self,
        record: dict[str, Any],
        config: StandinConfig,
        fault: str | None,
        b64: str,
        marker: Marker | None,
        prompt_tokens: int,
        max_tokens: int,
    ) -> web.Response:
        if marker is not None:
            subject = f"document {marker.doc_id} page {marker.page_number}"
            rotation_valid, rotation = marker.rotation_correction == 0, marker.rotation_correction
        elif record["image_sha1"] is not None:
            subject = f"unmarked image sha1 {record['image_sha1']}"
            rotation_valid, rotation = True, 0
        else:
            digest = hashlib.sha1(
                f"{len(b64)}:{b64[:DIGEST_SPAN]}:{b64[-DIGEST_SPAN:]}".encode("ascii", "replace")
            ).hexdigest()
            subject = f"image digest {digest}"
            rotation_valid, rotation = True, 0
        text = f"Stand-in transcription of {subject}."
        finish_reason = "stop"
        if fault == "garbage" and record.get("guided"):
            # A constrained model cannot leave the front-matter shape.
            fault = None
        if fault == "garbage":
            content = f"I am sorry, I cannot read {subject}."
        elif fault == "invalid_rotation":
            front = format_front_matter(
                primary_language=config.primary_language, is_rotation_valid=False, rotation_correction=45
            )
            content = front + text
        else:
            front = format_front_matter(
                primary_language=config.primary_language,
                is_rotation_valid=rotation_valid,
                rotation_correction=rotation,
            )
            content = front + text
        completion_tokens = max(1, len(content) // 4)
        if fault == "length":
            finish_reason, completion_tokens = "length", max_tokens
        elif completion_tokens > max_tokens:
            # As vLLM would: generation stops at max_tokens, mid-answer.
            content, completion_tokens, finish_reason = content[: max_tokens * 4], max_tokens, "length"
        if fault == "overlong":
            completion_tokens = max(completion_tokens, config.max_model_len + 1 - prompt_tokens)
        total_tokens = prompt_tokens + completion_tokens
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": config.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": total_tokens,
            },
        }
        record.update(outcome=fault or "ok", answer=content, finish_reason=finish_reason)
        self._finish_reasons[finish_reason] += 1
        self._prompt_tokens += prompt_tokens
        self._generation_tokens += completion_tokens
        encoded = json.dumps(payload).encode()
        if fault == "bad_json":
            encoded = encoded[: len(encoded) // 2]
        return web.Response(body=encoded, status=200, content_type="application/json")

    # ----- control plane ----------------------------------------------------------------------

    async def _control_get_config(self, request: web.Request) -> web.Response:
        return _json_response(self.config.to_dict())

    async def _control_config(self, request: web.Request) -> web.Response:
        try:
            patch = await request.json()
            if not isinstance(patch, dict):
                raise ValueError("the body must be a JSON object")
            return _json_response(self.configure(patch))
        except (ValueError, TypeError) as exc:
            return _json_response({"error": str(exc)}, status=400)

    async def _control_reset(self, request: web.Request) -> web.Response:
        try:
            options = await request.json() if request.can_read_body else {}
            keep_config = bool((options or {}).get("keep_config", False))
        except (ValueError, AttributeError):
            return _json_response({"error": "the body must be a JSON object"}, status=400)
        await self.reset(keep_config=keep_config)
        return _json_response(self.stats())

    async def _control_stats(self, request: web.Request) -> web.Response:
        return _json_response(self.stats())

    async def _control_requests(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
            limit = int(request.query["limit"]) if "limit" in request.query else None
        except ValueError:
            return _json_response({"error": "since and limit must be integers"}, status=400)
        return _json_response(self.requests(since, limit))

    async def _control_body(self, request: web.Request) -> web.Response:
        try:
            body = self._bodies[int(request.match_info["index"])]
        except (ValueError, IndexError):
            raise web.HTTPNotFound() from None
        return web.Response(body=body, content_type="application/octet-stream")

    async def _control_outage(self, request: web.Request) -> web.Response:
        try:
            options = await request.json()
            mode = options["mode"]
            seconds = options.get("seconds")
            seconds = None if seconds is None else float(seconds)
            if mode not in OUTAGE_MODES:
                raise ValueError(f"mode must be one of {OUTAGE_MODES}")
        except (ValueError, TypeError, KeyError) as exc:
            return _json_response({"error": f"bad outage request: {exc}"}, status=400)
        if mode == "refuse":
            await self.refuse(seconds, drop_inflight=bool(options.get("drop_inflight", False)))
        else:
            await self.resume()
            self.stall(seconds)
        return _json_response({"outage": self._outage})

    async def _control_resume(self, request: web.Request) -> web.Response:
        await self.resume()
        return _json_response({"outage": None})


def _bound_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Needed to re-listen on the same port while connections accepted earlier still use it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class StandinServer:
    """``VllmStandin`` on a background thread with its own event loop, driven synchronously.

    Every method marshals onto the server's loop, so it is safe to call from test threads.
    """

    def __init__(
        self,
        config: StandinConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        control_port: int | None = None,
        **overrides: Any,
    ) -> None:
        self.core = VllmStandin(config, **overrides)
        self._host, self._port, self._control_port = host, port, control_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StandinServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL including ``/v1``, as an OpenAI client expects."""
        return self.core.url

    @property
    def base_url(self) -> str:
        return self.core.base_url

    @property
    def control_url(self) -> str:
        return self.core.control_url

    @property
    def port(self) -> int:
        return self.core.port

    @property
    def model(self) -> str:
        return self.core.config.model

    @property
    def api_key(self) -> str | None:
        return self.core.config.api_key

    def start(self, timeout: float = 10.0) -> StandinServer:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.core.start(self._host, self._port, self._control_port))
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            # Image decoding runs in the loop's default executor; let its threads end with us.
            loop.run_until_complete(loop.shutdown_default_executor())

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"standin-{self._port}", daemon=True)
        self._thread.start()
        if not started.wait(timeout) or failure:
            self._thread.join(1)
            loop.close()
            raise RuntimeError("the vLLM stand-in did not start") from (failure[0] if failure else None)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.core.close(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()

    def _call(self, make: Any, timeout: float = 10.0) -> Any:
        if self._loop is None:
            raise RuntimeError("the stand-in is not running")

        async def invoke() -> Any:
            result = make()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(invoke(), self._loop).result(timeout)

    def configure(self, **settings: Any) -> dict[str, Any]:
        """Merge settings into the live config (mappings merge per key, ``None`` deletes)."""
        return self._call(lambda: self.core.configure(settings))

    def config(self) -> dict[str, Any]:
        return self._call(lambda: self.core.config.to_dict())

    def stats(self) -> dict[str, Any]:
        return self._call(self.core.stats)

    def requests(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return self._call(lambda: self.core.requests(since, limit))

    def bodies(self) -> list[bytes]:
        return self._call(self.core.bodies)

    def reset(self, keep_config: bool = False) -> None:
        self._call(lambda: self.core.reset(keep_config))

    def refuse_for(self, seconds: float | None = None, drop_inflight: bool = False) -> None:
        self._call(lambda: self.core.refuse(seconds, drop_inflight))

    def stall_for(self, seconds: float | None = None) -> None:
        async def stall() -> None:
            await self.core.resume()
            self.core.stall(seconds)

        self._call(stall)

    def resume(self) -> None:
        self._call(self.core.resume)
