#!/bin/sh
# One-shot MinIO setup run by the minio-init service: create the bucket and upload the sample PDFs
# under input/ so a first DAG run has something to convert. Idempotent.
set -eu

mc alias set local http://minio:9000 "${MINIO_ROOT_USER}" "${MINIO_ROOT_PASSWORD}" >/dev/null
mc mb --ignore-existing "local/${OLMOCR_BUCKET}"

# Samples are a convenience: failing to upload them must not block Airflow's workers.
if [ -d /examples ]; then
    mc mirror --overwrite --exclude "*.py" /examples "local/${OLMOCR_BUCKET}/input" \
        || echo "minio-init: could not upload the sample PDFs (continuing)"
fi
echo "minio-init: bucket ${OLMOCR_BUCKET} ready"
