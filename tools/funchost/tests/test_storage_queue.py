"""Storage queue trigger and queue output on Azurite, through a real host process."""

from __future__ import annotations

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient

from .support import APP_DIR, b64, eventually, only, records, unb64


@pytest.fixture
def queue_host(funchost, storage_connection_string, unique_name, tmp_path):
    names = {"FH_QUEUE": unique_name("in-"), "FH_QUEUE_OUT": unique_name("out-")}
    env = {
        "AzureWebJobsStorage": storage_connection_string,
        "FH_RECORD_DIR": str(tmp_path),
        **names,
        **only("queue_record"),
    }
    (host,) = funchost.start(APP_DIR, env=env)

    def queue(name: str) -> QueueClient:
        return QueueClient.from_connection_string(storage_connection_string, name)

    return host, queue(names["FH_QUEUE"]), queue(names["FH_QUEUE_OUT"]), queue(names["FH_QUEUE"] + "-poison"), tmp_path


def _peek(queue: QueueClient) -> list[str]:
    try:
        return [message.content for message in queue.peek_messages(max_messages=32)]
    except ResourceNotFoundError:  # the poison queue exists from the first poison message on
        return []


def test_success_passes_a_queue_message_sends_the_return_output_and_deletes(queue_host):
    host, inbox, outbox, _, record_dir = queue_host
    # The host created the queues it triggers on and sends to, before any message.
    inbox.get_queue_properties()
    outbox.get_queue_properties()

    sent = inbox.send_message(b64('{"out": "hello"}'))

    delivered = eventually(lambda: _peek(outbox), what="the $return output message")
    assert [unb64(text) for text in delivered] == ["hello"]
    eventually(lambda: not _peek(inbox), what="the trigger message to be deleted")
    (seen,) = records(record_dir, "queue_record", "start")
    assert seen["type"] == "QueueMessage"
    assert seen["id"] == sent.id
    assert seen["body"] == '{"out": "hello"}'
    assert seen["dequeue_count"] == 1
    assert seen["insertion_time"] and seen["expiration_time"] and seen["pop_receipt"]
    assert seen["function_name"] == "queue_record" and seen["invocation_id"]
    (invocation,) = host.invocations("queue_record")
    assert invocation.succeeded and f"message_id={sent.id}" in invocation.details


def test_a_message_that_keeps_failing_is_retried_then_moved_to_poison_without_output(queue_host):
    host, inbox, outbox, poison, record_dir = queue_host
    text = b64('{"fail": true, "out": "never"}')

    inbox.send_message(text)

    assert eventually(lambda: _peek(poison), what="the poison queue message") == [text]
    # host.json of the test app: maxDequeueCount 3, visibilityTimeout 0.
    assert [r["dequeue_count"] for r in records(record_dir, "queue_record", "fail")] == [1, 2, 3]
    assert not _peek(inbox)
    assert not _peek(outbox), "an output was sent although the function raised"
    assert [i.outcome for i in host.invocations("queue_record")] == ["Failed"] * 3


def test_a_body_that_is_not_base64_goes_to_poison_without_a_call(queue_host):
    host, inbox, _, poison, record_dir = queue_host

    inbox.send_message("not base64 at all!")

    assert eventually(lambda: _peek(poison), what="the poison queue message") == ["not base64 at all!"]
    assert records(record_dir, "queue_record") == []
    # The host logs the move just after it; wait for the line rather than race it.
    host.wait_for_log("is not valid base64", timeout=10)
