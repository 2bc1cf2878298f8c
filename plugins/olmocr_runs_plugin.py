"""Airflow plugin: serves the "OCR runs" pages in the api-server and links them from the UI's nav.

The output location is read from ``OLMOCR_OUTPUT_URI`` or the Airflow Variable
``olmocr_output_uri`` when a page is requested, so the plugin loads even before either is set.

Who sees what is the configured auth manager's answer (FAB, the simple auth manager or any other):
a run of a DAG is listed and opened only by users it lets read that DAG (``is_authorized_dag``), and
a run of no DAG (the command line) by those ``OLMOCR_RUNS_CLI_READERS`` names.
"""

from __future__ import annotations

import os

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_authenticated
from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends
from olmocr_runs import create_app

from olmocr_tasks.provider.hooks import storage_for
from olmocr_tasks.public import ConfigurationError, Storage

URL_PREFIX = "/olmocr"
# Who may see the runs of no DAG (CLI runs, and manifests whose DAG cannot be read): "operators",
# the users the auth manager lets read connections (Op and Admin in FAB and the simple auth manager),
# or "signed_in", every signed-in user (a deployment whose users may all see everything).
CLI_READERS_SETTING = "OLMOCR_RUNS_CLI_READERS"
CLI_READERS = ("operators", "signed_in")


def _storage(output_uri: str) -> Storage:
    # The manifests are read as the tasks wrote them: S3 through the aws_default connection (its
    # endpoint_url extra for MinIO and the like), not only the api-server's own AWS environment.
    return storage_for([output_uri])


def cli_readers() -> str:
    """``OLMOCR_RUNS_CLI_READERS`` (default ``operators``); any other value is refused, not guessed."""
    value = os.environ.get(CLI_READERS_SETTING, "").strip() or CLI_READERS[0]
    if value not in CLI_READERS:
        raise ConfigurationError(f"{CLI_READERS_SETTING} must be one of {', '.join(CLI_READERS)}, not {value!r}")
    return value


class AirflowRunAccess:
    """One request's user, answered by the auth manager, each DAG asked once."""

    def __init__(self, auth_manager: BaseAuthManager, user: BaseUser, cli: str) -> None:
        self._auth = auth_manager
        self._user = user
        self._cli = cli
        self._answers: dict[str | None, bool] = {}

    def may_read(self, dag_id: str | None) -> bool:
        if dag_id not in self._answers:
            self._answers[dag_id] = self._ask(dag_id)
        return self._answers[dag_id]

    def _ask(self, dag_id: str | None) -> bool:
        if dag_id is None:
            if self._cli == "signed_in":
                return True
            return self._auth.is_authorized_connection(method="GET", user=self._user)
        details = DagDetails(id=dag_id, team_name=_team_of(dag_id))
        return self._auth.is_authorized_dag(method="GET", details=details, user=self._user)


def _team_of(dag_id: str) -> str | None:
    # As Airflow's own routes ask (security.requires_access_dag); a query only in multi-team mode.
    if not conf.getboolean("core", "multi_team", fallback=False):
        return None
    from airflow.models.dag import DagModel

    return DagModel.get_team_name(dag_id)


def airflow_access(user: GetUserDep) -> AirflowRunAccess:
    """The pages' ``RunAccess``: the signed-in user (401 without one) as the auth manager sees them."""
    return AirflowRunAccess(get_auth_manager(), user, cli_readers())


# The api-server does not guard plugin apps: every route needs a signed-in user (the UI's session
# cookie is sent along when the pages are opened from the navigation), and each run the user's
# access to its DAG.
app = create_app(
    dependencies=[Depends(requires_authenticated())],
    storage_for=_storage,
    access=airflow_access,
)


class OlmocrRunsPlugin(AirflowPlugin):
    name = "olmocr_runs"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "OCR runs"}]
    # With a url_route the UI shows the pages inside its own frame at /plugin/ocr-runs; Airflow
    # drops external views that have none.
    external_views = [
        {
            "name": "OCR runs",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "ocr-runs",
            "category": "browse",
        }
    ]
