"""Settings shared by the CLI and the Airflow tasks.

Every knob has olmOCR 0.4.27's default where olmOCR has one; the others are ours and documented in
the README. Settings are frozen dataclasses so they can be logged, hashed and put in a manifest.
Secrets (the API key) are never fields of a settings object that reaches a manifest: see
``ServerSettings.public_dict``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.core.formats import FORMATS

DEFAULT_MODEL = "allenai/olmOCR-2-7B-1025-FP8"


@dataclass(frozen=True)
class ConnectionSettings:
    """Which server, which model, and who we are to it."""

    base_urls: tuple[str, ...] = ("http://127.0.0.1:8000/v1",)
    model: str = DEFAULT_MODEL
    api_key: str | None = field(default=None, repr=False)
    verify_tls: bool = True
    # olmOCR's --guided_decoding: answers constrained to its front matter, in the field the server's vLLM
    # version reads (olmocr_tasks.inference.guided); off by default, as in olmOCR.
    guided_decoding: bool = False


# How long a vLLM server may take to start cold: download, load and compile a 7B model, warm up. Whatever
# waits for a server to come up from nothing waits this long: Airflow's ``check_server`` (deferred in the
# triggerer; ``OLMOCR_SERVER_READY_TIMEOUT``) and ``serve-vllm`` for the vLLM process it started
# (``--ready-timeout``). The compose file allows vLLM as long.
COLD_START_TIMEOUT_S = 30 * 60.0


@dataclass(frozen=True)
class TimeoutSettings:
    """How long one request, or a conversion's wait for its server to answer, may take."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0
    write_timeout_s: float = 60.0
    # A conversion's readiness check before its first page: the server should be serving already (an
    # Airflow run's check_server waited for its start, ``COLD_START_TIMEOUT_S``), so a minute tells a
    # server that is down or refuses this client from one that is slow to answer, and an attempt
    # fails in a minute instead of half an hour.
    readiness_timeout_s: float = 60.0


@dataclass(frozen=True)
class RetrySettings:
    """How long a failing request is retried, and when failing requests are an outage."""

    # Transport errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter for at
    # most this long per request before the request counts as one failed page attempt.
    request_retry_budget_s: float = 120.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    # When no request has succeeded for this long while requests keep failing (and, for failures
    # without an answer such as timeouts, the server also fails its readiness probes), the server is
    # declared unavailable and the conversion stops (it never degrades an outage into fallback pages).
    outage_window_s: float = 180.0


@dataclass(frozen=True)
class HedgeSettings:
    """When a slow request gets a second one (see ``olmocr_tasks.inference.hedging_policy``).

    A request outstanding for hedge_multiple x the hedge_percentile of recent answer times, or
    hedge_idle_multiple x that after the server's queue emptied, and never before hedge_min_delay_s,
    gets a second request for the same page when the server has room; the first answer wins. Hedges
    are never page attempts.
    """

    hedge_requests: bool = True
    hedge_percentile: float = 0.95
    hedge_multiple: float = 3.0
    hedge_idle_multiple: float = 1.25
    hedge_min_delay_s: float = 1.0
    max_hedges_per_request: int = 2


@dataclass(frozen=True)
class ConcurrencySettings:
    """How many requests are in flight, and how they queue at the server (``backpressure``, ``priority``)."""

    max_concurrent_requests: int = 64
    # Read vLLM's /metrics and shrink the in-flight window when its waiting queue grows.
    adaptive_concurrency: bool = True
    # The adaptive window never goes below this, and /metrics is read this often to size it.
    min_concurrent_requests: int = 4
    metrics_poll_interval_s: float = 1.0
    # vLLM's --scheduling-policy of the deployment ("fcfs" or "priority"); only with "priority" does
    # every request carry the run's ``priority`` (olmocr_tasks.inference.priority), which fcfs would ignore.
    scheduling_policy: str = "fcfs"
    priority: int = 0


