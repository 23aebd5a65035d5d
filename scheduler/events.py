"""External events for waiting steps (an approval): from the API
(``POST /api/orders/{id}/events/{name}``, api/events.py) or from any Service Bus client
(a message on ``order-events``, :func:`receive_message`).

The decision is :func:`core.lifecycle.receive_event`'s, on the order's rows as read; the
write that ends the waiting line is If-Match on that read, as the supervisor's expiry of
the same line is, so an event racing the deadline either wins or finds the line no
longer waiting: exactly one of the two is written. A 412 means someone else moved the
row: decide again on the new row.

Replies (docs/clients.md, "Sending order events"): accepted (the line ended with this event);
a duplicate (the same event, name and body, already ended its line: nothing changes,
and the API answers 202 with the order as it is, like an accepted event, so a client
may resend safely); not waiting (no line waits for it: nothing changes; the API answers
409, a message is kept in the rejections table with the reason); unknown order (404,
or a rejection).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from pydantic import ValidationError

from adapters import telemetry
from adapters.store import ConcurrencyConflict, OrderNotFound, OrderRecord, RejectionStore
from core import lifecycle, names
from core.lifecycle import EventVerdict
from core.models import EventBody, OrderEvent, explain
from core.workflow import UnknownWorkflow, workflow
from scheduler.dispatch import Scheduler, carry_out, write_transition
from scheduler.submission import JSON_CONTENT_TYPE, _content_type_ok, _shown, _text

log = logging.getLogger(__name__)

#: Decisions in a row that lose the race for the row before giving up (each loss means
#: the row moved: a line ended or began; an order has only a few such moves).
MAX_RACES = 8


class Outcome(str, Enum):
    ACCEPTED = EventVerdict.ACCEPTED.value
    DUPLICATE = EventVerdict.DUPLICATE.value
    NOT_WAITING = EventVerdict.NOT_WAITING.value
    UNKNOWN_ORDER = "unknown_order"
    #: The message was not a valid event (kept in the rejections table).
    INVALID = "invalid"


@dataclass(frozen=True)
class Delivered:
    outcome: Outcome
    #: The order's rows after the event (None for an unknown order or an invalid message).
    record: OrderRecord | None = None
    reason: str | None = None


class Busy(RuntimeError):
    """The order's row kept moving under the event: try again (a transient failure)."""


def deliver(order_id: str, name: str, body: EventBody, *, scheduler: Scheduler, now: datetime) -> Delivered:
    """Decide on the event for ``order_id`` and write it if accepted; then carry out what
    the write began (the next step's agent request, the undo of the earlier steps, or
    the order's close). Each decision is a span ``order.event`` in the order's trace."""
    result = body.result()
    for _ in range(MAX_RACES):
        try:
            read = scheduler.store.read(order_id)
        except OrderNotFound:
            return Delivered(Outcome.UNKNOWN_ORDER, reason=f"no order {order_id!r}")
        with telemetry.continue_order(
            names.SPAN_EVENT, read.state.trace_parent, order_id=order_id, step=read.state.step,
            attempt=read.state.attempt,
        ) as span:
            delivered = _decide(read, name, body, result, scheduler=scheduler, now=now)
            span.set_attribute(names.ATTR_OUTCOME, delivered.outcome.value if delivered else "raced")
        if delivered is not None:
            return delivered
    raise Busy(f"order {order_id!r} moved {MAX_RACES} times while deciding on event {name}: try again")


def _decide(
    read: OrderRecord, name: str, body: EventBody, result: dict, *, scheduler: Scheduler, now: datetime
) -> Delivered | None:
    """One decision on the rows as read, and its write; None when the write lost the race."""
    order_id = read.state.order_id
    try:
        definition = workflow(read.state.workflow, read.state.workflow_version)
    except UnknownWorkflow as error:
        return Delivered(Outcome.NOT_WAITING, read, f"no step waits for {name}: {error}")
    decision = lifecycle.receive_event(
        read.state, read.lines, definition, name, result, scheduler.instance, now, scheduler.defaults
    )
    if decision.verdict is not EventVerdict.ACCEPTED:
        log.info("order %s: event %s %s: %s", order_id, name, decision.verdict.value, decision.reason or "")
        return Delivered(Outcome(decision.verdict.value), read, decision.reason)
    transition = decision.transition
    try:
        written = write_transition(scheduler, read, transition, now)
    except ConcurrencyConflict:
        return None  # the row moved (the deadline's give-up, a duplicate delivery): decide again
    except OrderNotFound:
        return Delivered(Outcome.UNKNOWN_ORDER, reason=f"no order {order_id!r}")
    log.info("order %s: %s %s by %s", order_id, name, "approved" if body.approved else "rejected", body.by)
    results = read.results()
    if body.approved:
        results[read.state.step or ""] = result
    carry_out(scheduler, written.state, transition, json.loads(read.document), results, now)
    return Delivered(Outcome.ACCEPTED, written)


def receive_message(
    body: bytes, *, message_id: object, content_type: object, scheduler: Scheduler, rejections: RejectionStore,
    now: datetime,
) -> Delivered:
    """An ``order-events`` message from any client. As for orders, nothing is lost and
    nothing loops: an invalid message, or an event no line waits for, is kept whole in
    the rejections table with the reason (source ``order-events``) and completed; only a
    failure to read or write (storage down, :class:`Busy`) raises, so Service Bus
    delivers the message again."""
    message_id, content_type = _text(message_id), _text(content_type)

    def reject(outcome: Outcome, reason: str, order_id: str | None = None, record: OrderRecord | None = None):
        rejections.add(
            body=body, reason=reason, now=now, message_id=message_id, content_type=content_type, order_id=order_id,
            source=names.ORDER_EVENTS_QUEUE,
        )
        log.warning("order event %s refused: %s", _shown(message_id), reason)
        return Delivered(outcome, record, reason)

    if not _content_type_ok(content_type):
        return reject(Outcome.INVALID, f"unsupported content type {_shown(content_type)!r}: send {JSON_CONTENT_TYPE}")
    try:
        event = OrderEvent.model_validate_json(body)
    except ValidationError as error:
        return reject(Outcome.INVALID, f"invalid order event: {explain(error)}")
    except (ValueError, RecursionError) as error:
        return reject(Outcome.INVALID, f"malformed order event: {str(error)[:500]}")
    delivered = deliver(event.order_id, event.name, event.body(), scheduler=scheduler, now=now)
    if delivered.outcome in (Outcome.NOT_WAITING, Outcome.UNKNOWN_ORDER):
        return reject(delivered.outcome, delivered.reason or delivered.outcome.value, event.order_id, delivered.record)
    return delivered
