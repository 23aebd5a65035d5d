"""An order's progress through its workflow, line by line, from the rows as read: what
``ordersctl status`` prints (and ``--json`` returns). Pure: no I/O."""

from __future__ import annotations

from core.models import Line, LineRecord, OrderState, ProcessState
from core.workflow import Kind, Workflow

#: A line that has not ended yet: waiting for the scheduler, or with its agent.
WAITING = "Waiting"
RUNNING = "Running"
#: An undo planned after the current one.
PLANNED = "Planned"
NOT_STARTED = "NotStarted"


class LineView(Line):
    """A line as an operator sees it: ended, running, waiting, planned or not started."""

    remote: str
    state: str


def progress(state: OrderState, workflow: Workflow, lines: tuple[LineRecord, ...] | list[LineRecord]) -> list[LineView]:
    """Every action of the workflow in order, then the compensations the order ran or
    plans, in the order they run."""
    ended = {(line.step_index, line.kind): line for line in sorted(lines, key=lambda line: line.updated_at)}
    current = None if state.process_state.terminal else (state.step_index, state.kind)

    def view(index: int, kind: Kind) -> LineView:
        step = workflow.steps[index]
        base = {"step": step.name, "kind": kind, "action": step.action_of(kind), "remote": step.remote}
        if (index, kind) == current:
            running = RUNNING if state.process_state is ProcessState.PROCESSING else WAITING
            return LineView(
                **base, state=running, attempt=state.attempt or None, failure_count=state.failure_count,
                last_error=state.last_error,
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
    undo = {i for i, kind in ended if kind is Kind.COMPENSATION} | set(state.plan)
    if current and current[1] is Kind.COMPENSATION:
        undo.add(current[0])
    views += [view(i, Kind.COMPENSATION) for i in sorted(undo, reverse=True)]
    return views
