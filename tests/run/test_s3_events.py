"""S3 event notifications (as the SQS AssetWatcher records them) → the PDFs to convert."""

from __future__ import annotations

import json
from typing import Any

from olmocr_tasks.run.s3_events import documents_from_asset_events


def record(key: str, event: str = "ObjectCreated:Put", bucket: str = "inbox-bucket") -> dict[str, Any]:
    """One record of an S3 event notification, keys encoded the way S3 encodes them."""
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": event,
        "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": 1234}},
    }


def message(*records: dict[str, Any], message_id: str = "m") -> dict[str, Any]:
    return {"MessageId": message_id, "ReceiptHandle": "r", "Body": json.dumps({"Records": list(records)})}


TEST_EVENT = {
    "MessageId": "test",
    "Body": json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "inbox-bucket"}),
}


def watcher_event(*messages: dict[str, Any]) -> dict[str, Any]:
    """The ``extra`` of an asset event recorded by AssetWatcher(MessageQueueTrigger(scheme="sqs"))."""
    return {"from_trigger": True, "payload": {"status": "success", "message_batch": list(messages)}}


def test_keys_are_url_decoded_with_plus_as_space() -> None:
    parsed = documents_from_asset_events(
        [watcher_event(message(record("in/a+b%2Bc.pdf"), record("in/caf%C3%A9+menu.PDF")))]
    )
    assert parsed.uris == ["s3://inbox-bucket/in/a b+c.pdf", "s3://inbox-bucket/in/café menu.PDF"]


def test_several_records_messages_and_events_in_arrival_order() -> None:
    first = watcher_event(message(record("1.pdf"), record("2.pdf")), message(record("3.pdf")))
    second = watcher_event(message(record("4.pdf", bucket="other")))
    parsed = documents_from_asset_events([first, second])
    assert parsed.uris == [
        "s3://inbox-bucket/1.pdf",
        "s3://inbox-bucket/2.pdf",
        "s3://inbox-bucket/3.pdf",
        "s3://other/4.pdf",
    ]
    assert parsed.messages == 3


def test_test_events_non_create_events_and_non_pdfs_are_ignored() -> None:
    parsed = documents_from_asset_events(
        [
            watcher_event(
                TEST_EVENT,
                message(
                    record("gone.pdf", event="ObjectRemoved:Delete"),
                    record("restored.pdf", event="ObjectRestore:Completed"),
                    record("notes.txt"),
                    record("copy.pdf", event="ObjectCreated:Copy"),
                    record("big.pdf", event="ObjectCreated:CompleteMultipartUpload"),
                    record("scans/Page.TIF"),
                    record("scans/anim.gif"),
                ),
            )
        ]
    )
    # Page images are documents too (issue 32); other files are not.
    assert parsed.uris == [
        "s3://inbox-bucket/copy.pdf",
        "s3://inbox-bucket/big.pdf",
        "s3://inbox-bucket/scans/Page.TIF",
    ]
    reasons = "\n".join(parsed.ignored)
    assert "s3:TestEvent" in reasons
    assert "ObjectRemoved:Delete" in reasons
    assert "ObjectRestore:Completed" in reasons
    assert "notes.txt: not a PDF or image name" in reasons and "anim.gif: not a PDF or image name" in reasons


def test_duplicates_are_returned_once() -> None:
    # SQS delivers at least once, and S3 may notify twice for one object.
    again = message(record("in/a+b%2Bc.pdf"), message_id="again")
    parsed = documents_from_asset_events(
        [watcher_event(message(record("in/a+b%2Bc.pdf")), again), watcher_event(again)]
    )
    assert parsed.uris == ["s3://inbox-bucket/in/a b+c.pdf"]


def test_sns_wrapped_notifications_are_unwrapped() -> None:
    inner = json.dumps({"Records": [record("via-sns.pdf")]})
    envelope = {"MessageId": "sns", "Body": json.dumps({"Type": "Notification", "Message": inner})}
    assert documents_from_asset_events([watcher_event(envelope)]).uris == ["s3://inbox-bucket/via-sns.pdf"]


def test_rest_api_events_may_list_documents() -> None:
    parsed = documents_from_asset_events([{"from_rest_api": True, "documents": ["s3://b/x.pdf", "s3://b/x.pdf"]}])
    assert parsed.uris == ["s3://b/x.pdf"]


def test_malformed_input_is_reported_not_raised() -> None:
    parsed = documents_from_asset_events(
        [
            None,
            {"unrelated": 1},
            {"payload": {"status": "error", "message_batch": []}},
            {"payload": {"status": "success", "message_batch": "nope"}},
            watcher_event(
                {"MessageId": "a", "Body": "not json"},
                {"MessageId": "b", "Body": json.dumps([1, 2])},
                {"MessageId": "c", "Body": json.dumps({"Records": [{"eventName": "ObjectCreated:Put"}]})},
                {"MessageId": "d", "Body": json.dumps({"Records": "x"})},
                "not a dict",
                message(record("ok.pdf")),
            ),
        ]
    )
    assert parsed.uris == ["s3://inbox-bucket/ok.pdf"]
    assert len(parsed.ignored) == 9
