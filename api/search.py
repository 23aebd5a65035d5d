"""Search and bulk resubmit: ``GET /api/orders?customer=ID[&since=...&until=...]``,
``GET /api/errors``, ``GET /api/errors/{group}``, ``POST /api/errors/{group}/resubmit``.

Plain functions of their inputs and collaborators, as api/orders.py (whose replies,
400s and continuation tokens they share); api/blueprint.py binds them. Each reads the
indexes of adapters/search.py, never scans the table.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from pydantic import AwareDatetime, TypeAdapter, ValidationError

from adapters import search
from adapters.messaging import Nudger
from api.orders import (
    DEFAULT_LIMIT, MAX_LIMIT, BadRequest, Reply, continuation_token, only, order_id_of, whole_number,
)
from core.models import Code
from core.progress import order_summary
from core.search import KeyRange, check_group, customer_key_range
from supervisor.bulk import resubmit_group

CUSTOMER_PARAMETERS = ("customer", "since", "until", "limit", "continuation")
ERRORS_PARAMETERS = ("limit", "continuation")
GROUP_PARAMETERS = ("limit", "continuation")
RESUBMIT_PARAMETERS = ("continuation",)
#: Groups per page of ``GET /api/errors``: each costs a count query (per 1,000 orders).
DEFAULT_GROUPS, MAX_GROUPS = 20, 100

_CUSTOMER = TypeAdapter(Code)
_TIME = TypeAdapter(AwareDatetime)


def customer_of(value: str | None) -> str:
    try:
        return _CUSTOMER.validate_python(value)
    except ValidationError:
        raise BadRequest(
            f"{value!r} is not a customer id: 1 to 64 characters, letters, digits and ._:@- , "
            "starting with a letter or a digit"
        ) from None


def time_of(name: str, value: str | None) -> datetime | None:
    """An ISO 8601 time with a zone (``2026-11-25T10:00:00Z``), or None when absent."""
    if value is None:
        return None
    try:
        return _TIME.validate_python(value)
    except ValidationError:
        raise BadRequest(f"{name} {value!r} is not an ISO 8601 time with a zone, e.g. 2026-11-25T10:00:00Z") from None


def _key(token: str | None, check: Callable[[str], str]) -> str | None:
    """The key a continuation token holds, checked by ``check`` (a ValueError: not ours)."""
    if not token:
        return None
    try:
        return check(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRequest("continuation is not a token from a previous page") from None


def _customer_key(text: str) -> str:
    if not (len(text) > 14 and text[:13].isdigit() and text[13] == "-"):
        raise ValueError(text)
    return text


def list_by_customer(params: Mapping[str, str], *, store) -> Reply:
    """``GET /api/orders?customer=c-1&since=...&until=...&limit=50&continuation=...``: one
    page of the customer's orders, newest first (``since``/``until`` bound their creation
    time, both inclusive, to the millisecond). An unknown customer is an empty page."""
    only(params, CUSTOMER_PARAMETERS)
    customer = customer_of(params.get("customer"))
    since, until = time_of("since", params.get("since")), time_of("until", params.get("until"))
    try:
        key_range: KeyRange = customer_key_range(since, until)
    except ValueError as error:
        raise BadRequest(str(error)) from None
    limit = whole_number("limit", params.get("limit"), default=DEFAULT_LIMIT, most=MAX_LIMIT)
    after = _key(params.get("continuation"), _customer_key)
    page = search.by_customer(store, customer, key_range=key_range, limit=limit, after=after)
    return Reply(
        200,
        {
            "customer": customer,
            "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None,
            "orders": [order_summary(s) for s in page.orders],
            "continuation": continuation_token(page.next_key) if page.next_key else None,
        },
    )


def list_errors(params: Mapping[str, str], *, store) -> Reply:
    """``GET /api/errors?limit=20&continuation=...``: the causes of Error with their counts,
    step or undo and a sample error, by group id; ``continuation`` for the next page."""
    only(params, ERRORS_PARAMETERS)
    limit = whole_number("limit", params.get("limit"), default=DEFAULT_GROUPS, most=MAX_GROUPS)
    after = _key(params.get("continuation"), check_group)
    found, last = search.groups(store, limit=limit, after=after)
    return Reply(200, {"groups": [g.document() for g in found], "continuation": continuation_token(last) if last else None})


def group_of(value: str | None) -> str:
    try:
        return check_group(value)
    except ValueError as error:
        raise BadRequest(str(error)) from None


def get_group(group_id: str | None, params: Mapping[str, str], *, store) -> Reply:
    """``GET /api/errors/{group}``: the cause, its count, and a page of its orders (by order id)."""
    only(params, GROUP_PARAMETERS)
    group_id = group_of(group_id)
    limit = whole_number("limit", params.get("limit"), default=DEFAULT_LIMIT, most=MAX_LIMIT)
    after = _key(params.get("continuation"), order_id_of)
    found = search.group(store, group_id)
    if found is None:
        return Reply(404, {"error": "not_found", "reason": f"no error group {group_id!r}"})
    rows, more = search.members(store, group_id, limit=limit, after=after)
    return Reply(
        200,
        {
            **found.document(),
            "orders": [{"order_id": r.order_id, "attempt": r.attempt,
                        "error_at": r.error_at.isoformat() if r.error_at else None} for r in rows],
            "continuation": continuation_token(rows[-1].order_id) if more and rows else None,
        },
    )


def resubmit_errors(
    group_id: str | None, params: Mapping[str, str], *, store, nudger: Nudger, now: Callable[[], datetime],
    pending_timeout: timedelta, per_second: float, batch: int,
) -> Reply:
    """``POST /api/errors/{group}/resubmit[?continuation=...]``: resubmit the group's orders
    (at most ``batch``, ``per_second``) and answer 200 with what was done; ``done: false``
    with a ``continuation``: POST again with it for the rest (supervisor/bulk.py)."""
    only(params, RESUBMIT_PARAMETERS)
    group_id = group_of(group_id)
    after = _key(params.get("continuation"), order_id_of)
    progress = resubmit_group(
        group_id, store=store, nudger=nudger, pending_timeout=pending_timeout, per_second=per_second, batch=batch,
        after=after, now=now,
    )
    body = progress.document()
    body["continuation"] = continuation_token(progress.continuation) if progress.continuation else None
    return Reply(200, body)
