"""Helpers for the emulator's own tests: unique queues, an SDK client, polling with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSender

from tests import polling

#: The project's polling helper, with the quicker pace these in-process checks can afford.
wait_until = partial(polling.wait_until, timeout=10.0, interval=0.02)


def receive_exactly(
    receiver: ServiceBusReceiver, count: int, *, timeout: float = 10.0
) -> list[ServiceBusReceivedMessage]:
    """Receive ``count`` messages (in as many calls as needed), failing after ``timeout`` seconds."""
    received: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(received) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"received {len(received)} of {count} messages within {timeout} s")
        received += receiver.receive_messages(max_message_count=count - len(received), max_wait_time=min(remaining, 5))
    return received


@pytest.fixture
def make_queue(servicebus_emulator, unique_name) -> Callable[..., str]:
    """Declare a queue with a unique name and the given properties; returns its name."""

    def make(**properties) -> str:
        return servicebus_emulator.declare_queue(unique_name("q"), **properties)

    return make


@pytest.fixture
def queue(make_queue) -> str:
    """A fresh queue with default properties."""
    return make_queue()


@pytest.fixture
def client(servicebus_connection_string) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus_connection_string) as sb_client:
        yield sb_client


def sender_for(client: ServiceBusClient, queue: str) -> ServiceBusSender:
    """A sender without the SDK's keep-alive thread, whose 1 s sleep every close would wait for.

    (Receivers keep theirs: the SDK always starts one when prefetch is 0.)
    """
    return client.get_queue_sender(queue, keep_alive=None)
