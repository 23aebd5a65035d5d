"""The Python worker's concurrency: one thread pool for every sync function, one event loop for
every async one, and the host's per-trigger limits on top (README "Concurrency")."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.storage.queue import QueueClient

from tools.funchost.invoke import THREAD_COUNT_SETTING, default_thread_count, worker_thread_count

from .support import APP_DIR, assert_drained, b64, eventually, host_env, most_at_once, records

SYNC = ("sb_record", "queue_sync")


def _send(servicebus_emulator, storage_connection_string, names, *, sb: int = 0, sync_queue: int = 0,
          async_queue: int = 0, body: str) -> None:
    """``body`` to the Service Bus queue (sb_record), the sync function's storage queue and the async one's."""
    if sb:
        with (
            ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client,
            client.get_queue_sender(names["FH_SB_QUEUE"]) as sender,
        ):
            sender.send_messages([ServiceBusMessage(body, message_id=f"m{i}") for i in range(sb)])
    for setting, count in (("FH_SYNC_QUEUE", sync_queue), ("FH_QUEUE", async_queue)):
        inbox = QueueClient.from_connection_string(storage_connection_string, names[setting])
        for _ in range(count):
            inbox.send_message(b64(body))


def _runs(record_dir, *functions: str) -> tuple[list[dict], list[dict]]:
    starts = [r for r in records(record_dir, event="start") if r["function"] in functions]
    dones = [r for r in records(record_dir, event="done") if r["function"] in functions]
    return starts, dones


def _all_done(record_dir, count: int, *functions: str):
    return eventually(
        lambda: len(_runs(record_dir, *functions)[1]) >= count and _runs(record_dir, *functions),
        timeout=60,
        what=f"{count} invocations of {', '.join(functions)} to finish",
    )


# --- sizing, as the worker's Dispatcher._get_sync_tp_max_workers -----------------------


def test_the_default_size_is_the_thread_pool_executor_default():
    cpus = getattr(os, "process_cpu_count", os.cpu_count)() or 1
    assert default_thread_count() == min(32, cpus + 4)
    # The worker passes max_workers=None: Python's own default, which this formula is.
    assert ThreadPoolExecutor()._max_workers == default_thread_count()
    unset = worker_thread_count({})
    assert unset.max_workers == min(32, cpus + 4)
    assert THREAD_COUNT_SETTING in unset.source and "not set" in unset.source and unset.warning is None


@pytest.mark.parametrize("value, size", [("1", 1), ("2", 2), ("64", 64), ("1000", 1000)])
def test_the_app_setting_sets_the_size_without_an_upper_bound(value, size):
    count = worker_thread_count({THREAD_COUNT_SETTING: value})
    assert (count.max_workers, count.warning) == (size, None)
    assert count.source == f"{THREAD_COUNT_SETTING}={size}"


@pytest.mark.parametrize("value", ["0", "-3", "two", "", "2.5"])
def test_an_invalid_app_setting_falls_back_to_the_default_with_a_warning(value):
    count = worker_thread_count({THREAD_COUNT_SETTING: value})
    assert count.max_workers == default_thread_count()
    assert count.warning and THREAD_COUNT_SETTING in count.warning


def test_a_host_without_the_setting_runs_the_default_pool_and_says_so(funchost, tmp_path, monkeypatch):
    monkeypatch.delenv(THREAD_COUNT_SETTING, raising=False)
    env = {"FH_RECORD_DIR": str(tmp_path), "FH_TIMER_SCHEDULE": "0 0 0 1 1 *"}
    (host,) = funchost.start(APP_DIR, env=env, functions=["tick", "tick_on_startup"])
    assert host.sync_threads == default_thread_count()
    line = host.wait_for_log(r"concurrency: .*").group(0)
    assert f"one thread pool of {default_thread_count()} ({THREAD_COUNT_SETTING} not set" in line
    assert "tick 1 (runs never overlap)" in line
    # The timer's sync function ran on the worker's pool.
    (ran,) = eventually(lambda: records(tmp_path, "tick_on_startup"), what="the start-up timer run")
    assert ran["function"] == "tick_on_startup"


# --- running, through real host processes ------------------------------------------------


@pytest.fixture
def stack(servicebus_emulator, storage_connection_string, unique_name, tmp_path):
    def make(*enabled: str, lock: float = 30, **settings: str):
        return host_env(
            servicebus_emulator, storage_connection_string, unique_name, tmp_path,
            lock_duration=timedelta(seconds=lock), enabled=enabled, **settings,
        )

    return make


def test_sync_functions_of_two_triggers_share_one_pool_of_python_threadpool_thread_count(
    funchost, servicebus_emulator, storage_connection_string, stack, tmp_path
):
    # Per trigger the host would run 4 (maxConcurrentCalls) + 6 (batchSize 4 + newBatchThreshold 2)
    # at once; the worker's one pool of 2 threads runs 2 of them, the others queue in it.
    env, names = stack(*SYNC, **{THREAD_COUNT_SETTING: "2"})
    (host,) = funchost.start(APP_DIR, env=env)
    assert host.sync_threads == 2
    line = host.wait_for_log(r"concurrency: .*").group(0)
    assert f"one thread pool of 2 ({THREAD_COUNT_SETTING}=2)" in line
    assert "sb_record maxConcurrentCalls=4" in line
    assert "queue_sync batchSize=4 + newBatchThreshold=2 = 6" in line

    _send(servicebus_emulator, storage_connection_string, names, sb=4, sync_queue=4, body='{"sleep": 1}')

    starts, dones = _all_done(tmp_path, 8, *SYNC)
    assert len(starts) == 8, "a message was handed to a function twice"
    assert {r["function"] for r in dones} == set(SYNC)
    assert most_at_once(starts, dones) == 2
    assert {r["thread"].split("_")[0] for r in starts} == {"ThreadPoolExecutor-0"}  # the runtime's one pool
    assert [i.outcome for i in host.invocations()] == ["Succeeded"] * 8


def test_async_functions_run_on_the_event_loop_beside_a_full_sync_pool(
    funchost, servicebus_emulator, storage_connection_string, stack, tmp_path
):
    env, names = stack("sb_record", "queue_record", **{THREAD_COUNT_SETTING: "1"})
    funchost.start(APP_DIR, env=env)
    # The one sync thread is busy ...
    _send(servicebus_emulator, storage_connection_string, names, sb=1, body='{"sleep": 4}')
    eventually(lambda: records(tmp_path, "sb_record", "start"), what="the sync function to hold the pool's thread")

    # ... and four async invocations still run together (the queue trigger's limit is 6).
    _send(servicebus_emulator, storage_connection_string, names, async_queue=4, body='{"sleep": 1.5}')

    starts, dones = _all_done(tmp_path, 4, "queue_record")
    assert most_at_once(starts, dones) == 4
    assert {r["thread"] for r in starts} == {"MainThread"}  # the worker's event loop
    (sync_done,) = eventually(lambda: records(tmp_path, "sb_record", "done"), what="the sync function to finish")
    # They started while the only sync thread was taken.
    assert max(datetime.fromisoformat(r["at"]) for r in starts) < datetime.fromisoformat(sync_done["at"])


def test_per_trigger_limits_still_apply_under_a_larger_pool(
    funchost, servicebus_emulator, storage_connection_string, stack, tmp_path
):
    env, names = stack(
        *SYNC,
        **{
            THREAD_COUNT_SETTING: "16",
            "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls": "2",
            "AzureFunctionsJobHost__extensions__queues__batchSize": "1",
            "AzureFunctionsJobHost__extensions__queues__newBatchThreshold": "0",
        },
    )
    funchost.start(APP_DIR, env=env)

    _send(servicebus_emulator, storage_connection_string, names, sb=4, sync_queue=3, body='{"sleep": 1}')

    starts, dones = _all_done(tmp_path, 7, *SYNC)
    assert len(starts) == 7
    assert most_at_once(*_runs(tmp_path, "sb_record")) == 2
    assert most_at_once(*_runs(tmp_path, "queue_sync")) == 1
    assert most_at_once(starts, dones) <= 3


def test_a_message_waiting_for_a_worker_thread_keeps_its_lock_and_lease(
    funchost, servicebus_emulator, storage_connection_string, stack, tmp_path
):
    # One thread, four messages of 2.5 s: each trigger's second message waits longer than
    # its 2 s lock or lease before it even starts. The host renews them while they wait,
    # so none is handed out again and none comes back with a higher delivery count.
    env, names = stack(*SYNC, lock=2, FUNCHOST_QUEUE_LEASE_SECONDS="2", **{THREAD_COUNT_SETTING: "1"})
    funchost.start(APP_DIR, env=env)

    _send(servicebus_emulator, storage_connection_string, names, sb=2, sync_queue=2, body='{"sleep": 2.5}')

    starts, dones = _all_done(tmp_path, 4, *SYNC)
    assert len(starts) == 4
    assert most_at_once(starts, dones) == 1
    assert [r["delivery_count"] for r in starts if r["function"] == "sb_record"] == [1, 1]
    assert [r["dequeue_count"] for r in starts if r["function"] == "queue_sync"] == [1, 1]
    inbox = QueueClient.from_connection_string(storage_connection_string, names["FH_SYNC_QUEUE"])
    assert_drained(servicebus_emulator, names, inbox)
