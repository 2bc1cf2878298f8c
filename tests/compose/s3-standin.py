#!/opt/s3-standin/venv/bin/python
"""moto's S3 server behind MinIO's command line, as far as docker/compose.yaml uses it.

Installed as ``minio`` (``minio server DIR --address HOST:PORT [--console-address ...]`` starts moto's
server on HOST:PORT; DIR and the console are ignored: moto keeps objects in memory) and as ``mc``
(``mc alias set NAME URL USER PASSWORD`` remembers URL; ``mc ready NAME`` succeeds once the server
answers there), which is what the minio service's health check runs.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

ALIASES = Path.home() / ".s3-standin-aliases.json"


def serve(args: list[str]) -> None:
    if not args or args[0] != "server":
        sys.exit(f"minio stand-in: only 'server' is supported, got {args}")
    address = ":9000"
    if "--address" in args:
        address = args[args.index("--address") + 1]
    host, _, port = address.rpartition(":")
    os.execv(
        "/opt/s3-standin/venv/bin/moto_server",
        ["moto_server", "-H", host or "0.0.0.0", "-p", port],
    )


def mc(args: list[str]) -> None:
    aliases = json.loads(ALIASES.read_text()) if ALIASES.exists() else {}
    if args[:2] == ["alias", "set"] and len(args) >= 4:
        aliases[args[2]] = args[3]
        ALIASES.write_text(json.dumps(aliases))
        return
    if args[:1] == ["ready"] and len(args) == 2:
        url = aliases.get(args[1])
        if url is None:
            sys.exit(f"mc stand-in: unknown alias {args[1]}")
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=5):
            return
    sys.exit(f"mc stand-in: unsupported command {args}")


if __name__ == "__main__":
    if Path(sys.argv[0]).name == "mc":
        mc(sys.argv[1:])
    else:
        serve(sys.argv[1:])
