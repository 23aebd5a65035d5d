"""The scheduler's two steps: claim a nudged order and send its agent request; record the
agent's response. Both are conditional on the state row's ETag."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

from core import lifecycle
from adapters.closing import close_order
from adapters.messaging import Publisher
from core.models import STEP, AgentRequest, AgentResponse, Nudge, OrderState, Status, StatusEvent, idempotency_key
from adapters.store import ConcurrencyConflict, OrderNotFound, StateStore

log = logging.getLogger(__name__)


def schedule(
    nudge: Nudge,
    *,
    store: StateStore,
    publisher: Publisher,
    instance: str,
    now: datetime,
    step_timeout: timedelta,
    requests_queue: str,
    responses_queue: str,
) -> AgentRequest | None:
    """Claim the order and send its agent request. None when there is nothing to do
    (the row is not Pending, or another instance won the claim)."""
    try:
        claimed = store.claim(nudge.order_id, instance, now, step_timeout, hint=nudge.state)
    except OrderNotFound:
        log.warning("nudge for unknown order %s dropped", nudge.order_id)
        return None
    if claimed is None:
        log.info("order %s not claimed by %s: not Pending or claimed elsewhere", nudge.order_id, instance)
        return None
    log.info("order %s attempt %s claimed by %s", claimed.order_id, claimed.attempt, instance)
    document = nudge.document if nudge.document is not None else store.get_order(nudge.order_id).document()
    request = AgentRequest(
        order_id=claimed.order_id,
        step=STEP,
        attempt=claimed.attempt,
        complete_by=claimed.complete_by,
        idempotency_key=idempotency_key(claimed.order_id, STEP),
        payload=json.loads(document),
        fence=claimed,
    )
    # A crash between the claim and this send leaves a Processing row whose deadline
    # passes: the supervisor resets it and the step runs again.
    publisher.send_agent_request(request, queue=requests_queue, reply_to=responses_queue, now=now)
    publisher.send_status(
        StatusEvent(order_id=claimed.order_id, status=Status.PROCESSING, time=now, attempt=claimed.attempt),
        queue=claimed.reply_to,
    )
    return request


def record(
    response: AgentResponse,
    *,
    store: StateStore,
    publisher: Publisher,
    now: datetime,
    alerts_queue: str,
) -> OrderState | None:
    """Apply an agent response if it is for the current attempt of a Processing row
    (fencing); a duplicate or stale response changes nothing and returns None."""
    current = response.fence
    if current is None or current.order_id != response.order_id or current.attempt != response.attempt:
        current = _read(store, response.order_id)
    while current is not None:
        new = lifecycle.complete(current, response, now)
        if new is None:
            log.info(
                "stale response for order %s attempt %s ignored (row: %s attempt %s)",
                response.order_id, response.attempt, current.process_state.value, current.attempt,
            )
            return None
        try:
            written = store.write(current, new)
        except ConcurrencyConflict:
            if current is not response.fence:
                return None  # moved under us after a fresh read: someone else decided
            current = _read(store, response.order_id)  # the fence was stale: decide on the row
            continue
        close_order(written, store=store, publisher=publisher, alerts_queue=alerts_queue, now=now)
        return written
    return None


def _read(store: StateStore, order_id: str) -> OrderState | None:
    try:
        return store.get(order_id)
    except OrderNotFound:
        log.warning("response for unknown order %s ignored", order_id)
        return None
