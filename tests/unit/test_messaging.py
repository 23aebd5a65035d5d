"""The app's Service Bus messages (adapters.messaging._message) against the SDK's own
``ServiceBusMessage`` of the same arguments: the sender turns both into the same outgoing
AMQP message, encoded to the same bytes (issue 21: the app builds the AMQP message itself,
without ServiceBusMessage's property setters)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._common.utils import transform_outbound_messages
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from opentelemetry.sdk.trace import TracerProvider

from adapters import telemetry
from adapters.messaging import JSON, MAX_MESSAGE_ID, _message, ended_key, status_message_id
from core.models import Alert, Status, StatusEvent, utcnow


def outgoing(message):
    """The AMQP message a sender sends for ``message`` (as ``send_messages`` converts it), with
    its creation and expiry times checked against its TTL and then left out: both are stamped
    from the clock, in whole seconds, at the conversion."""
    amqp = transform_outbound_messages(message, ServiceBusMessage, PyamqpTransport.to_outgoing_amqp_message)._message
    if amqp.properties.creation_time is not None:
        assert amqp.properties.absolute_expiry_time - amqp.properties.creation_time == amqp.header.ttl
    return amqp._replace(properties=amqp.properties._replace(creation_time=None, absolute_expiry_time=None))


def sdk_message(body, *, message_id, correlation_id, subject, **extra) -> ServiceBusMessage:
    """The message as the app built it before: the SDK's ServiceBusMessage."""
    return ServiceBusMessage(
        body.model_dump_json(), content_type=JSON, message_id=message_id, correlation_id=correlation_id,
        subject=subject, application_properties=telemetry.message_properties() or None, **extra,
    )


EVENT = StatusEvent(order_id="o-1", status=Status.PROCESSING, time=utcnow(), step="reserve", attempt=1)
ALERT = Alert(order_id="o-2", failure_count=3, last_error="HTTP 503", time=utcnow(), reason="needs an operator")
CASES = {
    "status event": (EVENT, {"message_id": "o-1:processing:1", "correlation_id": "o-1", "subject": "processing"}),
    "alert": (ALERT, {"message_id": "o-2:alert:2", "correlation_id": "o-2", "subject": "order-failed"}),
    # An agent request: ReplyTo and a time to live (whole seconds kept; under one second: 0).
    **{
        f"request, TTL {ttl}": (
            EVENT,
            {"message_id": "o-1:reserve:1", "correlation_id": "o-1", "subject": "reserve",
             "reply_to": "agent-responses", "time_to_live": ttl},
        )
        for ttl in (timedelta(seconds=29, milliseconds=700), timedelta(milliseconds=400), timedelta(days=2))
    },
}


@pytest.mark.parametrize("traced", [True, False], ids=["in a span", "no span"])
@pytest.mark.parametrize("case", CASES)
def test_the_app_sends_what_the_sdks_service_bus_message_sends(case, traced):
    body, arguments = CASES[case]
    provider = TracerProvider()
    try:
        if traced:
            with provider.get_tracer("test").start_as_current_span("order.step"):
                ours, theirs = _message(body, **arguments), sdk_message(body, **arguments)
            assert ours.application_properties.keys() == {b"traceparent", b"Diagnostic-Id"}
        else:
            ours, theirs = _message(body, **arguments), sdk_message(body, **arguments)
            assert ours.application_properties is None
    finally:
        provider.shutdown()
    sent, expected = outgoing(ours), outgoing(theirs)
    assert sent == expected
    assert encode_payload(bytearray(), sent) == encode_payload(bytearray(), expected)


def test_a_message_id_service_bus_refuses_is_refused_before_sending():
    arguments = {"correlation_id": "o-1", "subject": "processing"}
    _message(EVENT, message_id="m" * MAX_MESSAGE_ID, **arguments)
    for build in (_message, sdk_message):
        with pytest.raises(ValueError, match="message_id cannot be longer than 128"):
            build(EVENT, message_id="m" * (MAX_MESSAGE_ID + 1), **arguments)


def test_a_status_event_id_tells_apart_what_can_happen_twice_at_one_attempt_and_fits_service_bus():
    """An order's end is keyed by when it ended, so a later end at the same attempt is a new
    id; the longest order id with the longest status and a key still fits 128 characters,
    as a digest of all but the order id, distinct per key and the same for the same event."""
    ended = utcnow()
    event = StatusEvent(order_id="o-1", status=Status.COMPENSATED, time=ended, attempt=7)
    assert status_message_id(event) == "o-1:compensated:7"
    assert status_message_id(event, ended_key(ended)) == f"o-1:compensated:7:{int(ended.timestamp() * 1000):x}"
    long = event.model_copy(update={"order_id": "o" * 100, "attempt": 123456})
    ids = {status_message_id(long, key) for key in ("a", "a", "b")}
    assert len(ids) == 2 and all(len(i) <= MAX_MESSAGE_ID and i.startswith("o" * 100 + ":") for i in ids)
