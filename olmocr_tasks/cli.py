"""``olmocr-tasks``: convert PDFs from the command line, or serve a local engine.

Exit codes of ``convert`` follow the run's error-budget verdict, which its manifest records as an
Airflow run's does: 0 within the budget (failed documents, if any, are listed and in the manifest),
1 over the budget (more than ``--max-document-error-rate`` of its own documents failed, or some were
not converted); and 2 usage error, 3 inference server unavailable (or refusing the run part-way: what
it reached is published first), 4 storage unavailable. ``serve-cpu`` and ``serve-vllm`` serve until
SIGTERM/SIGINT and exit 0, 2 on a usage error (Tesseract or vLLM missing, an unset ``--api-key-env``),
1 when they cannot serve.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from olmocr_tasks import __version__
from olmocr_tasks.core.config import (
    DEFAULT_MODEL,
    ConcurrencySettings,
    ConversionSettings,
    DocumentLimits,
    HedgeSettings,
    PageSettings,
    RetrySettings,
    ServerSettings,
    TimeoutSettings,
)
from olmocr_tasks.core.errors import ConfigurationError, ServerNotReady, ServerUnavailable, StorageError
from olmocr_tasks.core.formats import FORMATS, ordered_formats
from olmocr_tasks.core.redaction import environment_secrets, install_log_redaction, redact
from olmocr_tasks.inference.priority import SCHEDULING_POLICIES
from olmocr_tasks.location.manifest import SKIP_CLAIMED, SKIP_RETRY_LATER
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.servers.cpu_engine import (
    CPU_ENGINE_MODEL,
    DEFAULT_OSD_MIN_CONFIDENCE,
    DEFAULT_PORT,
    CpuEngineHandle,
    create_cpu_engine,
)
from olmocr_tasks.servers.vllm_launcher import (
    EndpointSettings,
    ProcessSettings,
    ServingSettings,
    SupervisionSettings,
    VllmOptions,
    VllmSupervisor,
)

if TYPE_CHECKING:
    from olmocr_tasks.location.manifest_reader import ManifestReader

EXIT_OK, EXIT_BUDGET_EXCEEDED, EXIT_USAGE, EXIT_SERVER, EXIT_STORAGE = 0, 1, 2, 3, 4
CONVERT_EXIT_CODES = (
    "exit codes: 0 the run is within its error budget (its manifest records the verdict and lists any "
    "failed documents), 1 the budget is exceeded (more than --max-document-error-rate of its own documents "
    "failed, or some were not converted), 2 usage error, 3 inference server unavailable or refusing the run "
    "(a refusal part-way publishes what the run reached first), 4 storage unavailable"
)

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


def _formats(text: str) -> tuple[str, ...]:
    try:
        return ordered_formats(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_max_failed_attempts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-failed-attempts",
        type=_positive_int,
        default=RunSettings.max_failed_attempts,
        help=f"runs before a dead letter (default {RunSettings.max_failed_attempts})",
    )


def _add_convert_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a PDF or page image, a folder of them or an s3:// prefix",
        description="Convert PDFs and page images (PNG, JPEG, TIFF, WebP) to Dolma JSONL and markdown with olmOCR "
        "on an OpenAI-compatible server.",
        epilog=CONVERT_EXIT_CODES,
    )
    _add_convert_sources(parser)
    _add_server_connection(parser)
    _add_run_options(parser)
    _add_retry_options(parser)
    _add_timeout_options(parser)
    _add_hedging_options(parser)
    _add_request_options(parser)
    _add_rendering_options(parser)
    parser.set_defaults(func=_convert)


def _add_convert_sources(parser: argparse.ArgumentParser) -> None:
    """What to convert and where to: the input, the formats discovered in it, the output."""
    parser.add_argument("input", help="a document file, a local folder (recursive) or s3://bucket/prefix")
    parser.add_argument(
        "--formats",
        type=_formats,
        default=FORMATS,
        metavar="LIST",
        help=f"comma-separated formats to convert (default all: {','.join(FORMATS)}; jpg and tif also accepted); "
        "discovery lists only their extensions and other content fails as unsupported_format",
    )
    parser.add_argument("output", help="a local folder or s3://bucket/prefix")


def _add_server_connection(parser: argparse.ArgumentParser) -> None:
    """The inference server: its replicas, model and API key."""
    parser.add_argument(
        "--server",
        action="append",
        required=True,
        help="base URL including /v1, e.g. http://127.0.0.1:8000/v1; repeat (or comma-separate) for replicas",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"served model name (default {DEFAULT_MODEL})")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the Bearer API key")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """One run: its name, its request window, its page and error budgets, what it converts and writes."""
    parser.add_argument("--run-id", help="manifest name (default: cli-<UTC timestamp>-<random suffix>)")
    parser.add_argument(
        "--max-concurrent-requests", type=_positive_int, default=ConcurrencySettings.max_concurrent_requests
    )
    parser.add_argument("--max-page-retries", type=_positive_int, default=PageSettings.max_page_retries)
    parser.add_argument(
        "--max-page-error-rate",
        type=_rate,
        default=ConversionSettings.max_page_error_rate,
        help="a document fails when more than this share of its pages fell back to the text layer "
        f"(default {ConversionSettings.max_page_error_rate:g})",
    )
    parser.add_argument(
        "--max-document-error-rate",
        type=_rate,
        default=RunSettings.max_document_error_rate,
        help="the run fails (exit 1, after publishing its manifest) when more than this share of its own "
        f"documents failed (default {RunSettings.max_document_error_rate:g}; 0: any failure)",
    )
    parser.add_argument("--target-longest-image-dim", type=_positive_int, default=PageSettings.target_longest_image_dim)
    parser.add_argument("--no-markdown", action="store_true", help="write Dolma JSONL only")
    parser.add_argument("--reprocess", action="store_true", help="convert again even if already converted")
    parser.add_argument("--max-documents", type=_positive_int, help="convert at most this many documents")


def _add_retry_options(parser: argparse.ArgumentParser) -> None:
    """Documents that failed in earlier runs: when they are retried, and when a run's claim on one lapses."""
    _add_max_failed_attempts(parser)
    parser.add_argument("--retry-dead-letters", action="store_true", help="convert dead letters once more")
    parser.add_argument(
        "--retry-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="least time between two runs' attempts at a failing document: set it to how often you run this "
        "(e.g. 3600 from an hourly cron); default 0, every run retries",
    )
    parser.add_argument(
        "--claim-expiry",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="how long a document claim lasts without renewal before another run may take the document over "
        "(default: twice the read timeout plus the connect timeout)",
    )


