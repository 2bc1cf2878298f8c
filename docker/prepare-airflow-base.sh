#!/bin/sh
# Run as root while building the airflow image. The official apache/airflow image needs nothing here;
# a plain Debian base gets what that image provides and compose.yaml relies on: the airflow user
# (uid 50000, group 0), dumb-init, curl (health checks), AIRFLOW_HOME and a virtualenv for Airflow.
set -eu

# The official image's /entrypoint (root's PATH may not reach its airflow command).
if [ -x /entrypoint ] || command -v airflow >/dev/null 2>&1; then
    echo "prepare-airflow-base: the base image has Airflow; nothing to add"
    exit 0
fi
apt-get update
apt-get install -y --no-install-recommends dumb-init curl
rm -rf /var/lib/apt/lists/*
useradd --uid 50000 --gid 0 --home-dir /home/airflow --create-home --shell /bin/bash airflow
python3 -m venv /opt/olmocr-venv
mkdir -p "${AIRFLOW_HOME}/dags" "${AIRFLOW_HOME}/plugins" "${AIRFLOW_HOME}/logs" /opt/olmocr-airflow
chown -R airflow:0 /opt/olmocr-venv "${AIRFLOW_HOME}" /opt/olmocr-airflow
chmod -R g+rwX "${AIRFLOW_HOME}"
