"""``ordersctl approve`` / ``ordersctl reject`` (bound in ordersctl/cli.py): an event for an
order's waiting step, sent to the ``order-events`` queue as any Service Bus client may
(docs/clients.md, "Sending order events"), with MessageId = the order id + ':' + the event name
+ ':' + the first 16 hex digits of the body's SHA-256. The app decides on it;
``ordersctl status`` shows the outcome, and a refused event is kept in
``ordersctl rejections``."""

from __future__ import annotations

import getpass

from pydantic import ValidationError

from core.models import OrderEvent, explain


class InvalidEvent(ValueError):
    """The event would be refused: not sent."""


def event_message(order_id: str, *, approved: bool, by: str | None, note: str | None, event: str):
    """The Service Bus message of the event (``by`` defaults to the user's name)."""
    try:
        message = OrderEvent(order_id=order_id, name=event, approved=approved, by=by or getpass.getuser(), note=note)
    except ValidationError as error:
        raise InvalidEvent(f"invalid event, not sent: {explain(error)}") from error
    from azure.servicebus import ServiceBusMessage

    body = message.model_dump_json(exclude_none=True)
    return ServiceBusMessage(body, content_type="application/json", message_id=message.message_id())


def send_event(client, queue: str, message) -> None:
    """Send the event's message with ``client`` (a ServiceBusClient) to ``queue``."""
    with client, client.get_queue_sender(queue) as sender:
        sender.send_messages(message)
