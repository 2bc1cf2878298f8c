"""Turn S3 event notifications delivered through SQS into the list of PDFs to convert.

No Airflow here: the event DAG hands over the ``extra`` of each triggering asset event. An event
recorded by ``AssetWatcher(MessageQueueTrigger(scheme="sqs"))`` looks like::

    {"from_trigger": True,
     "payload": {"status": "success",
                 "message_batch": [{"MessageId": "...", "Body": "<S3 event notification JSON>"}, ...]}}

Rules, each from how S3 notifications really behave:

* object keys arrive URL-encoded with ``+`` for a space (``unquote_plus``);
* one message may hold several records, one run may consume several messages and several events;
* ``s3:TestEvent`` (sent when a notification is configured) and every event that is not
  ``ObjectCreated:*`` (deletes, restores, tagging) are ignored;
* keys that are not PDFs are ignored (a notification filter is not guaranteed to be configured);
* SQS delivers at least once, so a URI is returned once however often it arrives;
* messages that went through SNS carry the notification as a string under ``Message``.

An asset event posted through the REST API may instead carry ``{"documents": ["s3://...", ...]}``.
Anything unreadable is reported in ``ignored`` rather than raised: the trigger has already deleted
the messages, so failing the run would not bring them back, and the scheduled DAG reconciles.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

from olmocr_tasks.core.formats import is_document_name

CREATED_PREFIX = "ObjectCreated:"
TEST_EVENT = "s3:TestEvent"


@dataclass
class EventDocuments:
    """The PDFs named by a set of events, in arrival order, and why other entries were dropped."""

    uris: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    messages: int = 0
    _seen: set[str] = field(default_factory=set, repr=False)

    def add(self, uri: str) -> None:
        if uri not in self._seen:
            self._seen.add(uri)
            self.uris.append(uri)


def documents_from_asset_events(extras: Iterable[Mapping[str, Any] | None]) -> EventDocuments:
    """Collect the PDFs named by the ``extra`` of every triggering asset event of a run."""
    result = EventDocuments()
    for extra in extras:
        _read_event_extra(extra or {}, result)
    return result


def _read_event_extra(extra: Mapping[str, Any], result: EventDocuments) -> None:
    documents = extra.get("documents")
    if documents is not None:
        if isinstance(documents, list) and all(isinstance(uri, str) for uri in documents):
            for uri in documents:
                result.add(uri)
        else:
            result.ignored.append("asset event 'documents' is not a list of URIs")
        return
    payload = extra.get("payload")
    if not isinstance(payload, Mapping):
        result.ignored.append(f"asset event without a message payload (keys: {sorted(extra)})")
        return
    if payload.get("status") not in (None, "success"):
        result.ignored.append(f"trigger payload with status {payload.get('status')!r}")
        return
    batch = payload.get("message_batch")
    if not isinstance(batch, list):
        result.ignored.append("trigger payload without a message_batch list")
        return
    for message in batch:
        if isinstance(message, Mapping):
            _read_message(message, result)
        else:
            result.ignored.append("message that is not an object")


def _read_message(message: Mapping[str, Any], result: EventDocuments) -> None:
    result.messages += 1
    label = str(message.get("MessageId") or f"#{result.messages}")
    body = message.get("Body")
    try:
        notification = json.loads(body) if isinstance(body, str | bytes) else body
    except ValueError:
        result.ignored.append(f"message {label}: body is not JSON")
        return
    if not isinstance(notification, Mapping):
        result.ignored.append(f"message {label}: body is not a JSON object")
        return
    # SNS fan-out wraps the S3 notification as a string in the envelope's "Message".
    if notification.get("Type") == "Notification" and isinstance(notification.get("Message"), str):
        try:
            notification = json.loads(notification["Message"])
        except ValueError:
            result.ignored.append(f"message {label}: SNS Message is not JSON")
            return
        if not isinstance(notification, Mapping):
            result.ignored.append(f"message {label}: SNS Message is not a JSON object")
            return
    if notification.get("Event") == TEST_EVENT:
        result.ignored.append(f"message {label}: {TEST_EVENT}")
        return
    records = notification.get("Records")
    if not isinstance(records, list):
        result.ignored.append(f"message {label}: no Records")
        return
    for record in records:
        _read_record(record, label, result)


def _read_record(record: Any, label: str, result: EventDocuments) -> None:
    if not isinstance(record, Mapping):
        result.ignored.append(f"message {label}: a record is not an object")
        return
    event_name = str(record.get("eventName") or "")
    s3 = record.get("s3")
    try:
        bucket = s3["bucket"]["name"]  # type: ignore[index]
        raw_key = s3["object"]["key"]  # type: ignore[index]
    except (KeyError, TypeError):
        result.ignored.append(f"message {label}: record {event_name or '?'} without s3.bucket.name/object.key")
        return
    key = unquote_plus(str(raw_key))
    uri = f"s3://{bucket}/{key}"
    if not event_name.startswith(CREATED_PREFIX):
        result.ignored.append(f"{uri}: {event_name or 'unnamed event'} is not an object creation")
        return
    if not is_document_name(key):
        result.ignored.append(f"{uri}: not a PDF or image name")
        return
    result.add(uri)
