"""Each feature of the emulator, through the real azure-servicebus SDK (sync client) over a real socket."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import azure.servicebus
import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageLockLostError, MessagingEntityNotFoundError, ServiceBusError

from tools import servicebus_emulator as emulator

from .conftest import receive_exactly, sender_for, wait_until


def test_installed_sdk_is_the_version_the_emulator_was_built_against():
    # The emulator reuses the SDK's private _pyamqp codec: a different SDK version needs re-verifying.
    assert azure.servicebus.__version__ == emulator.SUPPORTED_SDK_VERSION, (
        f"azure-servicebus {azure.servicebus.__version__} is installed but the emulator was built against "
        f"{emulator.SUPPORTED_SDK_VERSION}; install that version or re-verify the emulator and update its pin"
    )
    emulator.check_sdk_version()


def test_another_sdk_version_stops_the_emulator_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(azure.servicebus, "__version__", "7.99.0")
    with pytest.raises(emulator.SdkVersionError, match=r"built against azure-servicebus==7\.15\.0.*7\.99\.0"):
        emulator.start()


def test_send_single_and_receive_peek_lock_then_complete(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("hello"))
    assert servicebus_emulator.message_counts(queue) == {"active": 1, "dead_letter": 0, "scheduled": 0, "locked": 0}
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receive_exactly(receiver, 1)
        assert str(message) == "hello"
        assert message.delivery_count == 0  # the Python SDK shows the header's count raw
        assert servicebus_emulator.message_counts(queue)["locked"] == 1
        receiver.complete_message(message)
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_send_a_list_and_a_batch(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(3)])
        batch = sender.create_message_batch()
        for i in range(50):
            batch.add_message(ServiceBusMessage(f"batch-{i}"))
        sender.send_messages(batch)
    assert servicebus_emulator.message_counts(queue)["active"] == 53
    with client.get_queue_receiver(queue) as receiver:
        messages = receive_exactly(receiver, 53)
        for message in messages:
            receiver.complete_message(message)
    assert [str(m) for m in messages] == [f"list-{i}" for i in range(3)] + [f"batch-{i}" for i in range(50)]
    numbers = [m.sequence_number for m in messages]
    assert numbers == sorted(numbers) and len(set(numbers)) == 53


def test_batch_size_comes_from_the_emulators_max_message_size(client, queue):
    with sender_for(client, queue) as sender:
        batch = sender.create_message_batch()
        assert batch.max_size_in_bytes == 1024 * 1024


def test_receive_and_delete_removes_on_delivery(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        messages = receive_exactly(receiver, 2)
        assert [str(m) for m in messages] == ["a", "b"]
        assert all(m.lock_token is None for m in messages)
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_every_message_property_round_trips(client, queue):
    scheduled = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)  # already due: enqueued at once
    sent = ServiceBusMessage(
        b"\x00binary body\xff",
        message_id="id-1",
        correlation_id="corr-1",
        reply_to="replies",
        reply_to_session_id="reply-session",
        session_id="session-1",
        subject="the subject",
        content_type="application/json",
        to="someone",
        application_properties={"text": "v", "number": 42, "ratio": 0.5, "flag": True},
        time_to_live=timedelta(minutes=5),
        scheduled_enqueue_time_utc=scheduled,
    )
    before = datetime.now(UTC)
    with sender_for(client, queue) as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver(queue) as receiver:
        (got,) = receive_exactly(receiver, 1)
        receiver.complete_message(got)
    assert b"".join(got.body) == b"\x00binary body\xff"
    assert got.message_id == "id-1"
    assert got.correlation_id == "corr-1"
    assert got.reply_to == "replies"
    assert got.reply_to_session_id == "reply-session"
    assert got.session_id == "session-1"
    assert got.subject == "the subject"
    assert got.content_type == "application/json"
    assert got.to == "someone"
    assert got.application_properties == {b"text": b"v", b"number": 42, b"ratio": 0.5, b"flag": True}
    assert got.time_to_live == timedelta(minutes=5)
    assert got.scheduled_enqueue_time_utc == scheduled
    assert got.expires_at_utc == got.enqueued_time_utc + timedelta(minutes=5)
    assert before - timedelta(seconds=1) < got.enqueued_time_utc < datetime.now(UTC) + timedelta(seconds=1)


def test_broker_properties_sequence_number_enqueued_time_and_lock(make_queue, client):
    queue = make_queue(lock_duration=timedelta(seconds=30))
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage("1"), ServiceBusMessage("2")])
    with client.get_queue_receiver(queue) as receiver:
        first, second = receive_exactly(receiver, 2)
        now = datetime.now(UTC)
        assert second.sequence_number == first.sequence_number + 1
        assert abs((first.locked_until_utc - now) - timedelta(seconds=30)) < timedelta(seconds=2)
        assert isinstance(first.lock_token, uuid.UUID) and first.lock_token != second.lock_token
        assert first.state == ServiceBusMessageState.ACTIVE
        receiver.complete_message(first)
        receiver.complete_message(second)


def test_abandon_redelivers_with_delivery_count_plus_one(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("again"))
    with client.get_queue_receiver(queue) as receiver:
        (first,) = receive_exactly(receiver, 1)
        receiver.abandon_message(first)
        (second,) = receive_exactly(receiver, 1)
        assert (first.delivery_count, second.delivery_count) == (0, 1)
        assert second.sequence_number == first.sequence_number
        receiver.complete_message(second)
    assert servicebus_emulator.message_counts(queue)["active"] == 0


def test_dead_letter_with_reason_and_description(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("poison", application_properties={"kept": "yes"}))
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receive_exactly(receiver, 1)
        receiver.dead_letter_message(message, reason="BadOrder", error_description="amount is negative")
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 1, "scheduled": 0, "locked": 0}
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
        (dead,) = receive_exactly(dead_letters, 1)
        assert str(dead) == "poison"
        assert dead.dead_letter_reason == "BadOrder"
        assert dead.dead_letter_error_description == "amount is negative"
        assert dead.application_properties[b"kept"] == b"yes"
        assert dead.sequence_number == message.sequence_number
        dead_letters.complete_message(dead)
    assert servicebus_emulator.message_counts(queue)["dead_letter"] == 0


def test_expired_lock_redelivers_and_the_old_lock_is_lost(make_queue, client):
    queue = make_queue(lock_duration=timedelta(milliseconds=500))
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("slow"))
    with client.get_queue_receiver(queue) as receiver:
        (first,) = receive_exactly(receiver, 1)
        (second,) = receive_exactly(receiver, 1, timeout=5)  # comes back once the lock expires
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == 1
        assert second.lock_token != first.lock_token
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(first)
        receiver.complete_message(second)


def test_settling_with_a_lock_the_broker_no_longer_holds_is_lock_lost(make_queue, client):
    # The SDK checks the lock time itself first; here the client clock still says "locked",
    # so the settlement reaches the emulator, which has already given the message to someone else.
    queue = make_queue(lock_duration=timedelta(milliseconds=500))
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("m"))
    with client.get_queue_receiver(queue) as receiver:
        (first,) = receive_exactly(receiver, 1)
        (second,) = receive_exactly(receiver, 1, timeout=5)
        first._expiry = datetime.now(UTC) + timedelta(minutes=1)  # pretend the client clock lags
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(first)
        receiver.complete_message(second)


def test_max_delivery_count_dead_letters(servicebus_emulator, make_queue, client):
    queue = make_queue(max_delivery_count=3)
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("unlucky"))
    with client.get_queue_receiver(queue) as receiver:
        for attempt in range(3):
            (message,) = receive_exactly(receiver, 1)
            assert message.delivery_count == attempt
            receiver.abandon_message(message)
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 1, "scheduled": 0, "locked": 0}
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
        (dead,) = receive_exactly(dead_letters, 1)
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert "3" in dead.dead_letter_error_description
        assert dead.delivery_count == 3
        dead_letters.complete_message(dead)


def test_expired_message_is_discarded(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("short-lived", time_to_live=timedelta(seconds=1)))
        sender.send_messages(ServiceBusMessage("long-lived"))
    assert servicebus_emulator.message_counts(queue)["active"] == 2
    wait_until(lambda: servicebus_emulator.message_counts(queue)["active"] == 1, timeout=5, what="expiry")
    assert servicebus_emulator.message_counts(queue)["dead_letter"] == 0
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receive_exactly(receiver, 1)
        assert str(message) == "long-lived"
        receiver.complete_message(message)


def test_expired_message_is_dead_lettered_where_the_queue_says_so(servicebus_emulator, make_queue, client):
    queue = make_queue(dead_letter_on_expiry=True, default_ttl=timedelta(milliseconds=500))  # the queue's TTL wins
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("stale", time_to_live=timedelta(hours=1)))
    wait_until(lambda: servicebus_emulator.message_counts(queue)["dead_letter"] == 1, timeout=5, what="expiry")
    assert servicebus_emulator.message_counts(queue)["active"] == 0
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
        (dead,) = receive_exactly(dead_letters, 1)
        assert str(dead) == "stale"
        assert dead.dead_letter_reason == "TTLExpiredException"
        dead_letters.complete_message(dead)


def test_scheduled_enqueue_time(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        at = datetime.now(UTC) + timedelta(seconds=1)
        sender.send_messages(ServiceBusMessage("later", scheduled_enqueue_time_utc=at))
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 1, "locked": 0}
    wait_until(lambda: servicebus_emulator.message_counts(queue)["active"] == 1, timeout=5, what="the schedule")
    assert datetime.now(UTC) >= at - timedelta(milliseconds=20)
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receive_exactly(receiver, 1)
        assert str(message) == "later"
        receiver.complete_message(message)


def test_schedule_messages_and_cancel_scheduled_messages(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender, client.get_queue_receiver(queue) as receiver:
        at = datetime.now(UTC) + timedelta(seconds=1)
        keep, cancel = sender.schedule_messages([ServiceBusMessage("keep"), ServiceBusMessage("cancel")], at)
        assert cancel > keep
        assert servicebus_emulator.message_counts(queue)["scheduled"] == 2
        sender.cancel_scheduled_messages(cancel)
        assert servicebus_emulator.message_counts(queue)["scheduled"] == 1
        (scheduled,) = receiver.peek_messages(5, sequence_number=1)
        assert scheduled.state == ServiceBusMessageState.SCHEDULED
        (message,) = receive_exactly(receiver, 1, timeout=5)
        assert (str(message), message.sequence_number) == ("keep", keep)
        receiver.complete_message(message)
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_peek_messages_neither_locks_nor_removes(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(5)])
    with client.get_queue_receiver(queue) as receiver:
        peeked = receiver.peek_messages(3, sequence_number=1)
        assert [str(m) for m in peeked] == ["p0", "p1", "p2"]
        rest = receiver.peek_messages(10, sequence_number=peeked[-1].sequence_number + 1)
        assert [str(m) for m in rest] == ["p3", "p4"]
        assert receiver.peek_messages(10, sequence_number=rest[-1].sequence_number + 1) == []
        assert servicebus_emulator.message_counts(queue) == {"active": 5, "dead_letter": 0, "scheduled": 0, "locked": 0}
        with pytest.raises(ValueError):
            receiver.complete_message(peeked[0])
        messages = receive_exactly(receiver, 5)
        assert [m.sequence_number for m in messages] == [m.sequence_number for m in peeked + rest]
        for message in messages:
            receiver.complete_message(message)


def test_renew_message_lock_keeps_the_message_locked(servicebus_emulator, make_queue, client):
    queue = make_queue(lock_duration=timedelta(seconds=1))
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("long job"))
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receive_exactly(receiver, 1)
        first_expiry = message.locked_until_utc
        halfway = time.monotonic() + 0.5
        wait_until(lambda: time.monotonic() > halfway, what="half the lock duration")
        renewed = receiver.renew_message_lock(message)
        assert renewed > first_expiry + timedelta(milliseconds=300)
        assert message.locked_until_utc == renewed
        past_first_expiry = time.monotonic() + 0.7
        wait_until(lambda: time.monotonic() > past_first_expiry, what="the first lock's expiry")
        assert servicebus_emulator.message_counts(queue)["locked"] == 1
        receiver.complete_message(message)
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_renewing_a_lost_lock_fails(make_queue, client):
    queue = make_queue(lock_duration=timedelta(milliseconds=500))
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("m"))
    with client.get_queue_receiver(queue) as receiver:
        (first,) = receive_exactly(receiver, 1)
        (second,) = receive_exactly(receiver, 1, timeout=5)
        first._expiry = None  # let the request reach the emulator
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(first)
        receiver.complete_message(second)


def test_defer_and_receive_deferred_messages(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage("deferred"), ServiceBusMessage("next")])
    with client.get_queue_receiver(queue) as receiver:
        first, second = receive_exactly(receiver, 2)
        receiver.defer_message(first)
        receiver.complete_message(second)
        assert servicebus_emulator.message_counts(queue)["active"] == 0
        (peeked,) = receiver.peek_messages(5, sequence_number=1)
        assert peeked.state == ServiceBusMessageState.DEFERRED
        (again,) = receiver.receive_deferred_messages([first.sequence_number])
        assert str(again) == "deferred"
        assert again.locked_until_utc > datetime.now(UTC)
        receiver.complete_message(again)  # settled through $management
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_duplicate_detection_drops_a_repeated_message_id_within_the_window(servicebus_emulator, make_queue, client):
    queue = make_queue(duplicate_detection=True, duplicate_detection_window=timedelta(milliseconds=500))
    plain = make_queue()
    with sender_for(client, queue) as sender, sender_for(client, plain) as plain_sender:
        for _ in range(2):
            sender.send_messages(ServiceBusMessage("x", message_id="same"))
            plain_sender.send_messages(ServiceBusMessage("x", message_id="same"))
        sender.send_messages(ServiceBusMessage("y", message_id="other"))
        assert servicebus_emulator.message_counts(queue)["active"] == 2
        assert servicebus_emulator.message_counts(plain)["active"] == 2  # the flag is per queue
        window_over = time.monotonic() + 0.55
        wait_until(lambda: time.monotonic() > window_over, what="the detection window")
        sender.send_messages(ServiceBusMessage("x", message_id="same"))
        assert servicebus_emulator.message_counts(queue)["active"] == 3


def test_released_messages_come_back_without_counting_a_delivery(servicebus_emulator, client, queue):
    # With prefetch the SDK locks messages ahead of the application; closing the receiver
    # drains the link and releases those it never handed out.
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
    with client.get_queue_receiver(queue, prefetch_count=5) as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        wait_until(lambda: servicebus_emulator.message_counts(queue)["locked"] == 5, what="the prefetch")
        receiver.complete_message(first)
    assert servicebus_emulator.message_counts(queue) == {"active": 4, "dead_letter": 0, "scheduled": 0, "locked": 0}
    with client.get_queue_receiver(queue) as receiver:
        messages = receive_exactly(receiver, 4)
        assert [m.delivery_count for m in messages] == [0, 0, 0, 0]
        for message in messages:
            receiver.complete_message(message)


@pytest.mark.parametrize("session_id", ["s1", NEXT_AVAILABLE_SESSION], ids=["session-id", "next-available"])
def test_session_receivers_are_refused_at_once_with_a_clear_error(servicebus_emulator, client, queue, session_id):
    # Queues here are not session-enabled: the receiver's attach (its source carries the
    # com.microsoft:session-filter) is refused with amqp:not-allowed, as Azure refuses a session
    # receiver on a queue without sessions; the SDK does not retry it.
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("stays", session_id="s1"))
    started = time.monotonic()
    with pytest.raises(ServiceBusError) as raised, client.get_queue_receiver(queue, session_id=session_id) as receiver:
        receiver.receive_messages(max_wait_time=5)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "A sessionful message receiver cannot be created" in message, message
    assert f"queue '{queue}' is not session-enabled" in message, message
    assert "amqp:not-allowed" in message, message
    assert elapsed < 5, f"the refusal took {elapsed:.1f} s"  # not retried, no timeout waited for
    assert servicebus_emulator.message_counts(queue) == {"active": 1, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_unknown_queue_is_entity_not_found(client, unique_name):
    missing = unique_name("missing")
    with pytest.raises(MessagingEntityNotFoundError), sender_for(client, missing) as sender:
        sender.send_messages(ServiceBusMessage("lost"))
    with pytest.raises(MessagingEntityNotFoundError), client.get_queue_receiver(missing) as receiver:
        receiver.receive_messages(max_wait_time=1)


def test_queue_names_are_case_insensitive(client, make_queue):
    queue = make_queue()
    with sender_for(client, queue.upper()) as sender:
        sender.send_messages(ServiceBusMessage("m"))
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receive_exactly(receiver, 1)
        receiver.complete_message(message)


def test_a_queue_name_with_a_leading_or_trailing_slash_is_the_same_queue(client, make_queue):
    """An entity is the path after the namespace, '/' separating segments: 'q/' and '/q'
    address q, as a ReplyTo of 'alerts/' reaches the alerts queue."""
    queue = make_queue()
    for spelling in (f"{queue}/", f"/{queue}", f"{queue.upper()}/"):
        with sender_for(client, spelling) as sender:
            sender.send_messages(ServiceBusMessage(spelling))
    with client.get_queue_receiver(queue) as receiver:
        received = receive_exactly(receiver, 3)
        assert sorted(str(m) for m in received) == sorted((f"{queue}/", f"/{queue}", f"{queue.upper()}/"))
        for message in received:
            receiver.complete_message(message)


def test_declare_queue_is_idempotent_and_keeps_messages(servicebus_emulator, client, queue):
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage("kept"))
    assert servicebus_emulator.declare_queue(queue) == queue
    assert servicebus_emulator.message_counts(queue)["active"] == 1
    with pytest.raises(KeyError):
        servicebus_emulator.message_counts("no-such-queue")
