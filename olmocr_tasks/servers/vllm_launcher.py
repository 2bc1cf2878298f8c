"""``olmocr-tasks serve-vllm``: run and supervise ``vllm serve`` for olmOCR on a single GPU host.

The launcher never imports vllm (it is an optional extra): it starts the ``vllm`` executable with
olmOCR's recommended arguments, waits until ``GET /v1/models`` lists the served model, prints the
Airflow connection to configure, restarts the server a bounded number of times if it dies, and
forwards SIGTERM/SIGINT to it.

The pieces are pure or injectable so they can be tested without a GPU: ``build_vllm_command``,
``wait_until_ready`` and ``VllmSupervisor``. The command line itself is in ``olmocr_tasks.cli``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from olmocr_tasks.core.config import COLD_START_TIMEOUT_S, DEFAULT_MODEL, SettingGroups
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.readiness import ModelsProbe

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'olmocr-airflow[vllm]' (vLLM 0.32; [vllm-olmocr]: olmOCR's 0.11.2)"
# One page image per prompt and no video, as olmOCR's pages need; vLLM wants this as JSON.
LIMIT_MM_PER_PROMPT = json.dumps({"video": 0, "image": 1})
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_PROBE_TIMEOUT_S = 5.0


class VllmNotInstalledError(ConfigurationError):
    """The ``vllm`` executable is not on PATH."""


class ReadinessError(RuntimeError):
    """vLLM did not become usable."""


class ServedModelMismatchError(ReadinessError):
    """vLLM answers but does not serve the expected model name (a configuration error)."""


class ReadinessTimeoutError(ReadinessError):
    """vLLM did not list the model within the timeout."""


class ServerExitedError(ReadinessError):
    """The vLLM process died before it became ready."""


class StopRequestedError(ReadinessError):
    """A signal asked the launcher to stop while waiting."""


@dataclass(frozen=True)
class ServingSettings:
    """What vLLM serves, and on how much of the GPU. Defaults follow olmOCR 0.4.x's own launch."""

    model: str = DEFAULT_MODEL
    # Defaults to ``model`` so the default olmocr_vllm connection (model = the HF id) works unchanged.
    served_model_name: str | None = None
    max_model_len: int = 16384
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    # vLLM's --scheduling-policy: "priority" serves runs by class (olmocr_tasks.inference.priority).
    scheduling_policy: str = "fcfs"

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


