"""The app's Service Bus sending (adapters.messaging.Publisher) against the Service Bus
emulator: what the broker keeps of an alert or a status event resent and of a short-lived
agent request, and senders idle long enough for Azure to have detached their links."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusClient
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from adapters import clients, messaging
from adapters.messaging import AsyncPublisher, ended_key
from adapters.wiring import services
from core.models import Alert, Status, StatusEvent, utcnow
from tests.integration.test_agent import request
from tests.integration.test_dispatch_and_supervise import answer
from tests.servicebus_helpers import receive
from tools import servicebus_emulator as emulator

#: The emulator's idle time for these tests (Azure: 10 minutes), and the app's, below it as 9 minutes are below 10.
IDLE, APP_IDLE = 1.0, 0.5


def alert(order_id: str) -> Alert:
    return Alert(order_id=order_id, failure_count=1, last_error="refused", time=utcnow(), reason="needs an operator")


def test_an_alert_resent_for_one_error_is_dropped_and_a_later_error_at_the_same_attempt_is_not(
    app_settings, servicebus_emulator
):
    """Duplicate detection on the alerts queue drops the same Error's alert sent again (a
    close repeated after a crash), not the alert of a new Error at the same attempt (an undo
    resubmitted that fails again at once, unclaimed)."""
    publisher, queue, ended = services().publisher, app_settings["ALERTS_QUEUE"], utcnow()
    publisher.send_alert(alert("o-a"), queue=queue, attempt=4, ended=ended)
    publisher.send_alert(alert("o-a"), queue=queue, attempt=4, ended=ended)  # the same Error, again
    publisher.send_alert(alert("o-a"), queue=queue, attempt=4, ended=ended + timedelta(seconds=3))  # a new one
    received = receive(servicebus_emulator.connection_string, queue, 3, timeout=3)
    assert len(received) == 2 and len({m.message_id for m in received}) == 2


def test_a_status_event_sent_again_is_dropped_and_a_new_one_of_its_status_and_attempt_is_not(
    app_settings, servicebus_emulator
):
    """A reply queue with duplicate detection (the alerts queue stands in for a client's) drops
    an order's end sent again (a close repeated after a crash) and a rejection of the same
    message redelivered, not a later end at the same attempt (an undo resubmitted that fails
    again at once) nor the rejection of another message naming the same order id. Their ids
    used to be the order id, status and attempt alone, so the new events were dropped."""
    publisher, queue, ended = services().publisher, app_settings["ALERTS_QUEUE"], utcnow()
    failed = StatusEvent(order_id="o-s", status=Status.FAILED, time=ended, attempt=4)
    for key in (ended_key(ended), ended_key(ended), ended_key(ended + timedelta(seconds=3))):
        assert publisher.send_status(failed, queue=queue, key=key)
    rejected = StatusEvent(order_id="o-s", status=Status.REJECTED, time=ended, detail="invalid order")
    for key in ("message-1", "message-1", "message-2"):
        assert publisher.send_status(rejected, queue=queue, key=key)
    received = receive(servicebus_emulator.connection_string, queue, 6, timeout=3)
    assert sorted(m.subject for m in received) == ["failed", "failed", "rejected", "rejected"]
    assert len({m.message_id for m in received}) == 4


def test_an_agent_request_with_under_a_second_left_still_expires(app_settings, servicebus_emulator):
    """A time-to-live is sent in whole seconds: under one second left is rounded up to one,
    never down to 0, which the broker would take for none (the queue's 14 days)."""
    sent = request("o-ttl", seconds=0.6)
    queue = app_settings["INVENTORY_REQUESTS_QUEUE"]
    assert services().publisher.send_agent_request(sent, queue=queue, reply_to="agent-responses", now=utcnow())
    (message,) = receive(servicebus_emulator.connection_string, queue, 1, timeout=3)
    assert message.time_to_live == timedelta(seconds=1)


@pytest.fixture
def idle_emulator(monkeypatch):
    """An emulator of this test's own (so the only links it detaches are the test's), with Azure's
    idle link detach (10 minutes without a call) shortened to IDLE, the app's sender refresh (9
    minutes) to APP_IDLE; ``wait_for_detach(n)``: until it has detached n idle links."""
    monkeypatch.setattr(messaging, "SENDER_IDLE_SECONDS", APP_IDLE)
    instance = emulator.start(queues=["replies", "agent-responses"], link_idle_timeout=IDLE)

    def wait_for_detach(count: int) -> None:
        deadline = time.monotonic() + 10
        while instance.operation_counts().get("link.idle-detached", 0) < count:
            assert time.monotonic() < deadline, "the emulator detached no idle link"
            time.sleep(0.05)

    instance.wait_for_detach = wait_for_detach
    yield instance
    instance.stop()


def test_a_status_event_after_azures_idle_detach_is_sent_on_a_new_link_and_the_queue_stays_usable(idle_emulator):
    """A reply queue quiet for 10 minutes: Azure has detached its sender's link, and the SDK only
    recovers by retrying after its back-off (1 s with the app's retry settings): here that send
    took 1.9 s of a status event's 2-s budget, and a plain sender's failed past it (~3 s), which
    loses the event and takes the queue for broken, dropping its events for a minute. The
    publisher now replaces a sender idle past SENDER_IDLE_SECONDS (9 minutes) before it sends."""
    client = ServiceBusClient.from_connection_string(idle_emulator.connection_string, **clients.SERVICEBUS_RETRY)
    publisher = messaging.Publisher(client)
    try:
        event = StatusEvent(order_id="o-i", status=Status.PROCESSING, time=utcnow(), step="reserve", attempt=1)
        assert publisher.send_status(event, queue="replies")
        first = publisher._links["replies"].sender
        idle_emulator.wait_for_detach(1)  # the sender's link, idle past the emulator's time
        for attempt, step in ((2, "charge"), (3, "ship")):
            assert publisher.send_status(event.model_copy(update={"step": step, "attempt": attempt}), queue="replies")
        assert publisher._links["replies"].sender is not first  # a new sender, not the detached link retried
    finally:
        publisher.close()
    received = receive(idle_emulator.connection_string, "replies", 3, timeout=3)
    assert [m.message_id for m in received] == ["o-i:processing:1", "o-i:processing:2", "o-i:processing:3"]


def test_an_agents_response_after_azures_idle_detach_goes_on_a_new_sender(idle_emulator):
    """The agents' async publisher replaces a sender idle past SENDER_IDLE_SECONDS too, rather than
    send on a link Azure has detached (the SDK would recover only by retrying, after its back-off)."""
    sent = request("o-ar")

    async def run() -> tuple[object, object]:
        client = AsyncServiceBusClient.from_connection_string(
            idle_emulator.connection_string, **clients.SERVICEBUS_RETRY
        )
        publisher = AsyncPublisher(client)
        try:
            await publisher.send_agent_response(answer(sent), queue="agent-responses")
            first = publisher._senders["agent-responses"]
            await asyncio.to_thread(idle_emulator.wait_for_detach, 1)
            await publisher.send_agent_response(answer(sent, result={"ok": True}), queue="agent-responses")
            return first, publisher._senders["agent-responses"]
        finally:
            await publisher.close()

    first, second = asyncio.run(run())
    assert first is not second
    assert len(receive(idle_emulator.connection_string, "agent-responses", 2, timeout=3)) == 2
