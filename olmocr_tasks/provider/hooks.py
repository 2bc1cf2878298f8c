"""``VllmHook``: the one place that turns the ``olmocr_vllm`` Airflow connection into server settings.

Connection fields:

* **host**: a bare host (``vllm.internal``), ``host/path``, or a full base URL
  (``https://vllm.example.com/v1``). Without a path the OpenAI root ``/v1`` is assumed.
* **schema**: ``http`` (default) or ``https`` when the host is bare (Airflow's "schema" field is
  reused for the URL scheme, as the HTTP provider does).
* **port**: used when the host does not name one.
* **password**: the API key, sent as a Bearer token (never logged: see ``ServerSettings.public_dict``).
* extras: ``model``; ``gpu_hour_price`` (price of one GPU hour, for the manifests' cost estimate);
  ``replicas`` (comma-separated base URLs, or a JSON list, of further replicas balanced with the
  first); ``max_concurrent_requests``; ``verify_tls``; any of the timeouts
  ``connect_timeout_s``, ``read_timeout_s``, ``write_timeout_s``, ``readiness_timeout_s``,
  ``request_retry_budget_s``, ``outage_window_s``; and the hedging knobs ``hedge_requests``
  (boolean, on by default), ``hedge_min_delay_s``, ``hedge_multiple`` and ``hedge_idle_multiple`` (see
  ``config.HedgeSettings`` and ``olmocr_tasks.inference.hedging_policy``); ``scheduling_policy``: ``fcfs`` (default) or
  ``priority``, as the deployment's vLLM runs (``--scheduling-policy``); with ``priority`` each page
  request carries its run's priority class (``olmocr_tasks.inference.priority``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from airflow.sdk import BaseHook

from olmocr_tasks.core.config import DEFAULT_MODEL, ServerAccess, ServerSettings, positive_number
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.priority import check_scheduling_policy
from olmocr_tasks.provider import CONNECTION_TYPE, DEFAULT_CONN_ID
from olmocr_tasks.storage.store import Storage
from olmocr_tasks.storage.uri import is_s3

# The AWS connection that reads inputs and writes outputs on S3 (and, by default, polls SQS).
AWS_CONN_ID = "aws_default"

_SCHEMES = ("http", "https")
_DEFAULT_PATH = "/v1"
_FLOAT_EXTRAS = (
    "connect_timeout_s",
    "read_timeout_s",
    "write_timeout_s",
    "readiness_timeout_s",
    "request_retry_budget_s",
    "outage_window_s",
    "hedge_min_delay_s",
    "hedge_multiple",
    "hedge_idle_multiple",
)
_BOOL_EXTRAS = ("verify_tls", "hedge_requests", "guided_decoding")


class ConnectionLike(Protocol):
    """The fields of an Airflow ``Connection`` this module reads (a plain object works in tests)."""

    conn_id: str | None
    host: str | None
    schema: str | None
    port: int | None
    password: str | None

    @property
    def extra_dejson(self) -> dict[str, Any]: ...


def base_url(host: str, scheme: str | None = None, port: int | None = None) -> str:
    """The OpenAI API root for a host given bare, as ``host/path``, or as a full URL."""
    host = host.strip()
    if not host:
        raise ConfigurationError("the vLLM connection has no host")
    if "://" not in host:
        chosen = (scheme or "http").strip().lower() or "http"
        host = f"{chosen}://{host}"
    parts = urlsplit(host)
    if parts.scheme.lower() not in _SCHEMES:
        raise ConfigurationError(f"the vLLM URL scheme must be http or https, not {parts.scheme!r}")
    if not parts.hostname:
        raise ConfigurationError(f"the vLLM connection host {host!r} names no host")
    netloc = parts.netloc
    if port and parts.port is None:
        netloc = f"{netloc}:{int(port)}"
    path = parts.path.rstrip("/") or _DEFAULT_PATH
    return urlunsplit((parts.scheme.lower(), netloc, path, parts.query, ""))


def _extra(extra: Mapping[str, Any], name: str) -> Any:
    # Forms of older Airflow versions stored custom fields as "extra__<conn type>__<name>".
    value = extra.get(name)
    if value is None:
        value = extra.get(f"extra__{CONNECTION_TYPE}__{name}")
    return None if value == "" else value


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"connection extra {name!r} must be a boolean, not {value!r}")


def _as_number(name: str, value: Any, kind: type[int] | type[float]) -> Any:
    return positive_number(f"connection extra {name!r}", value, kind)


def _replicas(value: Any, scheme: str | None) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [base_url(str(item), scheme) for item in items if str(item).strip()]


def settings_from_connection(conn: ConnectionLike, defaults: ServerSettings | None = None) -> ServerSettings:
    """Server settings for a connection; fields the connection leaves out keep ``defaults``."""
    defaults = defaults or ServerSettings()
    extra = conn.extra_dejson or {}
    primary = base_url(conn.host or "", conn.schema, conn.port)
    urls = [primary, *_replicas(_extra(extra, "replicas"), conn.schema)]
    changes: dict[str, Any] = {
        "base_urls": tuple(dict.fromkeys(urls)),
        "model": str(_extra(extra, "model") or DEFAULT_MODEL),
        "api_key": conn.password or None,
    }
    if (value := _extra(extra, "max_concurrent_requests")) is not None:
        changes["max_concurrent_requests"] = _as_number("max_concurrent_requests", value, int)
    for name in _BOOL_EXTRAS:
        if (value := _extra(extra, name)) is not None:
            changes[name] = _as_bool(name, value)
    for name in _FLOAT_EXTRAS:
        if (value := _extra(extra, name)) is not None:
            changes[name] = _as_number(name, value, float)
    if (value := _extra(extra, "scheduling_policy")) is not None:
        changes["scheduling_policy"] = check_scheduling_policy(value)
    return dataclasses.replace(defaults, **changes)


class VllmHook(BaseHook):
    """Reads the ``olmocr_vllm`` connection; checks that the server is up and serves the model."""

    conn_name_attr = "vllm_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONNECTION_TYPE
    hook_name = "olmOCR vLLM"

    def __init__(self, vllm_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vllm_conn_id = vllm_conn_id

    def get_conn(self) -> ServerSettings:
        return self.server_settings()

    def server_settings(self, **overrides: Any) -> ServerSettings:
        """Settings from the connection; ``overrides`` (e.g. a run's ``max_concurrent_requests``) win."""
        settings = settings_from_connection(self.get_connection(self.vllm_conn_id))
        changes = {name: value for name, value in overrides.items() if value is not None}
        return dataclasses.replace(settings, **changes) if changes else settings

    def server_access(self) -> ServerAccess:
        """Where the server is and its API key: what a resolved run leaves out and a task reads at use."""
        return self.server_settings().access

    def gpu_hour_price(self) -> float | None:
        """The connection's ``gpu_hour_price`` extra: the price of one GPU hour, for manifests' cost."""
        value = _extra(self.get_connection(self.vllm_conn_id).extra_dejson or {}, "gpu_hour_price")
        return None if value is None else _as_number("gpu_hour_price", value, float)

    def check_ready(self, settings: ServerSettings | None = None) -> list[str]:
        """Wait up to ``readiness_timeout_s`` until every replica lists the model; return the models.

        Raises ``ServerNotReady`` when the server stays unreachable, rejects the API key or serves
        another model.
        """
        # Imported when a check runs: every Airflow component loads this hook (the connection form),
        # and only a check needs the engine behind it.
        from olmocr_tasks.run.pipeline import check_server

        return check_server(settings or self.server_settings())

    def test_connection(self) -> tuple[bool, str]:
        """Backs the UI's "Test" button: one readiness probe with a short timeout."""
        try:
            settings = dataclasses.replace(self.server_settings(), readiness_timeout_s=5.0)
            models = self.check_ready(settings)
        except Exception as exc:
            return False, str(exc)
        return True, f"{settings.connection.model} is served ({', '.join(models)})"


def storage_options(aws_conn_id: str = AWS_CONN_ID) -> dict[str, Any]:
    """s3fs options from an Airflow AWS connection (keys, endpoint, region, botocore config).

    The options hold secrets: they stay in this process (never in XCom, logs or manifests).
    """
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=aws_conn_id)
    options: dict[str, Any] = {}
    session_credentials = hook.get_session().get_credentials()
    if session_credentials is None:
        options["anon"] = True
    else:
        # get_credentials also registers the secret with Airflow's log masker.
        credentials = hook.get_credentials()
        options["key"] = credentials.access_key
        options["secret"] = credentials.secret_key
        if credentials.token:
            options["token"] = credentials.token
    client_kwargs: dict[str, Any] = {}
    if endpoint := hook.conn_config.get_service_endpoint_url(service_name="s3"):
        client_kwargs["endpoint_url"] = endpoint
    if region := hook.conn_config.region_name:
        client_kwargs["region_name"] = region
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    if config_kwargs := hook.conn_config.extra_config.get("config_kwargs"):
        options["config_kwargs"] = dict(config_kwargs)
    return options


def storage_for(uris: Iterable[str], aws_conn_id: str = AWS_CONN_ID) -> Storage:
    """A ``Storage`` that can read and write every URI given; AWS is asked only when one is on S3."""
    return Storage(storage_options(aws_conn_id) if any(is_s3(uri) for uri in uris) else None)


def run_storage(aws_conn_id: str = AWS_CONN_ID) -> Storage:
    """A ``Storage`` for wherever a run leads, before it is known where: the AWS connection is asked for
    its options (once) only when the storage first reaches S3."""
    return Storage(functools.partial(storage_options, aws_conn_id))
