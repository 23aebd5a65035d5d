"""Service Bus queue trigger and outputs, on the project's emulator, through a real host process."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.storage.queue import QueueClient

from .support import APP_DIR, eventually, host_env, most_at_once, receive, records, unb64


@pytest.fixture
def sb_host(funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path):
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path,
        lock_duration=timedelta(seconds=10), max_delivery_count=3, enabled=("sb_record",),
    )
    (host,) = funchost.start(APP_DIR, env=env)
    return host, names, QueueClient.from_connection_string(storage_connection_string, names["FH_OUT_QUEUE"]), tmp_path


def _send(connection_string: str, queue: str, *messages: ServiceBusMessage) -> None:
    with ServiceBusClient.from_connection_string(connection_string) as client, client.get_queue_sender(queue) as sender:
        sender.send_messages(list(messages))


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_a_message_reaches_the_function_with_every_property_and_outputs_go_out(sb_host, servicebus_emulator):
    host, names, storage_out, record_dir = sb_host
    message_id = str(uuid.uuid4())
    properties = {"kind": "order", "attempt": 2, "urgent": True, "ratio": 0.5}
    before = datetime.now(UTC)
    _send(
        servicebus_emulator.connection_string,
        names["FH_SB_QUEUE"],
        ServiceBusMessage(
            b'{"out": "hello"}',
            message_id=message_id,
            correlation_id="order-42",
            reply_to="status-queue",
            content_type="application/json",
            subject="order.created",
            to="scheduler",
            application_properties=properties,
            time_to_live=timedelta(minutes=5),
        ),
    )

    (seen,) = eventually(lambda: records(record_dir, "sb_record", "start"), what="the invocation")
    assert seen["type"] == "ServiceBusMessage"
    assert seen["body"] == '{"out": "hello"}'
    assert seen["message_id"] == message_id
    assert seen["metadata_message_id"] == message_id
    assert seen["correlation_id"] == "order-42"
    assert seen["reply_to"] == "status-queue"
    assert seen["content_type"] == "application/json"
    assert seen["subject"] == seen["label"] == "order.created"
    assert seen["to"] == "scheduler"
    assert seen["delivery_count"] == 1
    assert isinstance(seen["sequence_number"], int)
    assert str(uuid.UUID(seen["lock_token"])) == seen["lock_token"]
    # As the Functions host sends them: times in UTC without an offset (the worker makes them naive
    # datetimes), the expiry from the message's absolute-expiry-time (the sender's clock, whole seconds),
    # and no LockedUntil or TimeToLive at all (the Service Bus extension's binding data has neither).
    assert seen["enqueued_time_is_naive"]
    enqueued = _parse(seen["enqueued_time_utc"]).replace(tzinfo=UTC)
    assert before - timedelta(seconds=5) <= enqueued <= datetime.now(UTC)
    expires = _parse(seen["expires_at_utc"]).replace(tzinfo=UTC)
    assert abs(expires - (enqueued + timedelta(minutes=5))) <= timedelta(seconds=2)
    assert seen["locked_until"] is None and seen["time_to_live"] is None
    assert seen["application_properties"] == seen["user_properties"] == properties

    # Both outputs went out after the call; the trigger message was completed.
    (bus_out,) = receive(servicebus_emulator.connection_string, names["FH_SB_OUT_QUEUE"], 1)
    assert str(bus_out) == "hello"
    texts = eventually(lambda: [m.content for m in storage_out.peek_messages()], what="the storage queue output")
    assert [unb64(text) for text in texts] == ["hello"]
    eventually(
        lambda: (
            servicebus_emulator.message_counts(names["FH_SB_QUEUE"])
            == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
        ),
        what="the trigger message to be completed",
    )
    (invocation,) = host.invocations("sb_record")
    assert invocation.succeeded and f"message_id={message_id}" in invocation.details


def test_an_exception_abandons_until_max_delivery_count_dead_letters_it_and_nothing_is_sent(
    sb_host, servicebus_emulator
):
    host, names, storage_out, record_dir = sb_host
    _send(
        servicebus_emulator.connection_string,
        names["FH_SB_QUEUE"],
        ServiceBusMessage(b'{"fail": true, "out": "never"}', message_id="doomed"),
    )

    eventually(
        lambda: servicebus_emulator.message_counts(names["FH_SB_QUEUE"])["dead_letter"] == 1,
        what="the message in the dead-letter queue",
    )
    assert [r["delivery_count"] for r in records(record_dir, "sb_record", "fail")] == [1, 2, 3]
    assert servicebus_emulator.message_counts(names["FH_SB_QUEUE"])["active"] == 0
    (dead,) = receive(
        servicebus_emulator.connection_string, names["FH_SB_QUEUE"], 1, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    )
    assert dead.message_id == "doomed"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert servicebus_emulator.message_counts(names["FH_SB_OUT_QUEUE"])["active"] == 0, "a Service Bus output was sent"
    assert list(storage_out.peek_messages()) == [], "a storage queue output was sent"
    assert [i.outcome for i in host.invocations("sb_record")] == ["Failed"] * 3


def test_max_concurrent_calls_bounds_the_invocations_in_flight(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    # host.json says 4; an app setting overrides it, as in Azure.
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path,
        lock_duration=timedelta(seconds=30), enabled=("sb_record",),
        AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls="3",
    )
    queue = names["FH_SB_QUEUE"]
    funchost.start(APP_DIR, env=env)
    _send(
        servicebus_emulator.connection_string,
        queue,
        *[ServiceBusMessage('{"sleep": 0.4}', message_id=f"c{i}") for i in range(9)],
    )

    eventually(lambda: len(records(tmp_path, "sb_record", "done")) == 9, what="nine invocations")
    started, finished = records(tmp_path, "sb_record", "start"), records(tmp_path, "sb_record", "done")
    assert most_at_once(started, finished) == 3
