"""One request's retry arithmetic (``olmocr_tasks.inference.request_retries``): backoff and ``Retry-After``."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from olmocr_tasks.core.config import RetrySettings
from olmocr_tasks.inference.request_retries import backoff_delay, retry_after_seconds


def test_backoff_doubles_per_round_with_jitter_in_the_upper_half_and_stops_at_its_cap() -> None:
    settings = RetrySettings(backoff_initial_s=0.5, backoff_max_s=4.0)
    for rounds, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (500, 4.0)):
        delays = [backoff_delay(settings, rounds) for _ in range(200)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert max(delays) - min(delays) > 0  # jittered, so replicas are not hit in lockstep


def test_retry_after_lengthens_a_wait_but_never_past_the_cap() -> None:
    settings = RetrySettings(backoff_initial_s=0.5, backoff_max_s=4.0)
    assert backoff_delay(settings, 1, retry_after=3.0) == 3.0
    assert backoff_delay(settings, 1, retry_after=3600.0) == 4.0
    assert 0.25 <= backoff_delay(settings, 1, retry_after=0.0) <= 0.5


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), (" 2.5 ", 2.5), ("-3", 0.0), ("soon", None), ("", None), ("nan", None), ("inf", None)],
)
def test_retry_after_header_in_seconds(header: str, seconds: float | None) -> None:
    response = httpx.Response(503, headers={"Retry-After": header})
    assert retry_after_seconds(response) == seconds


def test_retry_after_header_as_an_http_date_and_absent() -> None:
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    seconds = retry_after_seconds(httpx.Response(429, headers={"Retry-After": later}))
    assert seconds is not None and 100 <= seconds <= 121
    past = email.utils.formatdate(time.time() - 120, usegmt=True)
    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": past})) == 0.0
    assert retry_after_seconds(httpx.Response(503)) is None
