"""Convert exactly the PDFs named by S3 event notifications, as soon as they arrive through SQS.

    [check_server, plan (reads the events)] ─► convert[batch…] ─► publish_manifest ─► enforce_error_budget

An ``AssetWatcher`` polls the SQS queue that receives the bucket's ``ObjectCreated`` notifications;
each batch of messages becomes an asset event, and the events that accumulated trigger one run.
Keys are URL-decoded, test events and non-create events ignored, duplicates converted once; the
conversion tasks are the ingestion DAG's. Asset-triggered runs have no logical date or data interval.

Configuration: ``OLMOCR_SQS_QUEUE_URL`` **must** be set for events to arrive (without it the DAG still
loads, watching a placeholder queue that does not exist); ``OLMOCR_SQS_WAITER_DELAY`` (seconds between
empty polls, default 30); ``OLMOCR_SQS_CONN_ID`` (AWS connection for the queue, default ``aws_default``;
set it when ``aws_default`` points its ``endpoint_url`` at MinIO); ``OLMOCR_INPUT_URI`` (outputs
mirror keys relative to it) and ``OLMOCR_OUTPUT_URI``. The watcher polls only while this DAG is
unpaused. SQS messages are deleted when received, so the scheduled ``olmocr_ingest`` DAG remains the
reconciliation path. ``OLMOCR_SERVER_READY_TIMEOUT``, the failure notifier and OpenLineage work as
in ``olmocr_ingest``.
"""

from __future__ import annotations

import os

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher, dag

from olmocr_tasks.provider.flow import conversion_flow
from olmocr_tasks.provider.hooks import AWS_CONN_ID
from olmocr_tasks.provider.notifications import notify_run_failure
from olmocr_tasks.provider.params import event_params

QUEUE_PLACEHOLDER = "https://sqs.us-east-1.amazonaws.com/000000000000/set-OLMOCR_SQS_QUEUE_URL"
ASSET_NAME = "olmocr_s3_object_created"

s3_object_created = Asset(
    name=ASSET_NAME,
    watchers=[
        AssetWatcher(
            name="olmocr_s3_events_sqs",
            trigger=MessageQueueTrigger(
                scheme="sqs",
                sqs_queue=os.environ.get("OLMOCR_SQS_QUEUE_URL") or QUEUE_PLACEHOLDER,
                aws_conn_id=os.environ.get("OLMOCR_SQS_CONN_ID") or AWS_CONN_ID,
                max_messages=10,
                # Long polling: fewer empty receives, and events arrive within a second of a message.
                wait_time_seconds=20,
                waiter_delay=int(os.environ.get("OLMOCR_SQS_WAITER_DELAY", "30")),
            ),
        )
    ],
)


@dag(
    dag_id="olmocr_s3_events",
    schedule=[s3_object_created],
    catchup=False,
    max_active_runs=int(os.environ.get("OLMOCR_MAX_ACTIVE_RUNS", "2")),
    params=event_params(),
    tags=["olmocr"],
    # Sends the failed run's report through the notifier the olmocr_failure_notifier Variable names.
    on_failure_callback=notify_run_failure,
    doc_md=__doc__,
)
def olmocr_s3_events() -> None:
    conversion_flow(event_asset=ASSET_NAME)


olmocr_s3_events()
