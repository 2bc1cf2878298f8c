"""``olmocr-tasks``: convert PDFs from the command line, or serve a local engine.

Exit codes of ``convert``: 0 every document converted (or skipped as already converted), 1 some
documents failed (the manifest says which and why), 2 usage error, 3 inference server unavailable,
4 storage unavailable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import urlsplit

from olmocr_tasks import __version__
from olmocr_tasks.config import DEFAULT_MODEL, ConversionSettings, DocumentLimits, PageSettings, ServerSettings
from olmocr_tasks.errors import ConfigurationError, ServerNotReady, ServerUnavailable, StorageError
from olmocr_tasks.manifest import Manifest
from olmocr_tasks.redaction import environment_secrets, install_log_redaction, redact_text

EXIT_OK, EXIT_FAILED_DOCUMENTS, EXIT_USAGE, EXIT_SERVER, EXIT_STORAGE = 0, 1, 2, 3, 4

log = logging.getLogger("olmocr_tasks")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def _add_convert_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a PDF, a folder of PDFs or an s3:// prefix",
        description="Convert PDFs to Dolma JSONL and markdown with olmOCR on an OpenAI-compatible server.",
    )
    parser.add_argument("input", help="a PDF file, a local folder (recursive) or s3://bucket/prefix")
    parser.add_argument("output", help="a local folder or s3://bucket/prefix")
    parser.add_argument(
        "--server",
        action="append",
        required=True,
        help="base URL including /v1, e.g. http://127.0.0.1:8000/v1; repeat (or comma-separate) for replicas",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"served model name (default {DEFAULT_MODEL})")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the Bearer API key")
    parser.add_argument("--run-id", help="manifest name (default: cli-<UTC timestamp>)")
    parser.add_argument("--max-concurrent-requests", type=_positive_int, default=64)
    parser.add_argument("--max-page-retries", type=_positive_int, default=8)
    parser.add_argument("--max-page-error-rate", type=_rate, default=0.004)
    parser.add_argument("--target-longest-image-dim", type=_positive_int, default=1288)
    parser.add_argument("--no-markdown", action="store_true", help="write Dolma JSONL only")
    parser.add_argument("--reprocess", action="store_true", help="convert again even if already converted")
    parser.add_argument("--max-documents", type=_positive_int, help="convert at most this many documents")
    parser.add_argument("--max-failed-attempts", type=_positive_int, default=3, help="runs before a dead letter")
    parser.add_argument("--read-timeout", type=float, default=300.0, help="seconds to wait for one answer")
    parser.add_argument("--outage-window", type=float, default=180.0, help="seconds of failures before giving up")
    parser.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for the server to be ready")
    parser.add_argument("--gpu-hour-price", type=float, help="price of one GPU hour, for the cost estimate")
    parser.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    parser.add_argument(
        "--no-adaptive-concurrency",
        action="store_true",
        help="keep --max-concurrent-requests in flight instead of adapting to vLLM's /metrics queue",
    )
    parser.add_argument("--render-workers", type=_positive_int, help="PDFium worker processes (default: per core)")
    limits = parser.add_argument_group("document limits (hostile or oversized inputs fail as too_large)")
    limits.add_argument(
        "--max-document-bytes",
        type=_positive_int,
        default=DocumentLimits.max_bytes,
        metavar="N",
        help="largest file accepted",
    )
    limits.add_argument(
        "--max-document-pages",
        type=_positive_int,
        default=DocumentLimits.max_pages,
        metavar="N",
        help="most pages accepted",
    )
    limits.add_argument(
        "--max-render-pixels",
        type=_positive_int,
        default=DocumentLimits.max_render_pixels,
        metavar="N",
        help="page images larger than this many pixels are scaled down",
    )
    limits.add_argument(
        "--render-timeout",
        type=_positive_float,
        default=DocumentLimits.render_timeout_s,
        metavar="SECONDS",
        help="seconds one page may take to render before its renderer is killed and the page falls back",
    )
    parser.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from olmocr_tasks.pipeline import RunRequest, run_conversion
    from olmocr_tasks.storage import Storage

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigurationError(f"environment variable {args.api_key_env} is not set")
    servers = tuple(url.strip().rstrip("/") for value in args.server for url in value.split(",") if url.strip())
    settings = ConversionSettings(
        server=ServerSettings(
            base_urls=servers,
            model=args.model,
            api_key=api_key,
            read_timeout_s=args.read_timeout,
            outage_window_s=args.outage_window,
            readiness_timeout_s=args.ready_timeout,
            max_concurrent_requests=args.max_concurrent_requests,
            verify_tls=not args.insecure,
            adaptive_concurrency=not args.no_adaptive_concurrency,
        ),
        page=PageSettings(
            target_longest_image_dim=args.target_longest_image_dim, max_page_retries=args.max_page_retries
        ),
        limits=DocumentLimits(
            max_bytes=args.max_document_bytes,
            max_pages=args.max_document_pages,
            max_render_pixels=args.max_render_pixels,
            render_timeout_s=args.render_timeout,
        ),
        max_page_error_rate=args.max_page_error_rate,
        write_markdown=not args.no_markdown,
        gpu_hour_price=args.gpu_hour_price,
        render_workers=args.render_workers,
    )
    input_uri = args.input if "://" in args.input else os.path.abspath(args.input)
    output_uri = args.output if "://" in args.output else os.path.abspath(args.output)
    if "://" not in args.input and not os.path.exists(input_uri):
        raise ConfigurationError(f"input {args.input} does not exist")
    request = RunRequest(
        input_uri=input_uri,
        output_uri=output_uri,
        run_id=args.run_id or "cli-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        settings=settings,
        reprocess=args.reprocess,
        max_documents=args.max_documents,
        max_failed_attempts=args.max_failed_attempts,
    )
    manifest, uri = run_conversion(request, Storage(), progress_stream=sys.stderr)
    _print_summary(manifest, uri)
    return EXIT_FAILED_DOCUMENTS if manifest.counts()["failed"] else EXIT_OK


def _print_summary(manifest: Manifest, uri: str) -> None:
    counts = manifest.counts()
    metrics = manifest.metrics()
    print(
        f"converted {counts['converted']}, failed {counts['failed']}, skipped {counts['skipped']}, "
        f"already converted {counts['already_converted']}, dead letters {counts['dead_letters']}; "
        f"{counts['pages']} pages ({counts['fallback_pages']} fallback) at {metrics['pages_per_second']} pages/s"
    )
    for doc in manifest.documents:
        if doc.status == "failed":
            print(f"  failed: {doc.source}: {doc.error_class}: {doc.error}")
    print(f"manifest: {uri}")


def _known_secrets(args: argparse.Namespace) -> list[str | None]:
    secrets: list[str | None] = environment_secrets()
    if getattr(args, "api_key_env", None):
        secrets.append(os.environ.get(args.api_key_env))
    for value in getattr(args, "server", None) or []:
        for url in value.split(","):
            try:
                secrets.append(urlsplit(url.strip()).password)
            except ValueError:
                continue  # not a URL at all; the client reports it without echoing a password
    return secrets


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="olmocr-tasks", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert_parser(subparsers)
    from olmocr_tasks.cpu_engine import add_serve_cpu_parser
    from olmocr_tasks.vllm_launcher import add_serve_vllm_parser

    add_serve_cpu_parser(subparsers)
    add_serve_vllm_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secrets = _known_secrets(args)
    # Our own messages are redacted where they are built; this catches what libraries log (botocore
    # prints request headers, session token included, at DEBUG).
    install_log_redaction(secrets)
    try:
        return args.func(args)
    except ConfigurationError as exc:
        print(f"olmocr-tasks: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ServerUnavailable, ServerNotReady) as exc:
        print(f"olmocr-tasks: inference server unavailable: {redact_text(str(exc), secrets)}", file=sys.stderr)
        return EXIT_SERVER
    except StorageError as exc:
        print(f"olmocr-tasks: storage unavailable: {redact_text(str(exc), secrets)}", file=sys.stderr)
        return EXIT_STORAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
