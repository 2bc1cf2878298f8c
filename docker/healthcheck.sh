#!/bin/sh
# The image's HEALTHCHECK: one image runs every Airflow component, so the check follows the command
# the container was started with (PID 1's command line). One-shot commands (airflow-init) pass.
set -eu
command_line=$(tr '\0' ' ' </proc/1/cmdline)
check_url() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$1"
}
case "${command_line}" in
    *api-server*) check_url "http://127.0.0.1:${AIRFLOW__API__PORT:-8080}/api/v2/version" ;;
    *scheduler*) check_url "http://127.0.0.1:${AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT:-8974}/health" ;;
    *dag-processor*) airflow jobs check --job-type DagProcessorJob --local ;;
    *triggerer*) airflow jobs check --job-type TriggererJob --local ;;
    *"celery worker"*)
        celery --app airflow.providers.celery.executors.celery_executor.app inspect ping -d "celery@$(hostname)" ;;
    *) exit 0 ;;
esac