def _add_timeout_options(parser: argparse.ArgumentParser) -> None:
    """How long to wait for an answer, for a server that stopped answering, and for one to be ready."""
    parser.add_argument(
        "--read-timeout", type=float, default=TimeoutSettings.read_timeout_s, help="seconds to wait for one answer"
    )
    parser.add_argument(
        "--outage-window",
        type=float,
        default=RetrySettings.outage_window_s,
        help="seconds of failures before giving up",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=TimeoutSettings.readiness_timeout_s,
        help="seconds to wait for the server to be ready",
    )


def _add_hedging_options(parser: argparse.ArgumentParser) -> None:
    """When a slow page gets a second request (``inference.hedging``)."""
    parser.add_argument(
        "--hedge-min-delay",
        type=_positive_float,
        default=HedgeSettings.hedge_min_delay_s,
        metavar="SECONDS",
        help="never send a second request for a page outstanding less than this "
        f"(default {HedgeSettings.hedge_min_delay_s:g})",
    )
    parser.add_argument(
        "--hedge-multiple",
        type=_positive_float,
        default=HedgeSettings.hedge_multiple,
        help="while vLLM's queue holds requests, hedge a page outstanding this many times the recent p95 "
        f"answer time (default {HedgeSettings.hedge_multiple:g})",
    )
    parser.add_argument(
        "--hedge-idle-multiple",
        type=_positive_float,
        default=HedgeSettings.hedge_idle_multiple,
        help="while vLLM's queue is empty, hedge a page outstanding this many times the recent p95 answer "
        f"time since the queue emptied (default {HedgeSettings.hedge_idle_multiple:g})",
    )
    parser.add_argument("--no-hedging", action="store_true", help="never send a second request for a slow page")


