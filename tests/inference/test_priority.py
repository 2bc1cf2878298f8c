"""Priority classes (``olmocr_tasks.inference.priority``): which class a run gets, and how it reaches vLLM."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import os
from types import SimpleNamespace
from typing import Any

import pytest

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.inference.priority import AIRFLOW_WEIGHT, HIGH, LOW, NORMAL, VLLM_PRIORITY, run_class, with_priority
from olmocr_tasks.page.protocol import RequestBodyBuilder
from olmocr_tasks.provider.policy import convert_placement, task_instance_mutation_hook
from tests.fixtures.standin import StandinServer, marked_png


@pytest.mark.parametrize(
    ("run_type", "params", "expected"),
    [
        ("asset_triggered", {}, HIGH),
        ("manual", {"documents": ["s3://in/a.pdf"]}, HIGH),
        ("scheduled", {"scope": "auto"}, NORMAL),
        ("manual", {"scope": "interval"}, NORMAL),
        ("backfill", {"scope": "auto"}, LOW),
        ("manual", {"scope": "all"}, LOW),
        ("manual", {"scope": "auto"}, LOW),
        # The Param wins over the choice by run type.
        ("backfill", {"priority_class": "high"}, HIGH),
        ("manual", {"documents": ["s3://in/a.pdf"], "priority_class": "low"}, LOW),
        ("scheduled", {"priority_class": "auto"}, NORMAL),
    ],
)
def test_class_of_a_run(run_type: str, params: dict[str, Any], expected: str) -> None:
    assert run_class(run_type, params) == expected


def test_event_runs_are_high_and_an_unknown_class_is_refused() -> None:
    assert run_class("manual", {}, names_documents=True) == HIGH
    with pytest.raises(ConfigurationError, match="priority class"):
        run_class("manual", {"priority_class": "urgent"})
    # A request without the field (another client of a shared server) ranks with scheduled runs.
    assert VLLM_PRIORITY[NORMAL] == 0


def test_priority_is_the_last_key_as_json_dumps_writes_it() -> None:
    body = RequestBodyBuilder("m").build(b"QUJD", 0.1)
    expected = json.loads(body) | {"priority": -10}
    assert with_priority(body, -10) == json.dumps(expected).encode()
    assert with_priority(b"{}", 3) == b'{"priority": 3}'
    with pytest.raises(ValueError, match="JSON object"):
        with_priority(b"[1]", 3)


def _sent_bodies(server: StandinServer, settings: ServerSettings, body: bytes) -> list[bytes]:
    async def scenario() -> None:
        async with build_client(settings) as client:
            await client.complete(body)

    asyncio.run(scenario())
    return server.bodies()


def test_priority_reaches_vllm_only_under_priority_scheduling(standin_factory: Any) -> None:
    body = RequestBodyBuilder(ServerSettings().connection.model).build(marked_png(1, 1, as_base64=True), 0.1)
    base = {"model": ServerSettings().connection.model, "adaptive_concurrency": False, "priority": VLLM_PRIORITY[LOW]}

    fcfs = standin_factory()
    settings = ServerSettings(base_urls=(fcfs.url,), **base)
    # fcfs (the default): the body goes out exactly as built, byte for byte, whatever the run's class.
    assert _sent_bodies(fcfs, settings, body) == [body]

    prioritised = standin_factory(scheduling_policy="priority")
    settings = ServerSettings(base_urls=(prioritised.url,), scheduling_policy="priority", **base)
    (sent,) = _sent_bodies(prioritised, settings, body)
    assert sent == with_priority(body, VLLM_PRIORITY[LOW])
    assert prioritised.requests()[0]["priority"] == VLLM_PRIORITY[LOW]


def test_a_priority_server_serves_each_class_before_the_ones_below_it(standin_factory: Any) -> None:
    """The classes' values order the server's queue as the classes mean: waiting requests of a low, a
    normal and a high run, queued in that order, are served high first, low last."""
    server = standin_factory(scheduling_policy="priority", capacity=1, scripts={"9:1": ["slow"]}, slow_s=3600)
    model = ServerSettings().connection.model

    def settings(priority_class: str) -> ServerSettings:
        return ServerSettings(
            base_urls=(server.url,),
            model=model,
            adaptive_concurrency=False,
            scheduling_policy="priority",
            priority=VLLM_PRIORITY[priority_class],
            hedge_requests=False,
        )

    def body(doc: int) -> bytes:
        return RequestBodyBuilder(model).build(marked_png(doc, 1, as_base64=True), 0.1)

    async def waiting(count: int) -> None:
        while server.stats()["waiting"] < count:
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        clients = {cls: build_client(settings(cls)) for cls in (NORMAL, LOW, HIGH)}
        async with clients[NORMAL], clients[LOW], clients[HIGH]:
            holding = asyncio.ensure_future(clients[NORMAL].complete(body(9)))  # holds the one place
            while server.stats()["running"] < 1:
                await asyncio.sleep(0.01)
            sent = []
            for doc, cls in ((1, LOW), (2, NORMAL), (3, HIGH)):
                sent.append(asyncio.ensure_future(clients[cls].complete(body(doc))))
                await waiting(len(sent))
            server.configure(slow_s=0)
            await asyncio.gather(holding, *sent)

    asyncio.run(scenario())
    started = {r["marker"]["doc_id"]: r["started"] for r in server.requests() if r["marker"]["doc_id"] != 9}
    assert sorted(started, key=started.__getitem__) == [3, 2, 1], "served high, normal, low"


def test_unknown_scheduling_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="scheduling_policy"):
        build_client(ServerSettings(scheduling_policy="lottery"))


def _convert_ti(
    pool: str = "olmocr_vllm", task_id: str = "convert", dag_id: str = "olmocr_ingest", map_index: int = 0
) -> SimpleNamespace:
    return SimpleNamespace(dag_id=dag_id, task_id=task_id, pool=pool, priority_weight=1, map_index=map_index)


@pytest.mark.parametrize(
    ("run_type", "conf", "weight"),
    [
        ("manual", {"documents": ["s3://in/a.pdf"]}, AIRFLOW_WEIGHT[HIGH]),
        ("asset_triggered", {}, AIRFLOW_WEIGHT[HIGH]),
        ("scheduled", {}, AIRFLOW_WEIGHT[NORMAL]),
        ("backfill", {}, AIRFLOW_WEIGHT[LOW]),
        ("manual", {"scope": "all"}, AIRFLOW_WEIGHT[LOW]),
        ("backfill", {"priority_class": "high"}, AIRFLOW_WEIGHT[HIGH]),
    ],
)
def test_cluster_policy_weighs_convert_instances_by_class(
    run_type: str, conf: dict[str, Any], weight: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OLMOCR_HIGH_PRIORITY_POOL", raising=False)
    ti = _convert_ti()
    task_instance_mutation_hook(ti, SimpleNamespace(run_type=run_type, conf=conf))
    assert (ti.priority_weight, ti.pool) == (weight, "olmocr_vllm")


class _Pools:
    """The deployment's pools as the policy asks about them: which exist with slots, which have one free."""

    def __init__(self, reserved: int, free: set[str]) -> None:
        self.reserved, self.free, self.asked = reserved, free, []

    def reserved_slots(self, name: str) -> float:
        self.asked.append(("reserved", name))
        return self.reserved

    def has_free_slot(self, name: str) -> bool:
        self.asked.append(("free", name))
        return name in self.free


