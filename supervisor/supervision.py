"""One sweep of the supervisor, and the operator's resubmit."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from adapters import clients, search, telemetry
from core import lifecycle, liveness, names
from adapters.closing import close_order
from core.lifecycle import SupervisorPolicy, Verdict
from core.workflow import shortest_timeout
from adapters.messaging import Nudger, Publisher
from core.models import Nudge, OrderState, Status, StatusEvent
from adapters.settings import Settings
from adapters.store import ConcurrencyConflict, StateStore

log = logging.getLogger(__name__)


def policy_from(settings: Settings) -> SupervisorPolicy:
    return SupervisorPolicy(
        max_failures=settings.max_failures,
        step_timeout=settings.step_timeout,
        pending_timeout=settings.pending_timeout,
        backoff_base=timedelta(seconds=settings.retry_backoff_base_seconds),
        backoff_cap=timedelta(seconds=settings.retry_backoff_max_seconds),
        response_grace=settings.response_grace,
        send_slack=timedelta(seconds=clients.servicebus_retry_seconds()),
        shortest_timeout=timedelta(seconds=shortest_timeout(settings.step_defaults())),
    )


def liveness_timing(settings: Settings) -> liveness.Timing:
    """The settings the liveness bound depends on besides each step's policy
    (core/liveness.py; docs/workflows.md, "How long an order can take"); the breaker's
    jitter is the agents' (agents/breaker.py, BreakerOptions.jitter)."""
    return liveness.Timing(
        supervisor_interval=liveness.supervisor_interval(settings.supervisor_schedule),
        pending_timeout=settings.pending_timeout,
        backoff_base=timedelta(seconds=settings.retry_backoff_base_seconds),
        backoff_cap=timedelta(seconds=settings.retry_backoff_max_seconds),
        breaker_open=timedelta(seconds=settings.breaker_open_seconds),
        response_grace=settings.response_grace,
    )


def sweep(
    *,
    store: StateStore,
    publisher: Publisher,
    nudger: Nudger,
    policy: SupervisorPolicy,
    now: datetime,
    alerts_queue: str,
    responses_since: Callable[[], datetime | None] | None = None,
) -> Counter[str]:
    """Act on every expired in-flight order once. Returns what was done, by verdict.

    ``responses_since``: when the oldest message still on the responses queue was enqueued
    (``now`` if none; None if unknown), asked at most once a sweep, and only when an
    attempt's answer may still be on its way (``lifecycle.awaiting_answer``)."""
    done: Counter[str] = Counter()
    # An order indexed less than this long ago cannot have passed any deadline yet.
    youngest = min(policy.shortest_timeout or policy.step_timeout, policy.pending_timeout)
    backlog: list[datetime | None] = []
    for state in store.sweep(now, younger_than_cannot_expire=youngest):
        in_grace = lifecycle.in_grace(state, now, policy)
        if in_grace and not backlog and responses_since is not None:
            backlog.append(responses_since())
        decision = lifecycle.supervise(state, now, policy, backlog[0] if backlog else None)
        if decision.verdict is Verdict.NONE:
            continue
        if decision.verdict is Verdict.DROP_INDEX:
            # Terminal but still indexed: the finishing step died half-way. Give the
            # scheduler time to finish it itself before repeating its notifications.
            if now - state.updated_at > policy.step_timeout:
                # The sweep read the row a while ago: heal only the order as it still is, and
                # drop only the index row read here (an operator's resubmit since writes a new
                # one, then moves the row: that order is in flight again and keeps its row).
                index_etag = store.index_etag(state.order_id)
                current = store.get(state.order_id) if index_etag is not None else None
                if current is None or current.etag != state.etag:
                    continue
                heal = f"{names.SPAN_SUPERVISOR_PREFIX}heal"
                with telemetry.continue_order(heal, state.trace_parent, **_where(state)):
                    close_order(
                        current, store=store, publisher=publisher, alerts_queue=alerts_queue, now=now,
                        index_etag=index_etag,
                    )
                done["healed"] += 1
            continue
        # Each action joins the order's own trace (its TraceParent), so the retry it leads to does too.
        with telemetry.continue_order(
            f"{names.SPAN_SUPERVISOR_PREFIX}{decision.verdict.value}", state.trace_parent, **_where(state)
        ):
            done[_act(state, decision, store=store, publisher=publisher, nudger=nudger, policy=policy, now=now)] += 1
    if done:
        log.info("supervisor sweep: %s", dict(done))
    return done


def _where(state: OrderState) -> dict:
    return {"order_id": state.order_id, "step": state.step, "kind": state.kind, "attempt": state.attempt}


