"""Fixtures and helpers for the emulator's own tests (they need nothing outside this package).

A session-wide emulator in a background thread on a free port, with no queues: each
test declares its own with a unique name (``make_queue`` / ``queue``). An emulator
that cannot start fails the run with a clear message: these tests are never skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSender

from tools import servicebus_emulator as emulator

T = TypeVar("T")

#: Where ``python -m tools.servicebus_emulator`` can be imported from (the package's grandparent).
IMPORT_ROOT = Path(emulator.__file__).resolve().parents[2]
#: The name a figure travels under in a test's report.
_FIGURE = "Service Bus emulator figure"


def wait_until(
    check: Callable[[], T], *, timeout: float = 10.0, what: str = "the condition", interval: float = 0.02
) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail naming
    ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value {result!r}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def servicebus_emulator() -> Iterator[emulator.ServiceBusEmulator]:
    try:
        instance = emulator.start(host="127.0.0.1", port=0)
    except Exception as error:  # noqa: BLE001 - any reason it cannot run fails the run
        pytest.fail(f"The Service Bus emulator could not start: {error}", pytrace=False)
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def servicebus_connection_string(servicebus_emulator) -> str:
    return servicebus_emulator.connection_string


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """A short queue name unique to this test."""

    def make(prefix: str = "t") -> str:
        return f"{prefix}{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def report_figure(request) -> Callable[[str], None]:
    """Call with one line of text (a throughput...); it is printed in the run's closing
    summary. It travels in the test's report, so it arrives from pytest-xdist workers too."""
    return lambda line: request.node.user_properties.append((_FIGURE, line))


def pytest_terminal_summary(terminalreporter) -> None:
    figures = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == _FIGURE
    ]
    if figures:
        terminalreporter.section("Service Bus emulator figures")
        for line in figures:
            terminalreporter.write_line(line)


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
