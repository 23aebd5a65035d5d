"""``ordersctl send-order`` with stamps, over a real socket to the Service Bus emulator: with
``ORDERS_STAMPS`` listing the emulator as stamp 1, an order whose id picks stamp 1 is sent
to its ``orders`` queue, and one whose id picks stamp 0 is refused and never sent."""

from __future__ import annotations

import os
import subprocess
import sys

from azure.servicebus import ServiceBusClient

from core import names
from tests import ROOT


def cli(*args: str, stamps: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250", names.ORDERS_STAMPS_SETTING: stamps}
    return subprocess.run([sys.executable, "-m", "ordersctl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def order_of(stamp: int, stamps: int, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(10_000) if names.stamp_of(f"{prefix}-{i}", stamps) == stamp)


def test_send_order_sends_an_order_to_its_own_stamp_and_refuses_one_of_another(app_settings, servicebus_emulator):
    stamps = ["stamp-a.servicebus.windows.net", f"127.0.0.1:{servicebus_emulator.port}"]
    queue = app_settings[names.ORDERS_QUEUE_SETTING]
    mine, other = order_of(1, 2, "stamped"), order_of(0, 2, "stamped")
    order = ["--customer", "c-1", "--item", "sku-1:1:1.00"]

    refused = cli("send-order", "--order-id", other, *order, stamps=",".join(stamps))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"belongs to stamp 0 ({stamps[0]})" in " ".join(refused.stderr.split())

    sent = cli("send-order", "--order-id", mine, *order, stamps=",".join(stamps))
    assert sent.returncode == 0, sent.stdout + sent.stderr

    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client, \
            client.get_queue_receiver(queue) as receiver:
        waiting = receiver.peek_messages(max_message_count=10)
    assert [m.message_id.split(":")[0] for m in waiting] == [mine], "only the order of this stamp reached its queue"
