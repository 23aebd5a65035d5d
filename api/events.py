"""``POST /api/orders/{id}/events/{name}``: an external event for an order's waiting step
(an approval), as a plain function of its inputs (api/blueprint.py binds it).

Body ``{"approved": true|false, "by": "...", "note": "..."}`` (core.models.EventBody); with
App Service Authentication the signed-in caller's name is recorded as ``by``, whatever the
body says (the audit trail names who approved, as a cancel does).
202 with the order document when the event is accepted, or when it is a duplicate of
the event that already ended the line (nothing changes); 409 when no line waits for
it (nothing changes); 404 for an unknown order; 400 for a bad id, event name or body;
503 when the order's row kept moving under the event (try again). scheduler/events.py
decides and writes.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import TypeAdapter, ValidationError

from api.orders import BadRequest, Reply, order_id_of, refused
from core.models import EventBody, EventName, explain
from core.progress import status_document
from core.workflow import events
from scheduler.dispatch import Scheduler
from scheduler.events import Busy, Outcome, deliver

_EVENT_NAME = TypeAdapter(EventName)


def event_name_of(value: str | None) -> str:
    try:
        return _EVENT_NAME.validate_python(value)
    except ValidationError:
        raise BadRequest(f"{str(value)[:60]!r} is not an event a workflow waits for (known: {', '.join(events())})") from None


def event_body_of(body: bytes) -> EventBody:
    try:
        return EventBody.model_validate_json(body or b"")
    except ValidationError as error:
        raise BadRequest(
            f'invalid event: {explain(error)}; send {{"approved": true|false, "by": "...", "note": "..."}}'
        ) from None
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON: send {\"approved\": true|false, \"by\": \"...\", \"note\": \"...\"}") from None


def post_event(
    order_id: str | None, name: str | None, body: bytes, *, scheduler: Scheduler, now: datetime,
    signed_in: str | None = None,
) -> Reply:
    """``signed_in``: the caller's name as App Service Authentication gives it (None without it)."""
    order_id, name, event = order_id_of(order_id), event_name_of(name), event_body_of(body)
    if signed_in:
        event = event.model_copy(update={"by": signed_in[:200]})
    try:
        delivered = deliver(order_id, name, event, scheduler=scheduler, now=now)
    except Busy as error:
        return refused(503, "busy", str(error), **{"Retry-After": "1"})
    if delivered.outcome is Outcome.UNKNOWN_ORDER:
        return refused(404, "not_found", f"no order {order_id!r}")
    if delivered.outcome is Outcome.NOT_WAITING:
        return refused(409, "conflict", delivered.reason or f"no step of order {order_id!r} waits for {name}")
    record = delivered.record
    return Reply(202, status_document(record.state, record.document, record.lines))
