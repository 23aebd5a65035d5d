"""A Service Bus listener outlives its broker: it reconnects when the emulator comes back,
and goes on through Azure's push-back (throttling, lost locks, dropped links)."""

from __future__ import annotations

import re

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from tools import servicebus_emulator as emulator
from tools.servicebus_emulator import Faults

from .support import APP_DIR, eventually, only, records


def test_the_listener_reconnects_after_the_broker_restarts(funchost, storage_connection_string, unique_name, tmp_path):
    queue = unique_name("in-")
    first = emulator.start(port=0, queues=[queue])
    port = first.port
    env = {
        "ServiceBusConnection": first.connection_string,
        "AzureWebJobsStorage": storage_connection_string,
        "FH_RECORD_DIR": str(tmp_path),
        "FH_SB_QUEUE": queue,
        "FH_SB_OUT_QUEUE": unique_name("out-"),
        "FH_OUT_QUEUE": unique_name("out-"),
        **only("sb_record"),
    }
    try:
        (host,) = funchost.start(APP_DIR, env=env)
    finally:
        first.stop()
    host.wait_for_log(r"receiving from Service Bus queue \S+ failed")

    second = emulator.start(port=port, queues=[queue])
    try:
        with (
            ServiceBusClient.from_connection_string(second.connection_string) as client,
            client.get_queue_sender(queue) as sender,
        ):
            sender.send_messages(ServiceBusMessage("{}", message_id="after-restart"))
        eventually(lambda: records(tmp_path, "sb_record", "done"), timeout=30, what="the message after the restart")
        eventually(lambda: second.message_counts(queue)["locked"] == 0, what="its completion")
        assert second.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
    finally:
        host.terminate()
        second.stop()


def test_the_listener_goes_on_through_throttling_lost_locks_and_dropped_links(
    funchost, storage_connection_string, unique_name, tmp_path
):
    """Azure's push-back (the emulator's injected faults): a receiver refused because the namespace
    is throttled is opened again after 2 s, a dropped link or connection is opened again, a message
    whose lock was lost comes back; every message is handled and the queue ends empty."""
    queue = unique_name("in-")
    # A short lock: messages delivered on a link that drops stay locked until it expires.
    broker = emulator.start(
        port=0, queues=[emulator.QueueSettings(queue, lock_duration=2, duplicate_detection=True, max_delivery_count=50)]
    )
    env = {
        "ServiceBusConnection": broker.connection_string,
        "AzureWebJobsStorage": storage_connection_string,
        "FH_RECORD_DIR": str(tmp_path),
        "FH_SB_QUEUE": queue,
        "FH_SB_OUT_QUEUE": unique_name("out-"),
        "FH_OUT_QUEUE": unique_name("out-"),
        **only("sb_record"),
    }
    ids = [f"m-{i}" for i in range(20)]
    try:
        (host,) = funchost.start(APP_DIR, env=env)
        broker.set_faults(Faults(throttle=10, lock_lost=0.05, link_drop=0.05, connection_drop=0.03, seed=4))
        with ServiceBusClient.from_connection_string(broker.connection_string) as client:
            with client.get_queue_sender(queue) as sender:
                for message_id in ids:
                    eventually(lambda: _sent(sender, message_id), timeout=30, what=f"{message_id} sent")
        handled = eventually(
            lambda: (found := {r["message_id"] for r in records(tmp_path, "sb_record", "done")}) >= set(ids) and found,
            timeout=60,
            what="every message handled",
        )
        assert handled == set(ids)
        eventually(lambda: broker.message_counts(queue)["active"] + broker.message_counts(queue)["locked"] == 0,
                   timeout=30, what="the queue to empty")
        faults = broker.fault_counts()
        assert faults["throttled"] > 0 and faults["link_drop"] + faults["connection_drop"] > 0, faults
        assert broker.message_counts(queue)["dead_letter"] == 0
        # A throttled receiver is opened again after 2 s, the backoff left as it was. Which
        # requests the namespace refuses depends on the run's timing: when none of this run's
        # refusals hit the receiver (a loaded machine), throttle harder and keep sending until one does.
        throttled_reopen = r"failed \(ServiceBusServerBusyError: .*\); retrying in 2 s"
        if not re.search(throttled_reopen, host.log_text()):
            broker.set_faults(Faults(throttle=1, seed=4))
            with ServiceBusClient.from_connection_string(broker.connection_string) as client:
                with client.get_queue_sender(queue) as sender:
                    for message_id in ("more-1", "more-2", "more-3"):
                        eventually(lambda: _sent(sender, message_id), timeout=30, what=f"{message_id} sent")
        eventually(lambda: re.search(throttled_reopen, host.log_text()), timeout=30,
                   what="a throttled receiver opened again after 2 s")
    finally:
        funchost.stop_all()
        broker.stop()


def _sent(sender, message_id: str) -> bool:
    """Send once; False when Service Bus refused it for now (the caller tries again)."""
    try:
        sender.send_messages(ServiceBusMessage("{}", message_id=message_id))
    except ServiceBusError:
        return False
    return True
