#!/opt/s3-standin/venv/bin/python
"""moto's S3 server behind MinIO's command line, as far as docker/compose.yaml uses it.

Installed as ``minio`` (``minio server DIR --address HOST:PORT [--console-address ...]`` starts moto's
server on HOST:PORT; DIR and the console are ignored: moto keeps objects in memory) and as ``mc``, with
the commands the minio service's health check and docker/s3-users.sh run: an alias is
``MC_HOST_<alias>=http://user:password@host:port`` (or ``mc alias set NAME URL USER PASSWORD``);
``mc ready NAME`` succeeds once the server answers there; ``mc mb --ignore-existing NAME/BUCKET``
creates the bucket. moto accepts any credentials, so the account commands (``admin policy create``,
``admin user add`` with its keys on standard input, ``admin policy attach``, ``admin user info``) check
their arguments and change nothing: the tier shows the wiring, not MinIO's enforcement of the policy.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
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


def _alias(name: str) -> urllib.parse.SplitResult:
    aliases = json.loads(ALIASES.read_text()) if ALIASES.exists() else {}
    url = os.environ.get(f"MC_HOST_{name}") or aliases.get(name)
    if url is None:
        sys.exit(f"mc stand-in: unknown alias {name}")
    return urllib.parse.urlsplit(url)


def mc(args: list[str]) -> None:
    if args[:2] == ["alias", "set"] and len(args) >= 4:
        aliases = json.loads(ALIASES.read_text()) if ALIASES.exists() else {}
        aliases[args[2]] = args[3]
        ALIASES.write_text(json.dumps(aliases))
        return
    if args[:1] == ["ready"] and len(args) == 2:
        url = _alias(args[1])
        with urllib.request.urlopen(f"{url.scheme}://{url.hostname}:{url.port}/moto-api/", timeout=5):
            return
    if args[:2] == ["mb", "--ignore-existing"] and len(args) == 3:
        import boto3

        name, _, bucket = args[2].partition("/")
        url = _alias(name)
        s3 = boto3.client(
            "s3",
            endpoint_url=f"{url.scheme}://{url.hostname}:{url.port}",
            aws_access_key_id=url.username,
            aws_secret_access_key=url.password,
            region_name="us-east-1",
        )
        if bucket not in {entry["Name"] for entry in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=bucket)
        return
    if args[:3] == ["admin", "policy", "create"] and len(args) == 6:
        _alias(args[3])
        json.loads(Path(args[5]).read_text())  # the policy must at least be JSON
        return
    if args[:3] == ["admin", "user", "add"] and len(args) == 4:
        _alias(args[3])
        keys = sys.stdin.read().splitlines()
        if len(keys) != 2 or not all(keys):
            sys.exit("mc stand-in: admin user add reads an access key and a secret key, one a line")
        return
    if args[:3] == ["admin", "policy", "attach"] and len(args) == 7 and args[5] == "--user":
        _alias(args[3])
        return
    sys.exit(f"mc stand-in: unsupported command {args}")


if __name__ == "__main__":
    if Path(sys.argv[0]).name == "mc":
        mc(sys.argv[1:])
    else:
        serve(sys.argv[1:])
