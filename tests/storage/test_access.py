"""The allow-list of locations a triggered run may read and write (``olmocr_tasks.storage.access``).

The check through a real DAG run is in ``test_security.py``; symbolic links and tampered batch files
in real runs in ``tests/run/test_allowed_inputs.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.storage.access import AccessNotConfiguredError, AccessPolicy, LocationNotAllowedError


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


def test_nothing_configured_fails_closed_naming_the_setting() -> None:
    policy = _policy()
    assert policy == AccessPolicy(inputs=(), outputs=())
    with pytest.raises(AccessNotConfiguredError) as caught:
        policy.check_run("/data/in", "/data/out")
    message = str(caught.value)
    assert "OLMOCR_ALLOWED_INPUTS" in message and "OLMOCR_INPUT_URI" in message and "*" in message
    assert isinstance(caught.value, ConfigurationError)  # the plan task fails the run without retries
    for uri in ("/data/in/a.pdf", "/etc/passwd", "s3://any-bucket/a.pdf"):
        with pytest.raises(AccessNotConfiguredError, match="OLMOCR_ALLOWED_INPUTS"):
            policy.check_input(uri)
    with pytest.raises(AccessNotConfiguredError, match="OLMOCR_ALLOWED_OUTPUTS"):
        policy.check_output("s3://any-bucket/out/")
    # One side configured is not enough for a run: it reads and writes.
    only_inputs = _policy(OLMOCR_INPUT_URI="s3://scans/incoming/")
    only_inputs.check_input("s3://scans/incoming/a.pdf")
    with pytest.raises(AccessNotConfiguredError, match="OLMOCR_ALLOWED_OUTPUTS"):
        only_inputs.check_run("s3://scans/incoming/", "s3://results/")


def test_a_star_allows_anywhere_only_when_said() -> None:
    policy = _policy(OLMOCR_ALLOWED_INPUTS="*", OLMOCR_ALLOWED_OUTPUTS="*")
    assert policy == AccessPolicy.anywhere() == AccessPolicy(inputs=None, outputs=None)
    # Every location is allowed on both sides: none of these raises.
    policy.check_run("/data/in", "s3://any/out", ["/etc/passwd", "s3://other-bucket/a.pdf"])
    policy.check_input("s3://scans/incoming/../private/a.pdf")
    policy.check_output("/tmp/anywhere")
    # A star among prefixes is still anywhere; one side's star leaves the other closed.
    assert _policy(OLMOCR_ALLOWED_INPUTS="s3://a/ *").inputs is None
    assert _policy(OLMOCR_ALLOWED_INPUTS="*").outputs == ()


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


def test_a_link_out_of_an_allowed_folder_is_refused_when_resolved_not_by_name(tmp_path: Path) -> None:
    allowed, secret = tmp_path / "inbox", tmp_path / "tenant-b"
    allowed.mkdir()
    secret.mkdir()
    (secret / "payroll.pdf").write_bytes(b"%PDF-1.4 secret")
    (allowed / "inside.pdf").write_bytes(b"%PDF-1.4")
    (allowed / "x.pdf").symlink_to(secret / "payroll.pdf")
    (allowed / "alias.pdf").symlink_to(allowed / "inside.pdf")
    policy = _policy(OLMOCR_ALLOWED_INPUTS=str(allowed), OLMOCR_ALLOWED_OUTPUTS=str(tmp_path / "out"))
    # By name, a named link is inside: the run is not refused as a whole...
    policy.check_run("", str(tmp_path / "out"), [str(allowed / "x.pdf"), str(allowed / "inside.pdf")])
    # ...but the document is, resolved, without saying where its link leads.
    with pytest.raises(LocationNotAllowedError) as caught:
        policy.check_input(str(allowed / "x.pdf"))
    assert caught.value.linked and "symbolic link" in str(caught.value)
    assert "tenant-b" not in str(caught.value) and "payroll" not in str(caught.value)
    # A link that stays inside opens its real file; a plain file its own path.
    assert policy.check_input(str(allowed / "alias.pdf")) == str(allowed / "inside.pdf")
    assert policy.check_input(f"file://{allowed}/inside.pdf") == str(allowed / "inside.pdf")
    # A name outside every prefix still fails the whole run.
    with pytest.raises(LocationNotAllowedError) as outside:
        policy.check_run("", str(tmp_path / "out"), [str(secret / "payroll.pdf")])
    assert not outside.value.linked


def test_file_uris_are_percent_decoded_for_the_check_and_the_open_alike(tmp_path: Path) -> None:
    """``file:///srv/in/d%2Fd%2Fd/../../../secret/x.pdf`` names ``/srv/in/secret/x.pdf`` for the check; the
    path to open is the checked one, never the raw text (which, with a folder literally called
    ``d%2Fd%2Fd``, would climb three levels out)."""
    inbox = tmp_path / "srv" / "in"
    (inbox / "d%2Fd%2Fd").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "x.pdf").write_bytes(b"%PDF-1.4 secret")
    policy = _policy(OLMOCR_ALLOWED_INPUTS=str(inbox))
    uri = f"file://{inbox}/d%2Fd%2Fd/../../../secret/x.pdf"
    opened = policy.check_input(uri)
    assert opened == str(inbox / "secret" / "x.pdf")
    assert Path(opened).resolve().is_relative_to(inbox)
