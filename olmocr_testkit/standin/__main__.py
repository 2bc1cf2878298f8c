"""Run the vLLM stand-in as its own process.

    python -m olmocr_testkit.standin --port 0 --model NAME --latency 1.0 --capacity 16

When it is listening it prints one JSON line on stdout (``url`` ends in ``/v1``; ``control_url`` is a
second listener for the ``/_control`` API that stays up during a ``refuse`` outage), then serves until
SIGTERM or SIGINT. A separate process keeps its CPU out of a benchmark's measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

from olmocr_testkit.standin.server import StandinConfig, VllmStandin


def _pairs(values: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep:
            raise SystemExit(f"{option} expects KEY=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m olmocr_testkit.standin", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0, help="-1 serves /_control on --port only")
    parser.add_argument("--config", help="JSON object of StandinConfig settings, applied before the flags")
    parser.add_argument("--model")
    parser.add_argument("--api-key")
    parser.add_argument("--latency", type=float, dest="latency_s")
    parser.add_argument("--jitter", type=float, dest="jitter_s")
    parser.add_argument("--capacity", type=int)
    parser.add_argument("--identify", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--fault", action="append", default=[], metavar="NAME=RATE")
    parser.add_argument("--script", action="append", default=[], metavar="DOC:PAGE=F1,F2")
    parser.add_argument("--always", action="append", default=[], metavar="DOC:PAGE=FAULT")
    parser.add_argument("--slow", type=float, dest="slow_s")
    parser.add_argument("--retry-after", type=int, dest="retry_after_s")
    parser.add_argument("--max-model-len", type=int, dest="max_model_len")
    parser.add_argument("--keep-bodies", type=int, dest="keep_bodies")
    parser.add_argument("--scheduling-policy", choices=("fcfs", "priority"), dest="scheduling_policy")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)

    settings: dict[str, Any] = json.loads(args.config) if args.config else {}
    for name in (
        "model", "api_key", "latency_s", "jitter_s", "capacity", "identify", "metrics", "seed",
        "slow_s", "retry_after_s", "max_model_len", "keep_bodies", "scheduling_policy",
    ):  # fmt: skip
        value = getattr(args, name)
        if value is not None:
            settings[name] = value
    if args.fault:
        settings["fault_rates"] = {k: float(v) for k, v in _pairs(args.fault, "--fault").items()}
    if args.script:
        settings["scripts"] = {k: v.split(",") for k, v in _pairs(args.script, "--script").items()}
    if args.always:
        settings["always"] = _pairs(args.always, "--always")
    return args, settings


async def serve(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    standin = VllmStandin(StandinConfig().merged(settings))
    control_port = None if args.control_port < 0 else args.control_port
    await standin.start(args.host, args.port, control_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = {
        "url": standin.url,
        "base_url": standin.base_url,
        "control_url": standin.control_url,
        "port": standin.port,
        "pid": os.getpid(),
        "model": standin.config.model,
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await standin.close()


def main(argv: list[str] | None = None) -> None:
    args, settings = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    try:
        StandinConfig().merged(settings)
    except ValueError as exc:
        raise SystemExit(f"invalid stand-in settings: {exc}") from None
    runner = asyncio.run
    with contextlib.suppress(ImportError):
        # uvloop roughly halves the stand-in's CPU per request, which matters on a small box.
        import uvloop

        runner = uvloop.run
    runner(serve(args, settings))


if __name__ == "__main__":
    main()
