"""Several host processes on the same queues behave as competing instances of one app."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.storage.queue import QueueClient

from tests.funchost.support import APP_DIR, b64, eventually, only, records

COUNT = 40


def test_two_hosts_share_the_queues_and_no_message_is_handled_twice(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path, report_figure
):
    names = {
        "FH_SB_QUEUE": unique_name("in-"),
        "FH_SB_OUT_QUEUE": unique_name("out-"),
        "FH_OUT_QUEUE": unique_name("out-"),
        "FH_QUEUE": unique_name("in-"),
        "FH_QUEUE_OUT": unique_name("out-"),
    }
    servicebus_emulator.declare_queue(names["FH_SB_QUEUE"], lock_duration=timedelta(seconds=30))
    servicebus_emulator.declare_queue(names["FH_SB_OUT_QUEUE"])
    env = {
        "AzureWebJobsStorage": storage_connection_string,
        "ServiceBusConnection": servicebus_emulator.connection_string,
        "FH_RECORD_DIR": str(tmp_path),
        **names,
        **only("sb_record", "queue_record"),
    }
    hosts = funchost.start(APP_DIR, count=2, env=env)
    assert hosts[0].instance_id != hosts[1].instance_id

    body = json.dumps({"sleep": 0.2})
    with (
        ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client,
        client.get_queue_sender(names["FH_SB_QUEUE"]) as sender,
    ):
        sender.send_messages([ServiceBusMessage(body, message_id=f"m{i}") for i in range(COUNT)])
    inbox = QueueClient.from_connection_string(storage_connection_string, names["FH_QUEUE"])
    queue_ids = {inbox.send_message(b64(body)).id for _ in range(COUNT)}

    eventually(
        lambda: (
            len(records(tmp_path, "sb_record", "done")) >= COUNT
            and len(records(tmp_path, "queue_record", "done")) >= COUNT
        ),
        timeout=60,
        what=f"{COUNT} Service Bus and {COUNT} storage queue messages to be handled",
    )
    eventually(lambda: servicebus_emulator.message_counts(names["FH_SB_QUEUE"])["locked"] == 0, what="completions")

    sb_started = records(tmp_path, "sb_record", "start")
    queue_started = records(tmp_path, "queue_record", "start")
    # Every message handled exactly once, by one of the two instances.
    assert Counter(r["message_id"] for r in sb_started) == Counter({f"m{i}": 1 for i in range(COUNT)})
    assert Counter(r["id"] for r in queue_started) == Counter({i: 1 for i in queue_ids})
    instances = {host.instance_id for host in hosts}
    sb_share = Counter(r["instance"] for r in sb_started)
    queue_share = Counter(r["instance"] for r in queue_started)
    assert set(sb_share) == instances, f"each host should take Service Bus messages: {sb_share}"
    assert set(queue_share) == instances, f"each host should take storage queue messages: {queue_share}"
    assert servicebus_emulator.message_counts(names["FH_SB_QUEUE"]) == {
        "active": 0,
        "dead_letter": 0,
        "scheduled": 0,
        "locked": 0,
    }
    assert list(inbox.peek_messages()) == []
    report_figure(
        f"funchost competing hosts: Service Bus split {sorted(sb_share.values())}, "
        f"storage queue split {sorted(queue_share.values())} of {COUNT} each"
    )
