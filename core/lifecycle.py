"""Lifecycle decisions as pure functions: no I/O, no ``azure.*`` import.

Each function takes the state row as read (with its ETag) and returns what to write
(:class:`Transition`: the new state row, the step rows that end with it, and the line
to hand to an agent), or ``None`` when nothing applies. The store writes a transition
with If-Match on the ETag that came with the input, in one entity-group transaction,
so a decision made on a row that someone else has moved since is never written.

The scheduler's decisions (:func:`claim`, :func:`complete`) know the workflow; the
supervisor's (:func:`supervise`) know only deadlines and failure counts::

    Pending ─claim─► Processing(step k) ─done─► Processing(step k+1) … ─done─► Processed
                         │  refused: undo steps < k ──────────────┐
                         │  supervisor gave up: undo steps ≤ k ───┤ (k cannot be undone: Error)
                         ▼                                         ▼
                  expired, failures < max:           Processing(undo j) ─done/failed─► undo j-1 …
                  Pending, nudged after a backoff        └─► Compensated, or Error if an undo failed

A waiting step (``Step(wait_for=...)``) is claimed like any line but sends no request:
its event ends it (:func:`receive_event`: approved is done, rejected is refused), or its
deadline does (one attempt: the supervisor's expiry is a give-up, and :func:`give_up`
undoes the steps before it). An undo skips waiting steps: nothing was done there.

A cancel (:func:`request_cancel`) is recorded on the row and changes no line: the line in
flight settles first (its response, or its deadline through the supervisor), and where the
scheduler would start the next action it starts the undos instead (:func:`complete`,
:func:`claim`), of every step that was applied or whose outcome is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from core.models import AgentResponse, GroupLine, LineRecord, LineRun, LineState, OrderState, Outcome, ProcessState
from core.workflow import Kind, Step, StepPolicy, UnknownWorkflow, Workflow, workflow

#: LastError is a Table string property: keep it far below the 64 KiB limit.
MAX_ERROR_CHARS = 2_000
#: A group's line keeps a shorter one: every line of the group shares the row's ``Group``
#: property (core/workflow.py ``MAX_GROUP``).
MAX_LINE_ERROR_CHARS = 1_000
#: How early a nudge may come for a line of a group and still claim it: the clocks of the
#: supervisor that nudged (its sweep's time) and of the scheduler that takes the nudge differ
#: a little. A lone line is claimed on any nudge; a group's is claimed once due, so that a
#: nudge for one line does not cut another's backoff short.
EARLY_NUDGE = timedelta(seconds=2)


def _error(text: str | None) -> str | None:
    return None if text is None else text[:MAX_ERROR_CHARS]


def _line_error(text: str | None) -> str | None:
    return None if text is None else text[:MAX_LINE_ERROR_CHARS]


@dataclass(frozen=True)
class Transition:
    """What the scheduler writes, in one transaction, and then does."""

    state: OrderState
    #: Step rows that end with this transition.
    lines: tuple[LineRecord, ...] = ()
    #: For a line sent back to Pending: when the scheduler should be nudged again.
    nudge_delay: timedelta | None = None
    #: In a group (``state.group``): the step indexes of the lines this write claimed, each
    #: to go to its agent (the others are in flight already, or waiting, or ended).
    claimed: tuple[int, ...] = ()

    @property
    def dispatch(self) -> bool:
        """True when ``state`` is claimed for a line that must now go to its agent."""
        if self.state.group:
            return bool(self.claimed)
        return self.state.process_state is ProcessState.PROCESSING


def new_order(
    order_id: str, workflow: Workflow, now: datetime, pending_timeout: timedelta, reply_to: str | None,
    note: str | None = None, trace_parent: str | None = None,
) -> OrderState:
    """The state of a just-submitted order: Pending at its first step, to be claimed
    before ``now + pending_timeout``; ``note`` is for the operator, ``trace_parent`` the
    submission's trace context (W3C ``traceparent``).

    An empty ``reply_to`` (a ReplyTo of no characters, which Service Bus hands on as it
    was sent) names no queue and is kept as None, as Table Storage gives an empty text
    back: the state made here must be the row as read back, since a first claim made
    from the submission's snapshot sends it as its fence, and a fence that differs from
    the row under the same ETag is dropped as forged (scheduler/dispatch.py)."""
    return OrderState(
        order_id=order_id,
        process_state=ProcessState.PENDING,
        complete_by=now + pending_timeout,
        reply_to=reply_to or None,
        created_at=now,
        updated_at=now,
        workflow=workflow.name,
        workflow_version=workflow.version,
        step_index=0,
        kind=Kind.ACTION,
        step=workflow.steps[0].name,
        note=_error(note),
        trace_parent=trace_parent,
    )


def step_of(state: OrderState, workflow: Workflow) -> Step:
    return workflow.steps[state.step_index]


# --- the scheduler -------------------------------------------------------------------


def _start(
    state: OrderState, workflow: Workflow, index: int, kind: Kind, instance: str, now: datetime,
    defaults: StepPolicy, **changes,
) -> OrderState:
    """Processing for line (index, kind), claimed by ``instance`` with a new attempt."""
    step = workflow.steps[index]
    policy = step.policy_over(defaults)
    if (index, kind) != (state.step_index, state.kind):
        changes.setdefault("postponements", 0)  # a new line starts with none
    return state.model_copy(
        update={
            "process_state": ProcessState.PROCESSING,
            "step_index": index,
            "kind": kind,
            "step": step.name,
            "locked_by": instance,
            "attempt": state.attempt + 1,
            "complete_by": now + timedelta(seconds=policy.timeout_seconds),
            "max_failures": policy.max_failures,
            "gave_up": False,
            "updated_at": now,
            **changes,
        }
    )


def _end(state: OrderState, end: ProcessState, now: datetime, last_error: str | None, **changes) -> OrderState:
    return state.model_copy(
        update={
            "process_state": end,
            "locked_by": None,
            "gave_up": False,
            "postponements": 0,
            "group": (),
            "last_error": _error(last_error),
            "updated_at": now,
            **changes,
        }
    )


def _line_record(
    state: OrderState, workflow: Workflow, outcome: LineState, now: datetime, *, error: str | None = None, result=None
) -> LineRecord:
    """How the current line ended."""
    return LineRecord(
        order_id=state.order_id,
        step_index=state.step_index,
        step=state.step or "",
        kind=state.kind,
        action=step_of(state, workflow).action_of(state.kind),
        state=outcome,
        attempt=state.attempt,
        failure_count=state.failure_count,
        last_error=_error(error),
        result=result,
        updated_at=now,
    )


def claim(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy,
    ended: Sequence[LineRecord] = (), *, pending_timeout: timedelta,
) -> Transition | None:
    """Pending -> Processing for this instance, with a new attempt (fencing token).

    A Pending row the supervisor gave up on is not run again: the scheduler decides
    what giving up means for its line (:func:`give_up`), once the row is due
    (``CompleteBy - pending_timeout``, as every Pending row is written). A line given up
    while postponed is due only at its last attempt's Complete-By (:func:`postpone`):
    a nudge delivered early (at least once delivery) must not start its undo while a
    request of the line may still be delivered and act (found by the protocol model).
    Nor is an action of a cancelled order run (:func:`_cancel_pending`; ``ended``: the
    order's ended lines, as read).
    """
    if state.group and not state.process_state.terminal:
        # A group: the lines that are due, whatever the others are doing (:func:`_group_next`).
        return _group_next(state, workflow, instance, now, defaults, list(state.group), [],
                           pending_timeout=pending_timeout)
    if state.process_state is not ProcessState.PENDING:
        return None
    if state.gave_up:
        if now < state.complete_by - pending_timeout:
            return None  # not due: the nudge sent with the give-up's wait comes then
        return give_up(state, workflow, instance, now, defaults)
    if cancelled(state) and state.kind is Kind.ACTION:
        return _cancel_pending(state, workflow, instance, now, defaults, ended, pending_timeout)
    if state.kind is Kind.COMPENSATION and step_of(state, workflow).compensate is None:
        # Only reachable through a resubmit of a line that cannot be undone.
        return _compensate_next(state, workflow, instance, now, defaults, [], failed_now=True)
    if state.kind is Kind.ACTION and workflow.in_group(state.step_index):
        return _start_group(state, workflow, state.step_index, instance, now, defaults)  # a new order's first stage
    return Transition(_start(state, workflow, state.step_index, state.kind, instance, now, defaults))


def accepts_response(state: OrderState, response: AgentResponse) -> bool:
    """Fencing: only a response for the current attempt of a Processing row counts (in a
    group: of a Processing line of it)."""
    if state.group:
        return state.process_state is ProcessState.PROCESSING and _group_line(state, response) is not None
    return (
        state.process_state is ProcessState.PROCESSING
        and state.attempt == response.attempt
        and state.kind is response.kind
        and state.step == response.step
    )


def complete(
    state: OrderState, response: AgentResponse, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy
) -> Transition | None:
    """Record the current line's outcome and start the next line in the same write.

    None if the response is stale (another attempt, or the row is not Processing).
    """
    if not accepts_response(state, response):
        return None
    if state.group:
        return _complete_in_group(state, response, workflow, instance, now, defaults)
    if step_of(state, workflow).waiting:
        return None  # a waiting line is ended by its event or its deadline, never by an agent
    if state.kind is Kind.ACTION:
        if response.outcome is Outcome.SUCCEEDED:
            done = _line_record(state, workflow, LineState.DONE, now, result=response.result)
            if cancelled(state):
                # Cancelled while this action was in flight: it settled as applied, so it is
                # undone too, with the steps before it (a last step that cannot be undone: Error).
                return _compensate(state, workflow, instance, now, defaults, done, cancel_cause(state),
                                   first=state.step_index)
            return _advance(state, workflow, instance, now, defaults, done)
        # Refused: nothing was applied at this step; undo the ones before it.
        reason = response.error or "the remote service refused the step"
        refused = _line_record(state, workflow, LineState.REFUSED, now, error=reason)
        cause = cancel_cause(state) or f"step {state.step} refused: {reason}"
        return _compensate(state, workflow, instance, now, defaults, refused, cause, first=state.step_index - 1)
    if response.outcome is Outcome.SUCCEEDED:
        undone = _line_record(state, workflow, LineState.DONE, now, result=response.result)
        return _compensate_next(state, workflow, instance, now, defaults, [undone])
    reason = response.error or "the remote service refused the compensation"
    failed = _line_record(state, workflow, LineState.FAILED, now, error=reason)
    return _compensate_next(
        state.model_copy(update={"failed": (*state.failed, state.step_index)}),
        workflow, instance, now, defaults, [failed],
    )


def _advance(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy,
    *done: LineRecord,
) -> Transition:
    """The current action (or group) is done: claim the next stage, or end the order Processed."""
    last = workflow.stage_of(state.step_index)[-1]
    if last + 1 == len(workflow.steps):
        return Transition(_end(state, ProcessState.PROCESSED, now, None, failure_count=0), done)
    if workflow.in_group(last + 1):
        return _start_group(state, workflow, last + 1, instance, now, defaults, done)
    return Transition(
        _start(
            state, workflow, last + 1, Kind.ACTION, instance, now, defaults,
            failure_count=0, last_error=None, group=(),
        ),
        done,
    )


# --- groups: steps that run at once --------------------------------------------------
#
# While a group (core/workflow.py ``Parallel``) is in flight, the state row's current line
# is the group's first step and ``OrderState.group`` holds one GroupLine per step: each with
# its own attempt (from the order's one counter), deadline, failures and postponements. The
# row sums them up (:func:`_summed`), so that the sweep finds it by its earliest deadline.
# Every decision on a group row goes through :func:`_group_next`: the group is one write
# away from its next move whatever line answered, timed out or was nudged.


def _new_line(
    workflow: Workflow, index: int, attempt: int, now: datetime, defaults: StepPolicy, line: GroupLine | None = None
) -> GroupLine:
    """Line ``index`` claimed with ``attempt`` (its earlier failures, if any, kept)."""
    step = workflow.steps[index]
    policy = step.policy_over(defaults)
    complete_by = now + timedelta(seconds=policy.timeout_seconds)
    base = line or GroupLine(step_index=index, step=step.name, state=LineRun.PENDING, complete_by=complete_by)
    return base.model_copy(
        update={
            "state": LineRun.PROCESSING, "attempt": attempt, "complete_by": complete_by,
            "acts_until": max(complete_by, base.acts_until or complete_by), "max_failures": policy.max_failures,
            "gave_up": False,
        }
    )


def _summed(state: OrderState, lines: Sequence[GroupLine], instance: str | None, now: datetime, **changes) -> OrderState:
    """The row for a group whose lines are ``lines``: Processing while one is with its
    agent, due at the earliest deadline of the open ones, the last attempt given."""
    open_lines = [line for line in lines if line.state.open]
    processing = any(line.state is LineRun.PROCESSING for line in lines)
    update = {
        "group": tuple(lines),
        "process_state": ProcessState.PROCESSING if processing else ProcessState.PENDING,
        "locked_by": instance if processing else None,
        "attempt": max([state.attempt, *(line.attempt for line in lines)]),
        "updated_at": now,
        "failure_count": 0, "postponements": 0, "gave_up": False, "max_failures": None,
        **changes,
    }
    if open_lines:
        update["complete_by"] = min(line.complete_by for line in open_lines)
    return state.model_copy(update=update)


def _start_group(
    state: OrderState, workflow: Workflow, first: int, instance: str, now: datetime, defaults: StepPolicy,
    done: Sequence[LineRecord] = (),
) -> Transition:
    """Claim every line of the group that starts at step ``first``, in one write."""
    stage = workflow.stage_of(first)
    lines = [_new_line(workflow, index, state.attempt + n, now, defaults) for n, index in enumerate(stage, 1)]
    row = state.model_copy(
        update={"step_index": first, "kind": Kind.ACTION, "step": workflow.steps[first].name, "last_error": None}
    )
    return Transition(_summed(row, lines, instance, now), tuple(done), claimed=stage)


def _group_record(
    state: OrderState, workflow: Workflow, line: GroupLine, outcome: LineState, now: datetime, *,
    error: str | None = None, result=None,
) -> LineRecord:
    """How a line of a group ended."""
    step = workflow.steps[line.step_index]
    return LineRecord(
        order_id=state.order_id, step_index=line.step_index, step=step.name, kind=Kind.ACTION, action=step.action,
        state=outcome, attempt=line.attempt, failure_count=line.failure_count, last_error=_error(error),
        result=result, updated_at=now,
    )


def _settled(line: GroupLine, now: datetime) -> bool:
    """No request of the line can still act: its last attempt's Complete-By has passed."""
    return line.acts_until is None or now >= line.acts_until


def _group_next(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy,
    lines: list[GroupLine], records: list[LineRecord], *, pending_timeout: timedelta | None = None,
) -> Transition | None:
    """The group's next move, its lines as they now are (``records``: the ones that ended
    in this decision; ``pending_timeout``: claim the lines that are due, as a nudge does).

    Failing (a line refused or given up, or a cancel): no line starts again. A waiting line
    (between retries, or given up) is ended once it is settled (Cancelled, or Exhausted when
    given up); until then it waits, nudged when it will be. Once no line is open, the undos
    start: every line of the group that was done or whose outcome is unknown (Exhausted,
    Cancelled after attempts), highest index first, then the steps before the group, newest
    first. Not failing: every line done moves the order past the group; otherwise the due
    lines are claimed. None when nothing changes."""
    cause = state.cause or cancel_cause(state)
    failing = cause is not None or any(line.gave_up for line in lines)
    pending = pending_timeout or timedelta(0)
    claimed: list[int] = []
    waits: list[datetime] = []
    for n, line in enumerate(lines):
        if line.state is not LineRun.PENDING:
            continue
        due = line.complete_by - pending  # when its nudge comes (given up: once settled)
        if failing:
            until = max(line.acts_until or now, due) if line.gave_up else (line.acts_until or now)
            if now < until:  # may still act, or its give-up is not due: not ended yet
                waits.append(until)
                if pending_timeout is not None:  # due then: looked at again, nudged for it
                    lines[n] = line.model_copy(update={"complete_by": max(line.complete_by, until + pending)})
                continue
            if line.gave_up:
                why = line.last_error or f"step {line.step} gave up"
                cause = cause or f"step {line.step} gave up (outcome unknown): {why}"
                lines[n] = line.model_copy(update={"state": LineRun.EXHAUSTED, "gave_up": False})
                records.append(_group_record(state, workflow, line, LineState.EXHAUSTED, now, error=why))
            else:
                note = f"not run again: the group is undone ({line.failure_count} failed attempt(s), outcome unknown)"
                lines[n] = line.model_copy(update={"state": LineRun.CANCELLED})
                records.append(_group_record(state, workflow, line, LineState.CANCELLED, now, error=note))
        elif pending_timeout is not None and now >= due - EARLY_NUDGE:
            attempt = max(state.attempt, *(other.attempt for other in lines)) + 1
            lines[n] = _new_line(workflow, line.step_index, attempt, now, defaults, line)
            claimed.append(line.step_index)
    if not failing and all(line.state is LineRun.DONE for line in lines):
        last = lines[-1].step_index
        row = state.model_copy(update={"step_index": last, "step": workflow.steps[last].name, "group": ()})
        return _advance(row, workflow, instance, now, defaults, *records)
    if failing and not any(line.state.open for line in lines):
        undo = [line.step_index for line in reversed(lines)
                if line.state in (LineRun.DONE, LineRun.EXHAUSTED, LineRun.CANCELLED)]
        plan = (*undo, *range(lines[0].step_index - 1, -1, -1))
        begun = _end(state, ProcessState.PROCESSING, now, state.last_error).model_copy(
            update={"kind": Kind.COMPENSATION, "cause": _error(cause), "failed": (), "plan": plan}
        )
        return _compensate_next(begun, workflow, instance, now, defaults, records)
    if not records and not claimed and tuple(lines) == state.group:
        return None
    # Failing: why the group will be undone is on the row (a cancel's cause is the cancel's).
    row = _summed(state, lines, instance, now, **({"cause": _error(cause)} if cause and not state.cause else {}))
    if waits and pending_timeout is not None:
        return Transition(row, tuple(records), nudge_delay=min(waits) - now, claimed=tuple(claimed))
    return Transition(row, tuple(records), claimed=tuple(claimed))


def _group_line(state: OrderState, response: AgentResponse) -> int | None:
    """The position in ``state.group`` of the line a response answers: Processing, its
    step, its attempt; None when no line of the group in flight is that one."""
    if response.kind is not Kind.ACTION:
        return None
    for n, line in enumerate(state.group):
        if line.state is LineRun.PROCESSING and (line.step, line.attempt) == (response.step, response.attempt):
            return n
    return None


def _complete_in_group(
    state: OrderState, response: AgentResponse, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy
) -> Transition | None:
    n = _group_line(state, response)
    if n is None:
        return None
    lines = list(state.group)
    line = lines[n]
    if response.outcome is Outcome.SUCCEEDED:
        lines[n] = line.model_copy(update={"state": LineRun.DONE})
        record = _group_record(state, workflow, line, LineState.DONE, now, result=response.result)
        return _group_next(state, workflow, instance, now, defaults, lines, [record])
    reason = response.error or "the remote service refused the step"
    lines[n] = line.model_copy(update={"state": LineRun.REFUSED, "last_error": _line_error(reason)})
    record = _group_record(state, workflow, line, LineState.REFUSED, now, error=reason)
    failing = state if state.cause or cancelled(state) else state.model_copy(
        update={"cause": _error(f"step {line.step} refused: {reason}")}
    )
    return _group_next(failing, workflow, instance, now, defaults, lines, [record])


def _postpone_in_group(
    state: OrderState, response: AgentResponse, now: datetime, pending_timeout: timedelta, max_postponements: int
) -> Transition | None:
    """:func:`postpone` for one line of a group: the line waits, the others go on."""
    n = _group_line(state, response)
    if n is None:
        return None
    line = state.group[n]
    wait = timedelta(seconds=max(0.0, response.retry_after_seconds or 0.0))
    reason = _line_error(response.error or f"{line.step}: remote service unavailable")
    postponements = line.postponements + 1
    changes: dict = {"state": LineRun.PENDING, "postponements": postponements, "last_error": reason,
                     "complete_by": now + wait + pending_timeout}
    if not postponements % max_postponements:
        failures = line.failure_count + 1
        counted = f"postponed {postponements} times in a row, counted as a failed attempt; last: {reason}"
        changes.update(failure_count=failures, last_error=_line_error(counted))
        if line.max_failures is not None and failures >= line.max_failures:
            settled = max(now, line.acts_until or now)
            changes.update(gave_up=True, complete_by=settled + pending_timeout, postponements=0,
                           last_error=_line_error(f"gave up after {failures} failed attempts; {counted}"))
            wait = settled - now
    lines = list(state.group)
    lines[n] = line.model_copy(update=changes)
    return Transition(_summed(state, lines, state.locked_by, now, last_error=reason), nudge_delay=wait)


# --- waiting steps: an external event ends the line ----------------------------------


def waiting_for(state: OrderState, workflow: Workflow) -> str | None:
    """The event the order's current line waits for, or None when it waits for none.

    A waiting line has no remote action in flight (no agent request was sent), so
    nothing there can still take effect: a cancel may compensate the earlier steps at
    once, as a rejection does (:func:`receive_event`)."""
    if state.process_state is not ProcessState.PROCESSING or state.kind is not Kind.ACTION:
        return None
    return step_of(state, workflow).wait_for


class EventVerdict(str, Enum):
    #: The line waited for this event: it ends now (approved: the workflow goes on;
    #: rejected: the earlier steps are undone).
    ACCEPTED = "accepted"
    #: The same event (name and body) already ended its line: nothing to do.
    DUPLICATE = "duplicate"
    #: No line waits for this event (another line, an ended order, a passed deadline).
    NOT_WAITING = "not_waiting"


@dataclass(frozen=True)
class EventDecision:
    verdict: EventVerdict
    #: For ACCEPTED: what to write (If-Match), in one transaction.
    transition: Transition | None = None
    #: For NOT_WAITING: why.
    reason: str | None = None


def event_cause(step: str, event: str, body: dict) -> str:
    """Why an order is undone after a rejection: the step, by whom, and the note."""
    note = f": {body['note']}" if body.get("note") else ""
    return f"step {step}: {event} rejected by {body.get('by')}{note}"


def receive_event(
    state: OrderState, lines: tuple[LineRecord, ...] | list[LineRecord], workflow: Workflow, name: str, body: dict,
    instance: str, now: datetime, defaults: StepPolicy,
) -> EventDecision:
    """An external event ``name`` with ``body`` (``{"approved": bool, "by": ..., "note": ...}``)
    for an order, decided on its rows as read.

    Accepted only by a line waiting for ``name`` whose deadline has not passed: the
    write that ends the line is If-Match on the row as read, as is the supervisor's
    expiry, so of an event and the deadline exactly one wins. Approved: the line is
    Done with the body as its result, and the next step is claimed in the same write.
    Rejected: the line is Refused (nothing was applied at it) and the steps before it
    are undone. The same event again, once its line has ended with it, is a duplicate.
    """
    waited = waiting_for(state, workflow)
    if waited == name and not state.gave_up:
        if now >= state.complete_by:
            reason = f"step {state.step} stopped waiting for {name} at {state.complete_by.isoformat()}"
            return EventDecision(EventVerdict.NOT_WAITING, reason=reason)
        if body.get("approved"):
            done = _line_record(state, workflow, LineState.DONE, now, result=body)
            return EventDecision(EventVerdict.ACCEPTED, _advance(state, workflow, instance, now, defaults, done))
        cause = event_cause(state.step or "", name, body)
        refused = _line_record(state, workflow, LineState.REFUSED, now, error=cause, result=body)
        transition = _compensate(state, workflow, instance, now, defaults, refused, cause, first=state.step_index - 1)
        return EventDecision(EventVerdict.ACCEPTED, transition)
    for line in lines:
        step = workflow.steps[line.step_index] if 0 <= line.step_index < len(workflow.steps) else None
        if step is not None and step.wait_for == name and line.kind is Kind.ACTION and line.result == body:
            return EventDecision(EventVerdict.DUPLICATE)
    if waited is not None and waited != name:
        reason = f"step {state.step} waits for {waited}, not {name}"
    elif state.process_state.terminal:
        reason = f"the order is {state.process_state.value}: no step waits for {name}"
    else:
        reason = f"no step waits for {name}: the order is {state.process_state.value} at {state.kind.value} {state.step}"
    return EventDecision(EventVerdict.NOT_WAITING, reason=reason)


def postpone(
    state: OrderState, response: AgentResponse, now: datetime, pending_timeout: timedelta, max_postponements: int
) -> Transition | None:
    """The remote service is down for everyone (the agent's breaker refused the
    attempt's first call): the current line was not run and did not fail. Back to
    Pending, due after the wait; no failure counted, and the supervisor sees a deadline
    after the wait, so it counts no miss either. (An attempt whose own call failed is
    never postponed: the agent sends no response and the supervisor counts it.)

    A wait is not endless: every ``max_postponements``-th postponement in a row counts as
    one failed attempt, so a service that stays down ends in the failure path like any
    other failure. The count is kept (not started again) when a failure is counted: the
    line stays one whose last attempt was postponed, whose request may still be delivered
    and act until that attempt's Complete-By, which a cancel must wait out
    (:func:`_cancel_pending`).
    """
    if not accepts_response(state, response):
        return None
    if state.group:
        return _postpone_in_group(state, response, now, pending_timeout, max_postponements)
    wait = timedelta(seconds=max(0.0, response.retry_after_seconds or 0.0))
    reason = _error(response.error or f"{state.step}: remote service unavailable")
    common = {"process_state": ProcessState.PENDING, "locked_by": None, "updated_at": now}
    postponements = state.postponements + 1
    if postponements % max_postponements:
        changes = {"postponements": postponements, "last_error": reason, "complete_by": now + wait + pending_timeout}
        return Transition(state.model_copy(update={**common, **changes}), nudge_delay=wait)
    failures = state.failure_count + 1
    counted = f"postponed {postponements} times in a row, counted as a failed attempt; last: {reason}"
    if state.max_failures is not None and failures >= state.max_failures:
        # Out of failures: hand the line back for the scheduler's give-up, but not before the
        # postponed attempt's Complete-By. Service Bus delivers at least once: its request may
        # still reach an agent whose breaker is closed and act until then, and an undo that
        # ran first would be overtaken by what it undoes (found by the protocol model).
        given_up = _error(f"gave up after {failures} failed attempts; {counted}")
        settled = max(now, state.complete_by)
        # Handed back given up: the give-up (not a cancel) decides, and its wait is here.
        changes = {"gave_up": True, "complete_by": settled + pending_timeout, "last_error": given_up, "postponements": 0}
        wait = settled - now
    else:
        changes = {"last_error": _error(counted), "complete_by": now + wait + pending_timeout}
    return Transition(
        state.model_copy(update={"postponements": postponements, **common, **changes, "failure_count": failures}),
        nudge_delay=wait,
    )


def give_up(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy
) -> Transition:
    """The supervisor gave up on the current line (its failures ran out).

    An action's outcome is unknown: it may have been applied, so it is undone too,
    with the steps before it. If it cannot be undone, the order stops in Error for an
    operator (a resubmit runs it again with the same idempotency key). A compensation
    that gave up is recorded as failed and the others still run.
    """
    reason = state.last_error or f"step {state.step} gave up"
    step = step_of(state, workflow)
    if state.kind is Kind.ACTION and step.waiting:
        # Its deadline passed with no event: nothing was done at this step, undo the ones before.
        cause = f"step {state.step} timed out waiting for {step.wait_for}: {reason}"
        expired = _line_record(state, workflow, LineState.EXHAUSTED, now, error=cause)
        return _compensate(state, workflow, instance, now, defaults, expired, cause, first=state.step_index - 1)
    if state.kind is Kind.ACTION:
        exhausted = _line_record(state, workflow, LineState.EXHAUSTED, now, error=reason)
        if step.compensate is None:
            why = f"; the order was being cancelled ({cancel_cause(state)})" if cancelled(state) else ""
            error = (
                f"step {state.step}{why}: outcome unknown after {state.failure_count} failed attempts, and it cannot be "
                f"undone; check it at the remote service, then resubmit to run it again (same idempotency key). "
                f"Last: {reason}"
            )
            return Transition(_end(state, ProcessState.ERROR, now, error), (exhausted,))
        cause = cancel_cause(state) or f"step {state.step} gave up (outcome unknown): {reason}"
        return _compensate(state, workflow, instance, now, defaults, exhausted, cause, first=state.step_index)
    failed = _line_record(state, workflow, LineState.FAILED, now, error=reason)
    return _compensate_next(
        state.model_copy(update={"failed": (*state.failed, state.step_index)}),
        workflow, instance, now, defaults, [failed],
    )


def _compensate(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy,
    ended: LineRecord, cause: str, *, first: int,
) -> Transition:
    """Start undoing steps ``first`` down to 0, in reverse order."""
    plan = tuple(range(first, -1, -1))
    begun = state.model_copy(update={"kind": Kind.COMPENSATION, "cause": _error(cause), "failed": (), "plan": plan})
    return _compensate_next(begun, workflow, instance, now, defaults, [ended])


def _compensate_next(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy,
    records: list[LineRecord], *, failed_now: bool = False,
) -> Transition:
    """Claim the next compensation of the plan, or end the order: Compensated when every
    undo was done, Error when one could not be."""
    failed = list(state.failed)
    if failed_now:  # the current line itself cannot be undone
        failed.append(state.step_index)
        records.append(
            _line_record(state, workflow, LineState.FAILED, now, error="the step declares no compensation")
        )
    plan = list(state.plan)
    while plan:
        index = plan.pop(0)
        step = workflow.steps[index]
        if step.waiting:
            continue  # nothing was done at a waiting step: nothing to undo
        if step.compensate is None:
            failed.append(index)
            records.append(
                LineRecord(
                    order_id=state.order_id, step_index=index, step=step.name, kind=Kind.COMPENSATION, action=None,
                    state=LineState.FAILED, attempt=state.attempt, last_error="the step declares no compensation",
                    updated_at=now,
                )
            )
            continue
        return Transition(
            _start(
                state, workflow, index, Kind.COMPENSATION, instance, now, defaults,
                plan=tuple(plan), failed=tuple(failed), failure_count=0, postponements=0, last_error=None,
            ),
            tuple(records),
        )
    if failed:
        names = ", ".join(workflow.steps[i].name for i in failed)
        error = f"could not undo step(s) {names}; the order was being undone because {state.cause}"
        return Transition(
            _end(state, ProcessState.ERROR, now, error, plan=(), failed=tuple(failed)), tuple(records)
        )
    return Transition(_end(state, ProcessState.COMPENSATED, now, state.cause, plan=()), tuple(records))


# --- cancel --------------------------------------------------------------------------


class CancelVerdict(str, Enum):
    RECORDED = "recorded"  # written on the row now: the order will be undone
    ALREADY = "already"  # a cancel is recorded already, or the order is Compensated: a no-op
    REFUSED = "refused"  # the order ended Processed or in Error: nothing to cancel


@dataclass(frozen=True)
class CancelDecision:
    verdict: CancelVerdict
    #: The state to write (If-Match) when RECORDED.
    next_state: OrderState | None = None
    #: Why it was refused, or why it is a no-op.
    reason: str | None = None


def cancelled(state: OrderState) -> bool:
    return state.cancel_requested_at is not None


def cancel_cause(state: OrderState) -> str | None:
    """The Cause of a cancelled order: the cancel, who asked and why; None if not cancelled."""
    if not cancelled(state):
        return None
    by = f" by {state.cancelled_by}" if state.cancelled_by else ""
    why = state.cancel_reason or "no reason given"
    return _error(f"cancelled{by} at {state.cancel_requested_at.isoformat()}: {why}")


def nothing_in_flight(state: OrderState, workflow: Workflow | None) -> bool:
    """A Processing action line that sent no request to any remote: a step that waits for
    an external event (``Step.wait_for``) instead of calling a remote.
    Nothing there can still take effect, so a cancel need not wait for its deadline."""
    return workflow is not None and waiting_for(state, workflow) is not None


def request_cancel(
    state: OrderState, now: datetime, reason: str | None, by: str | None, workflow: Workflow | None = None
) -> CancelDecision:
    """Record a cancel on an order that has not ended (one If-Match write of the state
    row). Nothing else changes: the line in flight settles as it would have, and the
    scheduler then undoes the order instead of going on. Idempotent: a second cancel,
    or a cancel of a Compensated order, is a no-op; an order that ended Processed (every
    step done) or in Error (it needs an operator, who may resubmit it) is refused.

    A line with nothing in flight (:func:`nothing_in_flight`, on the order's ``workflow``)
    has nothing to settle: the same write hands it back to the scheduler (Pending, due
    now), whose claim undoes the steps before it at once (:func:`claim`); an event for it
    after that finds no line waiting."""
    if state.process_state is ProcessState.PROCESSED:
        return CancelDecision(
            CancelVerdict.REFUSED, reason=f"order {state.order_id} is Processed: every step is done, nothing to cancel"
        )
    if state.process_state is ProcessState.ERROR:
        return CancelDecision(
            CancelVerdict.REFUSED,
            reason=f"order {state.order_id} ended in Error: it needs an operator (check the remote services, then "
            "resubmit it); a cancel applies only to an order that has not ended",
        )
    if state.process_state is ProcessState.COMPENSATED:
        return CancelDecision(CancelVerdict.ALREADY, reason=f"order {state.order_id} is Compensated already")
    if cancelled(state):
        return CancelDecision(
            CancelVerdict.ALREADY, reason=f"order {state.order_id} was cancelled already ({cancel_cause(state)})"
        )
    changes: dict = {}
    if nothing_in_flight(state, workflow):
        changes = {"process_state": ProcessState.PENDING, "locked_by": None, "complete_by": now}
    recorded = state.model_copy(
        update={
            "cancel_requested_at": now,
            "cancel_reason": _error(reason) if reason else None,
            "cancelled_by": _error(by) if by else None,
            "updated_at": now,
            **changes,
        }
    )
    return CancelDecision(CancelVerdict.RECORDED, recorded)


def may_have_run(state: OrderState, ended: Sequence[LineRecord] = ()) -> bool:
    """Whether the current (Pending) action line may have been applied by an earlier
    attempt: one timed out or was postponed (failure or postponement counted), or the
    line ended before and was resubmitted (its row says so)."""
    if state.failure_count > 0 or state.postponements > 0:
        return True
    return any(line.step_index == state.step_index and line.kind is Kind.ACTION for line in ended)


def _cancel_pending(
    state: OrderState, workflow: Workflow, instance: str, now: datetime, defaults: StepPolicy,
    ended: Sequence[LineRecord], pending_timeout: timedelta,
) -> Transition:
    """A cancelled order's Pending action line is not claimed again: its earlier attempts,
    if any, are settled (their Complete-By passed: the supervisor reset the line after it),
    so the undos start now, of this step too when it may have run.

    A line that was postponed is the exception: the postponed attempt's request may still
    be delivered to an agent and act until that attempt's Complete-By, which the row no
    longer holds (it is at most the line's timeout after now). It is handed back as a
    give-up after that timeout, as :func:`postpone` does when failures run out (due then:
    its CompleteBy is that time plus ``pending_timeout``, as every Pending row is written,
    and :func:`claim` takes a given-up row only once due); the give-up then undoes the
    order (:func:`give_up`, with the cancel as cause)."""
    if state.postponements > 0:
        timeout = timedelta(seconds=step_of(state, workflow).policy_over(defaults).timeout_seconds)
        wait = state.model_copy(
            update={
                "gave_up": True, "postponements": 0, "failure_count": state.failure_count + 1, "locked_by": None,
                "complete_by": now + timeout + pending_timeout, "updated_at": now,
                "last_error": _error(f"cancelled while postponed: undone once the postponed attempt's deadline "
                                     f"({timeout.total_seconds():.0f} s at most) has passed; last: {state.last_error}"),
            }
        )
        return Transition(wait, nudge_delay=timeout)
    cause = cancel_cause(state) or "cancelled"
    if may_have_run(state, ended):
        note = f"cancelled after {state.failure_count} failed attempt(s): outcome unknown, undone"
        first = state.step_index
    else:
        note, first = "cancelled before it ran: not run", state.step_index - 1
    record = _line_record(state, workflow, LineState.CANCELLED, now, error=note)
    return _compensate(state, workflow, instance, now, defaults, record, cause, first=first)


def failed_steps(state: OrderState, workflow: Workflow) -> list[str]:
    return [workflow.steps[i].name for i in state.failed]


def fail(state: OrderState, reason: str, now: datetime) -> OrderState:
    """Any non-terminal state -> Error with the reason (e.g. an unknown workflow)."""
    return _end(state, ProcessState.ERROR, now, reason)


def resubmit(state: OrderState, now: datetime, pending_timeout: timedelta) -> OrderState | None:
    """Operator: Error -> Pending where the order stopped, failure count cleared.

    An order stopped in its actions runs the stopped step again; one stopped while
    undoing runs the compensations that failed, in reverse order. Done lines are never
    run again. The next claim takes a new attempt number, so any late response of the
    failed attempts stays fenced out; the remote sees the same idempotency keys.
    """
    if state.process_state is not ProcessState.ERROR:
        return None
    changes: dict = {}
    if state.kind is Kind.COMPENSATION and state.failed:
        retry = sorted(set(state.failed), reverse=True)
        changes = {"step_index": retry[0], "plan": tuple(retry[1:]), "failed": ()}
        try:  # the row names its current line's step, as every other transition leaves it
            changes["step"] = workflow(state.workflow, state.workflow_version).steps[retry[0]].name
        except (UnknownWorkflow, IndexError):
            pass  # the claim ends such an order in Error again, naming the definition
    return state.model_copy(
        update={
            "process_state": ProcessState.PENDING,
            "failure_count": 0,
            "postponements": 0,
            "gave_up": False,
            "locked_by": None,
            "complete_by": now + pending_timeout,
            "updated_at": now,
            **changes,
        }
    )


# --- the supervisor ------------------------------------------------------------------


def backoff(failure_count: int, base: timedelta, cap: timedelta) -> timedelta:
    """The wait before the next try after ``failure_count`` failures: base * 2**(n-1), capped."""
    if failure_count <= 0:
        return timedelta(0)
    return min(cap, base * (2 ** min(failure_count - 1, 30)))


class Verdict(str, Enum):
    NONE = "none"  # not expired, or terminal: nothing to do
    RETRY = "retry"  # expired Processing below the threshold: back to Pending, nudge later
    GIVE_UP = "give_up"  # expired Processing at the threshold: hand back to the scheduler
    RENUDGE = "renudge"  # expired Pending: the nudge was lost, nudge again
    DROP_INDEX = "drop_index"  # terminal: only the active index still names it


@dataclass(frozen=True)
class SupervisorPolicy:
    max_failures: int
    step_timeout: timedelta
    pending_timeout: timedelta
    backoff_base: timedelta
    backoff_cap: timedelta
    #: How long after an attempt's Complete-By its answer may still be on its way back, at
    #: most (RESPONSE_GRACE_SECONDS): the agent stops at Complete-By, but its response can be
    #: held up in the app's own plumbing (a backlog on the responses queue, a send retried
    #: while the namespace is throttled, a delivery stranded on a dropped link until its lock
    #: expires). A missed deadline is counted as the line's failure only after it, or earlier
    #: once no answer sent in time can still be on the way (:func:`awaiting_answer`).
    response_grace: timedelta = timedelta(0)
    #: How long an agent's send of its answer may take after Complete-By (its Service Bus
    #: client's retries of a throttled or dropped send).
    send_slack: timedelta = timedelta(0)
    #: The shortest deadline any line is given (core.workflow.shortest_timeout: a waiting
    #: step's APPROVAL_TIMEOUT_SECONDS, or a step's own timeout, may be shorter than
    #: STEP_TIMEOUT_SECONDS); None: ``step_timeout``. The sweep skips orders indexed more
    #: recently than this and ``pending_timeout``: none of them can have expired.
    shortest_timeout: timedelta | None = None


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: The state to write (If-Match), or None when nothing is written to the state row.
    next_state: OrderState | None = None
    #: How long the scheduler nudge waits before it becomes visible.
    nudge_delay: timedelta = timedelta(0)
    #: In a group, when the write acts on several lines: the further nudges, one per other
    #: wait (each line is claimed once it is due).
    more_nudges: tuple[timedelta, ...] = ()
    #: The lines whose deadline was missed (step, RETRY or GIVE_UP): one for a lone line, one
    #: per line of a group.
    missed: tuple[tuple[str, Verdict], ...] = ()


def in_grace(state: OrderState, now: datetime, policy: SupervisorPolicy) -> bool:
    """Whether an answer may still be on its way for an attempt past its Complete-By
    (:func:`awaiting_answer`, without the queue's backlog): the row's, or in a group, a line's."""
    if state.group:
        return any(
            line.state is LineRun.PROCESSING and line.complete_by <= now
            and awaiting_answer(state, now, policy, complete_by=line.complete_by)
            for line in state.group
        )
    return state.process_state is ProcessState.PROCESSING and awaiting_answer(state, now, policy)


def awaiting_answer(
    state: OrderState, now: datetime, policy: SupervisorPolicy, responses_since: datetime | None = None,
    *, complete_by: datetime | None = None,
) -> bool:
    """Is the answer of a Processing row's attempt, past its Complete-By, still awaited?

    Until the send slack has passed an answer may still be being sent; after it, only while
    the responses queue holds a message sent by then (``responses_since``: when the oldest
    message still on it was enqueued, ``now`` when it is empty, None when unknown: then until
    the grace ends); never past the grace. The queue's oldest message is one no scheduler
    has settled yet (peeking sees locked ones too), so once it is younger, every answer sent
    by then has been recorded, or dropped as stale: none is coming for this attempt.
    """
    complete_by = complete_by or state.complete_by  # a line of a group: its own
    if now >= complete_by + policy.response_grace:
        return False
    sent_by = complete_by + min(policy.send_slack, policy.response_grace)
    return now < sent_by or responses_since is None or responses_since <= sent_by


def supervise(
    state: OrderState, now: datetime, policy: SupervisorPolicy, responses_since: datetime | None = None
) -> Decision:
    """The supervisor's verdict on one row. Only expired rows are acted on: a Pending row
    past its deadline, a Processing row past its deadline and the response grace.

    Generic: it knows deadlines and failure counts, never what a step does or how to
    undo it. Giving up hands the row back to the scheduler (Pending, ``gave_up``),
    which decides between undoing the order and going on with its other undos.
    """
    if state.process_state.terminal:
        return Decision(Verdict.DROP_INDEX)
    if state.complete_by > now:
        return Decision(Verdict.NONE)
    if state.group:
        return _supervise_group(state, now, policy, responses_since)
    if state.process_state is ProcessState.PROCESSING and awaiting_answer(state, now, policy, responses_since):
        # Past Complete-By no agent acts for this attempt, but its answer, sent in time, may
        # still be on the way back through the app's own queues: it is still accepted (the row
        # keeps its attempt). Push-back in the plumbing costs time, not one of the line's attempts.
        return Decision(Verdict.NONE)
    if state.process_state is ProcessState.PENDING:
        # A Pending row past its deadline lost its nudge (or the scheduler crashed
        # before claiming). Not a failure of the step: no count, just a new deadline.
        renewed = state.model_copy(update={"complete_by": now + policy.pending_timeout, "updated_at": now})
        return Decision(Verdict.RENUDGE, renewed)
    failures = state.failure_count + 1
    reason = f"attempt {state.attempt} did not complete by {state.complete_by.isoformat()}"
    limit = state.max_failures or policy.max_failures
    common = {"process_state": ProcessState.PENDING, "locked_by": None, "failure_count": failures, "updated_at": now}
    if failures >= limit:
        given_up = state.model_copy(
            update={
                **common,
                "gave_up": True,
                "last_error": _error(f"gave up after {failures} failed attempts; last: {reason}"),
                "complete_by": now + policy.pending_timeout,
            }
        )
        return Decision(Verdict.GIVE_UP, given_up, missed=((state.step or "", Verdict.GIVE_UP),))
    delay = backoff(failures, policy.backoff_base, policy.backoff_cap)
    reset = state.model_copy(
        update={
            **common,
            "last_error": _error(reason),
            # The retry is due after the backoff; give the scheduler its pending window from then.
            "complete_by": now + delay + policy.pending_timeout,
        }
    )
    return Decision(Verdict.RETRY, reset, delay, missed=((state.step or "", Verdict.RETRY),))


def _supervise_group(
    state: OrderState, now: datetime, policy: SupervisorPolicy, responses_since: datetime | None
) -> Decision:
    """:func:`supervise` for each expired line of a group, in one write of the row: a
    Pending line is nudged again; a Processing one past its deadline (and the grace) is
    sent back to Pending for a retry after the backoff, or given up. The verdict is the
    gravest (a give-up, then a retry, then a nudge)."""
    lines = list(state.group)
    delays: list[timedelta] = []
    missed: list[tuple[str, Verdict]] = []
    for n, line in enumerate(lines):
        if not line.state.open or line.complete_by > now:
            continue
        if line.state is LineRun.PENDING:
            lines[n] = line.model_copy(update={"complete_by": now + policy.pending_timeout})
            delays.append(timedelta(0))
            continue
        if awaiting_answer(state, now, policy, responses_since, complete_by=line.complete_by):
            continue
        failures = line.failure_count + 1
        reason = f"attempt {line.attempt} did not complete by {line.complete_by.isoformat()}"
        common = {"state": LineRun.PENDING, "failure_count": failures}
        if failures >= (line.max_failures or policy.max_failures):
            lines[n] = line.model_copy(update={
                **common, "gave_up": True, "complete_by": now + policy.pending_timeout,
                "last_error": _line_error(f"gave up after {failures} failed attempts; last: {reason}"),
            })
            missed.append((line.step, Verdict.GIVE_UP))
            delays.append(timedelta(0))
            continue
        delay = backoff(failures, policy.backoff_base, policy.backoff_cap)
        lines[n] = line.model_copy(
            update={**common, "last_error": _line_error(reason), "complete_by": now + delay + policy.pending_timeout}
        )
        missed.append((line.step, Verdict.RETRY))
        delays.append(delay)
    if not delays:
        return Decision(Verdict.NONE)
    verdicts = {verdict for _, verdict in missed}
    verdict = next((v for v in (Verdict.GIVE_UP, Verdict.RETRY) if v in verdicts), Verdict.RENUDGE)
    errors = [line.last_error for line, old in zip(lines, state.group) if line != old and line.last_error]
    row = _summed(state, lines, state.locked_by, now, last_error=errors[-1] if errors else state.last_error)
    waits = sorted(set(delays))
    return Decision(verdict, row, waits[0], tuple(waits[1:]), tuple(missed))
