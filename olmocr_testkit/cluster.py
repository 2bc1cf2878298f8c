"""A real multi-process Airflow 3.3 deployment of this checkout, started, health-checked and stopped here.

It is laid out like ``docker/compose.yaml``, with plain ``airflow`` commands instead of containers:

    airflow api-server      REST API, UI and the execution API the workers call
    airflow scheduler       CeleryExecutor: task instances go to Redis, results to PostgreSQL
    airflow dag-processor   parses dags/
    airflow triggerer       runs the AssetWatcher that polls SQS
    airflow celery worker   twice, each its own process group, so one can be killed alone

on PostgreSQL (a fresh database, dropped afterwards) and Redis. Both are the machine's own servers on
127.0.0.1:5432 / :6379 when they answer, else throwaway instances started from Debian's binaries in
a temporary data directory on free ports (``make test`` installs the packages then).

``AirflowCluster`` is the deployment itself (used by the tests, ``make up-cluster`` and the
benchmark); ``Deployment`` adds what the tests point it at: the moto server (S3 and SQS), the vLLM
stand-in, the ``olmocr_vllm`` / ``aws_default`` connections and the DAGs' environment. Every
component's output goes to ``test-output/deployment/<session>/``; every process started here is
stopped on exit, failure included, by process group.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from olmocr_testkit import REPO_ROOT, tier_record
from olmocr_testkit.ports import PORT_ATTEMPTS, address_in_use, free_port

OUTPUT_ROOT = REPO_ROOT / "test-output" / "deployment"
POOL = "olmocr_vllm"
HIGH_PRIORITY_POOL = "olmocr_vllm_high"
ADMIN_USER = "admin"
LOCAL_POSTGRES = ("127.0.0.1", 5432)
LOCAL_REDIS = ("127.0.0.1", 6379)
# Sessions' folders kept under test-output/deployment/ (the newest ones), for reading failures later.
KEEP_SESSIONS = 5


class DeploymentError(RuntimeError):
    """A component did not start or did not become healthy; the message says where its log is."""


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], Any], timeout: float, interval: float = 0.5, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; raise ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(interval)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ------------------------------------------------------------------------------------ processes


@dataclass
class Process:
    """One started command, its output in ``log``.

    ``own_group``: it leads a process group (session) of its own, so it and everything it starts are
    signalled together; otherwise it stays in its starter's group (a terminal's Ctrl-C reaches it)
    and is signalled with its descendants one by one.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    own_group: bool = True

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def descendants(self) -> list[int]:
        import psutil

        with contextlib.suppress(psutil.Error):
            return [child.pid for child in psutil.Process(self.popen.pid).children(recursive=True)]
        return []

    def _signal(self, signum: int, pids: list[int]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.own_group:
                os.killpg(self.popen.pid, signum)
            else:
                os.kill(self.popen.pid, signum)
        signal_each(pids, signum)

    def kill(self) -> None:
        """SIGKILL it, its group and every descendant that left it, as a lost machine would."""
        self._signal(signal.SIGKILL, self.descendants())
        self.popen.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM it (and its group), then SIGKILL whatever is left after ``timeout``."""
        if self.alive:
            stragglers = self.descendants()
            self._signal(signal.SIGTERM, [] if self.own_group else stragglers)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
            self._signal(signal.SIGKILL, stragglers)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)


def signal_each(pids: list[int], signum: int) -> None:
    """Send ``signum`` to each process that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _die_with_parent() -> None:
    # Runs in the child before exec (Linux): SIGTERM when the process that started it dies, even by
    # SIGKILL, so nothing outlives an interactive `make up`.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def start_process(
    name: str, command: list[str], env: Mapping[str, str], log_dir: Path, *, own_group: bool = True
) -> Process:
    """Start ``command`` with its output in ``log_dir/<name>.log``.

    ``own_group`` False keeps it in the caller's process group and ends it when the caller dies (for
    the interactive ``make up``; not used under pytest, whose threads make a pre-exec hook unsafe).
    """
    log = log_dir / f"{name}.log"
    with open(log, "ab") as output:
        popen = subprocess.Popen(
            command,
            env=dict(env),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
            preexec_fn=None if own_group or sys.platform != "linux" else _die_with_parent,
        )
    return Process(name, popen, log, own_group)