class SettingGroups:
    """The groups of a settings object made of small frozen groups, such as ``ServerSettings``.

    Such an object is built from groups, from single settings by name, or both (names win over their
    group), so every setting's name is unique across its groups: callers, connection extras and
    manifests name a setting without its group.
    """

    def __init__(self, owner: str, kinds: dict[str, type]) -> None:
        self.owner = owner
        self.kinds = kinds
        self._group_of = {f.name: group for group, kind in kinds.items() for f in dataclasses.fields(kind)}
        if len(self._group_of) != sum(len(dataclasses.fields(kind)) for kind in kinds.values()):
            raise TypeError(f"{owner}: a setting's name is in two of its groups")

    def assign(self, target: object, given: dict[str, Any], settings: dict[str, Any]) -> None:
        """Set each group of the frozen ``target``: the one ``given`` (or its defaults), with ``settings`` in it."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in settings.items():
            if name not in self._group_of:
                raise TypeError(f"{self.owner} has no setting {name!r}")
            changes.setdefault(self._group_of[name], {})[name] = value
        for group, kind in self.kinds.items():
            value = given[group] if given.get(group) is not None else kind()
            if group in changes:
                value = dataclasses.replace(value, **changes[group])
            object.__setattr__(target, group, value)


_GROUPS = SettingGroups(
    "ServerSettings",
    {
        "connection": ConnectionSettings,
        "timeouts": TimeoutSettings,
        "retries": RetrySettings,
        "hedging": HedgeSettings,
        "concurrency": ConcurrencySettings,
    },
)


@dataclass(frozen=True, init=False)
class ServerSettings:
    """Where the OpenAI-compatible inference server lives and how to talk to it, in five small groups.

    Build it from groups, from single settings by name, or both (names win over their group)::

        ServerSettings(timeouts=TimeoutSettings(read_timeout_s=60), max_concurrent_requests=8)

    ``dataclasses.replace(settings, read_timeout_s=5)`` changes single settings the same way.
    """

    connection: ConnectionSettings
    timeouts: TimeoutSettings
    retries: RetrySettings
    hedging: HedgeSettings
    concurrency: ConcurrencySettings

    def __init__(
        self,
        *,
        connection: ConnectionSettings | None = None,
        timeouts: TimeoutSettings | None = None,
        retries: RetrySettings | None = None,
        hedging: HedgeSettings | None = None,
        concurrency: ConcurrencySettings | None = None,
        **settings: Any,
    ) -> None:
        given: dict[str, Any] = {
            "connection": connection,
            "timeouts": timeouts,
            "retries": retries,
            "hedging": hedging,
            "concurrency": concurrency,
        }
        _GROUPS.assign(self, given, settings)

    def public_dict(self) -> dict[str, Any]:
        """The settings as they may appear in logs and manifests, by name: no secret, no credentials in URLs."""
        data: dict[str, Any] = {}
        for group in _GROUPS.kinds:
            data.update(dataclasses.asdict(getattr(self, group)))
        data.pop("api_key")
        data["base_urls"] = _redacted_urls(self.connection.base_urls)
        data["api_key_set"] = self.connection.api_key is not None
        return data

    @property
    def access(self) -> ServerAccess:
        """Where the server is and the key to it (``ServerAccess``)."""
        return ServerAccess(self.connection.base_urls, self.connection.api_key)

    def with_access(self, access: ServerAccess) -> ServerSettings:
        """These settings for the server ``access`` names, with its key."""
        return dataclasses.replace(self, base_urls=access.base_urls, api_key=access.api_key)

    def to_dict(self) -> dict[str, Any]:
        """The settings by group, for a record that outlives the process (a resolved run): no API key, and
        the base URLs without their credentials. Whoever reads them back adds a ``ServerAccess``."""
        data = {group: dataclasses.asdict(getattr(self, group)) for group in _GROUPS.kinds}
        del data["connection"]["api_key"]
        data["connection"]["base_urls"] = _redacted_urls(self.connection.base_urls)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerSettings:
        """``to_dict`` read back (no key: see ``with_access``); a group or setting left out keeps its default."""
        _refuse_unknown(data, _GROUPS.kinds, "server settings")
        return cls(**{group: _from_fields(kind, data.get(group, {})) for group, kind in _GROUPS.kinds.items()})


@dataclass(frozen=True)
class ServerAccess:
    """Where a run's server is and the key to it: what a resolved run leaves out (``ServerSettings.to_dict``).

    An Airflow task reads it from the vLLM connection when it uses the server: the key stays out of
    every record, and a server moved to another address mid-run is followed.
    """

    base_urls: tuple[str, ...]
    api_key: str | None = field(default=None, repr=False)


def _redacted_urls(urls: tuple[str, ...]) -> list[str]:
    from olmocr_tasks.core.redaction import redact_url

    return [redact_url(url) for url in urls]


def _refuse_unknown(data: dict[str, Any], known: Any, what: str) -> None:
    # A setting this version does not know would be dropped silently: the run would be converted
    # otherwise than it was planned.
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigurationError(f"unknown {what}: {', '.join(unknown)} (written by another version?)")


def _from_fields(kind: Any, data: dict[str, Any], **groups: Any) -> Any:
    """Frozen settings from their ``dataclasses.asdict`` read back from JSON (lists are tuples again);
    ``groups``: the nested settings, already read back."""
    _refuse_unknown(data, [item.name for item in dataclasses.fields(kind)], kind.__name__)
    values = {name: tuple(value) if isinstance(value, list) else value for name, value in data.items()}
    return kind(**values, **groups)


@dataclass(frozen=True)
class PageSettings:
    """olmOCR's page protocol knobs."""

    target_longest_image_dim: int = 1288
    max_page_retries: int = 8
    max_tokens: int = 8000
    model_max_context: int = 16384
    # PNG zlib level for page images: the pixels are identical at every level; 1 costs a fraction of
    # the CPU of Pillow's default 6 for a slightly larger request body.
    png_compress_level: int = 1


