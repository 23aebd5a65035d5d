"""Stand-ins for what the Functions host hands a function: a trigger message and an
output binding. Orders themselves come from ``devtools.orders``."""

from __future__ import annotations

import uuid
from datetime import UTC


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


def every_page(store, state, *, limit: int) -> list[str]:
    """The order ids of every page of ``store.page_by_state(state)``, following the cursor."""
    ids, after = [], None
    while True:
        page, after = store.page_by_state(state, limit=limit, after=after)
        ids += [s.order_id for s in page]
        if after is None:
            return ids