def _as_postgres_user(command: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root; Debian's package creates the postgres account.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def _postgres_binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if not found:
        raise DeploymentError(
            f"PostgreSQL is not answering on {LOCAL_POSTGRES[0]}:{LOCAL_POSTGRES[1]} and `{name}` is not installed: "
            "run `make test` (it installs Debian's postgresql package) or start a server there"
        )
    return found


# ------------------------------------------------------------------------------ PostgreSQL, Redis


@dataclass
class Postgres:
    """A PostgreSQL server reachable with trust auth as ``postgres``; throwaway when ``data_dir`` is set."""

    host: str
    port: int
    data_dir: Path | None = None

    @classmethod
    def local_or_throwaway(cls, work_dir: Path) -> Postgres:
        return cls(*LOCAL_POSTGRES) if answers(*LOCAL_POSTGRES) else cls.throwaway(work_dir)

    @classmethod
    def throwaway(cls, work_dir: Path) -> Postgres:
        """A server of our own: a new data directory under ``work_dir``, a free port, trust auth."""
        if os.geteuid() == 0:
            # The server runs as postgres, which cannot enter root's private folders: a folder of
            # its own in the system temp directory instead.
            data_dir = Path(tempfile.mkdtemp(prefix="olmocr-postgres-"))
            shutil.chown(data_dir, "postgres")
        else:
            data_dir = work_dir / "postgres"
            data_dir.mkdir(parents=True)
        subprocess.run(
            _as_postgres_user([_postgres_binary("initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust"]),
            check=True,
            capture_output=True,
        )
        log = data_dir / "server.log"
        # PostgreSQL is told a number: when another process took the port first, again on a fresh one.
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            log.unlink(missing_ok=True)
            started = subprocess.run(
                _as_postgres_user(
                    [
                        _postgres_binary("pg_ctl"),
                        "-D",
                        str(data_dir),
                        "-l",
                        str(log),
                        "-o",
                        f"-p {port} -k {data_dir} -c listen_addresses=127.0.0.1",
                        "-w",
                        "start",
                    ]
                ),
                check=False,
                capture_output=True,
            )
            if started.returncode == 0:
                return cls("127.0.0.1", port, data_dir)
            if attempt == PORT_ATTEMPTS or not address_in_use(_tail(log)):
                raise DeploymentError(f"PostgreSQL did not start ({started.returncode}); {log}:\n{_tail(log)}")
        raise AssertionError("unreachable")

    def url(self, database: str, driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://postgres@{self.host}:{self.port}/{database}"

    def _execute(self, statement: str) -> None:
        import psycopg2

        connection = psycopg2.connect(host=self.host, port=self.port, user="postgres", dbname="postgres")
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(statement)
        finally:
            connection.close()

    def create_database(self, name: str) -> bool:
        """Create ``name`` unless it exists; True when it was created."""
        import psycopg2

        connection = psycopg2.connect(host=self.host, port=self.port, user="postgres", dbname="postgres")
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                exists = cursor.fetchone() is not None
        finally:
            connection.close()
        if not exists:
            self._execute(f'CREATE DATABASE "{name}"')
        return not exists

    def drop_database(self, name: str) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        if self.data_dir is not None:
            subprocess.run(
                _as_postgres_user([_postgres_binary("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "stop"]),
                check=False,
                capture_output=True,
            )
            shutil.rmtree(self.data_dir, ignore_errors=True)


@dataclass
class Redis:
    """A Redis server; throwaway when ``process`` is set."""

    host: str
    port: int
    process: Process | None = None

    @classmethod
    def local_or_throwaway(cls, work_dir: Path) -> Redis:
        return cls(*LOCAL_REDIS) if answers(*LOCAL_REDIS) else cls.throwaway(work_dir)

    @classmethod
    def throwaway(cls, work_dir: Path) -> Redis:
        """A server of our own on a free port, keeping nothing on disk."""
        binary = shutil.which("redis-server")
        if not binary:
            raise DeploymentError(
                f"Redis is not answering on {LOCAL_REDIS[0]}:{LOCAL_REDIS[1]} and redis-server is not installed: "
                "run `make test` (it installs Debian's redis-server package) or start a server there"
            )
        data_dir = work_dir / "redis"
        data_dir.mkdir(parents=True)
        # Redis is told a number: when another process took the port first, again on a fresh one.
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            process = start_process(f"redis-{attempt}", [*command, "--dir", str(data_dir)], os.environ, work_dir)
            wait_until(lambda process=process: _redis_ready_or_gone(process), 30, what="throwaway Redis ready")
            if process.alive:
                return cls("127.0.0.1", port, process)
            log = process.log
            if attempt == PORT_ATTEMPTS or not address_in_use(_tail(log)):
                raise DeploymentError(f"Redis exited ({process.popen.returncode}); {log}:\n{_tail(log)}")
        raise AssertionError("unreachable")

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _redis_ready_or_gone(process: Process) -> bool:
    # Redis logs "Ready to accept connections" once it listens; an answer on the port could be another's.
    return not process.alive or b"ready to accept connections" in process.log.read_bytes().lower()


# ------------------------------------------------------------------------------------ the cluster


@dataclass
class ClusterSettings:
    work_dir: Path  # AIRFLOW_HOME, logs and throwaway servers live here
    api_port: int = 0  # 0: a free port
    workers: int = 2
    worker_concurrency: int = 2
    pool_slots: int = 3
    # The pool reserved for high-priority runs, as compose's init creates it (0: none).
    high_priority_slots: int = 1
    # Extra environment of every component (the DAGs' configuration and connections).
    env: dict[str, str] = field(default_factory=dict)
    # None: a fresh database named after the session, dropped at stop().
    database: str | None = None
    drop_database: bool = True
    # Keep the fernet key, JWT secret and admin password in work_dir/secrets.json across starts
    # (a kept database needs the same fernet key; users keep their login).
    persistent_secrets: bool = False
    # Components stay in the starter's process group and die with it (an interactive `make
    # up-cluster`); the tests keep each in a group of its own, so one worker can be killed alone.
    attached: bool = False
    # Airflow's test timings (``TEST_TIMINGS``) instead of its production defaults: the test deployment
    # and ``make up-cluster --test-timings``, never a plain ``make up-cluster``.
    test_timings: bool = False


# What the tests shorten: a lost worker's task instance is failed (and retried) after 30 s without
# heartbeats, not Airflow's 300 s, so the killed-worker tests take a minute, not five.
TEST_TIMINGS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
}


def timing_env(settings: ClusterSettings) -> dict[str, str]:
    """The Airflow timing settings a deployment overrides: none (Airflow's own) unless ``test_timings``."""
    return dict(TEST_TIMINGS) if settings.test_timings else {}


class AirflowCluster:
    """api-server, scheduler, dag-processor, triggerer and Celery workers on PostgreSQL and Redis."""

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self.work_dir = settings.work_dir
        self.log_dir = self.work_dir / "logs"
        self.home = self.work_dir / "home"
        self.token = uuid.uuid4().hex[:10]
        self.database = settings.database or f"olmocr_test_{self.token}"
        self.api_port = settings.api_port or free_port()
        self._secrets = self._load_secrets()
        # Chosen again when the triggerer starts, after the api-server holds its port (see start()).
        self._ports = {"trigger_logs": free_port()}
        self.admin_password = self._secrets["admin"]
        # Tasks go to a queue of their own, so another deployment sharing the Redis never takes them.
        self.queue = f"olmocr-{self.token}"
        self.processes: dict[str, Process] = {}
        self.postgres: Postgres | None = None
        self.redis: Redis | None = None
        self._created_database = False
        self._stopped = False

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def worker_names(self) -> list[str]:
        return [f"worker-{index + 1}" for index in range(self.settings.workers)]

    # -------------------------------------------------------------------------- environment

    def _load_secrets(self) -> dict[str, str]:
        from cryptography.fernet import Fernet

        path = self.work_dir / "secrets.json"
        if self.settings.persistent_secrets and path.exists():
            return json.loads(path.read_text())
        values = {
            "fernet": Fernet.generate_key().decode(),
            "jwt": secrets.token_urlsafe(32),
            "api": secrets.token_urlsafe(32),
            "admin": secrets.token_urlsafe(12),
        }
        if self.settings.persistent_secrets:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
            path.chmod(0o600)
        return values

    def env(self) -> dict[str, str]:
        assert self.postgres is not None and self.redis is not None
        inherited = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "OLMOCR_"))}
        # The components are started by path, and they start further `airflow` processes by name.
        bin_dir = str(Path(sys.executable).parent)
        inherited["PATH"] = os.pathsep.join([bin_dir, inherited.get("PATH", "")])
        env = {
            **inherited,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__PARALLELISM": "16",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__FERNET_KEY": self._secrets["fernet"],
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "olmocr_testkit.worker_identity.worker_hostname",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url(self.database),
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": self.postgres.url(self.database, "db+postgresql+psycopg2"),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.settings.worker_concurrency),
            # Sending a task to Redis can take more than the default 1 s on a loaded 2-core machine.
            "AIRFLOW__CELERY__OPERATION_TIMEOUT": "15",
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": self.queue,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": self._secrets["api"],
            # Every component signs and checks tokens with this; a per-process random one breaks workers.
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secrets["jwt"],
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.log_dir / "tasks"),
            # The triggerer serves its log on a port; two deployments on one machine must not share it.
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self._ports["trigger_logs"]),
            # The task supervisor looks for its task's exit after the task's last socket closes, and when
            # it looks a moment too early it sleeps this long (Airflow's default 5 s) holding the worker
            # slot: a one-page run's short tasks each kept theirs ~5 s past their end (bench/README Run 14).
            # 1 s bounds that, for one heartbeat per running task per second (as docker/compose.yaml).
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # The DAG files do not change while it runs: parse them at start, rarely again (CPU).
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__TRIGGERER__CAPACITY": "50",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        env.update(timing_env(self.settings))
        env.update(self.settings.env)
        return env

    def airflow(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run one ``airflow`` command against this deployment; raise with its output if it fails."""
        result = subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), *args],
            env=self.env(),
            cwd=REPO_ROOT,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise DeploymentError(f"airflow {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    # ------------------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 420) -> AirflowCluster:
        """Start everything in an order that avoids start-up races; return once all is healthy.

        On a fresh database, components started at the same instant race on their job rows (a
        duplicate key killed the dag-processor): the api-server comes first, the others one by one.
        The timeout is generous because a 2-core machine shared with other work may take a minute
        just to import Airflow in each component.
        """
        deadline = time.monotonic() + timeout
        atexit.register(self.stop)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({ADMIN_USER: self.admin_password}))
        self.postgres = Postgres.local_or_throwaway(self.work_dir)
        self.redis = Redis.local_or_throwaway(self.work_dir)
        self._created_database = self.postgres.create_database(self.database)
        self.airflow("db", "migrate")
        self.airflow("pools", "set", POOL, str(self.settings.pool_slots), "vLLM capacity of this deployment")
        if self.settings.high_priority_slots:
            slots = str(self.settings.high_priority_slots)
            self.airflow("pools", "set", HIGH_PRIORITY_POOL, slots, "high-priority runs, beside " + POOL)
        self._launch_on_port("api-server", self._choose_api_port, lambda: self._get("/api/v2/version"), deadline)
        for name in ("scheduler", "dag-processor"):
            self._launch(name, [name])
            self._wait(lambda name=name: self._job_healthy(name), deadline, name, "healthy")
        # Its log server (a child process that only logs a port it cannot bind) takes a port chosen
        # now, while the api-server holds its own: two free_port() calls may return the same number.
        triggerer_ready = functools.partial(self._job_healthy, "triggerer")
        self._launch_on_port("triggerer", self._choose_trigger_log_port, triggerer_ready, deadline)
        for worker in self.worker_names():
            self.start_worker(worker, deadline=deadline)
        return self

    def _choose_api_port(self) -> None:
        self.api_port = self.settings.api_port or free_port()

    def _choose_trigger_log_port(self) -> None:
        self._ports["trigger_logs"] = next(port for port in iter(free_port, None) if port != self.api_port)

    def _launch_on_port(
        self, name: str, choose_port: Callable[[], None], ready: Callable[[], Any], deadline: float
    ) -> None:
        """Launch a component that is told its port by number and wait until ``ready``.

        Another process can take a free port before the component binds it: when the component
        exits saying the address was in use, it is started again on a fresh port (its earlier log
        kept as ``<name>.<attempt>.log``). A port fixed by the settings is not changed.
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            choose_port()
            process = self._launch(name, [name])
            try:
                self._wait(ready, deadline, name, "ready")
                return
            except DeploymentError:
                fixed = name == "api-server" and self.settings.api_port
                if fixed or attempt == PORT_ATTEMPTS or process.alive or not address_in_use(_tail(process.log)):
                    raise
                process.stop()
                process.log.rename(process.log.with_name(f"{name}.{attempt}.log"))

    def start_worker(self, name: str, *, deadline: float | None = None) -> Process:
        deadline = deadline or time.monotonic() + 300
        command = ["celery", "worker", "--queues", self.queue, "--celery-hostname", f"{name}-{self.token}@%h"]
        command += ["--concurrency", str(self.settings.worker_concurrency), "--without-mingle", "--without-gossip"]
        command += ["--skip-serve-logs"]
        process = self._launch(name, command, OLMOCR_WORKER_NAME=name)
        self._wait(lambda: b" ready." in process.log.read_bytes(), deadline, name, "ready")
        return process

    def _launch(self, name: str, args: list[str], **extra_env: str) -> Process:
        command = [str(Path(sys.executable).parent / "airflow"), *args]
        process = start_process(
            name, command, {**self.env(), **extra_env}, self.log_dir, own_group=not self.settings.attached
        )
        self.processes[name] = process
        return process

    def _wait(self, check: Callable[[], Any], deadline: float, name: str, state: str) -> None:
        process = self.processes[name]
        while not check():
            if not process.alive:
                raise DeploymentError(
                    f"{name} exited ({process.popen.returncode}); {process.log}:\n{_tail(process.log)}"
                )
            if time.monotonic() > deadline:
                raise DeploymentError(f"{name} not {state} in time; {process.log}:\n{_tail(process.log)}")
            time.sleep(1)

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            response = httpx.get(self.api_url + path, timeout=10)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def health(self) -> dict[str, Any]:
        return self._get("/api/v2/monitor/health") or {}

    def _job_healthy(self, component: str) -> bool:
        key = component.replace("-", "_")
        return (self.health().get(key) or {}).get("status") == "healthy"

    def healthy(self) -> bool:
        health = self.health()
        parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
        components_ok = all((health.get(part) or {}).get("status") == "healthy" for part in parts)
        return components_ok and all(process.alive for process in self.processes.values())

    def kill(self, name: str) -> None:
        self.processes[name].kill()

    def task_attempt_processes(self, ti_id: str) -> list[int]:
        """The supervisor and the task process of one running try (``ti_id``: its id in the REST API).

        The Task SDK titles the task process ``airflow worker -- <ti id>``; its parent is the
        supervisor, a Celery pool process, which heartbeats for it.
        """
        import psutil

        for name in self.worker_names():
            for pid in self.processes[name].descendants():
                with contextlib.suppress(psutil.Error):
                    process = psutil.Process(pid)
                    if f"airflow worker -- {ti_id}" in " ".join(process.cmdline()):
                        return [process.ppid(), process.pid]
        return []

    def stop(self) -> None:
        """Stop every component (workers first), drop the database, stop throwaway servers. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for process in reversed(list(self.processes.values())):
            process.stop()
        if self.postgres is not None and self._created_database and self.settings.drop_database:
            with contextlib.suppress(Exception):
                self.postgres.drop_database(self.database)
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()

    def __enter__(self) -> AirflowCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------------- REST client


class AirflowApi:
    """The public REST API with a token from ``POST /auth/token``, as any client would use it."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base_url = base_url
        self.client = httpx.Client(base_url=base_url, timeout=60)
        response = self.client.post("/auth/token", json={"username": username, "password": password})
        if response.status_code != 201:
            raise DeploymentError(f"POST /auth/token answered {response.status_code}: {response.text[:500]}")
        self.token = response.json()["access_token"]
        self.client.headers["Authorization"] = f"Bearer {self.token}"

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, **kwargs)

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        if response.status_code >= 300:
            raise AssertionError(f"{method} {path} answered {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.ok("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused})

    def reparse(self, dag_id: str) -> None:
        """Ask the dag-processor to parse the DAG's file now rather than at its next interval.

        An AssetWatcher is registered with the triggerer when its DAG is parsed while unpaused, so
        unpausing an event-driven DAG takes effect at the next parse.
        """
        token = self.ok("GET", f"/api/v2/dags/{dag_id}/details")["file_token"]
        self.ok("PUT", f"/api/v2/parseDagFile/{token}")

    def wait_for_dag(self, dag_id: str, timeout: float = 300) -> dict[str, Any]:
        def parsed() -> dict[str, Any] | None:
            response = self.request("GET", f"/api/v2/dags/{dag_id}")
            return response.json() if response.status_code == 200 else None

        return wait_until(parsed, timeout, 2, what=f"DAG {dag_id} parsed")

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, **body: Any) -> httpx.Response:
        return self.request(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}, **body}
        )

    def dag_runs(self, dag_id: str, **params: Any) -> list[dict[str, Any]]:
        return self.ok("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100, **params})["dag_runs"]

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.ok("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600) -> dict[str, Any]:
        """The run once it has finished (success or failed)."""

        def finished() -> dict[str, Any] | None:
            run = self.dag_run(dag_id, run_id)
            return run if run["state"] in ("success", "failed") else None

        return wait_until(finished, timeout, 2, what=f"{dag_id} run {run_id} finished")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
        return self.ok("GET", path, params={"limit": 1000})["task_instances"]

    def task_tries(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict[str, Any]]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/tries"
        return self.ok("GET", path)["task_instances"]

    def close(self) -> None:
        self.client.close()


# ------------------------------------------------------------------------------ the test deployment


def session_dir() -> Path:
    """A new folder under test-output/deployment/ for one session; the oldest beyond a few are removed."""
    OUTPUT_ROOT.mkdir(parents=True, exist_ok=True)
    for old in sorted(OUTPUT_ROOT.iterdir())[: -(KEEP_SESSIONS - 1) or None]:
        shutil.rmtree(old, ignore_errors=True)
    path = OUTPUT_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path.mkdir()
    return path


@dataclass
class Deployment:
    """The cluster wired to a moto server (S3 + SQS) and the vLLM stand-in, as the tests use it."""

    cluster: AirflowCluster
    moto_url: str
    standin: Any  # olmocr_testkit.standin.process.StandinProcess
    bucket: str
    queue_url: str
    api: AirflowApi

    @property
    def input_uri(self) -> str:
        """The DAGs' default input (``OLMOCR_INPUT_URI``), where scheduled runs discover."""
        return f"s3://{self.bucket}/scheduled/input/"

    @property
    def output_uri(self) -> str:
        return f"s3://{self.bucket}/scheduled/output/"

    @contextlib.contextmanager
    def slow_server(self, latency_s: float) -> Iterator[None]:
        """The stand-in answers every page after ``latency_s`` within the block, so instances overlap."""
        previous = self.standin.config()["latency_s"]
        self.standin.configure(latency_s=latency_s)
        try:
            yield
        finally:
            self.standin.configure(latency_s=previous)

    def running_converts(self) -> list[dict[str, Any]]:
        """The convert task instances running now, in every DAG and run."""
        path = "/api/v2/dags/~/dagRuns/~/taskInstances"
        params = {"task_id": "convert", "state": "running", "limit": 100}
        return self.api.ok("GET", path, params=params)["task_instances"]

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.api.close()
        self.cluster.stop()
        self.standin.stop()


EVENTS_PREFIX = "events/input/"
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
CONSUMER_DAGS = REPO_ROOT / "tests" / "deployment" / "dags"
# A user's downstream DAG, scheduled on the olmocr_outputs asset.
CONSUMER_DAG = "olmocr_outputs_consumer"


@contextlib.contextmanager
def deployment(moto_url: str, *, pool_slots: int = 3, workers: int = 2) -> Iterator[Deployment]:
    """Start the whole test deployment; everything is stopped when the block exits, however it exits."""
    import boto3

    from olmocr_testkit.airflow_env import aws_connection, vllm_connection
    from olmocr_testkit.bucket import DUMMY_KEY, DUMMY_SECRET, REGION
    from olmocr_testkit.standin.process import start_standin_process

    work_dir = session_dir()
    # make test checks afterwards that this happened once in its run (tier_record).
    tier_record.record(tier_record.START, "deployment", session=work_dir.name)
    clients = {
        "endpoint_url": moto_url,
        "region_name": REGION,
        "aws_access_key_id": DUMMY_KEY,
        "aws_secret_access_key": DUMMY_SECRET,
    }
    bucket = f"deployment-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **clients).create_bucket(Bucket=bucket)
    queue_url = boto3.client("sqs", **clients).create_queue(QueueName=f"{bucket}-events")["QueueUrl"]
    # The server wants a key, as a real deployment's would: the connection carries it, and rotating
    # it on the stand-in mid-run is how a revoked key looks to the tasks.
    # vLLM run with --scheduling-policy priority, as the connection says: runs' classes reach its queue.
    standin = start_standin_process(latency_s=0.05, api_key=secrets.token_urlsafe(24), scheduling_policy="priority")
    empty = work_dir / "no-aws-config"
    env = {
        "AIRFLOW_CONN_OLMOCR_VLLM": vllm_connection(
            standin.url, standin.model, standin_api_key(standin), scheduling_policy="priority"
        ),
        "AIRFLOW_CONN_AWS_DEFAULT": aws_connection(moto_url, DUMMY_KEY, DUMMY_SECRET, REGION),
        # Keep any real AWS configuration of the machine out of the deployment.
        "AWS_CONFIG_FILE": str(empty),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        "AWS_EC2_METADATA_DISABLED": "true",
        "OLMOCR_INPUT_URI": f"s3://{bucket}/scheduled/input/",
        "OLMOCR_OUTPUT_URI": f"s3://{bucket}/scheduled/output/",
        # Every minute, so a test sees the scheduler's own run of a real interval within minutes.
        "OLMOCR_SCHEDULE": "* * * * *",
        "OLMOCR_MAX_ACTIVE_RUNS": "4",
        # OLMOCR_LOOKBACK_INTERVALS is left at its default (one interval), as a deployment would run.
        # A lost worker's convert instance is retried after 10-20 s instead of 1-2 min: the stand-in
        # never goes away, so the wait a vLLM restart needs would only lengthen the tests.
        "OLMOCR_CONVERT_RETRY_DELAY": "10",
        # Runs triggered with their own prefixes (every test but the scheduled one) stay in the bucket.
        "OLMOCR_ALLOWED_INPUTS": f"s3://{bucket}/",
        "OLMOCR_ALLOWED_OUTPUTS": f"s3://{bucket}/",
        # The product's dags/ and, in a bundle of its own, a downstream DAG of the outputs asset.
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
            [
                {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
                {"name": "test-consumers", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(CONSUMER_DAGS)}},
            ]
        ),
        "OLMOCR_SQS_QUEUE_URL": queue_url,
        "OLMOCR_SQS_WAITER_DELAY": "2",
    }
    settings = ClusterSettings(work_dir=work_dir, workers=workers, pool_slots=pool_slots, env=env, test_timings=True)
    cluster = AirflowCluster(settings)
    api: AirflowApi | None = None
    try:
        cluster.start()
        api = AirflowApi(cluster.api_url, ADMIN_USER, cluster.admin_password)
        for dag_id in ("olmocr_ingest", "olmocr_s3_events", CONSUMER_DAG):
            api.wait_for_dag(dag_id)
        result = Deployment(cluster, moto_url, standin, bucket, queue_url, api)
        yield result
    finally:
        if api is not None:
            api.close()
        cluster.stop()
        standin.stop()


def standin_api_key(standin: Any) -> str | None:
    """The key the stand-in wants now (its control API reports it; the model API never does)."""
    return standin.config().get("api_key")