def test_cluster_policy_reserved_pool_and_what_it_leaves_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLMOCR_HIGH_PRIORITY_POOL", raising=False)
    high_run = SimpleNamespace(run_type="manual", conf={"documents": ["a.pdf"]})
    low_run = SimpleNamespace(run_type="backfill", conf={})
    full = _Pools(reserved=1, free=set())
    # Every convert slot held: the reserved pool (the convert pool's name + "_high" by default).
    assert convert_placement(_convert_ti(), high_run, full) == (AIRFLOW_WEIGHT[HIGH], "olmocr_vllm_high")
    assert convert_placement(_convert_ti(), low_run, full) == (AIRFLOW_WEIGHT[LOW], "olmocr_vllm")
    assert full.asked == [("reserved", "olmocr_vllm_high"), ("free", "olmocr_vllm")]  # only for the high run
    # A big high run: its first instance (as many as the reserve has slots) there, the rest first in the
    # convert pool's queue, where each slot a backfill instance frees is theirs.
    assert [convert_placement(_convert_ti(map_index=index), high_run, full)[1] for index in range(3)] == [
        "olmocr_vllm_high",
        "olmocr_vllm",
        "olmocr_vllm",
    ]
    # A free convert slot: take it, the reserve stays for the next high run.
    free = _Pools(reserved=1, free={"olmocr_vllm"})
    assert convert_placement(_convert_ti(), high_run, free) == (AIRFLOW_WEIGHT[HIGH], "olmocr_vllm")
    # No reserved pool (or 0 slots): high runs wait in the convert pool, first in its queue, never stranded.
    none = _Pools(reserved=0, free=set())
    assert convert_placement(_convert_ti(), high_run, none) == (AIRFLOW_WEIGHT[HIGH], "olmocr_vllm")
    # A retried instance already in the reserved pool is still ours; the setting renames the pool.
    monkeypatch.setenv("OLMOCR_HIGH_PRIORITY_POOL", "urgent_ocr")
    assert convert_placement(_convert_ti(pool="urgent_ocr"), high_run, full) == (AIRFLOW_WEIGHT[HIGH], "urgent_ocr")
    # Through the hook, a run attached to no database session cannot show the pool exists: convert pool.
    through_hook = _convert_ti()
    task_instance_mutation_hook(through_hook, high_run)
    assert through_hook.pool == "olmocr_vllm"
    # Other tasks, instances not bound to a run yet and bad Params are left as they are.
    for ti, run in (
        (_convert_ti(task_id="plan"), SimpleNamespace(run_type="backfill", conf={})),
        (_convert_ti(), None),
        (_convert_ti(), SimpleNamespace(run_type="manual", conf={"priority_class": "urgent"})),
        (_convert_ti(pool="someone_elses"), SimpleNamespace(run_type="backfill", conf={})),
        # Another DAG's task named convert, even in our pool, is someone else's.
        (_convert_ti(dag_id="their_etl"), SimpleNamespace(run_type="manual", conf={"documents": ["a.pdf"]})),
    ):
        before = dict(vars(ti))
        task_instance_mutation_hook(ti, run)
        assert vars(ti) == before


