"""Several host processes on the same queues behave as competing instances of one app."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

from .support import APP_DIR, assert_drained, eventually, host_env, records, send_to_both

COUNT = 40


def test_two_hosts_share_the_queues_and_no_message_is_handled_twice(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path, report_figure
):
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path, lock_duration=timedelta(seconds=30)
    )
    hosts = funchost.start(APP_DIR, count=2, env=env)
    assert hosts[0].instance_id != hosts[1].instance_id

    body = json.dumps({"sleep": 0.2})
    inbox, queue_ids = send_to_both(servicebus_emulator, storage_connection_string, names, body, count=COUNT)

    eventually(
        lambda: (
            len(records(tmp_path, "sb_record", "done")) >= COUNT
            and len(records(tmp_path, "queue_record", "done")) >= COUNT
        ),
        timeout=60,
        what=f"{COUNT} Service Bus and {COUNT} storage queue messages to be handled",
    )

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
    assert_drained(servicebus_emulator, names, inbox)
    report_figure(
        f"funchost competing hosts: Service Bus split {sorted(sb_share.values())}, "
        f"storage queue split {sorted(queue_share.values())} of {COUNT} each"
    )
