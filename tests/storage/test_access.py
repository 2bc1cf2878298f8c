"""The allow-list of locations a triggered run may read and write (``olmocr_tasks.storage.access``).

The check through a real DAG run is in ``test_security.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.storage.access import AccessPolicy, LocationNotAllowedError


def _policy(**env: str) -> AccessPolicy:
    return AccessPolicy.from_env(env)


def test_defaults_are_the_configured_locations() -> None:
    policy = _policy(OLMOCR_INPUT_URI="s3://scans/incoming/", OLMOCR_OUTPUT_URI="s3://results/ocr")
    policy.check_run("s3://scans/incoming", "s3://results/ocr/", ["s3://scans/incoming/2025/a.pdf"])
    with pytest.raises(LocationNotAllowedError) as caught:
        policy.check_input("s3://scans/private/a.pdf")
    assert caught.value.uri == "s3://scans/private/a.pdf" and caught.value.role == "input"
    assert "'s3://scans/private/a.pdf'" in str(caught.value) and "OLMOCR_ALLOWED_INPUTS" in str(caught.value)
    with pytest.raises(LocationNotAllowedError, match="OLMOCR_ALLOWED_OUTPUTS"):
        policy.check_output("s3://attacker/loot/")
    # A typed configuration error: the plan task fails the run without retries.
    assert issubclass(LocationNotAllowedError, ConfigurationError)


def test_explicit_lists_win_over_the_configured_locations() -> None:
    policy = _policy(
        OLMOCR_INPUT_URI="s3://scans/incoming/",
        OLMOCR_ALLOWED_INPUTS="s3://scans/incoming/, s3://archive/2019/  s3://archive/2020",
        OLMOCR_ALLOWED_OUTPUTS="*",
    )
    for uri in ("s3://scans/incoming/a.pdf", "s3://archive/2019/x/y.pdf", "S3://archive/2020/z.pdf"):
        policy.check_input(uri)
    policy.check_output("/anywhere/at/all")
    with pytest.raises(LocationNotAllowedError):
        policy.check_input("s3://archive/2021/a.pdf")


def test_nothing_configured_means_unrestricted() -> None:
    policy = _policy()
    assert policy == AccessPolicy(inputs=None, outputs=None)
    # Every location is allowed on both sides: none of these raises.
    policy.check_run("/data/in", "s3://any/out", ["/etc/passwd", "s3://other-bucket/a.pdf"])
    policy.check_input("s3://scans/incoming/../private/a.pdf")
    policy.check_output("/tmp/anywhere")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://scans/incomingX/a.pdf",  # a prefix is a folder, not a string prefix
        "s3://scans/incoming/../private/a.pdf",  # some S3-compatible stores collapse dot segments
        "s3://scans/incoming/./a.pdf",
        "s3://scans-incoming/a.pdf",
        "s3://scans",
        "/scans/incoming/a.pdf",  # a local path is never under an S3 prefix
        "",
    ],
)
def test_s3_prefixes_are_folders_and_dot_segments_are_refused(uri: str) -> None:
    with pytest.raises(LocationNotAllowedError):
        _policy(OLMOCR_ALLOWED_INPUTS="s3://scans/incoming").check_input(uri)


def test_local_paths_cannot_climb_or_link_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed, secret = tmp_path / "inbox", tmp_path / "secret"
    allowed.mkdir()
    secret.mkdir()
    (allowed / "escape").symlink_to(secret)
    policy = _policy(OLMOCR_ALLOWED_INPUTS=str(allowed))
    policy.check_input(str(allowed / "a.pdf"))
    policy.check_input(f"file://{allowed}/sub/b.pdf")
    policy.check_input(f"{allowed}/sub/../c.pdf")
    monkeypatch.chdir(allowed)  # relative paths resolve against the worker's working folder
    policy.check_input("d.pdf")
    for uri in (f"{allowed}/../secret/a.pdf", str(allowed / "escape" / "a.pdf"), f"{allowed}-2/a.pdf", "/etc/passwd"):
        with pytest.raises(LocationNotAllowedError):
            policy.check_input(uri)
