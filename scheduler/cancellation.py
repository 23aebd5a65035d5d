"""Cancel an order: record the request on its state row (one If-Match write), tell the
submitter (``cancelling``) and nudge the scheduler, which undoes the order once the line
in flight has settled (core/lifecycle.py: :func:`~core.lifecycle.request_cancel`,
:func:`~core.lifecycle.claim`, :func:`~core.lifecycle.complete`).

One entry for every way in: ``POST /api/orders/{id}/cancel`` (api/cancel.py),
``ordersctl cancel`` and a message on the ``order-cancellations`` queue
(:func:`cancel_message`, bound in scheduler/blueprint.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from adapters import telemetry
from adapters.messaging import Nudger, Publisher
from adapters.store import ConcurrencyConflict, OrderNotFound, RejectionStore, StateStore
from core import lifecycle, names
from core.lifecycle import CancelVerdict
from core.models import CancelRequest, Nudge, OrderState, ProcessState, Status, StatusEvent, explain
from core.workflow import UnknownWorkflow, Workflow, workflow
from scheduler.submission import JSON_CONTENT_TYPE, _claimed_order_id, _content_type_ok, _shown, _text

log = logging.getLogger(__name__)

#: Writes tried when others keep moving the row between our read and our write (each
#: loser re-reads and decides again on the new row: a 412 is never written over).
MAX_TRIES = 5


class NotCancellable(Exception):
    """The order ended Processed or in Error: there is nothing to cancel (HTTP 409)."""


class Busy(NotCancellable):
    """The order's row kept moving under the cancel (others' writes won every try): not
    refused, to be tried again (HTTP 503; a cancel message is left to Service Bus to deliver
    again)."""


@dataclass(frozen=True)
class Cancelled:
    #: RECORDED now, or ALREADY (a cancel was recorded before, or the order is Compensated).
    verdict: CancelVerdict
    state: OrderState
    reason: str | None = None


def cancel(
    order_id: str, *, reason: str | None, by: str | None, store: StateStore, publisher: Publisher, nudger: Nudger,
    now: datetime,
) -> Cancelled:
    """Record a cancel on ``order_id``. Raises :class:`OrderNotFound`, or
    :class:`NotCancellable` for an order that ended Processed or in Error.

    The order's partition is read (one query), not its state row alone: a cancel of an
    order never claimed is the first write over it, and deletes its first-claim seal in the
    same transaction (:meth:`StateStore.write_over`), so no nudge can first-claim it after."""
    record = store.read(order_id)
    state = record.state
    with telemetry.continue_order(
        names.SPAN_CANCEL, state.trace_parent, order_id=order_id, step=state.step, kind=state.kind,
        attempt=state.attempt,
    ):
        for _ in range(MAX_TRIES):
            decision = lifecycle.request_cancel(state, now, reason, by, _definition(state))
            if decision.verdict is CancelVerdict.REFUSED:
                telemetry.annotate(outcome="refused")
                raise NotCancellable(decision.reason)
            if decision.verdict is CancelVerdict.ALREADY:
                telemetry.annotate(outcome="already")
                return Cancelled(CancelVerdict.ALREADY, state, decision.reason)
            try:
                written = store.write_over(record, decision.next_state).state
            except ConcurrencyConflict:
                record = store.read(order_id)  # someone moved the row: decide again on it
                state = record.state
                continue
            telemetry.annotate(outcome="recorded")
            log.warning("order %s: %s", order_id, lifecycle.cancel_cause(written))
            publisher.send_status(
                StatusEvent(
                    order_id=order_id, status=Status.CANCELLING, time=now, step=written.step,
                    detail=lifecycle.cancel_cause(written), attempt=written.attempt,
                ),
                queue=written.reply_to,
            )
            if written.process_state is ProcessState.PENDING:
                # It may wait for a delayed nudge (a backoff, a postponement): act now.
                nudger.nudge(Nudge(order_id=order_id, state=written))
            return Cancelled(CancelVerdict.RECORDED, written)
        raise Busy(f"order {order_id} kept changing while cancelling; try again")


def _definition(state: OrderState) -> Workflow | None:
    try:
        return workflow(state.workflow, state.workflow_version)
    except UnknownWorkflow:
        return None  # the scheduler ends such an order in Error; the cancel is recorded all the same


@dataclass(frozen=True)
class MessageOutcome:
    #: "recorded", "already", or "rejected" (kept in the rejections table with the reason).
    result: str
    order_id: str | None = None
    reason: str | None = None


def cancel_message(
    body: bytes, *, message_id: object, content_type: object, store: StateStore, rejections: RejectionStore,
    publisher: Publisher, nudger: Nudger, now: datetime,
) -> MessageOutcome:
    """A message on the ``order-cancellations`` queue, by the rule of the orders queue
    (scheduler/submission.py): a message that cannot be acted on (not JSON, not a
    :class:`CancelRequest`, an unknown order, an order that ended Processed or in Error)
    is kept whole with its reason in the rejections table (source ``order-cancellations``)
    and completes: never retried in a loop, nothing lost. Only a failure of storage, or
    an order whose row kept moving under the cancel (:class:`Busy`), raises, so Service
    Bus delivers the message again."""
    message_id, content_type = _text(message_id), _text(content_type)

    def reject(reason: str, order_id: str | None = None) -> MessageOutcome:
        rejections.add(
            body=body, reason=reason, now=now, message_id=message_id, content_type=content_type, order_id=order_id,
            source=names.CANCELLATIONS_QUEUE,
        )
        log.warning("cancel message %s rejected: %s", (message_id or "")[:100], reason)
        return MessageOutcome("rejected", order_id, reason)

    if not _content_type_ok(content_type):
        return reject(f"unsupported content type {_shown(content_type)!r}: send the request as {JSON_CONTENT_TYPE}")
    try:
        request = CancelRequest.model_validate_json(body)
    except ValidationError as error:
        return reject(f"invalid cancel request: {explain(error)}", _claimed_order_id(body))
    except ValueError as error:
        return reject(f"malformed cancel request: {error}")
    try:
        done = cancel(
            request.order_id, reason=request.reason, by="a Service Bus message", store=store, publisher=publisher,
            nudger=nudger, now=now,
        )
    except OrderNotFound:
        return reject(f"no order {request.order_id!r}", request.order_id)
    except Busy:
        raise  # not refused: Service Bus delivers it again
    except NotCancellable as error:
        return reject(str(error), request.order_id)
    return MessageOutcome(done.verdict.value, request.order_id, done.reason)

