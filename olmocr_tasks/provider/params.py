"""The trigger forms (Params) of the conversion DAGs, with their defaults from the environment.

Defaults are read when the DAG file is parsed: ``OLMOCR_INPUT_URI``, ``OLMOCR_OUTPUT_URI`` and
``OLMOCR_LOOKBACK_INTERVALS``; the error budgets' defaults are the engine's (``ConversionSettings``,
``RunSettings``). The scope and lookback defaults are owned here (``DEFAULT_SCOPE``,
``DEFAULT_LOOKBACK_INTERVALS``): they are about Airflow's data intervals, which the engine and the CLI
never see (they get a LastModified window), and ``provider.run_requests`` falls back to them.
"""

from __future__ import annotations

from airflow.sdk import Param

from olmocr_tasks.core import environment
from olmocr_tasks.core.config import ConversionSettings
from olmocr_tasks.core.formats import FORMATS
from olmocr_tasks.inference.priority import AUTO, CLASSES
from olmocr_tasks.run.settings import RunSettings

# Which PDFs discovery considers (the ``scope`` Param).
SCOPES = ("auto", "interval", "all")
DEFAULT_SCOPE = "auto"
# How many intervals before its own a scheduled run's window opens (``run_requests.resolve_window``).
DEFAULT_LOOKBACK_INTERVALS = 1.0


def ingest_params() -> dict[str, Param]:
    """The trigger form of the ingestion DAG."""
    return {
        "input_uri": Param(
            environment.input_uri(),
            type=["null", "string"],
            title="Input",
            description="Where the PDFs are: s3://bucket/prefix/ or a local folder (default: OLMOCR_INPUT_URI).",
            section="Input and output",
        ),
        "output_uri": Param(
            environment.output_uri(),
            type=["null", "string"],
            title="Output",
            description="Where markdown, Dolma records and manifests go (default: OLMOCR_OUTPUT_URI).",
            section="Input and output",
        ),
        "documents": Param(
            None,
            type=["null", "array"],
            items={"type": "string"},
            title="Documents",
            description="Convert only these PDF URIs (one per line) instead of discovering the input.",
            section="What to convert",
        ),
        "scope": Param(
            DEFAULT_SCOPE,
            type="string",
            enum=list(SCOPES),
            values_display={
                "auto": "auto: this interval for scheduled and backfill runs, everything otherwise",
                "interval": "interval: PDFs last modified in this run's data interval",
                "all": "all: every PDF not converted yet",
            },
            title="Scope",
            description="Which PDFs discovery considers; ignored when Documents is given.",
            section="What to convert",
        ),
        "reprocess": Param(
            False,
            type="boolean",
            title="Reprocess",
            description="Convert again even if a PDF was already converted with this model and prompt.",
            section="What to convert",
        ),
        "lookback_intervals": Param(
            _lookback_default(),
            type="number",
            minimum=0,
            title="Lookback (intervals)",
            description=(
                "Scheduled runs also list PDFs modified this many intervals before their own, so late and "
                "multipart uploads (S3 dates them when the upload started) are not missed; already converted "
                f"ones cost nothing (default: OLMOCR_LOOKBACK_INTERVALS or {DEFAULT_LOOKBACK_INTERVALS:g}). "
                "Backfill runs do not look back: they list past intervals after the fact, and adjacent ones run "
                "at once."
            ),
            section="What to convert",
        ),
        "max_documents": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Max documents",
            description="Convert at most this many PDFs in this run (empty: no limit).",
            section="What to convert",
        ),
        "formats": Param(
            list(FORMATS),
            type="array",
            items={"type": "string", "enum": list(FORMATS)},
            minItems=1,
            uniqueItems=True,
            title="Formats",
            description=(
                "Which inputs to convert: pdf, and page images (png, jpeg, tiff, webp; multi-page TIFF is one "
                "document). Discovery lists only these extensions, in any letter case; a file whose content "
                "is of another format fails as unsupported_format."
            ),
            section="What to convert",
        ),
        **_shared_params(),
    }


def event_params() -> dict[str, Param]:
    """The trigger form of the S3-event DAG: the events choose the documents."""
    params = ingest_params()
    params["input_uri"] = Param(
        environment.input_uri(),
        type=["null", "string"],
        title="Input prefix",
        description="Output names mirror keys relative to this prefix, as in the ingestion DAG.",
        section="Input and output",
    )
    for name in ("documents", "scope", "lookback_intervals", "max_documents"):
        del params[name]
    return params


def _shared_params() -> dict[str, Param]:
    return {
        "max_page_error_rate": Param(
            ConversionSettings.max_page_error_rate,
            type="number",
            minimum=0,
            maximum=1,
            title="Max page error rate",
            description="A document fails when more than this share of its pages could not be converted.",
            section="Error budgets",
        ),
        "max_document_error_rate": Param(
            RunSettings.max_document_error_rate,
            type="number",
            minimum=0,
            maximum=1,
            title="Max document error rate",
            description="The run fails (after publishing its manifest) when more documents than this share fail.",
            section="Error budgets",
        ),
        "retry_dead_letters": Param(
            False,
            type="boolean",
            title="Retry dead letters",
            description=(
                "Convert dead letters once more (every run re-drives failed PDFs until they become dead letters)."
            ),
            section="Error budgets",
        ),
        "max_failed_attempts": Param(
            RunSettings.max_failed_attempts,
            type="integer",
            minimum=1,
            title="Max failed attempts",
            description="A PDF that failed in this many runs is listed as a dead letter instead of retried.",
            section="Error budgets",
        ),
        "max_concurrent_requests": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Max concurrent requests",
            description="In-flight page requests per convert task (empty: the connection's setting).",
            section="Server",
        ),
        "priority_class": Param(
            AUTO,
            type="string",
            enum=[AUTO, *CLASSES],
            values_display={
                AUTO: "auto: high for listed documents and S3 events, normal for scheduled runs, low for "
                "backfills and runs over everything",
                **{name: name for name in CLASSES},
            },
            title="Priority class",
            description=(
                "Which runs go first for a convert slot and, when the vLLM connection's scheduling_policy is "
                "priority, in vLLM's queue (olmocr_tasks.inference.priority)."
            ),
            section="Server",
        ),
        "batch_pages": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Pages per convert task",
            description=(
                "Documents with at least this many pages get their own convert task; smaller ones are "
                "packed until a task has this many (empty: OLMOCR_BATCH_PAGES, else the requests in flight "
                "per task). Pages are estimated from file sizes (OLMOCR_BYTES_PER_PAGE)."
            ),
            section="Server",
        ),
    }


def _lookback_default() -> float:
    return environment.lookback_intervals(DEFAULT_LOOKBACK_INTERVALS)
