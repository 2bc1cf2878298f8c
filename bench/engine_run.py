"""Run one conversion like ``olmocr-tasks convert`` does, with engine settings the CLI does not expose.

The backpressure comparison needs adaptive concurrency switched off, which is a ``ServerSettings``
field without a CLI flag; this driver builds the same ``RunRequest`` the CLI builds and calls the same
``run_conversion``, so the only difference from a CLI run is the setting under test.

    python -m bench.engine_run INPUT OUTPUT --server URL --model NAME [--no-adaptive] [--window N]
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_run")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--server", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--run-id")
    parser.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--window", type=int, default=64, help="max in-flight requests (the CLI's default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from olmocr_tasks.core.config import ConversionSettings, ServerSettings
    from olmocr_tasks.run.pipeline import run_conversion
    from olmocr_tasks.run.request import RunRequest
    from olmocr_tasks.storage.store import Storage

    settings = ConversionSettings(
        server=ServerSettings(
            base_urls=(args.server.rstrip("/"),),
            model=args.model,
            max_concurrent_requests=args.window,
            adaptive_concurrency=args.adaptive,
        )
    )
    request = RunRequest(
        input_uri=args.input,
        output_uri=args.output,
        run_id=args.run_id or "bench-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        settings=settings,
    )
    manifest, _ = run_conversion(request, Storage(), progress_stream=sys.stderr)
    return 1 if manifest.counts()["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
