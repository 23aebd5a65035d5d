"""An order's progress through its workflow, line by line, from the rows as read: what
``ordersctl status`` prints, and the order document that ``ordersctl status --json`` and
the status API (``GET /api/orders/{id}``) return. Pure: no I/O."""

from __future__ import annotations

import json
from typing import Any

from core.lifecycle import waiting_for
from core.models import Line, LineRecord, LineRun, OrderState, ProcessState
from core.workflow import Kind, UnknownWorkflow, Workflow, workflow

#: A line that has not ended yet: waiting for the scheduler, or with its agent.
WAITING = "Waiting"
RUNNING = "Running"
#: A waiting step's line (core/workflow.py ``Step.wait_for``) claimed: waiting for its event.
WAITING_FOR_EVENT = "WaitingForEvent"
#: An undo planned after the current one.
PLANNED = "Planned"
NOT_STARTED = "NotStarted"


class LineView(Line):
    """A line as an operator sees it: ended, running, waiting, planned or not started."""

    remote: str
    state: str
    #: A waiting step's event (its line calls no remote).
    wait_for: str | None = None


def progress(state: OrderState, workflow: Workflow, lines: tuple[LineRecord, ...] | list[LineRecord]) -> list[LineView]:
    """Every action of the workflow in order, then the compensations the order ran or
    plans, in the order they run."""
    ended = {(line.step_index, line.kind): line for line in sorted(lines, key=lambda line: line.updated_at)}
    current = _current(state)

    def view(index: int, kind: Kind) -> LineView:
        step = workflow.steps[index]
        base = {"step": step.name, "kind": kind, "action": step.action_of(kind), "remote": step.remote,
                "wait_for": step.wait_for}
        if (index, kind) in current:
            processing, attempt, failure_count, last_error = current[(index, kind)]
            running = RUNNING if processing else WAITING
            if running == RUNNING and step.waiting:
                running = WAITING_FOR_EVENT
            return LineView(
                **base, state=running, attempt=attempt or None, failure_count=failure_count, last_error=last_error,
            )
        if (index, kind) in ended:
            line = ended[(index, kind)]
            return LineView(
                **base, state=line.state.value, attempt=line.attempt, failure_count=line.failure_count,
                last_error=line.last_error, result=line.result,
            )
        if kind is Kind.COMPENSATION and index in state.plan and not state.process_state.terminal:
            return LineView(**base, state=PLANNED)
        return LineView(**base, state=NOT_STARTED)

    views = [view(i, Kind.ACTION) for i in range(len(workflow.steps))]
    undo = {i for i, kind in (*ended, *current) if kind is Kind.COMPENSATION} | set(state.plan)
    views += [view(i, Kind.COMPENSATION) for i in sorted(undo, reverse=True)]
    return views


def _current(state: OrderState) -> dict[tuple[int, Kind], tuple[bool, int, int, str | None]]:
    """The lines that have not ended, by (step index, kind): whether each is with its agent
    (Processing), its attempt, failures and last error. The row's one line; or, while a group
    is in flight, each open line of it."""
    if state.process_state.terminal:
        return {}
    if state.group:
        return {
            (line.step_index, Kind.ACTION): (
                line.state is LineRun.PROCESSING, line.attempt, line.failure_count, line.last_error,
            )
            for line in state.group if line.state.open
        }
    processing = state.process_state is ProcessState.PROCESSING
    return {(state.step_index, state.kind): (processing, state.attempt, state.failure_count, state.last_error)}


def steps_of(state: OrderState, lines: tuple[LineRecord, ...] | list[LineRecord]) -> list[dict[str, Any]]:
    """Every line of the order as JSON-ready dicts; one ``{"error": ...}`` entry when the
    order's workflow definition is not known to this version of the app."""
    try:
        definition = workflow(state.workflow, state.workflow_version)
    except UnknownWorkflow as error:
        return [{"error": str(error)}]
    return [line.model_dump(mode="json") for line in progress(state, definition, lines)]


def waiting(state: OrderState) -> dict[str, Any] | None:
    """``{"event": ..., "until": ...}`` while the order's current line waits for an external
    event (``POST /api/orders/{id}/events/{event}``), else None."""
    try:
        definition = workflow(state.workflow, state.workflow_version)
    except UnknownWorkflow:
        return None
    event = waiting_for(state, definition)
    return None if event is None else {"event": event, "step": state.step, "until": state.complete_by.isoformat()}


def order_summary(state: OrderState) -> dict[str, Any]:
    """Where an order stands, in one JSON-ready dict (a row of ``GET /api/orders?state=``)."""
    return {
        "order_id": state.order_id,
        "state": state.process_state.value,
        "step": state.step,
        "kind": state.kind.value,
        "attempt": state.attempt,
        "failure_count": state.failure_count,
        "last_error": state.last_error,
        "complete_by": state.complete_by.isoformat(),
        "created_at": state.created_at.isoformat(),
        "updated_at": state.updated_at.isoformat(),
    }


def status_document(
    state: OrderState, document: str, lines: tuple[LineRecord, ...] | list[LineRecord]
) -> dict[str, Any]:
    """The order with its steps: ``ordersctl status --json`` and ``GET /api/orders/{id}``.

    ``document`` is the order as stored (its JSON text); ``lines`` the rows of the lines
    that ended."""
    return {
        "order_id": state.order_id,
        "state": state.process_state.value,
        "workflow": state.workflow,
        "workflow_version": state.workflow_version,
        "step": state.step,
        "kind": state.kind.value,
        "attempt": state.attempt,
        "failure_count": state.failure_count,
        "locked_by": state.locked_by,
        "complete_by": state.complete_by.isoformat(),
        "last_error": state.last_error,
        "cause": state.cause,
        "waiting": waiting(state),
        "cancel": None if state.cancel_requested_at is None else {
            "requested_at": state.cancel_requested_at.isoformat(),
            "reason": state.cancel_reason,
            "by": state.cancelled_by,
        },
        "reply_to": state.reply_to,
        "note": state.note,
        "created_at": state.created_at.isoformat(),
        "updated_at": state.updated_at.isoformat(),
        "order": json.loads(document),
        "steps": steps_of(state, lines),
    }
