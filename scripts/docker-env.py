"""`make docker-env`: docker/.env for docker/compose.yaml, with a fresh secret for every placeholder.

Every setting docker/.env.example gives a value is written; those whose example value is a
``change-me`` placeholder get a new random secret unless docker/.env already holds a real one (the
script keeps what you set and fills in the rest, so it is safe to run again). The file is written
owner-only and atomically; values are never printed, only the names of those generated.

    python3 scripts/docker-env.py [--env-file PATH] [--example PATH]
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import sys
import tempfile
from pathlib import Path

DOCKER = Path(__file__).resolve().parent.parent / "docker"
PLACEHOLDER = "change-me"


def fernet_key() -> str:
    """What ``cryptography.fernet.Fernet.generate_key()`` returns (32 random bytes, URL-safe base64), not
    starting with "-" either: like every value here it may reach a command line (1 key in 64 did)."""
    while True:
        value = base64.urlsafe_b64encode(os.urandom(32)).decode()
        if not value.startswith("-"):
            return value


def token(length: int) -> str:
    """A URL-safe secret (letters, digits, "-", "_": the values go into URLs and JSON unescaped) that
    does not start with "-", which a command line would read as an option."""
    while True:
        value = secrets.token_urlsafe(length)
        if not value.startswith("-"):
            return value


def new_secret(name: str) -> str:
    if name.endswith("FERNET_KEY"):
        return fernet_key()
    if name.endswith(("JWT_SECRET", "SECRET_KEY")):
        return token(48)  # signing keys: 384 bits
    return token(24)


def is_unset(value: str | None) -> bool:
    return not value or value.lower().startswith(PLACEHOLDER)


def read_values(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def fill(example: Path, env_file: Path) -> list[str]:
    """Write ``env_file`` from ``example`` (keeping ``env_file``'s own values); the names generated."""
    existing = read_values(env_file) if env_file.exists() else {}
    generated: list[str] = []
    lines: list[str] = []
    source = env_file.read_text().splitlines() if env_file.exists() else example.read_text().splitlines()
    seen: set[str] = set()
    wanted = read_values(example)
    for line in source:
        key, sep, value = line.partition("=")
        key = key.strip()
        if line.lstrip().startswith("#") or not sep:
            lines.append(line)
            continue
        seen.add(key)
        if key in wanted and wanted[key].startswith(PLACEHOLDER) and is_unset(value.strip()):
            generated.append(key)
            lines.append(f"{key}={new_secret(key)}")
        else:
            lines.append(line)
    for key, value in wanted.items():
        # A setting the example gained after docker/.env was made.
        if key in seen:
            continue
        if value.startswith(PLACEHOLDER) and is_unset(existing.get(key)):
            generated.append(key)
            value = new_secret(key)
        lines.append(f"{key}={value}")
    descriptor, temporary = tempfile.mkstemp(dir=env_file.parent, prefix=".env.")
    try:
        with os.fdopen(descriptor, "w") as handle:  # mkstemp: mode 0600 from the start
            handle.write("\n".join(lines) + "\n")
        os.replace(temporary, env_file)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-file", type=Path, default=DOCKER / ".env")
    parser.add_argument("--example", type=Path, default=DOCKER / ".env.example")
    args = parser.parse_args(argv)
    generated = fill(args.example, args.env_file)
    if generated:
        print(f"{args.env_file}: new secrets for {', '.join(generated)}")
    else:
        print(f"{args.env_file}: every secret was already set; nothing changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
