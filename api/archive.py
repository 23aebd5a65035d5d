"""The archive's reads over HTTP (``api/blueprint.py`` binds them): finished orders that
retention archived to blob storage and deleted from the table (docs/retention.md).

``GET /api/archive/{day}?limit=50&continuation=...``: one page of the day's archived
orders, in the order they were archived; ``GET /api/archive/{day}/orders/{id}``: one of
them as ``GET /api/orders/{id}`` showed it, with ``archived_at``. Refusals as the status
API's (api/orders.py): 400 for a bad day, id, limit or continuation, or an unknown
parameter; 404 for a day with no archive, or an order not in the day's archive.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Mapping

from adapters.archive import Archive, BadCursor
from api.orders import DEFAULT_LIMIT, MAX_LIMIT, BadRequest, Reply, only, order_id_of, refused, whole_number
from core.retention import BadDay, parse_day

PAGE_PARAMETERS = ("limit", "continuation")
#: What a day's list shows of each archived order.
SUMMARY_KEYS = ("order_id", "state", "workflow", "created_at", "updated_at", "archived_at")


def day_of(value: str | None) -> str:
    """The day from a route, checked (YYYY-MM-DD, a real date)."""
    try:
        return parse_day(value)
    except BadDay as error:
        raise BadRequest(str(error)) from None


def _cursor(token: str | None) -> tuple[int, int]:
    """(part, byte offset) from a continuation token; (0, 0) for the first page."""
    if not token:
        return 0, 0
    try:
        part, offset = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().split(":")
        cursor = int(part), int(offset)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRequest("continuation is not a token from a previous page") from None
    if min(cursor) < 0:
        raise BadRequest("continuation is not a token from a previous page")
    return cursor


def _token(part: int, offset: int) -> str:
    return base64.urlsafe_b64encode(f"{part}:{offset}".encode()).rstrip(b"=").decode()


def summary(document: dict) -> dict:
    """One archived order in a day's list."""
    return {key: document.get(key) for key in SUMMARY_KEYS}


def list_day(day: str | None, params: Mapping[str, str], *, archive: Archive) -> Reply:
    """``GET /api/archive/{day}``: ``{"day", "orders": [...], "continuation"}``, one page."""
    day = day_of(day)
    only(params, PAGE_PARAMETERS)
    limit = whole_number("limit", params.get("limit"), default=DEFAULT_LIMIT, most=MAX_LIMIT)
    part, offset = _cursor(params.get("continuation"))
    if not archive.has_day(day):
        return refused(404, "not_found", f"no archive for {day}")
    try:
        page = list(itertools.islice(archive.lines(day, part=part, offset=offset), limit + 1))
    except BadCursor:  # a part, or an offset, no page ended at
        raise BadRequest("continuation is not a token from a previous page") from None
    shown = page[:limit]
    more = len(page) > limit
    return Reply(200, {
        "day": day,
        "orders": [summary(line.document) for line in shown],
        "continuation": _token(shown[-1].part, shown[-1].end) if more else None,
    })


def get_archived(day: str | None, order_id: str | None, *, archive: Archive) -> Reply:
    """``GET /api/archive/{day}/orders/{id}``: the archived order, as the API showed it."""
    day, order_id = day_of(day), order_id_of(order_id)
    document = archive.find(day, order_id)
    if document is None:
        return refused(404, "not_found", f"no order {order_id!r} in the archive of {day}")
    return Reply(200, document)
