"""The status API's requests, as plain functions of their inputs and collaborators
(``api/blueprint.py`` binds them to HTTP routes; tests call them directly too).

Every reply is JSON. A refused request gets ``{"error": <code>, "reason": <text>}``
with its status, never a stack trace: 400 for a bad order id, state, limit or
continuation; 401/403 for a caller without the role (core/access.py), 403 for a
POST from another site's page (its Origin, :func:`same_origin`); 404 for an
unknown order; 405 for a method the route does not take; 409 for a resubmit of an
order that is not in Error. No input reaches a 500: a failure of the app itself
(storage down) answers 500 ``internal_error`` in the same JSON, and is logged.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from adapters.messaging import Nudger
from adapters.store import OrderNotFound, StateStore
from core import access
from core.models import OrderId, ProcessState
from core.progress import order_summary, status_document
from supervisor.supervision import NotResubmittable, resubmit

#: Orders per page of ``GET /api/orders``: the default and the most.
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
LIST_PARAMETERS = ("state", "limit", "continuation")

_ORDER_ID = TypeAdapter(OrderId)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """A reply: ``body`` is JSON-encoded, unless ``mimetype`` says otherwise (then it is
    text or bytes as is: the operator page and its files, api/ops.py)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    mimetype: str = "application/json"


def refused(status: int, error: str, reason: str, **headers: str) -> Reply:
    return Reply(status, {"error": error, "reason": reason}, dict(headers))


class BadRequest(ValueError):
    """A request the API refuses with 400 and this reason."""


def order_id_of(value: str | None) -> str:
    """The order id from a route, checked against the order id pattern of core/models.py."""
    try:
        return _ORDER_ID.validate_python(value)
    except ValidationError:
        raise BadRequest(
            f"{value!r} is not an order id: 1 to 100 characters, letters, digits and ._:@- , "
            "starting with a letter or a digit"
        ) from None


def serve(
    method: str,
    headers: Mapping[str, str],
    *,
    methods: tuple[str, ...],
    roles: frozenset[str],
    mode: access.ApiAuth,
    action: Callable[[], Reply],
) -> Reply:
    """Check the caller, then the method, then run ``action``; a BadRequest becomes a 400."""
    lowered = {name.lower(): value for name, value in headers.items()}
    denial = access.check(mode, lowered, roles, platform_auth=os.environ.get(access.PLATFORM_AUTH_SETTING))
    if denial is not None:
        return refused(denial.status, denial.error, denial.reason)
    if method.upper() not in methods:
        allowed = ", ".join(methods)
        return refused(405, "method_not_allowed", f"{method.upper()} is not allowed here; use {allowed}", Allow=allowed)
    if method.upper() not in SAFE_METHODS and not same_origin(lowered):
        return refused(403, "forbidden", "a cross-site request: its Origin is not this API's site")
    try:
        return action()
    except BadRequest as error:
        return refused(400, "bad_request", str(error))
    except Exception:  # noqa: BLE001 - the app's own failure (storage down): JSON too, never a trace
        log.exception("%s request failed", method.upper())
        return refused(500, "internal_error", "the app could not answer this request (logged); try again later")


#: Methods that change nothing: any page may send them (a browser sends them anyway).
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def same_origin(headers: Mapping[str, str]) -> bool:
    """No ``Origin`` (not a browser, or a same-origin GET), or one whose host is this API's
    (``Host``, or the ``X-Forwarded-Host`` of a proxy in front). In Azure the operator
    page's browser carries the Easy Auth session cookie on every request to the app,
    also on a form another site posts to it: such a cross-site POST carries that site's
    Origin and is refused, so a resubmit comes from the app's own page or a non-browser
    client only. ``headers`` have lower-cased names."""
    origin = headers.get("origin")
    if not origin:
        return True
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:  # e.g. "http://[::1": an Origin that does not parse is not this site
        return False
    hosts = {headers.get(name, "").split(",")[0].strip().lower() for name in ("host", "x-forwarded-host")}
    return bool(netloc) and netloc in hosts - {""}


def get_order(order_id: str | None, *, store: StateStore) -> Reply:
    """``GET /api/orders/{id}``: the order with its steps, as ``ordersctl status --json``."""
    order_id = order_id_of(order_id)
    try:
        record = store.read(order_id)
    except OrderNotFound:
        return refused(404, "not_found", f"no order {order_id!r}")
    return Reply(200, status_document(record.state, record.document, record.lines))


def _state(value: str | None) -> ProcessState:
    known = ", ".join(state.value for state in ProcessState)
    if not value:
        raise BadRequest(f"give the state to list: state={known.replace(', ', '|')}")
    for state in ProcessState:
        if state.value.lower() == value.strip().lower():
            return state
    raise BadRequest(f"state {value!r} is not one of {known}")


def only(params: Mapping[str, str], known) -> None:
    """Refuse a query parameter the endpoint does not know (a typo would otherwise be ignored)."""
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r} (known: {', '.join(known)})")


def whole_number(name: str, value: str | None, *, default: int, most: int) -> int:
    """A query parameter that must be a whole number from 1 to ``most`` (``default`` if absent)."""
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= most:
        raise BadRequest(f"{name} {value!r} is not a whole number from 1 to {most}")
    return number


def continuation_token(order_id: str) -> str:
    """The opaque token of the page after ``order_id``."""
    return base64.urlsafe_b64encode(order_id.encode()).rstrip(b"=").decode()


def _after(token: str | None) -> str | None:
    if not token:
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        return order_id_of(text)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRequest("continuation is not a token from a previous page") from None


def list_orders(params: Mapping[str, str], *, store: StateStore) -> Reply:
    """``GET /api/orders?state=Error&limit=50&continuation=...``: one page of the orders in
    a state, in order-id order; ``continuation`` in the reply asks for the next page (null
    on the last)."""
    only(params, LIST_PARAMETERS)
    state, after = _state(params.get("state")), _after(params.get("continuation"))
    limit = whole_number("limit", params.get("limit"), default=DEFAULT_LIMIT, most=MAX_LIMIT)
    page, last = store.page_by_state(state, limit=limit, after=after)
    return Reply(
        200,
        {
            "state": state.value,
            "orders": [order_summary(s) for s in page],
            "continuation": continuation_token(last) if last else None,
        },
    )


def resubmit_order(
    order_id: str | None, *, store: StateStore, nudger: Nudger, now: datetime, pending_timeout: timedelta
) -> Reply:
    """``POST /api/orders/{id}/resubmit``: an order in Error back to Pending where it
    stopped (supervisor.supervision.resubmit); 409 for any other state."""
    order_id = order_id_of(order_id)
    try:
        state = resubmit(order_id, store=store, nudger=nudger, now=now, pending_timeout=pending_timeout)
    except OrderNotFound:
        return refused(404, "not_found", f"no order {order_id!r}")
    except NotResubmittable as error:
        return refused(409, "conflict", str(error))
    return Reply(202, order_summary(state))
