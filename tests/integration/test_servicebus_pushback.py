"""Service Bus push-back met by the app's own code (the scheduler's send after its claim),
with the emulator's injected faults (tools/servicebus_emulator/faults.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusServerBusyError

from adapters.clients import SERVICEBUS_RETRY
from adapters.wiring import services
from core.models import Nudge, ProcessState, utcnow
from tests.integration.test_dispatch_and_supervise import answer, nudges_waiting, record, schedule, submit, supervise
from tests.servicebus_helpers import receive
from tools.servicebus_emulator import Faults

#: A credit every million seconds: once one message has used it up, every send is refused.
REFUSE_EVERY_SEND = Faults(throttle=1e-6)


def use_up_the_credits(emulator, queue: str) -> None:
    """Throttle the namespace and spend its credit: every later send is refused, whatever the retries."""
    emulator.set_faults(REFUSE_EVERY_SEND)
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("the last credit"))


def test_the_apps_clients_retry_transient_service_bus_failures_as_configured(app_settings):
    config = services().publisher.client._config
    assert (config.retry_total, config.retry_backoff_factor, config.retry_backoff_max) == (
        SERVICEBUS_RETRY["retry_total"], SERVICEBUS_RETRY["retry_backoff_factor"], SERVICEBUS_RETRY["retry_backoff_max"],
    )


def test_a_request_send_refused_for_good_after_the_claim_leaves_a_row_the_supervisor_recovers(
    app_settings, servicebus_emulator, unique_name
):
    s = services()
    nudge = submit("o-sb-1")
    try:
        use_up_the_credits(servicebus_emulator, servicebus_emulator.declare_queue(unique_name("scratch-")))
        with pytest.raises(ServiceBusServerBusyError):  # after the SDK's retries (1 + 2 + 4 s)
            schedule(nudge)
    finally:
        servicebus_emulator.set_faults(Faults())
    assert servicebus_emulator.fault_counts()["throttled"] >= SERVICEBUS_RETRY["retry_total"] + 1
    # The claim was written before the send: the row is in flight, and no request was sent.
    state = s.store.get("o-sb-1")
    assert (state.process_state, state.attempt) == (ProcessState.PROCESSING, 1)
    assert servicebus_emulator.message_counts(app_settings["INVENTORY_REQUESTS_QUEUE"])["active"] == 0
    # The host retries the failed invocation with the same nudge: the line is claimed already.
    assert schedule(nudge, instance="i2") is None
    # Past the step's deadline the supervisor resets the row, and the next claim sends attempt 2.
    now = utcnow() + s.settings.step_timeout + timedelta(seconds=1)
    assert supervise(now)["retry"] == 1
    assert len(nudges_waiting(include_invisible=True)) >= 1
    request = schedule(Nudge(order_id="o-sb-1"), now=now + timedelta(seconds=300))
    assert (request.step, request.attempt) == ("reserve", 2)
    (sent,) = receive(servicebus_emulator.connection_string, app_settings["INVENTORY_REQUESTS_QUEUE"], 1)
    assert sent.message_id == "o-sb-1:reserve:2"
    assert record(answer(request), now=now + timedelta(seconds=301)).step == "charge"
    assert record(answer(request), now=now + timedelta(seconds=302)) is None, "a response twice changes nothing"


def test_the_supervisor_sees_when_the_oldest_response_still_queued_was_sent(app_settings, servicebus_emulator):
    """What the supervisor peeks before counting a missed deadline (core.lifecycle.awaiting_answer):
    the enqueued time of the oldest message on the responses queue, a locked one included (its
    handler may be recording it), and the current time once the queue is empty."""
    publisher, queue = services().publisher, app_settings["AGENT_RESPONSES_QUEUE"]
    before = utcnow()
    assert publisher.oldest_enqueued(queue) >= before - timedelta(seconds=1)  # empty: nothing older than now
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage("first"), ServiceBusMessage("second")])
        with client.get_queue_receiver(queue) as receiver:
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)  # locked, not settled
            assert str(first) == "first"
            assert publisher.oldest_enqueued(queue) == first.enqueued_time_utc
            receiver.complete_message(first)
            (second,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert publisher.oldest_enqueued(queue) == second.enqueued_time_utc
            receiver.complete_message(second)
    assert publisher.oldest_enqueued(queue) >= first.enqueued_time_utc