def _add_request_options(parser: argparse.ArgumentParser) -> None:
    """How requests are sent and accounted: cost estimate, TLS, guided decoding, adaptive window."""
    parser.add_argument("--gpu-hour-price", type=float, help="price of one GPU hour, for the cost estimate")
    parser.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    parser.add_argument(
        "--guided-decoding",
        action="store_true",
        help="constrain answers to olmOCR's front matter (olmOCR's --guided_decoding; needs vLLM)",
    )
    parser.add_argument(
        "--no-adaptive-concurrency",
        action="store_true",
        help="keep --max-concurrent-requests in flight instead of adapting to vLLM's /metrics queue",
    )


def _add_rendering_options(parser: argparse.ArgumentParser) -> None:
    """Rendering: its worker processes and the limits that stop hostile or oversized documents."""
    parser.add_argument("--render-workers", type=_positive_int, help="PDFium worker processes (default: per core)")
    limits = parser.add_argument_group(
        "document limits (hostile or oversized inputs fail as too_large or too_many_pages)"
    )
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
        help="most pages accepted (more fail as too_many_pages before any rendering)",
    )
    limits.add_argument(
        "--max-render-pixels",
        type=_positive_int,
        default=DocumentLimits.max_render_pixels,
        metavar="N",
        help="page images larger than this many pixels are scaled down",
    )
    limits.add_argument(
        "--max-image-pixels",
        type=_positive_int,
        default=DocumentLimits.max_image_pixels,
        metavar="N",
        help="a page image (PNG, JPEG, TIFF, WebP) of more pixels as stored fails as too_large before it is decoded",
    )
    limits.add_argument(
        "--render-timeout",
        type=_positive_float,
        default=DocumentLimits.render_timeout_s,
        metavar="SECONDS",
        help="seconds one page may take to render before its renderer is killed and the page falls back",
    )
    limits.add_argument(
        "--render-memory-bytes",
        type=_positive_int,
        default=DocumentLimits.render_memory_bytes,
        metavar="N",
        help="address space of one render worker; a page that needs more fails its document as too_large",
    )


