"""``ordersctl archive show DAY [--order ID] [--full]``: finished orders that retention
archived to blob storage and deleted from the table (docs/retention.md), as JSON."""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError

from adapters.archive import Archive
from api.archive import summary
from core.models import OrderId
from core.retention import parse_day


class NotArchived(LookupError):
    """No archive for that day, or the order is not in it."""


def checked(day: str, order: str | None = None) -> str:
    """The day, checked with the order id if any, before anything is read: ValueError for
    a day that is not ``YYYY-MM-DD`` or an id that is not an order id."""
    day = parse_day(day)
    if order is not None:
        try:
            TypeAdapter(OrderId).validate_python(order)
        except ValidationError:
            raise ValueError(f"{order!r} is not an order id") from None
    return day


def show(archive: Archive, day: str, *, order: str | None = None, full: bool = False) -> str:
    """The JSON ``ordersctl archive show`` prints: ``{"day", "orders": [...], "count"}`` (a
    summary of each order, or with ``full`` its whole document), or with ``order`` that
    order's document as ``GET /api/orders/{id}`` showed it. Raises ValueError for a bad day
    or order id, :class:`NotArchived` when there is nothing to show."""
    day = checked(day, order)
    if not archive.has_day(day):
        raise NotArchived(f"no archive for {day}")
    if order is not None:
        document = archive.find(day, order)
        if document is None:
            raise NotArchived(f"no order {order!r} in the archive of {day}")
        return json.dumps(document, indent=2, ensure_ascii=False)
    orders = [line.document if full else summary(line.document) for line in archive.lines(day)]
    return json.dumps({"day": day, "orders": orders, "count": len(orders)}, indent=2, ensure_ascii=False)