@dataclass(frozen=True)
class EndpointSettings:
    """Where clients reach vLLM, the key they need, and the Airflow connection printed for them."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key_env: str | None = None
    conn_id: str = "olmocr_vllm"


@dataclass(frozen=True)
class ProcessSettings:
    """The ``vllm serve`` process: the command, extra arguments, extra environment."""

    vllm_binary: str = "vllm"
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class SupervisionSettings:
    """How long readiness is waited for, and how often a dying server is restarted."""

    # First start downloads ~9 GB of weights and compiles kernels, hence a generous bound.
    ready_timeout_s: float = COLD_START_TIMEOUT_S
    poll_interval_s: float = 2.0
    max_restarts: int = 5
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 120.0
    # A server that ran this long before dying gets a fresh restart budget: the bound is meant for
    # crash loops, not for a server that fails once a week.
    stable_after_s: float = 3600.0
    stop_grace_s: float = 30.0


_GROUPS = SettingGroups(
    "VllmOptions",
    {
        "serving": ServingSettings,
        "endpoint": EndpointSettings,
        "process": ProcessSettings,
        "supervision": SupervisionSettings,
    },
)


@dataclass(frozen=True, init=False)
class VllmOptions:
    """How to start and supervise vLLM, in four small groups (built as ``ServerSettings`` is)::

    VllmOptions(endpoint=EndpointSettings(port=8123), max_restarts=2)
    """

    serving: ServingSettings
    endpoint: EndpointSettings
    process: ProcessSettings
    supervision: SupervisionSettings

    def __init__(
        self,
        *,
        serving: ServingSettings | None = None,
        endpoint: EndpointSettings | None = None,
        process: ProcessSettings | None = None,
        supervision: SupervisionSettings | None = None,
        **settings: Any,
    ) -> None:
        given: dict[str, Any] = {
            "serving": serving,
            "endpoint": endpoint,
            "process": process,
            "supervision": supervision,
        }
        _GROUPS.assign(self, given, settings)


def build_vllm_command(options: VllmOptions) -> list[str]:
    """The ``vllm serve`` command line (argv) for ``options``."""
    serving, endpoint = options.serving, options.endpoint
    try:
        binary = shlex.split(options.process.vllm_binary)
    except ValueError as exc:
        raise ConfigurationError(f"--vllm-binary cannot be parsed: {exc}") from None
    if not binary:
        raise ConfigurationError("--vllm-binary is empty")
    # --disable-log-requests is not passed although olmOCR does: request logging is off by default
    # since vLLM 0.10.2 and the flag was removed in 0.12, where it would stop the server starting.
    return [
        *binary,
        "serve",
        serving.model,
        "--served-model-name",
        serving.model_name,
        "--host",
        endpoint.host,
        "--port",
        str(endpoint.port),
        "--max-model-len",
        str(serving.max_model_len),
        "--limit-mm-per-prompt",
        LIMIT_MM_PER_PROMPT,
        "--gpu-memory-utilization",
        str(serving.gpu_memory_utilization),
        "--tensor-parallel-size",
        str(serving.tensor_parallel_size),
        "--data-parallel-size",
        str(serving.data_parallel_size),
        "--uvicorn-log-level",
        "warning",
        # Only when asked: fcfs is vLLM's default, and older releases lack the flag.
        *(["--scheduling-policy", serving.scheduling_policy] if serving.scheduling_policy != "fcfs" else []),
        *options.process.extra_args,
    ]


def _client_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def base_url(options: VllmOptions) -> str:
    """The OpenAI base URL clients use (``.../v1``)."""
    host = _client_host(options.endpoint.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{options.endpoint.port}/v1"


def connection_json(options: VllmOptions) -> dict[str, Any]:
    """The Airflow connection (JSON form) for this server. Never contains the API key."""
    serving, endpoint = options.serving, options.endpoint
    return {
        "conn_type": "olmocr_vllm",
        "host": _client_host(endpoint.host),
        "port": endpoint.port,
        "schema": "http",
        # The connection tells clients the policy: with "priority" requests carry their run's class.
        "extra": {"model": serving.model_name}
        | ({"scheduling_policy": serving.scheduling_policy} if serving.scheduling_policy != "fcfs" else {}),
    }


def connection_env_line(options: VllmOptions) -> str:
    """``AIRFLOW_CONN_<ID>='<json>'``, ready to paste into a shell or an env file."""
    name = "AIRFLOW_CONN_" + options.endpoint.conn_id.upper().replace("-", "_")
    return f"{name}={shlex.quote(json.dumps(connection_json(options)))}"


def wait_until_ready(
    url: str,
    model_name: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 1800.0,
    interval_s: float = 2.0,
    is_alive: Callable[[], bool] | None = None,
    should_stop: Callable[[], bool] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> None:
    """Poll ``{url}/models`` until it lists ``model_name``.

    Raises ``ServedModelMismatchError`` as soon as the server answers without the model (retrying
    cannot fix a wrong name), ``ServerExitedError`` if ``is_alive`` turns false,
    ``StopRequestedError`` if ``should_stop`` turns true, ``ReadinessTimeoutError`` after the timeout.
    """
    probe = ModelsProbe(url, model_name, api_key=api_key)
    deadline = time.monotonic() + timeout_s
    with httpx.Client() as client:
        while True:
            if should_stop is not None and should_stop():
                raise StopRequestedError("stop requested")
            if is_alive is not None and not is_alive():
                raise ServerExitedError("vLLM exited before it became ready")
            result = probe.probe_sync(client, _PROBE_TIMEOUT_S)
            if result.ready:
                return
            if result.reason == "auth":
                raise ReadinessError(f"vLLM rejected the API key (HTTP {result.status})")
            if result.reason == "model_missing" and result.models:
                raise ServedModelMismatchError(
                    f"vLLM at {url} serves {', '.join(sorted(result.models))}, not {model_name!r}; "
                    "check --served-model-name and the model of the olmocr_vllm connection"
                )
            # Anything else (refused, 5xx, a 404 or an empty list from a server still loading) may pass.
            if time.monotonic() >= deadline:
                raise ReadinessTimeoutError(f"vLLM did not list {model_name!r} at {url}/models within {timeout_s:g}s")
            sleep(interval_s)


def _child_setup() -> None:
    # Own session, so a terminal Ctrl-C reaches only the launcher, which forwards it exactly once;
    # and on Linux the child is told to stop if the launcher dies without cleaning up.
    os.setsid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # vLLM's engine processes share the server's process group; a server that died or was killed
    # can leave them holding GPU memory, which would make the next start fail.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class VllmSupervisor:
    """Start vLLM, wait for readiness, announce the connection, restart on death (bounded)."""

    def __init__(self, options: VllmOptions, out: TextIO | None = None) -> None:
        self.options = options
        self.out = out if out is not None else sys.stdout
        self.command = build_vllm_command(options)
        if shutil.which(self.command[0]) is None:
            raise VllmNotInstalledError(
                f"vLLM is not installed ({self.command[0]!r} not found): {INSTALL_HINT}, or pass --vllm-binary"
            )
        self.api_key: str | None = None
        key_env = options.endpoint.api_key_env
        if key_env:
            self.api_key = os.environ.get(key_env) or None
            if self.api_key is None:
                raise ConfigurationError(f"--api-key-env {key_env}: that environment variable is not set")
        self.launches = 0
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._forwarded = False

    # -- control ----------------------------------------------------------------------------------

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask the loop to end; the signal is passed on to vLLM (safe to call from a signal handler)."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)
                self._forwarded = True

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.options.process.env}
        env.setdefault("OMP_NUM_THREADS", "1")  # as olmOCR does; vLLM's CPU threads only compete
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key  # via the environment: argv is visible to every user
        self.launches += 1
        self._forwarded = False
        logger.info("starting vLLM (launch %d): %s", self.launches, shlex.join(self.command))
        return subprocess.Popen(self.command, env=env, preexec_fn=_child_setup)

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None and not self._forwarded:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        grace = self.options.supervision.stop_grace_s
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            logger.warning("vLLM did not stop within %gs; killing it", grace)
        _kill_group(proc)
        proc.wait()

    def _announce(self) -> None:
        options = self.options
        lines = [
            f"vLLM is ready: {base_url(options)} serves {options.serving.model_name!r}",
            "Configure Airflow with:",
            connection_env_line(options),
        ]
        if key_env := options.endpoint.api_key_env:
            lines.append(f'and add "password": <the API key in ${key_env}> to it (the key is not printed)')
        lines.append(f"or convert from the CLI: olmocr-tasks convert --server {base_url(options)} <input> <output>")
        print("\n".join(lines), file=self.out, flush=True)

    # -- loop -------------------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped (0), a configuration error (2) or too many deaths / no readiness (1)."""
        options = self.options
        supervision = options.supervision
        restarts = 0
        announced = False
        url = base_url(options)
        while not self._stop.is_set():
            proc = self._proc = self._spawn()
            started = time.monotonic()
            try:
                wait_until_ready(
                    url,
                    options.serving.model_name,
                    api_key=self.api_key,
                    timeout_s=supervision.ready_timeout_s,
                    interval_s=supervision.poll_interval_s,
                    is_alive=lambda proc=proc: proc.poll() is None,
                    should_stop=self._stop.is_set,
                    sleep=self._stop.wait,
                )
            except StopRequestedError:
                break
            except ServerExitedError:
                pass
            except ServedModelMismatchError as exc:
                logger.error("%s", exc)
                self._terminate(proc)
                return EXIT_USAGE
            except ReadinessError as exc:
                logger.error("%s", exc)
                self._terminate(proc)
                return EXIT_FAILED
            else:
                if announced:
                    logger.info("vLLM is serving again at %s", url)
                else:
                    self._announce()
                    announced = True
                while proc.poll() is None and not self._stop.wait(0.5):
                    pass
            if self._stop.is_set():
                break
            returncode = proc.wait()
            _kill_group(proc)
            if time.monotonic() - started >= supervision.stable_after_s:
                restarts = 0
            restarts += 1
            if restarts > supervision.max_restarts:
                logger.error(
                    "vLLM exited with code %s; it died %d times, giving up (is the GPU free? see its log above)",
                    returncode,
                    restarts,
                )
                return EXIT_FAILED
            delay = min(supervision.backoff_max_s, supervision.backoff_initial_s * 2 ** (restarts - 1))
            logger.warning(
                "vLLM exited with code %s; restart %d of %d in %gs",
                returncode,
                restarts,
                supervision.max_restarts,
                delay,
            )
            self._stop.wait(delay)
        if self._proc is not None:
            self._terminate(self._proc)
        return EXIT_OK
