"""The app's Service Bus sending (adapters.messaging.Publisher) against the Service Bus
emulator: what the broker keeps of an alert resent and of a short-lived agent request."""

from __future__ import annotations

from datetime import timedelta

from adapters.messaging import ended_key
from adapters.wiring import services
from core.models import Alert, Status, StatusEvent, utcnow
from tests.integration.test_agent import request
from tests.servicebus_helpers import receive


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
