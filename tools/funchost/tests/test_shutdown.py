"""SIGTERM drains: in-flight messages finish and are settled; past the drain deadline they are abandoned."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from azure.storage.queue import QueueClient

from .support import APP_DIR, assert_drained, b64, eventually, host_env, only, records, send_to_both


@pytest.fixture
def stack(servicebus_emulator, storage_connection_string, unique_name, tmp_path):
    return host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path, lock_duration=timedelta(seconds=30)
    )


def _start_both(servicebus_emulator, storage_connection_string, names, seconds: float) -> QueueClient:
    inbox, _ = send_to_both(
        servicebus_emulator, storage_connection_string, names, f'{{"sleep": {seconds}}}', message_id="slow"
    )
    return inbox


def test_sigterm_lets_in_flight_messages_finish_settles_them_and_exits_cleanly(
    funchost, servicebus_emulator, storage_connection_string, stack, tmp_path
):
    env, names = stack
    (host,) = funchost.start(APP_DIR, env=env)
    inbox = _start_both(servicebus_emulator, storage_connection_string, names, 1.5)
    eventually(lambda: len(records(tmp_path, event="start")) == 2, what="both functions to start")

    started = time.monotonic()
    assert host.terminate(timeout=30) == 0
    assert time.monotonic() - started < 10

    assert {r["function"] for r in records(tmp_path, event="done")} == {"sb_record", "queue_record"}
    assert [i.outcome for i in host.invocations()] == ["Succeeded", "Succeeded"]
    assert_drained(servicebus_emulator, names, inbox)
    assert "funchost stopped:" in host.log_text() and "drained=True" in host.log_text()


def test_past_the_drain_deadline_in_flight_messages_are_abandoned(
    funchost, servicebus_emulator, storage_connection_string, stack, tmp_path
):
    env, names = stack
    (host,) = funchost.start(APP_DIR, env=env, drain_timeout=0.5)
    inbox = _start_both(servicebus_emulator, storage_connection_string, names, 30)
    eventually(lambda: len(records(tmp_path, event="start")) == 2, what="both functions to start")

    started = time.monotonic()
    assert host.terminate(timeout=30) == 0
    assert time.monotonic() - started < 10

    assert records(tmp_path, event="done") == []
    # Both messages are back for another instance at once: abandoned, and made visible again.
    assert servicebus_emulator.message_counts(names["FH_SB_QUEUE"])["active"] == 1
    assert len(list(inbox.peek_messages())) == 1
    log = host.log_text()
    assert "sb_record: abandoning message slow unfinished at shutdown" in log
    assert "queue_record: released message" in log


def test_ctrl_c_stops_and_a_second_one_cuts_the_drain_short(funchost, storage_connection_string, unique_name, tmp_path):
    names = {"FH_QUEUE": unique_name("in-"), "FH_QUEUE_OUT": unique_name("out-")}
    env = {"AzureWebJobsStorage": storage_connection_string, "FH_RECORD_DIR": str(tmp_path), **names}
    (host,) = funchost.start(APP_DIR, env={**env, **only("queue_record")}, drain_timeout=60)
    inbox = QueueClient.from_connection_string(storage_connection_string, names["FH_QUEUE"])
    inbox.send_message(b64('{"sleep": 60}'))
    eventually(lambda: records(tmp_path, "queue_record", "start"), what="the function to start")

    host.interrupt()
    host.wait_for_log(r"waiting for 1 in-flight message")
    started = time.monotonic()
    host.interrupt()
    assert host.process.wait(15) == 0
    assert time.monotonic() - started < 10
    log = host.log_text()
    assert "SIGINT received: stopping" in log and "second SIGINT" in log
    assert "queue_record: released message" in log
    assert len(list(inbox.peek_messages())) == 1