def default_run_id(now: datetime | None = None) -> str:
    """``cli-<UTC time to the second>-<6 random hex digits>``: two runs started in the same second get
    different manifests, and ids still sort by start time."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"cli-{stamp}-{token_hex(3)}"


def _convert(args: argparse.Namespace) -> int:
    from olmocr_tasks.run.pipeline import run_conversion
    from olmocr_tasks.run.request import resolve_run
    from olmocr_tasks.storage.store import Storage

    api_key = _api_key_from_env(args.api_key_env)
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
            guided_decoding=args.guided_decoding,
            adaptive_concurrency=not args.no_adaptive_concurrency,
            hedge_requests=not args.no_hedging,
            hedge_min_delay_s=args.hedge_min_delay,
            hedge_multiple=args.hedge_multiple,
            hedge_idle_multiple=args.hedge_idle_multiple,
        ),
        page=PageSettings(
            target_longest_image_dim=args.target_longest_image_dim, max_page_retries=args.max_page_retries
        ),
        limits=DocumentLimits(
            max_bytes=args.max_document_bytes,
            max_pages=args.max_document_pages,
            max_render_pixels=args.max_render_pixels,
            max_image_pixels=args.max_image_pixels,
            render_timeout_s=args.render_timeout,
            render_memory_bytes=args.render_memory_bytes,
        ),
        write_markdown=not args.no_markdown,
        gpu_hour_price=args.gpu_hour_price,
        render_workers=args.render_workers,
    )
    input_uri = args.input if "://" in args.input else os.path.abspath(args.input)
    output_uri = args.output if "://" in args.output else os.path.abspath(args.output)
    if "://" not in args.input and not os.path.exists(input_uri):
        raise ConfigurationError(f"input {args.input} does not exist")
    # The flags the DAGs' Params share (reprocess, formats, the error budgets...) are read by their
    # shared names, through the builder Airflow's plan uses too.
    request = resolve_run(
        vars(args),
        input_uri=input_uri,
        output_uri=output_uri,
        run_id=args.run_id or default_run_id(),
        settings=settings,
        retry_interval=timedelta(seconds=args.retry_interval),
        claim_expiry_s=args.claim_expiry,
    )
    manifest, uri = run_conversion(request, Storage(), progress_stream=sys.stderr)
    _print_summary(manifest, uri)
    return EXIT_BUDGET_EXCEEDED if manifest.error_budget().get("exceeded") else EXIT_OK


def _add_dead_letters_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dead-letters",
        help="list the PDFs an output location gave up on",
        description="List the dead letters of an output location (PDFs that failed in too many runs), one "
        "per line: source, failed runs, last error. Take them back with convert --retry-dead-letters "
        "or the DAGs' retry_dead_letters Param.",
    )
    parser.add_argument("output", help="a local folder or s3://bucket/prefix")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"served model name (default {DEFAULT_MODEL})")
    parser.add_argument("--target-longest-image-dim", type=_positive_int, default=PageSettings.target_longest_image_dim)
    _add_max_failed_attempts(parser)
    parser.set_defaults(func=_dead_letters)


def _dead_letters(args: argparse.Namespace) -> int:
    from olmocr_tasks.run.planning import list_dead_letters
    from olmocr_tasks.run.request import run_conversion_key
    from olmocr_tasks.storage.store import Storage

    output_uri = args.output if "://" in args.output else os.path.abspath(args.output)
    key = run_conversion_key(args.model, args.target_longest_image_dim)
    for entry in list_dead_letters(output_uri, Storage(), key, args.max_failed_attempts):
        print(f"{entry.source}\t{entry.failed_attempts}\t{entry.error}")
    return EXIT_OK


def _add_manifest_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "manifest",
        help="print a run's manifest summary, or stream its documents",
        description="Print the summary of a run's manifest (counts, metrics, error budget, cost, shards) as "
        "JSON; with --documents stream every document entry as JSON Lines instead, one object per line, "
        "whatever the manifest's layout (entries in shards or, before schema 3, inline). The stable way "
        "for scripts and jq to read a run.",
    )
    parser.add_argument("output", help="the run's output location: a local folder or s3://bucket/prefix")
    parser.add_argument("run_id", help="the run id (the name of manifests/<run-id>.json)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--documents", action="store_true", help="stream every document entry as JSON Lines")
    what.add_argument("--dead-letters", action="store_true", help="stream the run's dead letters as JSON Lines")
    parser.set_defaults(func=_manifest)


def _manifest(args: argparse.Namespace) -> int:
    from olmocr_tasks.location.manifest_reader import read_manifest
    from olmocr_tasks.storage.store import Storage

    output_uri = args.output if "://" in args.output else os.path.abspath(args.output)
    manifest = read_manifest(Storage(), output_uri, args.run_id)
    if manifest is None:
        raise ConfigurationError(f"no published manifest for run {args.run_id!r} under {output_uri}")
    if not (args.documents or args.dead_letters):
        print(json.dumps(manifest.summary, indent=1, ensure_ascii=False))
        return EXIT_OK
    entries = manifest.iter_documents() if args.documents else manifest.iter_dead_letters()
    try:
        for entry in entries:
            sys.stdout.write(json.dumps(entry, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (``| head``): not an error. Python would complain at exit otherwise.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def _add_clean_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "clean",
        help="remove finished run folders and obsolete state from an output location",
        description="Remove _runs/<run>/ folders of published runs untouched for --older-than-days, and state "
        "that no longer serves a pending document (failure markers of converted versions, saved pages of "
        "converted documents). Never touches outputs, manifests, or anything a running or unpublished run needs.",
    )
    parser.add_argument("output", help="a local folder or s3://bucket/prefix")
    parser.add_argument("--older-than-days", type=float, required=True, metavar="N", help="keep anything newer")
    parser.add_argument("--dry-run", action="store_true", help="report what would be removed, remove nothing")
    parser.set_defaults(func=_clean)


def _clean(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from olmocr_tasks.location.retention import clean_output
    from olmocr_tasks.storage.store import Storage

    if args.older_than_days < 0:
        raise ConfigurationError("--older-than-days must not be negative")
    output_uri = args.output if "://" in args.output else os.path.abspath(args.output)
    report = clean_output(output_uri, Storage(), older_than=timedelta(days=args.older_than_days), dry_run=args.dry_run)
    for folder in report.removed_runs:
        print(f"{'would remove' if args.dry_run else 'removed'}\t{folder}")
    for folder, reason in report.kept_runs.items():
        print(f"kept\t{folder}\t{reason}")
    print(report.summary())
    return EXIT_OK


def _print_summary(manifest: ManifestReader, uri: str) -> None:
    counts = manifest.counts()
    metrics = manifest.metrics()
    print(
        f"converted {counts['converted']}, failed {counts['failed']}, skipped {counts['skipped']}, "
        f"already converted {counts['already_converted']}, dead letters {counts['dead_letters']}; "
        f"{counts['pages']} pages ({counts['fallback_pages']} fallback) at {metrics['pages_per_second']} pages/s"
    )
    for doc in manifest.iter_entries():  # streamed: a big run's entries are never all in memory
        if doc.status == "failed":
            again = " (re-driven)" if doc.redriven else ""
            print(f"  failed{again}: {doc.source}: {doc.error_class}: {doc.error}")
        elif doc.skip_reason == SKIP_CLAIMED:
            print(f"  left for later: {doc.source}: claimed by run {doc.claimed_by}")
        elif doc.skip_reason == SKIP_RETRY_LATER:
            print(f"  left for later: {doc.source}: failed recently, tried again from {doc.retry_from}")
    verdict = manifest.error_budget()
    if verdict.get("exceeded"):
        print("error budget exceeded: " + "; ".join(verdict.get("problems") or ()))
    elif verdict:
        print(f"within the error budget ({verdict['max_document_error_rate']:.1%} of documents may fail)")
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


def _api_key_from_env(variable: str | None) -> str | None:
    """The key held in ``$variable`` (``--api-key-env``); naming an unset or empty variable is a usage error."""
    if not variable:
        return None
    value = os.environ.get(variable)
    if not value:
        raise ConfigurationError(f"--api-key-env {variable}: environment variable {variable} is not set")
    return value


def _serve_until_signalled(serve: Callable[[], int], request_stop: Callable[[int], None]) -> int:
    """Run ``serve`` on this thread; SIGTERM and SIGINT call ``request_stop(signum)`` (vLLM's launcher
    passes the signal on to vLLM), then ``serve``'s exit code is returned."""

    def _stop(signum: int, frame: object) -> None:
        request_stop(signum)

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return serve()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _add_serve_cpu_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-cpu",
        help="serve olmOCR's protocol on the CPU with Tesseract (demo / no GPU; lower quality)",
        description=(
            "Run an OpenAI-compatible server that answers olmOCR page requests with Tesseract OCR. "
            "Point the olmocr_vllm connection (or --server) at the printed URL."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks one)")
    parser.add_argument(
        "--served-model-name",
        default=CPU_ENGINE_MODEL,
        help=f"model name to answer to (default {CPU_ENGINE_MODEL}; the connection's model must match)",
    )
    parser.add_argument(
        "--api-key-env", metavar="VAR", help="require 'Authorization: Bearer <value of $VAR>' on /v1 routes"
    )
    parser.add_argument(
        "--max-concurrency",
        type=_positive_int,
        default=os.cpu_count() or 1,
        help="Tesseract processes at once; further requests wait (default: CPU count)",
    )
    parser.add_argument(
        "--tesseract", dest="tesseract_binary", default="tesseract", help="tesseract binary (default: on PATH)"
    )
    parser.add_argument("--lang", default="eng", help="Tesseract language(s), e.g. eng or eng+deu (default eng)")
    parser.add_argument(
        "--no-rotation",
        dest="detect_rotation",
        action="store_false",
        help="skip orientation detection (report every page upright)",
    )
    parser.add_argument(
        "--osd-min-confidence",
        type=float,
        default=DEFAULT_OSD_MIN_CONFIDENCE,
        help="minimum Tesseract OSD confidence to report a page as rotated",
    )
    parser.add_argument(
        "--page-timeout",
        dest="page_timeout_s",
        type=_positive_float,
        default=120.0,
        help="seconds before a Tesseract run is killed (default 120)",
    )
    parser.set_defaults(func=_serve_cpu)


