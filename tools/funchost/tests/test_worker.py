"""The worker processes beside the host: what a crash, a hang past functionTimeout and several workers do.

As in Azure: a worker that dies fails the invocations it held (their messages are abandoned and
delivered again) and is started again, and the host stops at the third worker error within 30
minutes; an invocation that outlives host.json ``functionTimeout`` fails at once and its worker is
restarted; ``FUNCTIONS_WORKER_PROCESS_COUNT`` workers share the invocations round-robin.
"""

from __future__ import annotations

import json
from datetime import timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from .support import APP_DIR, eventually, host_env, records


def _send(servicebus_emulator, queue: str, *bodies: dict) -> None:
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(json.dumps(body), message_id=f"m-{i}") for i, body in
                                  enumerate(bodies)])


def _env(servicebus_emulator, storage_connection_string, unique_name, record_dir, **settings):
    return host_env(servicebus_emulator, storage_connection_string, unique_name, record_dir,
                    lock_duration=timedelta(seconds=30), max_delivery_count=5, enabled=("sb_record",), **settings)


def test_a_worker_that_dies_mid_invocation_is_started_again_and_the_message_delivered_again(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    env, names = _env(servicebus_emulator, storage_connection_string, unique_name, tmp_path)
    (host,) = funchost.start(APP_DIR, env=env)
    first_worker = host.worker_pids
    _send(servicebus_emulator, names["FH_SB_QUEUE"], {"crash_first": True})

    (done,) = eventually(lambda: records(tmp_path, "sb_record", "done"), what="the second delivery to finish")
    starts = records(tmp_path, "sb_record", "start")
    assert [r["delivery_count"] for r in starts] == [1, 2]
    assert starts[0]["pid"] in first_worker and done["pid"] not in first_worker  # a new worker took it
    failed, succeeded = host.invocations("sb_record")
    assert (failed.succeeded, succeeded.succeeded) == (False, True)
    assert "WorkerExited: the worker process" in failed.details and "exited with code 3" in failed.details
    log = host.log_text()
    assert "Language Worker Process exited" in log and "worker 1: ready" in log
    assert host.running


def test_the_third_worker_error_stops_the_host_and_its_message_is_not_lost(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    env, names = _env(servicebus_emulator, storage_connection_string, unique_name, tmp_path)
    (host,) = funchost.start(APP_DIR, env=env)
    _send(servicebus_emulator, names["FH_SB_QUEUE"], {"crash": True})  # every delivery kills its worker

    eventually(lambda: host.returncode is not None, timeout=60, what="the host to stop")
    assert host.returncode == 1
    log = host.log_text()
    assert log.count("Language Worker Process exited") == 3
    assert "Exceeded language worker restart retry count for runtime:python" in log
    assert len(records(tmp_path, "sb_record", "start")) == 3
    # Abandoned each time, and still there (not completed, not yet dead-lettered).
    counts = eventually(lambda: (c := servicebus_emulator.message_counts(names["FH_SB_QUEUE"]))["active"] == 1 and c,
                        what="the message back in the queue")
    assert counts["dead_letter"] == 0


def test_an_invocation_past_function_timeout_fails_at_once_and_its_worker_is_restarted(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    env, names = _env(servicebus_emulator, storage_connection_string, unique_name, tmp_path,
                      AzureFunctionsJobHost__functionTimeout="00:00:02")
    (host,) = funchost.start(APP_DIR, env=env)
    _send(servicebus_emulator, names["FH_SB_QUEUE"], {"sleep_first": 60})  # hangs its worker's thread

    # Abandoned at the timeout, the message comes back at once (to whichever worker is ready: the
    # hung one still takes invocations during the 2 s grace), and the second delivery finishes.
    eventually(lambda: records(tmp_path, "sb_record", "done"), timeout=30, what="the second delivery to finish")
    host.wait_for_log(r"worker 1: ready", timeout=30)  # the hung worker was replaced
    timed_out = host.invocations("sb_record")[0]
    assert not timed_out.succeeded and timed_out.duration_ms < 4000
    assert "Timeout value of 00:00:02 was exceeded by function: Functions.sb_record" in timed_out.details
    log = host.log_text()
    assert "Timeout value of 00:00:02 exceeded by function 'Functions.sb_record'" in log
    assert "A function timeout has occurred. Restarting worker process" in log
    assert "Language Worker Process exited" not in log  # a restart for a timeout is no worker error
    assert host.running


def test_several_worker_processes_share_the_invocations_round_robin(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    env, names = _env(servicebus_emulator, storage_connection_string, unique_name, tmp_path,
                      FUNCTIONS_WORKER_PROCESS_COUNT="2", FUNCHOST_WORKER_STARTUP_INTERVAL_SECONDS="0")
    (host,) = funchost.start(APP_DIR, env=env)
    host.wait_for_log(r"worker 1: ready")
    _send(servicebus_emulator, names["FH_SB_QUEUE"], *({"n": i} for i in range(8)))

    done = eventually(lambda: len(r := records(tmp_path, "sb_record", "done")) == 8 and r, what="8 messages")
    by_worker = {}
    for item in done:
        by_worker[item["pid"]] = by_worker.get(item["pid"], 0) + 1
    assert sorted(by_worker.values()) == [4, 4], by_worker
    assert "concurrency: 2 worker process(es)" in host.log_text()