@dataclass(frozen=True)
class DocumentLimits:
    """Guards that turn hostile or oversized inputs into typed failures instead of crashes."""

    max_bytes: int = 512 * 1024 * 1024
    # olmOCR-style page cap, checked when a document is opened (before any page is rendered): a few
    # hundred KB of PDF can hold thousands of pages, each sent up to max_page_retries times.
    max_pages: int = 2000
    # Renders larger than this many pixels are scaled down (enormous page boxes).
    max_render_pixels: int = 1288 * 1288 * 4
    # Pixels of one page of an image document (PNG, JPEG, TIFF, WebP) as stored, before it is scaled:
    # decoding needs memory in proportion, so a bigger image (a decompression bomb: a few KB that
    # declare 100,000 x 100,000 pixels) fails as too_large before it is decoded. Pillow's own bomb
    # threshold (twice its warning level), about 13,400 x 13,400: an A0 sheet at 400 dpi.
    max_image_pixels: int = 178_956_970
    render_timeout_s: float = 120.0
    # Address space of one render worker (RLIMIT_AS): a page whose render needs more (a content stream
    # or image that decompresses to gigabytes) fails its document as too_large instead of exhausting
    # the host. A worker needs ~100 MiB of its own plus ~60 MiB per page at the largest render.
    render_memory_bytes: int = 2 * 1024 * 1024 * 1024
    # CPU seconds one render worker may use in its lifetime (the hard RLIMIT_CPU); the pool replaces a
    # worker before it gets there, so only a worker that escapes its per-request limit ever meets it.
    render_worker_cpu_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.render_worker_cpu_s < 2 * self.render_timeout_s:
            # The pool retires a worker once one more request could reach the limit: a lifetime
            # shorter than two requests would retire one after every page.
            raise ConfigurationError(
                f"render_worker_cpu_s ({self.render_worker_cpu_s:g}) must be at least twice render_timeout_s "
                f"({self.render_timeout_s:g})"
            )


@dataclass(frozen=True)
class ConversionSettings:
    """Everything that shapes one conversion run."""

    server: ServerSettings = field(default_factory=ServerSettings)
    page: PageSettings = field(default_factory=PageSettings)
    limits: DocumentLimits = field(default_factory=DocumentLimits)
    max_page_error_rate: float = 0.004
    write_markdown: bool = True
    # The input formats this run converts (``core.formats``): discovery lists only their names, and a
    # document whose content is of another format fails as unsupported_format.
    formats: tuple[str, ...] = FORMATS
    # Documents whose bytes are held in memory at once by one process (pages of these interleave).
    max_open_documents: int = 16
    # PDFium worker processes per converting process (None: one per core, see render_pool).
    render_workers: int | None = None
    # Added to the render workers' niceness: low-priority runs give the host's CPU way (priority.py).
    render_nice: int = 0
    gpu_hour_price: float | None = None

    def public_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["server"] = self.server.public_dict()
        return data

    def to_dict(self) -> dict[str, Any]:
        """Every setting, for a record that outlives the process: no secret (``ServerSettings.to_dict``)."""
        data = dataclasses.asdict(self)
        data["server"] = self.server.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConversionSettings:
        """``to_dict`` read back; the server has no key until ``ServerSettings.with_access``."""
        values = dict(data)
        return _from_fields(
            cls,
            values,
            server=ServerSettings.from_dict(values.pop("server", {})),
            page=_from_fields(PageSettings, values.pop("page", {})),
            limits=_from_fields(DocumentLimits, values.pop("limits", {})),
        )


def positive_number(what: str, value: Any, kind: type[int] | type[float] = float, unit: str = "a number") -> Any:
    """``value`` as a positive ``kind``, or a ConfigurationError naming ``what`` (a setting, an extra)."""
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{what} must be {unit}, not {value!r}") from None
    if number <= 0:
        raise ConfigurationError(f"{what} must be positive, not {value!r}")
    return number
