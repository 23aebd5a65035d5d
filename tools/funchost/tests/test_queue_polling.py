"""The storage-queue trigger's polling: the Functions host's back-off between empty polls,
and the wake-up of an instance's own listener by its output bindings."""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tools.funchost.queue_trigger import MIN_POLL_SECONDS, Backoff

from .support import APP_DIR, eventually, host_env, records

#: How long neither poller may poll when the test sends (the output's message must wait for no one).
QUIET = timedelta(seconds=2.5)


def test_the_wait_between_empty_polls_grows_as_the_functions_host_s():
    """100 ms, then 100 ms + 0.8-1.2 x 100 ms x 2^(n-1), capped; a poll that found messages starts over."""
    backoff = Backoff(MIN_POLL_SECONDS, 2.0, random.Random(7))
    waits = [backoff.next(False) for _ in range(9)]
    assert waits[0] == MIN_POLL_SECONDS
    for n, wait in enumerate(waits[1:6], start=1):
        base = 2 ** (n - 1) * MIN_POLL_SECONDS
        assert MIN_POLL_SECONDS + 0.8 * base <= wait <= MIN_POLL_SECONDS + 1.2 * base, (n, wait)
    assert waits[6:] == [2.0, 2.0, 2.0]  # 100 ms + ~3.2 s passes the maximum
    assert backoff.next(True) == MIN_POLL_SECONDS
    assert 0.18 <= backoff.next(False) <= 0.22


def test_an_output_binding_wakes_its_own_instance_s_idle_listener_at_once(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    """Two idle instances, their pollers backed off towards a one-minute maximum: the message
    a function's queue output sends is taken at once, by the instance that sent it (the Storage
    Queues extension's SharedQueueWatcher is per host); the other's next poll is seconds away."""
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path, lock_duration=timedelta(seconds=30),
        AzureFunctionsJobHost__extensions__queues__maxPollingInterval="00:01:00",
    )
    env["FH_OUT_QUEUE"] = names["FH_QUEUE"]  # sb_record's queue output feeds queue_record's trigger
    hosts = funchost.start(APP_DIR, count=2, env=env, args=["--debug", "funchost.queue"])
    # Idle polls after start: ~0.1, 0.3, 0.6, 1.1, 2.0, 3.7, 7.0, 13.4 s (±20% from the third on).
    # Send once neither instance's next poll of the queue is due for QUIET seconds or more.
    eventually(
        lambda: all(_next_poll(host, names["FH_QUEUE"]) > datetime.now() + QUIET for host in hosts),
        timeout=60,
        what=f"both instances' pollers of {names['FH_QUEUE']} idle for {QUIET.total_seconds():g} s or more",
    )
    with (
        ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client,
        client.get_queue_sender(names["FH_SB_QUEUE"]) as sender,
    ):
        sender.send_messages(ServiceBusMessage('{"out": "wake"}', message_id="wake"))

    (sent,) = eventually(lambda: records(tmp_path, "sb_record", "done"), what="the Service Bus function")
    (taken,) = eventually(lambda: records(tmp_path, "queue_record", "start"), what="the queue function")
    assert taken["body"] == "wake"
    assert taken["instance"] == sent["instance"], "another instance's output woke this listener"
    waited = datetime.fromisoformat(taken["at"]) - datetime.fromisoformat(sent["at"])
    assert waited < timedelta(seconds=2.5), f"the output's message waited {waited} for a poll"
    assert {host.instance_id for host in hosts} >= {sent["instance"]}


def _next_poll(host, queue: str) -> datetime:
    """When ``host``'s poller of ``queue`` polls next, by its last idle line (``--debug funchost.queue``);
    the distant past when it logged none (its waits are still shorter than 2 s)."""
    idle = re.findall(
        rf"^(\S+ \S+) DEBUG +\[funchost\.queue\] queue {re.escape(queue)}: idle, next poll in ([\d.]+) s$",
        host.log_text(),
        re.MULTILINE,
    )
    if not idle:
        return datetime.min
    logged, wait = idle[-1]
    return datetime.strptime(logged, "%Y-%m-%d %H:%M:%S,%f") + timedelta(seconds=float(wait))
