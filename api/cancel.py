"""``POST /api/orders/{id}/cancel``: cancel an order that has not ended (operator role).

Optional JSON body ``{"reason": "..."}`` (core.models.CancelRequest's reason: 1 to 500
characters, no control characters). Replies: 202 with the order document (as
``GET /api/orders/{id}``) when the cancel is recorded, and when it is a no-op (a cancel
was recorded before, or the order is Compensated); 409 for an order that ended Processed
or in Error, with the reason; 503 (Retry-After: 1) when the order's row kept moving under
the cancel (try again); 404 for an unknown order; 400 for a bad id or body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime

from pydantic import ValidationError

from adapters.messaging import Nudger, Publisher
from adapters.store import OrderNotFound, StateStore
from api.orders import BadRequest, Reply, order_id_of, refused
from core import access
from core.models import CancelRequest, explain
from core.progress import status_document
from scheduler.cancellation import Busy, NotCancellable, cancel

#: A body larger than this is not a cancel request.
MAX_BODY_BYTES = 4_096


def reason_of(body: bytes | None) -> str | None:
    """The reason from an optional JSON body ``{"reason": "..."}``; BadRequest otherwise."""
    if not body or not body.strip():
        return None
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"the body is larger than {MAX_BODY_BYTES} bytes: send {{\"reason\": \"...\"}} or nothing")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest('the body is not JSON: send {"reason": "..."} or nothing') from None
    if not isinstance(document, dict):
        raise BadRequest('the body must be a JSON object: {"reason": "..."}')
    unknown = sorted(set(document) - {"reason"})
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}: the body takes only \"reason\"")
    try:
        # The route names the order; the model checks the reason as for a Service Bus message.
        return CancelRequest.model_validate({"order_id": "o", **document}).reason
    except ValidationError as error:
        raise BadRequest(explain(error)) from None


def caller(mode: access.ApiAuth, headers: Mapping[str, str]) -> str:
    """Who asked, as the cancel records it: the Easy Auth principal's name, else the API."""
    if mode is access.ApiAuth.EASYAUTH:
        return access.signed_in(mode, headers) or "an operator"
    return "the status API"


def cancel_order(
    order_id: str | None, body: bytes | None, *, by: str, store: StateStore, publisher: Publisher, nudger: Nudger,
    now: datetime,
) -> Reply:
    order_id = order_id_of(order_id)
    reason = reason_of(body)
    try:
        cancel(order_id, reason=reason, by=by, store=store, publisher=publisher, nudger=nudger, now=now)
    except OrderNotFound:
        return refused(404, "not_found", f"no order {order_id!r}")
    except Busy as error:
        return refused(503, "busy", str(error), **{"Retry-After": "1"})
    except NotCancellable as error:
        return refused(409, "conflict", str(error))
    record = store.read(order_id)
    return Reply(202, status_document(record.state, record.document, record.lines))
