"""A Service Bus listener outlives its broker: it reconnects when the emulator comes back."""

from __future__ import annotations

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tools import servicebus_emulator as emulator

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
