#!/bin/sh
# Installs olmocr-airflow into an image with the lock (constraints.txt) as constraints, in two
# steps so that the dependency layer survives code changes:
#   install-package.sh dependencies EXTRAS   the dependencies of pyproject.toml with those extras
#   install-package.sh package EXTRAS        the package itself (its dependencies are in place)
# Into /opt/olmocr-venv with uv where the image has that virtualenv (a plain Debian base, the CPU
# engine), else with pip into the airflow user's site-packages, beside the official image's Airflow.
set -eu
phase="$1"
extras="$2"
cd /opt/olmocr-airflow

# A build behind a TLS-intercepting proxy mounts the proxy's CA bundle as the secret build_ca.
if [ -s /run/secrets/build_ca ]; then
    export SSL_CERT_FILE=/run/secrets/build_ca PIP_CERT=/run/secrets/build_ca
fi
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 UV_NO_CACHE=1

if [ "${phase}" = dependencies ]; then
    requirements=/tmp/olmocr-requirements.txt
    EXTRAS="${extras}" python3 - > "${requirements}" <<'PY'
import os
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
lines = list(project["dependencies"])
for extra in filter(None, os.environ["EXTRAS"].split(",")):
    lines += project["optional-dependencies"][extra]
print("\n".join(lines))
PY
fi

if [ -x /opt/olmocr-venv/bin/python ]; then
    if [ ! -x /opt/olmocr-venv/bin/uv ]; then
        /opt/olmocr-venv/bin/pip install --quiet "uv==${UV_VERSION}"
    fi
    uv="/opt/olmocr-venv/bin/uv pip install --python /opt/olmocr-venv/bin/python --compile-bytecode -c constraints.txt"
    if [ "${phase}" = dependencies ]; then
        # Airflow itself where the base has none (it is in the airflow extra, pinned by the lock).
        ${uv} -r /tmp/olmocr-requirements.txt
    else
        ${uv} --no-deps ".[${extras}]"
    fi
else
    if [ "${phase}" = dependencies ]; then
        # Naming Airflow keeps pip from replacing the image's release while it resolves the extras.
        pip install --quiet -c constraints.txt "apache-airflow==${AIRFLOW_VERSION}" -r /tmp/olmocr-requirements.txt
    else
        pip install --quiet --no-deps ".[${extras}]"
    fi
fi
rm -f /tmp/olmocr-requirements.txt