def _act(
    state: OrderState, decision: lifecycle.Decision, *, store: StateStore, publisher: Publisher, nudger: Nudger,
    policy: SupervisorPolicy, now: datetime,
) -> str:
    """Write the supervisor's verdict on one expired order and hand it back to the
    scheduler; what was done ("lost_race" when someone moved the row first). The write
    reads the order's partition first (:meth:`StateStore.transition`: one query per
    verdict, not per row swept), so it deletes the first-claim seal of an order never
    written over since its submission."""
    written = store.transition(state, decision.next_state)
    if written is None:
        telemetry.annotate(outcome="lost_race")
        return "lost_race"  # another supervisor (or the scheduler) moved it first
    telemetry.annotate(outcome=decision.verdict)
    for step, verdict in decision.missed:
        # A Processing line whose complete-by passed: a missed deadline.
        telemetry.deadline_missed(step, state.kind, verdict)
    # Every verdict hands the row back to the scheduler; what giving up means for
    # the order (undo it, or go on undoing) is the scheduler's to decide.
    for delay in (decision.nudge_delay, *decision.more_nudges):
        nudger.nudge(Nudge(order_id=written.order_id, state=written), delay=delay)
    if written.group:
        _group_acted(state, written, decision, publisher, now)
    elif decision.verdict is Verdict.GIVE_UP:
        log.warning("order %s: gave up on %s %s: %s", written.order_id, written.kind.value, written.step, written.last_error)
    elif decision.verdict is Verdict.RETRY:
        log.warning(
            "order %s reset for retry %s/%s of %s %s in %.0f s: %s",
            written.order_id, written.failure_count, written.max_failures or policy.max_failures,
            written.kind.value, written.step, decision.nudge_delay.total_seconds(), written.last_error,
        )
        publisher.send_status(
            StatusEvent(
                order_id=written.order_id, status=Status.RETRYING, time=now, step=written.step,
                detail=written.last_error, attempt=written.attempt,
            ),
            queue=written.reply_to,
        )
    return decision.verdict.value


def _group_acted(
    before: OrderState, written: OrderState, decision: lifecycle.Decision, publisher: Publisher, now: datetime
) -> None:
    """The log lines and status events of a verdict on the lines of a group: one per line acted on."""
    missed = dict(decision.missed)
    for old, line in zip(before.group, written.group):
        verdict = missed.get(line.step)
        if line == old or verdict is None:
            continue
        if verdict is Verdict.GIVE_UP:
            log.warning("order %s: gave up on action %s: %s", written.order_id, line.step, line.last_error)
            continue
        log.warning("order %s reset for retry %s/%s of action %s: %s", written.order_id, line.failure_count,
                    line.max_failures, line.step, line.last_error)
        publisher.send_status(
            StatusEvent(order_id=written.order_id, status=Status.RETRYING, time=now, step=line.step,
                        detail=line.last_error, attempt=line.attempt),
            queue=written.reply_to,
        )


class NotResubmittable(Exception):
    """Only an order in Error can be resubmitted."""


def resubmit(
    order_id: str, *, store: StateStore, nudger: Nudger, now: datetime, pending_timeout: timedelta,
    expected: Callable[[OrderState], bool] | None = None,
) -> OrderState:
    """Operator: Error -> Pending where the order stopped (the stopped step, or the undos
    that failed), failure count cleared, nudged. The next claim takes a new attempt
    number (fencing out any late response of the failed attempts), and the remote
    service sees the same idempotency keys, so work it already did is not redone.

    ``expected``: the Error the caller means (a bulk resubmit's: the one its group's row
    records); any other, as read here, is not resubmitted (:class:`NotResubmittable`)."""
    record = store.read(order_id)  # the partition: the write deletes a first-claim seal still there
    state = record.state
    with telemetry.continue_order(names.SPAN_RESUBMIT, state.trace_parent, **_where(state)):
        new = lifecycle.resubmit(state, now, pending_timeout)
        if new is None:
            raise NotResubmittable(f"order {order_id} is {state.process_state.value}, not Error: nothing to resubmit")
        if expected is not None and not expected(state):
            raise NotResubmittable(f"order {order_id} is in another Error than the one meant: look again")
        store.reindex(order_id, now)  # back in the supervisor's view before it leaves Error
        try:
            written = store.write_over(record, new).state
        except ConcurrencyConflict:
            raise NotResubmittable(f"order {order_id} changed while resubmitting; look again") from None
        nudger.nudge(Nudge(order_id=order_id, state=written))
        search.unindex_error(store, state)  # out of its cause's group (that Error's row only)
        return written
