"""One page through olmOCR's retry ladder: render, ask, validate, rotate, retry, or fall back.

Semantics follow olmOCR 0.4.27's ``process_page`` for an external server:

* up to ``max_page_retries`` attempts, attempt *i* at ``TEMPERATURE_BY_ATTEMPT[i]``;
* success needs a valid completion (``finish_reason == "stop"``, tokens within the context) whose
  front matter says the rotation is valid;
* an answer that says the rotation is invalid makes the next attempts render the page turned by the
  cumulative correction (PIL's counter-clockwise ``ROTATE_R``);
* when attempts run out, the last valid answer is accepted; failing that, the page falls back to the
  PDF's own text layer and is flagged ``is_fallback``.

Unlike olmOCR, transport failures are not page attempts: the client retries them, and an outage
surfaces as ``ServerUnavailable`` which aborts the conversion instead of producing fallback pages.
Hedged requests (a second request for a slow one, see ``hedging``) are not attempts either; a page
counts them in ``PageResult.hedged``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from olmocr_tasks.core.config import PageSettings
from olmocr_tasks.core.errors import AttemptFailed, RenderError
from olmocr_tasks.page.protocol import (
    Completion,
    CompletionFormatError,
    FrontMatterError,
    RequestBodyBuilder,
    parse_completion,
    temperature_for_attempt,
)
from olmocr_tasks.page.results import PageResult

log = logging.getLogger(__name__)


class PageRenderer(Protocol):
    async def render_page(
        self, path: str, page_index: int, target_longest_image_dim: int = 1288, rotation: int = 0
    ) -> bytes: ...

    async def page_text(self, path: str, page_index: int) -> str: ...


class CompletionClient(Protocol):
    def slot(self) -> AbstractAsyncContextManager[None]: ...

    async def complete(self, body: bytes, *, on_hedge: Callable[[], None] | None = None) -> dict: ...


@dataclass
class _Hedges:
    count: int = 0

    def add(self) -> None:
        self.count += 1


@dataclass
class _Candidate:
    completion: Completion
    attempt: int


class PageConverter:
    """Converts single pages; shared by every document of a process."""

    def __init__(
        self,
        client: CompletionClient,
        renderer: PageRenderer,
        body_builder: RequestBodyBuilder,
        settings: PageSettings,
    ) -> None:
        self._client = client
        self._renderer = renderer
        self._builder = body_builder
        self._settings = settings

    async def convert(self, path: str, page_index: int) -> PageResult:
        hedges = _Hedges()
        result = await self._convert(path, page_index, hedges)
        return dataclasses.replace(result, hedged=hedges.count) if hedges.count else result

    async def _convert(self, path: str, page_index: int, hedges: _Hedges) -> PageResult:
        page_number = page_index + 1
        rotation = 0
        accepted: _Candidate | None = None
        last_valid: _Candidate | None = None
        attempts = 0
        busy_s = 0.0
        server_in = server_out = 0
        failure_reason = "no valid answer"

        for attempt in range(self._settings.max_page_retries):
            attempts += 1
            try:
                payload, elapsed = await self._ask(path, page_index, rotation, attempt, hedges)
            except RenderError as exc:
                failure_reason = f"render failed: {exc}"
                break  # rendering again would fail (or hang) again; the text layer is all we can offer
            except AttemptFailed as exc:
                failure_reason = str(exc)
                continue
            busy_s += elapsed
            try:
                completion = parse_completion(payload, self._settings.model_max_context)
            except (FrontMatterError, CompletionFormatError) as exc:
                failure_reason = f"unusable answer: {exc}"
                continue
            server_in += completion.input_tokens
            server_out += completion.output_tokens
            response = completion.response
            if completion.is_valid and response.is_rotation_valid:
                accepted = _Candidate(completion, attempt)
                break
            if completion.is_valid:
                last_valid = _Candidate(completion, attempt)
            else:
                failure_reason = (
                    f"invalid answer: finish_reason={completion.finish_reason}, tokens={completion.total_tokens}"
                )
            if not response.is_rotation_valid:
                rotation = (rotation + response.rotation_correction) % 360
                failure_reason = "rotation never validated"

        chosen = accepted or last_valid
        if chosen is not None:
            return PageResult.from_response(
                page_number,
                chosen.completion.response,
                input_tokens=chosen.completion.input_tokens,
                output_tokens=chosen.completion.output_tokens,
                attempts=attempts,
                accepted_attempt=chosen.attempt + 1,
                latency_s=busy_s,
                server_input_tokens=server_in,
                server_output_tokens=server_out,
            )
        log.debug("page %d of %s falls back to its text layer: %s", page_number, path, failure_reason)
        text = await self._fallback_text(path, page_index)
        return PageResult.fallback(
            page_number,
            text,
            attempts=attempts,
            latency_s=busy_s,
            reason=failure_reason,
            server_input_tokens=server_in,
            server_output_tokens=server_out,
        )

    async def _ask(
        self, path: str, page_index: int, rotation: int, attempt: int, hedges: _Hedges
    ) -> tuple[dict, float]:
        # The slot is taken before rendering so that rendered images never pile up in memory: at most
        # one image per in-flight request exists at any time.
        async with self._client.slot():
            image = await self._renderer.render_page(
                path, page_index, self._settings.target_longest_image_dim, rotation
            )
            body = self._builder.build(image, temperature_for_attempt(attempt))
            del image
            started = time.monotonic()
            payload = await self._client.complete(body, on_hedge=hedges.add)
            return payload, time.monotonic() - started

    async def _fallback_text(self, path: str, page_index: int) -> str:
        try:
            return await self._renderer.page_text(path, page_index)
        except RenderError as exc:
            log.warning("text layer of page %d of %s is unreadable too: %s", page_index + 1, path, exc)
            return ""