def _serve_cpu(args: argparse.Namespace) -> int:
    api_key = _api_key_from_env(args.api_key_env)
    try:
        server = create_cpu_engine(
            args.host,
            args.port,
            served_model_name=args.served_model_name,
            api_key=api_key,
            max_concurrency=args.max_concurrency,
            tesseract_binary=args.tesseract_binary,
            lang=args.lang,
            detect_rotation=args.detect_rotation,
            osd_min_confidence=args.osd_min_confidence,
            page_timeout_s=args.page_timeout_s,
        )
    except OSError as exc:
        print(f"olmocr-tasks: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    engine = CpuEngineHandle(server)
    return _serve_until_signalled(engine.serve, engine.request_stop)


def _add_serve_vllm_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-vllm",
        help="start and supervise vLLM serving olmOCR on this GPU host",
        description=(
            "Run 'vllm serve' with olmOCR's arguments, wait until it serves the model, print the Airflow "
            "connection, restart it if it dies. Arguments after '--' go to vllm serve unchanged."
        ),
    )
    # The launcher's own defaults (the groups of VllmOptions), not restated here.
    serving, endpoint, process, supervision = (
        ServingSettings(),
        EndpointSettings(),
        ProcessSettings(),
        SupervisionSettings(),
    )
    parser.add_argument("--model", default=serving.model, help=f"model id or path (default {serving.model})")
    parser.add_argument("--served-model-name", help="name clients use (default: --model)")
    parser.add_argument("--host", default=endpoint.host, help=f"address vLLM binds (default {endpoint.host})")
    parser.add_argument("--port", type=int, default=endpoint.port, help=f"port (default {endpoint.port})")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=serving.max_model_len,
        help=f"context length (default {serving.max_model_len})",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=serving.gpu_memory_utilization,
        help=f"fraction of GPU memory ({serving.gpu_memory_utilization:g})",
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=serving.tensor_parallel_size)
    parser.add_argument("--data-parallel-size", type=int, default=serving.data_parallel_size)
    parser.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default=serving.scheduling_policy,
        help="vLLM's scheduling policy; 'priority' serves high-priority runs first and the printed "
        f"connection says so (default {serving.scheduling_policy})",
    )
    parser.add_argument("--api-key-env", metavar="VAR", help="require the Bearer key held in $VAR (passed to vLLM)")
    parser.add_argument(
        "--vllm-binary", default=process.vllm_binary, help=f"vllm command (default: {process.vllm_binary} on PATH)"
    )
    parser.add_argument(
        "--conn-id", default=endpoint.conn_id, help=f"Airflow connection id to print ({endpoint.conn_id})"
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=supervision.ready_timeout_s,
        help=f"seconds to wait for the model ({supervision.ready_timeout_s:g})",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=supervision.max_restarts,
        help=f"restarts after crashes before giving up ({supervision.max_restarts})",
    )
    parser.add_argument("vllm_args", nargs="*", metavar="-- VLLM_ARGS", help="extra arguments for vllm serve")
    parser.set_defaults(func=_serve_vllm)


