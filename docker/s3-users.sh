#!/bin/sh
# One-shot setup run by the s3-users service, the only one given MinIO's root account: the bucket, a
# policy limited to it, and the account every Airflow container uses (OLMOCR_S3_ACCESS_KEY_ID), so a
# compromised task reaches the bucket and nothing else in the store. Safe to run again.
# No secret goes on a command line: the root account reaches mc as MC_HOST_store, the new account's
# keys on mc's standard input.
set -eu

sh "$(dirname "$0")/check-secrets.sh" MINIO_ROOT_PASSWORD:16 OLMOCR_S3_SECRET_ACCESS_KEY:16

bucket="${OLMOCR_BUCKET:-olmocr}"
user="${OLMOCR_S3_ACCESS_KEY_ID:?OLMOCR_S3_ACCESS_KEY_ID is not set}"
if [ "$user" = "$MINIO_ROOT_USER" ]; then
    echo "olmocr-airflow: refusing to start: OLMOCR_S3_ACCESS_KEY_ID is MinIO's root user; Airflow gets an account of its own (make docker-env)." >&2
    exit 1
fi
export MC_HOST_store="http://${MINIO_ROOT_USER}:${MINIO_ROOT_PASSWORD}@minio:${MINIO_PORT:-9000}"

echo "s3-users: bucket ${bucket}"
mc mb --ignore-existing "store/${bucket}"

policy="$(mktemp)"
trap 'rm -f "$policy"' EXIT
printf '%s' '{"Version": "2012-10-17", "Statement": [
  {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
   "Resource": ["arn:aws:s3:::'"$bucket"'"]},
  {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
   "Resource": ["arn:aws:s3:::'"$bucket"'/*"]}]}' >"$policy"
echo "s3-users: policy olmocr-bucket (${bucket} only)"
mc admin policy create store olmocr-bucket "$policy"

echo "s3-users: account ${user}"
printf '%s\n%s\n' "$user" "$OLMOCR_S3_SECRET_ACCESS_KEY" | mc admin user add store
# Attaching a policy the account already has is an error to mc; the account's policy is what counts.
if ! mc admin policy attach store olmocr-bucket --user "$user" 2>/dev/null; then
    mc admin user info store "$user" | grep -q 'olmocr-bucket'
fi
echo "s3-users: done"
