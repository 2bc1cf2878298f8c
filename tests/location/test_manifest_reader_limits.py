"""The manifest reader's bounds are settings, and its JSON is strict (``ReadLimits``, ``strict_json``)."""

from __future__ import annotations

import pytest

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.location.manifest_reader import ManifestFormatError, ReadLimits, check_summary, strict_json


def test_read_limits_come_from_the_settings_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OLMOCR_MAX_SUMMARY_BYTES", "OLMOCR_MAX_SHARD_BYTES", "OLMOCR_MAX_ENTRY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    assert ReadLimits.from_environment() == ReadLimits()
    monkeypatch.setenv("OLMOCR_MAX_SUMMARY_BYTES", "1000")
    monkeypatch.setenv("OLMOCR_MAX_SHARD_BYTES", "2000")
    monkeypatch.setenv("OLMOCR_MAX_ENTRY_BYTES", "300")
    limits = ReadLimits.from_environment()
    assert (limits.summary_bytes, limits.shard_bytes, limits.line_bytes) == (1000, 2000, 300)
    monkeypatch.setenv("OLMOCR_MAX_SHARD_BYTES", "-5")
    with pytest.raises(ConfigurationError, match="OLMOCR_MAX_SHARD_BYTES must be positive"):
        ReadLimits.from_environment()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": NaN}', "NaN is not a number"),
        ('{"a": -Infinity}', "-Infinity is not a number"),
        ('{"a": ' + "1" * 100_000 + "}", "beyond 64 bits"),
        ('{"a": 9223372036854775809}', "beyond 64 bits"),
        ('{"a": 1e400}', "beyond 64 bits"),
        ('{"a": -1e300}', "beyond 64 bits"),
        ("[" * 100_000, "is not JSON"),
    ],
)
def test_strict_json_refuses_what_no_manifest_holds(text: str, reason: str) -> None:
    with pytest.raises(ManifestFormatError, match=reason):
        strict_json(text, "summary x")


def test_strict_json_keeps_every_number_a_manifest_holds() -> None:
    assert strict_json('{"a": 9223372036854775807, "b": -2.5e18, "c": 0.001}', "x") == {
        "a": 2**63 - 1,
        "b": -2.5e18,
        "c": 0.001,
    }


def test_check_summary_names_the_field_of_the_wrong_type() -> None:
    check_summary({"counts": {"pages": 3}, "overview": {"progress": {"points": [[1, 2.5, 3]]}}, "entries": {}})
    with pytest.raises(ManifestFormatError, match=r"overview\.progress\.points\[0\] has 2 items"):
        check_summary({"entries": {}, "overview": {"progress": {"points": [[1, 2]]}}})
    with pytest.raises(ManifestFormatError, match=r"counts\.pages is bool, not a whole number"):
        check_summary({"entries": {}, "counts": {"pages": True}})
    with pytest.raises(ManifestFormatError, match=r"entries\.documents\.shards\[0\]\.path is dict, not text"):
        check_summary({"entries": {"documents": {"count": 1, "shards": [{"path": {}, "entries": 1}]}}})
    with pytest.raises(ManifestFormatError, match=r"documents is str, not a list"):
        check_summary({"documents": "all of them"})
