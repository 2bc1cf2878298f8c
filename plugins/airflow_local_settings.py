"""Airflow's local settings for deployments that use this plugins folder: the olmOCR cluster policy.

Airflow imports ``airflow_local_settings`` from ``$AIRFLOW_HOME/config`` or, failing that, from the
plugins folder. This one places convert instances by their run's priority class
(``olmocr_tasks.provider.policy``): high-priority runs are queued first for a slot of the vLLM pool.
A deployment with its own ``airflow_local_settings.py`` (which wins) adds the same import to it.
"""

from __future__ import annotations

from typing import Any


def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    # ``dag_run`` must be declared: Airflow passes a local-settings hook only as many of the hookspec's
    # arguments as the function declares, and without its run the policy cannot tell a convert
    # instance's class (it leaves the instance as it is).
    # Imported when called, not when loaded: Airflow loads this module while it initialises, and the
    # policy module imports Airflow, so a process whose first import is the policy module would find
    # it half-initialised here.
    from olmocr_tasks.provider.policy import task_instance_mutation_hook as place_by_priority

    place_by_priority(task_instance, dag_run)
