"""A run planned in one step and converted and published in others (the Airflow tasks), each by name.

The step that plans resolves the run once (``run.request.resolve_run``: for Airflow's ``plan`` task
the DAG run's Params, the vLLM connection and the deployment's environment) and ``plan_in_batches``
keeps it beside the plan, without secrets (``RunRequest.to_dict``). Every later step opens the plan by
name (``open_planned_run``): the resolved run is read back once (a bounded read), over one storage and
one run folder, and converting a batch (``convert_planned_batch``) and publishing
(``publish_planned_run``) work from them. So a batch is converted with the settings the run was
planned with, even when the DAG's Params, the vLLM connection or the workers' environment change while
the run is under way.

What a later step reads for itself, at use, is passed in by name: where the server is and its key
(``ServerAccess``, never written down), the worker's own allow-list (``AccessPolicy``: each worker
checks the run against it, whatever the plan says), the attempt's try number and task identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmocr_tasks.core.config import ServerAccess
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.location.run_folders import RunFolder, new_plan_id, safe_name
from olmocr_tasks.run.batching import BatchingRule
from olmocr_tasks.run.pipeline import BatchResult, convert_batch_in
from olmocr_tasks.run.planning import plan_batches
from olmocr_tasks.run.publishing import PublishedRun, publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.access import AccessPolicy
from olmocr_tasks.storage.store import Storage


@dataclass(frozen=True)
class PlannedRun:
    """One plan of a run as a later step opens it: the run as resolved, and its run folder (and storage)."""

    request: RunRequest
    folder: RunFolder

    @property
    def storage(self) -> Storage:
        return self.folder.storage

    @property
    def plan_id(self) -> str:
        return self.folder.plan_id


def plan_in_batches(
    request: RunRequest, storage: Storage, rule: BatchingRule, *, label: str
) -> tuple[str, list[dict[str, Any]]]:
    """Plan ``request`` under a fresh plan id (``label`` makes it readable) into batches, the resolved run
    first (``planning.plan_batches``); returns the plan id and the batch descriptors.

    A fresh plan id per planning: a cleared and re-run DAG run plans again, and nothing a task of the
    earlier plan still writes can reach this plan's manifest.
    """
    folder = request.run_folder(storage, new_plan_id(label))
    return folder.plan_id, plan_batches(request, storage, folder, rule)


def open_planned_run(
    storage: Storage,
    output_uri: str,
    run_id: str,
    plan_id: Any,
    *,
    server: ServerAccess,
    access: AccessPolicy,
) -> PlannedRun:
    """The plan ``plan_id`` of run ``run_id`` under ``output_uri``, its resolved run read back once.

    ``plan_id`` may come from elsewhere (XCom): it must be a safe name (``ConfigurationError``). The
    output is checked against ``access`` before anything is read from it, and the run's own locations
    once they are known. ``storage`` is the step's one storage: it reaches the output now and the
    run's inputs later, and its counter counts what the step asked of it.
    """
    plan_id = safe_name(plan_id, "plan id")
    access.check_run("", output_uri)
    folder = RunFolder(storage, output_uri, run_id, plan_id)
    request = RunRequest.from_dict(folder.read_resolved_run(), server=server, access=access)
    if (request.output_uri, request.run_id) != (output_uri, run_id):
        raise ConfigurationError(
            f"plan {plan_id} under {output_uri} was resolved for run {request.run_id!r} at {request.output_uri}: "
            "plan the run again"
        )
    request.access.check_run(request.input_uri, request.output_uri)
    return PlannedRun(request, folder)


def checked_batch_key(value: Any) -> str:
    """``value`` if it is a safe batch key (a batch descriptor comes through XCom), else ``ConfigurationError``."""
    return safe_name(value, "batch key")


def convert_planned_batch(
    run: PlannedRun, batch_key: str, *, try_number: int, task_context: dict[str, Any] | None = None
) -> BatchResult:
    """Convert batch ``batch_key`` of the plan as attempt ``try_number`` (``pipeline.convert_batch_in``).

    Its sources are read from the run folder and each is checked against the run's allowed inputs just
    before it is opened. The batch's work goes through the run's storage, whose counter is the step's
    own: the part reports what the step asked of storage, the reads of its run and batch included.
    """
    sources = run.folder.read_batch(checked_batch_key(batch_key))
    return convert_batch_in(
        run.request, run.folder, batch_key, sources, try_number=try_number, task_context=task_context
    )


def publish_planned_run(run: PlannedRun, *, airflow_run: dict[str, Any] | None = None) -> PublishedRun:
    """Publish the plan's manifest from the plan and what its batches reported (``publishing.publish_run``)."""
    return publish_run(run.request, run.storage, run.folder, run.folder.read_plan(), airflow_run=airflow_run)
