"""Reading what the app sent, through the real SDK."""

from __future__ import annotations

import json
import time

from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage


def receive(
    connection_string: str, queue: str, count: int, *, timeout: float = 10.0, sub_queue=None
) -> list[ServiceBusReceivedMessage]:
    """Receive and complete up to ``count`` messages (from ``sub_queue``, e.g. the
    dead-letter queue, if given), waiting at most ``timeout`` seconds."""
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
            while len(got) < count and time.monotonic() < deadline:
                wait = max(0.1, min(2.0, deadline - time.monotonic()))
                for message in receiver.receive_messages(max_message_count=count - len(got), max_wait_time=wait):
                    receiver.complete_message(message)
                    got.append(message)
    return got


def bodies(messages) -> list[dict]:
    return [json.loads(str(m)) for m in messages]
