"""The ``dag.test()`` driver ``olmocr_testkit.airflow_env.AirflowEnv.dag_test`` runs in a subprocess.

    python -m olmocr_testkit.dag_test_driver dag-test DAG_ID [--logical-date ISO|none|now] [--conf JSON]

It runs the DAG with ``dag.test()`` in the environment it was started with and prints
``DAG_TEST_RESULT {"state": ..., "run_id": ..., ...}`` as its last line; the exit status is 0 only for a
successful run. ``dag.test`` creates manual runs only, and this driver leaves them as they are:
scheduled, backfill and asset-triggered runs are tested through a real scheduler and triggerer in
``tests/deployment/``. Airflow is imported only inside the driver, after its environment is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from olmocr_testkit.airflow_env import RESULT_PREFIX


def _dag_test(args: argparse.Namespace) -> int:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import timezone

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        print(json.dumps(bag.import_errors, indent=1), file=sys.stderr)
    dag = bag.dags[args.dag_id]
    logical: Any
    if args.logical_date == "none":
        logical = None
    elif args.logical_date == "now":
        logical = timezone.utcnow()
    else:
        logical = timezone.parse(args.logical_date)
    conf = json.loads(args.conf) if args.conf else None
    started = time.monotonic()
    run = dag.test(logical_date=logical, run_conf=conf)
    state = str(getattr(run.state, "value", run.state))
    summary = {"state": state, "run_id": run.run_id, "seconds": round(time.monotonic() - started, 2)}
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    return 0 if state == "success" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m olmocr_testkit.dag_test_driver")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("dag-test", help="run one DAG run with dag.test()")
    run.add_argument("dag_id")
    run.add_argument("--logical-date", default="now")
    run.add_argument("--conf")
    args = parser.parse_args(argv)
    return _dag_test(args)


if __name__ == "__main__":
    sys.exit(main())
