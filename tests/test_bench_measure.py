"""The bench's exact memory peak is the command's own, not the harness's that started it."""

from __future__ import annotations

import sys

from bench.measure import run_measured

MIB = 2**20


def test_the_exact_peak_is_the_commands_own_whatever_the_harness_holds() -> None:
    # A harness far bigger than the commands: forked from it directly, every child's ru_maxrss would
    # read at least this much.
    harness_ballast = bytearray(300 * MIB)
    harness_ballast[::4096] = b"x" * len(range(0, len(harness_ballast), 4096))

    small = run_measured([sys.executable, "-c", "pass"], label="small")
    large = run_measured([sys.executable, "-c", "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                         label="large")  # fmt: skip

    assert (small.returncode, large.returncode) == (0, 0)
    assert small.max_rss_bytes < 100 * MIB
    assert large.max_rss_bytes >= 200 * MIB > small.max_rss_bytes
    # The launcher's own size is the floor an exact peak can show.
    assert 0 < small.extra["launcher_rss_bytes"] <= small.max_rss_bytes


def test_a_command_killed_at_its_timeout_reports_no_exact_peak() -> None:
    hung = run_measured([sys.executable, "-c", "import time; time.sleep(60)"], label="hung", timeout_s=1)
    assert hung.returncode != 0
    assert hung.max_rss_bytes == 0
