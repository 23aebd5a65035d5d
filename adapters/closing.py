"""What happens once an order is terminal: tell the submitter, alert on Error, index it by
the day it ended (adapters/finished.py, for retention), leave the active index.

Called by the scheduler right after the terminal write, and by the supervisor for a
terminal row still in the active index (a crash between the write and this step).
Notifications are therefore at least once; their message ids are stable, so the
alerts queue's duplicate detection drops a repeat.
"""

from __future__ import annotations

import logging
from datetime import datetime

from adapters import search, telemetry, traces
from adapters.finished import record_finished
from adapters.messaging import Publisher, ended_key
from adapters.store import StateStore
from core import names
from core.models import Alert, OrderState, ProcessState, Status, StatusEvent
from core.workflow import UnknownWorkflow, workflow

log = logging.getLogger(__name__)

_STATUS = {
    ProcessState.PROCESSED: Status.PROCESSED,
    ProcessState.COMPENSATED: Status.COMPENSATED,
    ProcessState.ERROR: Status.FAILED,
}


def close_order(
    state: OrderState, *, store: StateStore, publisher: Publisher, alerts_queue: str, now: datetime,
    index_etag: str | None = None,
) -> None:
    """Close a terminal order: its status event (and alert), its indexes, then its active
    row, If-Match on ``index_etag`` when given (the supervisor's heal: a row written since,
    by an operator's resubmit, stays)."""
    with telemetry.span(
        names.SPAN_CLOSE, order_id=state.order_id, step=state.step, kind=state.kind, attempt=state.attempt,
        state=state.process_state,
    ):
        if state.process_state is ProcessState.ERROR:
            telemetry.error(state.last_error or "the order ended in Error")
        _close(state, store=store, publisher=publisher, alerts_queue=alerts_queue, now=now, index_etag=index_etag)
    telemetry.order_closed(state.process_state)


def failure_record(state: OrderState, failed: list[str]) -> str:
    """The one line an order that ended Compensated or in Error always leaves in Application Insights,
    whatever the trace sampling kept (docs/observability.md, "What is kept of a failed order"): its end,
    why, what could not be undone, and its trace id, to find its spans when they were kept."""
    undone = f"; could not undo {', '.join(failed)}" if failed else ""
    return (f"order {state.order_id} ended {state.process_state.value} at {state.step} "
            f"(attempt {state.attempt}): {state.cause or state.last_error or 'no cause recorded'}{undone}; "
            f"last error: {state.last_error or '-'}; trace {traces.trace_id_of(state.trace_parent) or '-'}")


def _close(
    state: OrderState, *, store: StateStore, publisher: Publisher, alerts_queue: str, now: datetime,
    index_etag: str | None,
) -> None:
    if state.process_state is ProcessState.COMPENSATED:
        # A warning: host.json keeps the app's warnings and errors (Function: Warning) and never samples
        # them (excludedTypes: Trace), so every failed order is explained after the fact.
        log.warning("%s", failure_record(state, []), extra={"order_id": state.order_id})
    if state.process_state is ProcessState.ERROR:
        try:
            definition = workflow(state.workflow, state.workflow_version)
            failed = [definition.steps[i].name for i in state.failed]
        except (UnknownWorkflow, IndexError):
            failed = [str(i) for i in state.failed]
        alert = Alert(
            order_id=state.order_id,
            failure_count=state.failure_count,
            last_error=state.last_error,
            time=now,
            reason=(
                f"could not undo step(s) {', '.join(failed)}: the order needs an operator"
                if failed
                else f"step {state.step} could not be completed and cannot be undone: the order needs an operator"
            ),
            step=state.step,
            failed_compensations=failed,
        )
        log.error(
            "%s", failure_record(state, failed),
            extra={"order_id": state.order_id, "failure_count": state.failure_count, "attempt": state.attempt},
        )
        # The alert must not be lost: a failed send raises, the index row stays,
        # and the supervisor closes the order again.
        publisher.send_alert(alert, queue=alerts_queue, attempt=state.attempt, ended=state.updated_at)
    publisher.send_status(
        StatusEvent(
            order_id=state.order_id, status=_STATUS[state.process_state], time=now, detail=state.last_error,
            attempt=state.attempt,
        ),
        queue=state.reply_to,
        key=ended_key(state.updated_at),  # the same end sent again has the same id; a later end at this attempt not
    )
    search.index_error(store, state)  # before the active row goes: a crash leaves that row, the sweep redoes this
    record_finished(state, store=store)  # before the active row goes: a crash between, the sweep heals
    store.unindex(state.order_id, index_etag)
