"""host.json ``prefetchCount``: the trigger's receiver holds messages ahead of its calls, locked
for it (the Functions host's processor does the same, ``ServiceBusProcessorOptions.PrefetchCount``);
each is still handed to the function once, within ``maxConcurrentCalls``, and a stopping host
hands what it held unread back to the queue at once, without counting a delivery."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from .support import eventually, host_env, most_at_once, receive, records

PREFETCH = 8
MESSAGES = 6
LOCK = timedelta(seconds=30)


def _prefetching(servicebus_emulator, storage_connection_string, unique_name, record_dir, lock: timedelta):
    """``sb_record`` alone, one call at a time, prefetching ``PREFETCH``: ``(env, names)``."""
    return host_env(
        servicebus_emulator, storage_connection_string, unique_name, record_dir, lock_duration=lock,
        enabled=("sb_record",),
        AzureFunctionsJobHost__extensions__serviceBus__prefetchCount=str(PREFETCH),
        AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls="1",
    )


@pytest.fixture
def stack(servicebus_emulator, storage_connection_string, unique_name, tmp_path):
    return _prefetching(servicebus_emulator, storage_connection_string, unique_name, tmp_path, LOCK)


def _send(servicebus_emulator, queue: str, bodies: dict[str, str]) -> list[str]:
    """Send each body with its message id, in order; returns the ids."""
    with (
        ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages([ServiceBusMessage(body, message_id=i) for i, body in bodies.items()])
    return list(bodies)


def _same(body: str) -> dict[str, str]:
    return {f"m{i}": body for i in range(MESSAGES)}


def _released(servicebus_emulator, queue: str) -> int:
    return servicebus_emulator.operation_counts().get(f"settle.released {queue}", 0)


def test_prefetched_messages_are_locked_ahead_and_each_runs_once_within_the_concurrency(
    funchost, servicebus_emulator, stack, tmp_path
):
    env, names = stack
    queue = names["FH_SB_QUEUE"]
    funchost.start(env=env)
    ids = _send(servicebus_emulator, queue, _same('{"sleep": 0.3}'))

    # While the first message runs (one at a time), the receiver already holds the others, locked.
    eventually(lambda: records(tmp_path, "sb_record", "start"), what="the first invocation")
    held = eventually(
        lambda: (c := servicebus_emulator.message_counts(queue))["locked"] >= 2 and c, what="messages locked ahead"
    )
    assert len(records(tmp_path, "sb_record", "done")) < MESSAGES, held

    eventually(lambda: len(records(tmp_path, "sb_record", "done")) == MESSAGES, what="every message handled")
    starts = records(tmp_path, "sb_record", "start")
    assert sorted(r["message_id"] for r in starts) == ids  # each once
    assert [r["delivery_count"] for r in starts] == [1] * MESSAGES  # none redelivered
    assert most_at_once(starts, records(tmp_path, "sb_record", "done")) == 1  # maxConcurrentCalls holds
    empty = {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
    eventually(lambda: servicebus_emulator.message_counts(queue) == empty, what="the queue to be empty")
    assert _released(servicebus_emulator, queue) == 0


def test_a_stopping_host_hands_its_prefetched_messages_back_at_once_uncounted(
    funchost, servicebus_emulator, stack, tmp_path
):
    env, names = stack
    queue = names["FH_SB_QUEUE"]
    (host,) = funchost.start(env=env)
    ids = _send(servicebus_emulator, queue, _same('{"sleep": 1}'))
    eventually(lambda: records(tmp_path, "sb_record", "start"), what="the first invocation")
    eventually(lambda: servicebus_emulator.message_counts(queue)["locked"] >= 2, what="messages locked ahead")

    stopped_at = time.monotonic()
    assert host.terminate(timeout=30) == 0
    done = records(tmp_path, "sb_record", "done")
    assert [r["message_id"] for r in records(tmp_path, "sb_record", "start")] == [r["message_id"] for r in done]

    # The rest are back well before their locks (30 s) would have let them go, and released, not
    # abandoned: the next receiver gets them as never delivered.
    left = MESSAGES - len(done)
    assert left >= 1
    eventually(lambda: servicebus_emulator.message_counts(queue)["active"] == left, what="the held messages back")
    assert time.monotonic() - stopped_at < LOCK.total_seconds() / 2
    assert _released(servicebus_emulator, queue) >= left
    again = receive(servicebus_emulator.connection_string, queue, left)
    assert sorted(m.message_id for m in again) == sorted(set(ids) - {r["message_id"] for r in done})
    assert [m.delivery_count for m in again] == [0] * left


def test_a_message_that_waited_in_the_buffer_is_renewed_at_half_of_each_renewed_lock(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    # The second message waits ~8 s of its 10-s lock in the buffer behind the first: renewed at
    # half of the 2 s it has left, then at half of each renewed lock (every 5 s), not every 1 s.
    env, names = _prefetching(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path, timedelta(seconds=10)
    )
    queue = names["FH_SB_QUEUE"]
    funchost.start(env=env)
    _send(servicebus_emulator, queue, {"first": '{"sleep": 8}', "second": '{"sleep": 10}'})
    eventually(lambda: len(records(tmp_path, "sb_record", "done")) == 2, timeout=60, what="both messages handled")

    starts = records(tmp_path, "sb_record", "start")
    assert [(r["message_id"], r["delivery_count"]) for r in starts] == [("first", 1), ("second", 1)]  # no lock lost
    renewals = servicebus_emulator.operation_counts().get(f"management.renew-lock {queue}", 0)
    # first: once (8 s of a 10-s lock); second: at 1 s, then every 5 s of its 10 s: about 4 in all.
    # Renewing at half of what was left at dispatch would renew the second every 1 s: about 11.
    assert 2 <= renewals <= 7, renewals
    empty = {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
    eventually(lambda: servicebus_emulator.message_counts(queue) == empty, what="the queue to be empty")
