"""What other AMQP clients send, handled as Azure Service Bus handles it.

The Python SDK sends UUID message ids and ``modified`` outcomes with ``delivery-failed``
set; the JavaScript SDK (``@azure/service-bus``) sends string message ids and abandons
without ``delivery-failed``; the .NET SDK abandons with an empty ``modified``. These
tests put those bytes on the wire with a raw client (``rawamqp``); ``test_js_sdk.py``
runs the JavaScript SDK itself.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageState, ServiceBusSubQueue

from tools.servicebus_emulator import codec

from .conftest import receive_exactly, sender_for
from .rawamqp import (
    RELEASED,
    RawClient,
    application_properties,
    correlation_id,
    enc_map,
    enc_ulong,
    enc_uuid,
    enc_uuid_array,
    header_delivery_count,
    message,
    modified,
    rejected,
    section,
    status_code,
    typed,
)

MESSAGE_IDS = {
    "string": codec.enc_string("d3b07384-d9a0-4c9b-8f7e-5c1a2b3c4d5e"),  # the JavaScript SDK's
    "uuid": enc_uuid(uuid.UUID("d3b07384-d9a0-4c9b-8f7e-5c1a2b3c4d5e")),  # the Python and .NET SDKs'
    "ulong": enc_ulong(42),
    "binary": codec.enc_binary(b"\x00\x01request"),
}

#: How each SDK abandons: the fields of its ``modified`` outcome.
ABANDONS = {
    "dotnet: empty modified": [],
    "javascript: delivery-failed unset, undeliverable-here false": [codec.NULL, codec.FALSE],
    "python: delivery-failed true": [codec.TRUE, codec.FALSE],
    "delivery-failed false": [codec.FALSE, codec.FALSE],
}


@pytest.fixture
def raw(servicebus_emulator) -> Iterator[RawClient]:
    with RawClient(servicebus_emulator.port) as client:
        yield client


def _send(raw: RawClient, queue: str, payload: bytes) -> None:
    sender = raw.attach(queue, receiver=False)
    assert "accepted" in raw.send(sender, payload)


# --- request/reply: correlation id -----------------------------------------------------------


@pytest.mark.parametrize("kind", MESSAGE_IDS)
def test_a_cbs_reply_is_correlated_by_the_requests_message_id_of_the_same_type(raw, kind):
    reply = raw.request(
        "$cbs",
        "put-token",
        codec.enc_string("SharedAccessSignature sr=x&sig=y&se=1&skn=k"),
        message_id=MESSAGE_IDS[kind],
        properties=(("type", codec.enc_string("servicebus.windows.net:sastoken")), ("name", codec.enc_string("q"))),
    )
    assert status_code(reply) == 200
    assert typed(correlation_id(reply)) == typed(MESSAGE_IDS[kind])


@pytest.mark.parametrize("kind", MESSAGE_IDS)
def test_a_management_reply_is_correlated_by_the_requests_message_id_of_the_same_type(raw, queue, kind):
    body = enc_map(
        [
            (codec.enc_string("from-sequence-number"), codec.enc_long(1)),
            (codec.enc_string("message-count"), codec.enc_int(1)),
        ]
    )
    reply = raw.request(f"{queue}/$management", "com.microsoft:peek-message", body, message_id=MESSAGE_IDS[kind])
    assert status_code(reply) == 204  # nothing to peek
    assert typed(correlation_id(reply)) == typed(MESSAGE_IDS[kind])


def test_a_request_without_a_message_id_gets_a_reply_without_a_correlation_id(raw):
    reply = raw.request("$cbs", "put-token", codec.enc_string("token"), message_id=codec.NULL)
    assert status_code(reply) == 200
    assert correlation_id(reply) is None


# --- abandon, release, defer ---------------------------------------------------------------------


@pytest.mark.parametrize("fields", ABANDONS.values(), ids=ABANDONS.keys())
def test_every_sdks_abandon_counts_a_delivery_up_to_dead_lettering(servicebus_emulator, make_queue, raw, fields):
    queue = make_queue(max_delivery_count=2)
    _send(raw, queue, message(message_id=codec.enc_string("m1")))
    receiver = raw.attach(queue, receiver=True)
    first = raw.receive(receiver)
    assert header_delivery_count(first.payload) == 0
    assert "modified" in raw.settle(first, modified(fields))
    second = raw.receive(receiver)
    assert header_delivery_count(second.payload) == 1
    raw.settle(second, modified(fields))
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 1, "scheduled": 0, "locked": 0}
    dead = raw.receive(raw.attach(f"{queue}/$DeadLetterQueue", receiver=True))
    assert application_properties(dead.payload)["DeadLetterReason"] == codec.enc_string("MaxDeliveryCountExceeded")
    assert header_delivery_count(dead.payload) == 2


def test_released_hands_the_message_back_without_counting_a_delivery(servicebus_emulator, raw, queue):
    _send(raw, queue, message())
    receiver = raw.attach(queue, receiver=True)
    for _ in range(3):
        delivery = raw.receive(receiver)
        assert header_delivery_count(delivery.payload) == 0
        assert "released" in raw.settle(delivery, RELEASED)
    assert servicebus_emulator.message_counts(queue) == {"active": 1, "dead_letter": 0, "scheduled": 0, "locked": 0}


@pytest.mark.parametrize("delivery_failed", [codec.NULL, codec.TRUE], ids=["dotnet-javascript", "python"])
def test_modified_undeliverable_here_defers(servicebus_emulator, client, raw, queue, delivery_failed):
    _send(raw, queue, message())
    receiver = raw.attach(queue, receiver=True)
    raw.settle(raw.receive(receiver), modified([delivery_failed, codec.TRUE]))
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
    with client.get_queue_receiver(queue) as sdk_receiver:
        (peeked,) = sdk_receiver.peek_messages(5)
        assert peeked.state == ServiceBusMessageState.DEFERRED


# --- properties to modify --------------------------------------------------------------------------


def test_abandon_applies_the_properties_to_modify_with_their_types(raw, queue):
    _send(
        raw,
        queue,
        message(application_properties=[("kept", codec.enc_string("yes")), ("attempt", codec.enc_int(0))]),
    )
    receiver = raw.attach(queue, receiver=True)
    first = raw.receive(receiver)
    annotations = enc_map(
        [
            (codec.enc_symbol("attempt"), codec.enc_int(1)),  # replaces, keeping its place
            (codec.enc_symbol("note"), codec.enc_string("try later")),  # a string stays a string
            (codec.enc_string("token"), codec.enc_binary(b"\x01\x02")),  # a string key, binary value
        ]
    )
    raw.settle(first, modified([codec.NULL, codec.FALSE, annotations]))  # the JavaScript SDK's abandon
    second = raw.receive(receiver)
    assert header_delivery_count(second.payload) == 1
    assert list(application_properties(second.payload).items()) == [
        ("kept", codec.enc_string("yes")),
        ("attempt", codec.enc_int(1)),
        ("note", codec.enc_string("try later")),
        ("token", codec.enc_binary(b"\x01\x02")),
    ]


def test_defer_applies_the_properties_to_modify(client, raw, queue):
    _send(raw, queue, message(application_properties=[("kept", codec.enc_string("yes"))]))
    receiver = raw.attach(queue, receiver=True)
    delivery = raw.receive(receiver)
    annotations = enc_map([(codec.enc_symbol("deferredBy"), codec.enc_string("raw"))])
    raw.settle(delivery, modified([codec.NULL, codec.TRUE, annotations]))  # the .NET and JavaScript SDKs' defer
    with client.get_queue_receiver(queue) as sdk_receiver:
        (peeked,) = sdk_receiver.peek_messages(5)
        (again,) = sdk_receiver.receive_deferred_messages([peeked.sequence_number])
        assert again.application_properties == {b"kept": b"yes", b"deferredBy": b"raw"}
        sdk_receiver.complete_message(again)


def test_dead_letter_applies_the_other_entries_of_the_error_info_as_properties(servicebus_emulator, raw, queue):
    _send(raw, queue, message(application_properties=[("kept", codec.enc_string("yes"))]))
    delivery = raw.receive(raw.attach(queue, receiver=True))
    outcome = rejected(
        [
            ("note", codec.enc_string("set while dead-lettering")),  # the JavaScript SDK's extra properties
            ("DeadLetterReason", codec.enc_string("BadOrder")),
            ("DeadLetterErrorDescription", codec.enc_string("amount is negative")),
        ]
    )
    assert "rejected" in raw.settle(delivery, outcome)
    assert servicebus_emulator.message_counts(queue)["dead_letter"] == 1
    dead = raw.receive(raw.attach(f"{queue}/$DeadLetterQueue", receiver=True))
    assert list(application_properties(dead.payload).items()) == [
        ("kept", codec.enc_string("yes")),
        ("note", codec.enc_string("set while dead-lettering")),
        ("DeadLetterReason", codec.enc_string("BadOrder")),
        ("DeadLetterErrorDescription", codec.enc_string("amount is negative")),
    ]


def test_update_disposition_over_management_applies_properties_to_modify(raw, queue):
    # How the JavaScript SDK settles a message it received with receiveDeferredMessages.
    _send(raw, queue, message(application_properties=[("kept", codec.enc_string("yes"))]))
    receiver = raw.attach(queue, receiver=True)
    first = raw.receive(receiver)
    body = enc_map(
        [
            (codec.enc_string("lock-tokens"), enc_uuid_array([first.lock_token])),
            (codec.enc_string("disposition-status"), codec.enc_string("abandoned")),
            (codec.enc_string("properties-to-modify"), enc_map([(codec.enc_string("note"), codec.enc_string("x"))])),
        ]
    )
    reply = raw.request(f"{queue}/$management", "com.microsoft:update-disposition", body)
    assert status_code(reply) == 200
    second = raw.receive(receiver)
    assert header_delivery_count(second.payload) == 1
    assert application_properties(second.payload) == {"kept": codec.enc_string("yes"), "note": codec.enc_string("x")}


# --- message ids ----------------------------------------------------------------------------------


def test_a_message_sent_without_a_message_id_gets_one_on_enqueue(client, raw, queue):
    # Service Bus gives one to every message that has none; the JavaScript SDK relies on it.
    _send(raw, queue, message(with_properties=False, value=codec.enc_string("no properties section")))
    _send(raw, queue, message(message_id=None, value=codec.enc_string("no message id")))
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("own id", message_id="mine"))
    with client.get_queue_receiver(queue) as receiver:
        messages = receive_exactly(receiver, 3)
        for received in messages:
            receiver.complete_message(received)
    assert [m.body for m in messages[:2]] == [b"no properties section", b"no message id"]  # AMQP values
    ids = [m.message_id for m in messages]
    assert all(re.fullmatch(r"[0-9a-f]{32}", message_id) for message_id in ids[:2]), ids
    assert ids[0] != ids[1]
    assert (str(messages[2]), ids[2]) == ("own id", "mine")


def test_scheduled_messages_get_a_message_id_too(client, raw, queue):
    # The SDKs give scheduled messages an id themselves; a client that does not still gets one.
    later = codec.enc_timestamp(int((time.time() + 300) * 1000))
    scheduled = message(message_id=None, annotations=[("x-opt-scheduled-enqueue-time", later)])
    entry = enc_map([(codec.enc_string("message"), codec.enc_binary(scheduled))])
    body = enc_map([(codec.enc_string("messages"), codec.enc_list([entry]))])
    reply = raw.request(f"{queue}/$management", "com.microsoft:schedule-message", body)
    assert status_code(reply) == 200
    with client.get_queue_receiver(queue) as receiver:
        (peeked,) = receiver.peek_messages(1)
        assert peeked.state == ServiceBusMessageState.SCHEDULED
        assert re.fullmatch(r"[0-9a-f]{32}", peeked.message_id)


def test_the_dead_letter_queue_keeps_the_assigned_message_id(client, raw, queue):
    _send(raw, queue, message(message_id=None))
    raw.settle(raw.receive(raw.attach(queue, receiver=True)), rejected([]))
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (dead,) = receive_exactly(receiver, 1)
        assert re.fullmatch(r"[0-9a-f]{32}", dead.message_id)
        receiver.complete_message(dead)


# --- keys the broker owns ---------------------------------------------------------------------------


def _keys(payload: bytes, code: int) -> list[str | None]:
    """The keys of a message's annotations or application properties, in order, duplicates kept."""
    raw = section(payload, code)
    return [codec.text_key(key) for key, _ in codec.map_entries(raw)] if raw is not None else []


