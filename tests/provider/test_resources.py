"""The peak-memory line the tasks log at their end (``olmocr_tasks.provider.resources``)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

from olmocr_tasks.provider.resources import PEAK_MEMORY_EVENT, log_peak_memory, peak_memory

LINE = re.compile(re.escape(PEAK_MEMORY_EVENT) + r" self (\d+\.\d) MiB, children (\d+\.\d) MiB$")


def test_logs_one_line_with_the_figures_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="olmocr_tasks.provider.resources"):
        peak = log_peak_memory()
    lines = [record.getMessage() for record in caplog.records if record.name == "olmocr_tasks.provider.resources"]
    assert len(lines) == 1
    found = LINE.match(lines[0])
    assert found is not None, lines[0]
    assert (float(found[1]), float(found[2])) == (peak.self_mib, peak.children_mib)
    # An interpreter with pytest loaded holds tens of MiB; the unit is MiB, not KiB or bytes.
    assert 10 < peak.self_mib < 100_000


def test_children_is_the_peak_of_a_reaped_child() -> None:
    # A child that touches 64 MiB: once reaped, the children's peak is at least that.
    code = "b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert peak_memory().children_mib >= 64
