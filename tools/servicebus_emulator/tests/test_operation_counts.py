"""The emulator's operation counters (``operation_counts()``), through the real SDK.

The session-wide emulator is shared, so each test reads the counters of its own queue,
as the difference between two readings.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from tools import servicebus_emulator as emulator

from .conftest import receive_exactly, sender_for, wait_until


def delta(after: dict[str, int], before: dict[str, int]) -> Counter[str]:
    return Counter({key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)})


def of(counts: Counter[str], queue: str) -> dict[str, int]:
    """The counters of one queue (and its dead-letter queue), keyed without the queue's name."""
    return {
        key.rsplit(" ", 1)[0] + (" dlq" if key.endswith("/$deadletterqueue") else ""): value
        for key, value in counts.items()
        if key.endswith(f" {queue}") or key.endswith(f" {queue}/$deadletterqueue")
    }


def test_every_kind_of_operation_is_counted_per_queue(servicebus_emulator, client, queue):
    before = servicebus_emulator.operation_counts()
    with sender_for(client, queue) as sender:
        batch = sender.create_message_batch()
        for number in range(4):
            batch.add_message(ServiceBusMessage(f"m{number}"))
        sender.send_messages(batch)  # one transfer, four messages
        sender.send_messages(ServiceBusMessage("m4"))
        sender.schedule_messages(ServiceBusMessage("later"), datetime.now(UTC) + timedelta(hours=1))
    with client.get_queue_receiver(queue) as receiver:
        completed, abandoned, dead, deferred, kept = receive_exactly(receiver, 5)
        receiver.renew_message_lock(kept)
        receiver.complete_message(completed)
        receiver.abandon_message(abandoned)
        receiver.dead_letter_message(dead, reason="test")
        receiver.defer_message(deferred)
        receiver.complete_message(kept)
        (again,) = receive_exactly(receiver, 1)  # the abandoned one
        receiver.complete_message(again)
        receiver.peek_messages(10, sequence_number=1)
        (deferred_again,) = receiver.receive_deferred_messages([deferred.sequence_number])
        receiver.complete_message(deferred_again)  # through $management
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
        (dead_again,) = receive_exactly(dead_letters, 1)
        dead_letters.complete_message(dead_again)

    counts = delta(servicebus_emulator.operation_counts(), before)
    assert of(counts, queue) == {
        "enqueue": 5,  # messages, not transfers; scheduled ones are a management operation
        "management.schedule-message": 1,
        "deliver": 6,  # five, and the abandoned one again
        "settle.accepted": 3,
        "settle.modified": 2,  # abandon, defer
        "settle.rejected": 1,  # dead-letter
        "management.renew-lock": 1,
        "management.peek-message": 1,
        "management.receive-by-sequence-number": 1,
        "management.update-disposition": 1,
        "deliver dlq": 1,
        "settle.accepted dlq": 1,
    }
    assert counts["connections"] >= 1
    assert counts["frame.open"] == counts["connections"]
    assert counts["frame.transfer"] >= 2 and counts["frame.disposition"] >= 6
    assert counts["frame.attach"] >= 3 and counts["frame.flow"] >= 1


def test_released_deliveries_are_counted_apart(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
    before = servicebus_emulator.operation_counts()
    with client.get_queue_receiver(queue, prefetch_count=5) as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        wait_until(lambda: servicebus_emulator.message_counts(queue)["locked"] == 5, what="the prefetch")
        receiver.complete_message(first)
    counts = of(delta(servicebus_emulator.operation_counts(), before), queue)
    assert counts == {"deliver": 5, "settle.accepted": 1, "settle.released": 4}


def test_counts_start_at_zero_and_a_server_counts_only_its_own_work():
    with emulator.start(queues=[emulator.QueueSettings("solo")]) as other:
        assert other.operation_counts() == {}
        other.declare_queue("second")
        assert other.operation_counts() == {}, "declaring queues is configuration, not an operation"