def test_a_dag_of_ones_own_is_placed_once_named_in_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLMOCR_HIGH_PRIORITY_POOL", raising=False)
    monkeypatch.setenv("OLMOCR_POLICY_DAGS", "olmocr_ingest, invoices_ocr")
    ours, theirs = _convert_ti(dag_id="invoices_ocr"), _convert_ti(dag_id="olmocr_s3_events")
    for ti in (ours, theirs):
        task_instance_mutation_hook(ti, SimpleNamespace(run_type="asset_triggered", conf={}))
    assert (ours.priority_weight, theirs.priority_weight) == (AIRFLOW_WEIGHT[HIGH], 1)


def test_the_policy_reaches_airflow_through_its_entry_point() -> None:
    """Installing the package is enough: Airflow's policy plugin manager (pluggy) loads the
    ``airflow.policy`` entry point, and its hook places a convert instance."""
    import pluggy
    from airflow import policies

    manager = pluggy.PluginManager(policies.local_settings_hookspec.project_name)
    manager.add_hookspecs(policies)
    manager.load_setuptools_entrypoints("airflow.policy")
    assert "olmocr_tasks.provider.policy" in {
        impl.plugin.__name__ for impl in manager.hook.task_instance_mutation_hook.get_hookimpls()
    }
    ti = _convert_ti()
    manager.hook.task_instance_mutation_hook(
        task_instance=ti, dag_run=SimpleNamespace(run_type="manual", conf={"documents": ["a.pdf"]})
    )
    assert ti.priority_weight == AIRFLOW_WEIGHT[HIGH]


