#!/bin/sh
# The image's entrypoint (under dumb-init). On the official apache/airflow base its own /entrypoint
# runs; on a plain Debian base the same contract: `bash ...`/`python ...` run as given, anything else
# is an airflow subcommand (`api-server`, `scheduler`, `celery worker`, ...).
if [ -x /entrypoint ]; then
    exec /entrypoint "$@"
fi
case "${1:-}" in
    bash | sh | python | python3) exec "$@" ;;
    *) exec airflow "$@" ;;
esac