def vllm_options_from_args(args: argparse.Namespace) -> VllmOptions:
    """``serve-vllm``'s arguments as launcher options."""
    return VllmOptions(
        serving=ServingSettings(
            model=args.model,
            served_model_name=args.served_model_name,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            tensor_parallel_size=args.tensor_parallel_size,
            data_parallel_size=args.data_parallel_size,
            scheduling_policy=args.scheduling_policy,
        ),
        endpoint=EndpointSettings(host=args.host, port=args.port, api_key_env=args.api_key_env, conn_id=args.conn_id),
        process=ProcessSettings(vllm_binary=args.vllm_binary, extra_args=tuple(args.vllm_args)),
        supervision=SupervisionSettings(ready_timeout_s=args.ready_timeout, max_restarts=args.max_restarts),
    )


def _serve_vllm(args: argparse.Namespace) -> int:
    # The supervisor reads --api-key-env itself: it hands the key to vLLM through the environment.
    supervisor = VllmSupervisor(vllm_options_from_args(args))
    return _serve_until_signalled(supervisor.run, supervisor.request_stop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="olmocr-tasks", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert_parser(subparsers)
    _add_dead_letters_parser(subparsers)
    _add_manifest_parser(subparsers)
    _add_clean_parser(subparsers)
    _add_serve_cpu_parser(subparsers)
    _add_serve_vllm_parser(subparsers)
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
        print(f"olmocr-tasks: inference server unavailable: {redact(str(exc), secrets)}", file=sys.stderr)
        return EXIT_SERVER
    except StorageError as exc:
        print(f"olmocr-tasks: storage unavailable: {redact(str(exc), secrets)}", file=sys.stderr)
        return EXIT_STORAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
