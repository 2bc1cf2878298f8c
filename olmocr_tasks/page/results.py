"""What converting a page and a document produces. Plain dataclasses, JSON-friendly."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from olmocr_tasks.page.protocol import PageResponse


@dataclass
class PageResult:
    """One page's outcome. ``page_number`` is 1-based like olmOCR's spans."""

    page_number: int
    text: str | None
    primary_language: str | None
    is_rotation_valid: bool
    rotation_correction: int
    is_table: bool
    is_diagram: bool
    input_tokens: int
    output_tokens: int
    attempts: int
    # 1-based attempt whose answer was accepted; None for a fallback page.
    accepted_attempt: int | None
    latency_s: float
    is_fallback: bool
    fallback_reason: str | None = None
    # Tokens of every answered attempt, retries included (what the server actually spent).
    server_input_tokens: int = 0
    server_output_tokens: int = 0
    # Second requests sent because a request was slow (see olmocr_tasks.inference.hedging_policy); never attempts.
    hedged: int = 0

    @classmethod
    def from_response(
        cls,
        page_number: int,
        response: PageResponse,
        *,
        input_tokens: int,
        output_tokens: int,
        attempts: int,
        accepted_attempt: int,
        latency_s: float,
        server_input_tokens: int,
        server_output_tokens: int,
    ) -> PageResult:
        return cls(
            page_number=page_number,
            text=response.natural_text,
            primary_language=response.primary_language,
            is_rotation_valid=response.is_rotation_valid,
            rotation_correction=response.rotation_correction,
            is_table=response.is_table,
            is_diagram=response.is_diagram,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            attempts=attempts,
            accepted_attempt=accepted_attempt,
            latency_s=latency_s,
            is_fallback=False,
            server_input_tokens=server_input_tokens,
            server_output_tokens=server_output_tokens,
        )

    @classmethod
    def fallback(
        cls,
        page_number: int,
        text: str | None,
        *,
        attempts: int,
        latency_s: float,
        reason: str,
        server_input_tokens: int = 0,
        server_output_tokens: int = 0,
    ) -> PageResult:
        """A page whose attempts were exhausted: the PDF's own text layer, as olmOCR does."""
        return cls(
            page_number=page_number,
            text=text or None,
            primary_language=None,
            is_rotation_valid=True,
            rotation_correction=0,
            is_table=False,
            is_diagram=False,
            input_tokens=0,
            output_tokens=0,
            attempts=attempts,
            accepted_attempt=None,
            latency_s=latency_s,
            is_fallback=True,
            fallback_reason=reason,
            server_input_tokens=server_input_tokens,
            server_output_tokens=server_output_tokens,
        )


@dataclass(frozen=True)
class DocumentTotals:
    """What a converted document adds up to: the one place its pages are summed."""

    pages: int
    fallback_pages: int
    # Tokens of the accepted answers (what the outputs hold).
    input_tokens: int
    output_tokens: int
    attempts: int
    # Tokens of every answered attempt, retries included (what the server actually spent).
    server_input_tokens: int
    server_output_tokens: int
    # Seconds of each non-fallback page's accepted attempt, and how many pages each attempt number won.
    page_latencies_s: tuple[float, ...]
    accepted_attempt_histogram: dict[str, int]
    # Hedged requests of the document's pages (not attempts).
    hedged: int = 0

    @classmethod
    def of(cls, pages: Sequence[PageResult]) -> DocumentTotals:
        histogram: dict[str, int] = {}
        for page in pages:
            key = str(page.accepted_attempt) if page.accepted_attempt is not None else "fallback"
            histogram[key] = histogram.get(key, 0) + 1
        return cls(
            pages=len(pages),
            fallback_pages=sum(1 for page in pages if page.is_fallback),
            input_tokens=sum(page.input_tokens for page in pages),
            output_tokens=sum(page.output_tokens for page in pages),
            attempts=sum(page.attempts for page in pages),
            server_input_tokens=sum(page.server_input_tokens for page in pages),
            server_output_tokens=sum(page.server_output_tokens for page in pages),
            page_latencies_s=tuple(round(page.latency_s, 4) for page in pages if not page.is_fallback),
            accepted_attempt_histogram=histogram,
            hedged=sum(page.hedged for page in pages),
        )


@dataclass
class DocumentResult:
    """A converted document: its pages in order plus identity of the source bytes."""

    source: str
    size: int
    sha256: str
    pages: list[PageResult] = field(default_factory=list)
    seconds: float = 0.0

    @functools.cached_property
    def totals(self) -> DocumentTotals:
        """The document's sums, computed once; its manifest entry and its Dolma record both use them."""
        return DocumentTotals.of(self.pages)

    @property
    def page_count(self) -> int:
        return self.totals.pages

    @property
    def fallback_pages(self) -> int:
        return self.totals.fallback_pages

    @property
    def input_tokens(self) -> int:
        return self.totals.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.totals.output_tokens

    @property
    def attempts(self) -> int:
        return self.totals.attempts

    @property
    def text(self) -> str:
        """olmOCR's concatenation: each non-empty page text, newline-separated except after the last."""
        return "".join(span_text for span_text, _ in self.page_spans_text())

    def page_spans_text(self) -> list[tuple[str, int]]:
        last = len(self.pages) - 1
        pieces: list[tuple[str, int]] = []
        for index, page in enumerate(self.pages):
            if page.text is None:
                pieces.append(("", page.page_number))
            else:
                pieces.append((page.text if index == last else page.text + "\n", page.page_number))
        return pieces

    def page_spans(self) -> list[list[int]]:
        """``[start_char, end_char, page_number]`` per page, as in olmOCR's ``pdf_page_numbers``."""
        spans: list[list[int]] = []
        offset = 0
        for piece, page_number in self.page_spans_text():
            spans.append([offset, offset + len(piece), page_number])
            offset += len(piece)
        return spans
