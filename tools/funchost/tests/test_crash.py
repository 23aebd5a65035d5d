"""Crashes and long runs: locks and leases are renewed while a function runs, and expire when its host dies."""

from __future__ import annotations

from datetime import timedelta

import pytest

from .support import APP_DIR, assert_drained, eventually, host_env, records, send_to_both

SHORT = 2  # seconds: the Service Bus lock duration and the storage queue lease in these tests


@pytest.fixture
def short_locks(servicebus_emulator, storage_connection_string, unique_name, tmp_path):
    return host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path,
        lock_duration=timedelta(seconds=SHORT), max_delivery_count=5, FUNCHOST_QUEUE_LEASE_SECONDS=str(SHORT),
    )


def test_locks_and_leases_are_renewed_while_a_function_outlives_them(
    funchost, servicebus_emulator, storage_connection_string, short_locks, tmp_path
):
    env, names = short_locks
    funchost.start(APP_DIR, env=env)
    inbox, _ = send_to_both(servicebus_emulator, storage_connection_string, names, '{"sleep_first": 3.5}')

    eventually(lambda: len(records(tmp_path, event="done")) == 2, timeout=30, what="both slow functions to finish")
    # Renewed in time: neither message was handed out a second time while its function ran.
    assert len(records(tmp_path, event="start")) == 2
    assert_drained(servicebus_emulator, names, inbox)


def test_messages_of_a_killed_host_come_back_to_another_instance(
    funchost, servicebus_emulator, storage_connection_string, short_locks, tmp_path
):
    env, names = short_locks
    (victim,) = funchost.start(APP_DIR, env=env)
    send_to_both(servicebus_emulator, storage_connection_string, names, '{"sleep_first": 60}')
    eventually(lambda: len(records(tmp_path, event="start")) == 2, what="both functions to start on the first host")

    victim.kill()
    assert not victim.stopped_cleanly
    (survivor,) = funchost.start(APP_DIR, env=env)

    done = eventually(
        lambda: len(records(tmp_path, event="done")) == 2 and records(tmp_path, event="done"),
        timeout=30,
        what="redelivery",
    )
    assert {r["instance"] for r in done} == {survivor.instance_id}
    again = {r["function"]: r for r in records(tmp_path, event="start") if r["instance"] == survivor.instance_id}
    assert again["sb_record"]["delivery_count"] == 2
    assert again["queue_record"]["dequeue_count"] == 2
