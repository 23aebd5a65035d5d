"""Valid orders for tests, built from the model's own rules."""

from __future__ import annotations

import json
import uuid
from datetime import UTC


def order_dict(order_id: str | None = None, /, *, lines: int = 2, **overrides) -> dict:
    items = [{"sku": f"sku-{i}", "quantity": i + 1, "unit_price": "2.50"} for i in range(lines)]
    total = sum((i + 1) * 250 for i in range(lines))
    body = {
        "order_id": order_id or f"o-{uuid.uuid4().hex[:12]}",
        "customer_id": "c-42",
        "customer_name": "Zoë Ångström",
        "currency": "EUR",
        "items": items,
        "total": f"{total // 100}.{total % 100:02d}",
    }
    body.update(overrides)
    return body


def order_json(order_id: str | None = None, /, **overrides) -> bytes:
    return json.dumps(order_dict(order_id, **overrides)).encode()


def servicebus_message(
    body: bytes,
    *,
    message_id: str = "m-1",
    reply_to: str | None = None,
    content_type: str | None = "application/json",
    delivery_count: int = 1,
):
    """A fully populated trigger message, as the Functions host hands it to a function."""
    from datetime import datetime, timedelta

    from azure.functions.servicebus import ServiceBusMessage

    now = datetime.now(UTC)
    return ServiceBusMessage(
        body=body,
        message_id=message_id,
        reply_to=reply_to,
        content_type=content_type,
        correlation_id=None,
        delivery_count=delivery_count,
        enqueued_time_utc=now,
        expires_at_utc=now + timedelta(days=14),
        locked_until=now + timedelta(seconds=60),
        lock_token=str(uuid.uuid4()),
        sequence_number=1,
        enqueued_sequence_number=1,
        time_to_live=timedelta(days=14),
        application_properties={},
        user_properties={},
    )


class Captured:
    """An output binding's value as the function set it (``func.Out``)."""

    def __init__(self) -> None:
        self.value = None

    def set(self, value) -> None:
        self.value = value

    def get(self):
        return self.value
