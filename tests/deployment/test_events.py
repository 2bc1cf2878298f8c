"""Event-triggered runs: S3 bucket notifications → SQS → the AssetWatcher in the running triggerer.

moto delivers the bucket's ``ObjectCreated`` notifications to the SQS queue the deployment's
``OLMOCR_SQS_QUEUE_URL`` names, one object per message as S3 does. S3 itself may put several records
in one message; moto never does, so one message is sent with the exact JSON S3 sends, naming two
objects (one key URL-encoded as S3 encodes it). The DAG is unpaused only once every message is
queued, so one watcher poll sees several messages, and the run(s) must convert exactly those objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import assert_outputs_name_their_pages, sources, union_converted
from tests.fixtures.s3 import s3_notification

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_s3_events"


def _queue_empty(bucket: Bucket, queue_url: str) -> bool:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = bucket.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return all(int(attributes[name]) == 0 for name in names)


@pytest.fixture
def notifications(deployment: Deployment, bucket: Bucket, prefix: str) -> Iterator[str]:
    """The bucket notifies the deployment's queue of PDFs created under ``<prefix>input/``; the queue starts empty.

    Afterwards the bucket notifies nothing and the queue is emptied again, however the test ended, so
    no message of this test triggers a run in another.
    """
    queue_arn = bucket.sqs.get_queue_attributes(QueueUrl=deployment.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    _drain(bucket, deployment.queue_url)
    rules = [{"Name": "prefix", "Value": f"{prefix}input/"}, {"Name": "suffix", "Value": ".pdf"}]
    bucket.s3.put_bucket_notification_configuration(
        Bucket=bucket.name,
        NotificationConfiguration={
            "QueueConfigurations": [
                {"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"], "Filter": {"Key": {"FilterRules": rules}}}
            ]
        },
    )
    yield f"{prefix}input/"
    bucket.s3.put_bucket_notification_configuration(Bucket=bucket.name, NotificationConfiguration={})
    _drain(bucket, deployment.queue_url)


def _drain(bucket: Bucket, queue_url: str) -> None:
    """Delete every visible message (PurgeQueue refuses a second purge within 60 s)."""
    while messages := bucket.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages"):
        entries = [{"Id": str(n), "ReceiptHandle": message["ReceiptHandle"]} for n, message in enumerate(messages)]
        bucket.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)


def test_s3_notifications_through_sqs_trigger_runs_that_convert_exactly_those_objects(
    deployment: Deployment, bucket: Bucket, prefix: str, notifications: str, unpause: Callable[[str], None]
) -> None:
    doc_ids: dict[str, int] = {}
    for number in range(3):
        doc_ids[bucket.put_pdf(f"{notifications}upload-{number}.pdf", pages=1 + number % 2, doc_id=150 + number)] = (
            150 + number
        )
    manual_keys = [f"{prefix}manual/first.pdf", f"{prefix}manual/two words.pdf"]
    for number, key in enumerate(manual_keys):
        doc_ids[bucket.put_pdf(key, doc_id=155 + number)] = 155 + number
    bucket.sqs.send_message(QueueUrl=deployment.queue_url, MessageBody=s3_notification(bucket.name, *manual_keys))
    unnotified = bucket.put_pdf(f"{prefix}elsewhere/quiet.pdf", doc_id=158)
    messages = 4
    # Runs another test (or an earlier try of this one) caused are not this test's.
    earlier = {run["dag_run_id"] for run in deployment.api.dag_runs(DAG)}

    def mine() -> list[dict[str, Any]]:
        return [run for run in deployment.api.dag_runs(DAG) if run["dag_run_id"] not in earlier]

    unpause(DAG)
    # The watcher starts polling once the DAG is parsed unpaused; parse now instead of in minutes.
    deployment.api.reparse(DAG)

    def all_converted() -> list[dict[str, Any]] | None:
        if not _queue_empty(bucket, deployment.queue_url):
            return None
        runs = mine()
        if not runs or any(run["state"] not in ("success", "failed") for run in runs):
            return None
        manifests = [bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"]) for run in runs]
        if any(manifest is None for manifest in manifests):
            return None
        return manifests if set(union_converted(manifests)) >= set(doc_ids) else None

    manifests = wait_until(all_converted, timeout=600, interval=3, what="every notified object converted")

    runs = mine()
    assert {run["run_type"] for run in runs} == {"asset_triggered"}
    assert {run["state"] for run in runs} == {"success"}
    assert union_converted(manifests) == sorted(doc_ids), "each notified object converted exactly once"
    assert sorted(source for manifest in manifests for source in sources(manifest)) == sorted(doc_ids), (
        "each notified object listed exactly once"
    )
    assert len(runs) < messages, "several messages feed one run"
    assert not any(unnotified in sources(manifest) for manifest in manifests)
    for manifest in manifests:
        assert_outputs_name_their_pages(bucket, manifest, doc_ids)
