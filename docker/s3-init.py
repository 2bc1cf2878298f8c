"""One-shot S3 setup run by the s3-init service: create the bucket and upload the sample PDFs under
input/ so a first DAG run has something to convert. Idempotent; works against MinIO or any S3 endpoint.

Endpoint and credentials come from the AWS_* variables compose.yaml gives every Airflow container.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

bucket = os.environ.get("OLMOCR_BUCKET", "olmocr")
s3 = boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or None)
region = os.environ.get("AWS_REGION", "us-east-1")
try:
    s3.head_bucket(Bucket=bucket)
except ClientError:
    # us-east-1 is S3's default location and takes no constraint; every other region needs one.
    location = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    s3.create_bucket(Bucket=bucket, **location)
print(f"s3-init: bucket {bucket} ready")

# Samples are a convenience: failing to upload them must not block Airflow's workers.
examples = Path("/examples")
try:
    for path in sorted(path for path in examples.rglob("*") if path.suffix.lower() == ".pdf"):
        s3.upload_file(str(path), bucket, f"input/{path.relative_to(examples).as_posix()}")
        print(f"s3-init: uploaded input/{path.relative_to(examples).as_posix()}")
except (OSError, ClientError) as error:
    print(f"s3-init: could not upload the sample PDFs (continuing): {error}", file=sys.stderr)