def test_a_clients_own_broker_annotations_are_replaced_not_duplicated(raw, queue):
    # A map's keys must be distinct: Service Bus sets these annotations itself.
    own = [
        ("x-opt-sequence-number", codec.enc_long(999)),
        ("x-opt-enqueued-time", codec.enc_timestamp(0)),
        ("x-opt-locked-until", codec.enc_timestamp(0)),
        ("x-opt-message-state", codec.enc_int(2)),
        ("x-opt-custom", codec.enc_string("kept")),
    ]
    _send(raw, queue, message(annotations=own))
    delivery = raw.receive(raw.attach(queue, receiver=True))
    keys = _keys(delivery.payload, codec.MESSAGE_ANNOTATIONS)
    assert sorted(keys) == sorted(set(keys)), keys
    assert keys[0] == "x-opt-custom"
    annotations = codec.decode_value(section(delivery.payload, codec.MESSAGE_ANNOTATIONS))
    assert annotations[b"x-opt-sequence-number"] != 999
    assert b"x-opt-message-state" not in annotations  # an active message has none


def test_a_message_dead_lettered_again_carries_the_new_reason_once(servicebus_emulator, raw, queue):
    # Sent on from a dead-letter queue with its properties, then dead-lettered again.
    _send(raw, queue, message(message_id=codec.enc_string("m")))
    reason = [("DeadLetterReason", codec.enc_string("First"))]
    raw.settle(raw.receive(raw.attach(queue, receiver=True)), rejected(reason))
    dead_letters = raw.attach(f"{queue}/$DeadLetterQueue", receiver=True)
    dead = raw.receive(dead_letters)
    raw.settle(dead, codec.outcome(codec.ACCEPTED))
    kept = list(application_properties(dead.payload).items())
    _send(raw, queue, message(message_id=codec.enc_string("m"), application_properties=kept))
    second_reason = rejected([("DeadLetterReason", codec.enc_string("Second"))])
    raw.settle(raw.receive(raw.attach(queue, receiver=True)), second_reason)
    second = raw.receive(dead_letters).payload
    assert _keys(second, codec.APPLICATION_PROPERTIES) == ["DeadLetterReason"]
    assert application_properties(second)["DeadLetterReason"] == codec.enc_string("Second")
    assert servicebus_emulator.message_counts(queue)["dead_letter"] == 1