def test_a_low_priority_run_is_planned_like_others_and_renders_niced(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run's class changes in the task code: the plan's waves (none more by default) and the
    render workers' niceness, each with its setting (0 switches the niceness off; a nonsense value is a
    configuration error)."""
    from olmocr_tasks.inference.priority import RENDER_NICE
    from olmocr_tasks.provider.run_requests import batching_rule, render_nice
    from olmocr_tasks.run.batching import LOW_CLASS_MIN_WAVES
    from olmocr_tasks.run.request import RunRequest

    for name in ("OLMOCR_LOW_CLASS_WAVES", "OLMOCR_LOW_PRIORITY_NICE", "OLMOCR_BATCH_PAGES"):
        monkeypatch.delenv(name, raising=False)
    request = RunRequest(input_uri="/in", output_uri="/out", run_id="r")
    assert batching_rule({}, request, LOW).min_waves == LOW_CLASS_MIN_WAVES == 1
    assert batching_rule({}, request, HIGH).min_waves == batching_rule({}, request, NORMAL).min_waves == 1
    # A run that names its batch size keeps it, whatever its class.
    named = batching_rule({"batch_pages": 8}, request, LOW)
    assert (named.min_pages, named.min_waves) == (8, 1)
    assert (render_nice(HIGH), render_nice(NORMAL), render_nice(LOW)) == (0, 0, RENDER_NICE[LOW])
    monkeypatch.setenv("OLMOCR_LOW_CLASS_WAVES", "3")
    monkeypatch.setenv("OLMOCR_LOW_PRIORITY_NICE", "0")
    assert (batching_rule({}, request, LOW).min_waves, render_nice(LOW)) == (3, 0)
    monkeypatch.setenv("OLMOCR_LOW_PRIORITY_NICE", "25")
    with pytest.raises(ConfigurationError, match="OLMOCR_LOW_PRIORITY_NICE"):
        render_nice(LOW)


def test_the_plugins_folder_local_settings_place_a_convert_instance_as_airflow_loads_them() -> None:
    """A deployment that relies on ``plugins/airflow_local_settings.py`` (no installed entry point) gets
    the same placement: loaded the way Airflow loads local settings (its shim forwards only the
    arguments the function declares), the hook receives the run and places the instance."""
    import importlib.util

    import pluggy
    from airflow import policies

    from olmocr_testkit.airflow_env import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "airflow_local_settings", REPO_ROOT / "plugins" / "airflow_local_settings.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    manager = pluggy.PluginManager(policies.local_settings_hookspec.project_name)
    manager.add_hookspecs(policies)
    policies.make_plugin_from_local_settings(manager, module, {"task_instance_mutation_hook"})
    ti = _convert_ti()
    manager.hook.task_instance_mutation_hook(
        task_instance=ti, dag_run=SimpleNamespace(run_type="manual", conf={"documents": ["a.pdf"]})
    )
    assert ti.priority_weight == AIRFLOW_WEIGHT[HIGH]
    backfill = _convert_ti()
    manager.hook.task_instance_mutation_hook(
        task_instance=backfill, dag_run=SimpleNamespace(run_type="backfill", conf={})
    )
    assert backfill.priority_weight == AIRFLOW_WEIGHT[LOW]


def _niceness_after_giving_way(render_nice: int, others: int) -> tuple[int, int, int, list[int], bool]:
    """In a forked process: give way with ``others`` other active runs; the niceness of this process
    before and after, what is left for the engine, the niceness of a thread and a child started
    before, and whether the watch gave way."""
    import subprocess
    import threading

    from olmocr_tasks.core.config import ConversionSettings
    from olmocr_tasks.provider.tasks import give_way
    from olmocr_tasks.run.request import RunRequest

    before = os.nice(0)
    child = subprocess.Popen(["sleep", "30"])
    thread_id: list[int] = []
    parked = threading.Event()
    thread = threading.Thread(target=lambda: (thread_id.append(threading.get_native_id()), parked.wait(30)))
    thread.start()
    asked: list[int] = []

    def count() -> int:
        asked.append(others)
        return others

    request = RunRequest(
        input_uri="/in", output_uri="/out", run_id="r", settings=ConversionSettings(render_nice=render_nice)
    )
    watches = []
    for _ in range(2):  # a second instance in the same process (airflow dags test) adds nothing more
        request, watch = give_way(request, count)
        if watch is not None:
            # The first answer decides: wait for it, then end the watch as convert_body does.
            watch.gave_way.wait(5 if others else 0.3)
            watches.append(watch)
    gave_way = any(watch.gave_way.is_set() for watch in watches)
    for watch in watches:
        watch.stop()
    nices = [os.getpriority(os.PRIO_PROCESS, thread_id[0]), os.getpriority(os.PRIO_PROCESS, child.pid)]
    parked.set()
    child.kill()
    assert not render_nice or asked, "the watch never asked"
    return before, os.nice(0), request.settings.render_nice, nices, gave_way


@pytest.mark.parametrize(("render_nice", "others"), [(0, 1), (7, 0), (7, 2)])
def test_a_low_priority_convert_instance_is_niced_only_while_other_runs_are_active(
    render_nice: int, others: int
) -> None:
    """Alone it runs at normal priority; once another conversion run is active its whole process (every
    thread, not only the one that decided) and its children (render workers) are niced. Measured in a
    forked process, as Airflow forks one per task attempt, so the test process keeps its niceness."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        before, after, left_for_engine, (thread_nice, child_nice), gave_way = pool.submit(
            _niceness_after_giving_way, render_nice, others
        ).result()
    expected = min(before + render_nice, 19) if others else before
    assert (after, thread_nice, child_nice) == (expected, expected, expected)
    assert gave_way == bool(render_nice and others)
    assert left_for_engine == 0
