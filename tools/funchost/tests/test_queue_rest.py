"""The storage-queue trigger's REST calls (queue_rest.py) against Azurite: the same messages,
errors and visibility as through the SDK."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from tools.funchost.queue_rest import lean_queue

from .support import eventually


@pytest.fixture
def queue(storage_connection_string, unique_name) -> QueueClient:
    client = QueueClient.from_connection_string(storage_connection_string, unique_name("rest-"))
    client.create_queue()
    return client


def test_a_message_is_sent_received_and_deleted_as_through_the_sdk(queue):
    rest = lean_queue(queue, pool_size=2)
    text = "<order id=\"o&1\"> é ✓ +/= '"
    rest.send(text)
    (peeked,) = queue.peek_messages()  # what the SDK reads of it
    assert peeked.content == text

    (first,) = rest.receive(16, 3)
    assert first.id == peeked.id and first.dequeue_count == 1
    assert first.next_visible_on - first.inserted_on >= timedelta(seconds=2)  # hidden for the 3 s asked
    (message,) = eventually(lambda: rest.receive(16, 30), what="the message visible again after 3 s")
    assert (message.id, message.content, message.dequeue_count) == (peeked.id, text, 2)
    assert (message.inserted_on, message.expires_on) == (peeked.inserted_on, peeked.expires_on)
    assert message.next_visible_on > message.inserted_on and message.pop_receipt

    with pytest.raises(HttpResponseError) as refused:
        rest.delete(message.id, "AgAAAAMAAAAAAAAA+/==")  # not its pop receipt: refused, not "gone"
    assert refused.value.status_code == 400 and not isinstance(refused.value, ResourceNotFoundError)
    rest.delete(message.id, message.pop_receipt)
    assert queue.get_queue_properties().approximate_message_count == 0
    with pytest.raises(ResourceNotFoundError):
        rest.delete(message.id, message.pop_receipt)
    rest.close()


def test_a_missing_queue_is_not_found_for_each_call(storage_connection_string, unique_name):
    rest = lean_queue(QueueClient.from_connection_string(storage_connection_string, unique_name("gone-")), 1)
    with pytest.raises(ResourceNotFoundError):
        rest.receive(1, 30)
    with pytest.raises(ResourceNotFoundError):
        rest.send("x")


def test_without_an_account_key_the_sdk_is_kept(queue):
    sas = QueueClient.from_queue_url(f"{queue.url}?sv=2024-08-04&sig=not-a-real-signature")
    assert lean_queue(sas, pool_size=1) is None
