#!/usr/bin/env bash
# One-shot setup run by the airflow-init service before the other Airflow components start: the
# secrets checked, database schema, the admin user, and the pools that bound convert tasks per vLLM
# deployment. Nothing else starts unless it succeeds (compose.yaml: service_completed_successfully).
# Connections need no setup: they come from the AIRFLOW_CONN_* variables in compose.yaml.
# Safe to run again: every step is idempotent.
set -euo pipefail

# Placeholders from docker/.env.example, empty or short secrets: refused before anything uses them.
sh "$(dirname "$0")/check-secrets.sh" \
    AIRFLOW_JWT_SECRET:32 AIRFLOW_API_SECRET_KEY:32 AIRFLOW_FERNET_KEY:fernet AIRFLOW_ADMIN_PASSWORD:12 \
    POSTGRES_PASSWORD:16 REDIS_PASSWORD:16 OLMOCR_S3_SECRET_ACCESS_KEY:16

echo "olmocr-airflow init: migrating the metadata database"
airflow db migrate

username="${AIRFLOW_ADMIN_USERNAME:-admin}"
# FAB's "users create" leaves an existing user untouched ("already exist in the db").
echo "olmocr-airflow init: admin user '${username}'"
# "--option=value": a value that starts with "-" is not read as an option. The password is not an
# option at all (any user of the host could read it in ps): without --password the command asks for
# it twice, and with no terminal reads both answers from standard input (printf is a shell builtin).
printf '%s\n%s\n' "${AIRFLOW_ADMIN_PASSWORD:?AIRFLOW_ADMIN_PASSWORD is not set}" "${AIRFLOW_ADMIN_PASSWORD}" |
    airflow users create \
    --username="${username}" \
    --firstname Admin \
    --lastname User \
    --role Admin \
    --email "${username}@example.com"

slots="${OLMOCR_VLLM_POOL_SLOTS:-8}"
echo "olmocr-airflow init: pool olmocr_vllm with ${slots} slots"
airflow pools set olmocr_vllm "${slots}" "Convert tasks running at once against the vLLM deployment"

# Reserved for high-priority runs (REST documents, S3 events): their convert instances never wait for
# a backfill's instance to end (README "Priority classes"). 0 removes it: they then share olmocr_vllm.
high_slots="${OLMOCR_HIGH_PRIORITY_POOL_SLOTS:-1}"
if [ "${high_slots}" -gt 0 ]; then
    echo "olmocr-airflow init: pool olmocr_vllm_high with ${high_slots} slots"
    airflow pools set olmocr_vllm_high "${high_slots}" "Convert tasks of high-priority runs, beside olmocr_vllm"
elif airflow pools get olmocr_vllm_high >/dev/null 2>&1; then
    echo "olmocr-airflow init: no reserved pool (OLMOCR_HIGH_PRIORITY_POOL_SLOTS=0): removing olmocr_vllm_high"
    airflow pools delete olmocr_vllm_high
fi

# A malformed AIRFLOW_CONN_* value would otherwise only surface when the first task runs.
if airflow connections get olmocr_vllm >/dev/null 2>&1; then
    echo "olmocr-airflow init: connection olmocr_vllm resolves"
else
    echo "olmocr-airflow init: WARNING: connection olmocr_vllm does not resolve; check AIRFLOW_CONN_OLMOCR_VLLM" >&2
fi
echo "olmocr-airflow init: done"
