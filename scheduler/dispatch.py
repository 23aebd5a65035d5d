"""The scheduler's two steps, both conditional on the state row's ETag:

- :func:`schedule`: a nudge -> claim the order's current line -> its agent request;
- :func:`record`: an agent response -> record the line's outcome and, in the same
  write, claim the next line (the next step, or the next undo) -> its agent request;
  or end the order (Processed, Compensated, Error) and close it.

The workflow decisions are :mod:`core.lifecycle`'s; this module reads, writes and sends.

Both decide on the row as read (one partition query: the state row, the order and the
lines so far), never on what a message claims. A nudge's snapshot and a response's
fence (the row as claimed, with its ETag) are claims: anyone who can send to the queue
can write them, and a matching ETag proves only that the row is unchanged since that
ETag, not that the message's other fields are the row's. A message whose claim names
the row's current ETag with other contents is a forgery: dropped and counted. An order's
first claim is made without a read, proven by its transaction (:func:`_first_claim`);
and where this process wrote the order last, the decision is first taken on what it
wrote (adapters/order_cache.py), trusted only if its If-Match write succeeds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters import telemetry
from adapters.closing import close_order
from adapters.messaging import Nudger, Publisher
from adapters.order_cache import OrderCache
from adapters.store import ConcurrencyConflict, OrderNotFound, OrderRecord, StateStore
from core import lifecycle, names
from core.lifecycle import Transition
from core.claims import concrete_etag
from core.models import (
    AgentPolicy,
    AgentRequest,
    AgentResponse,
    Context,
    LineRecord,
    Nudge,
    OrderState,
    Outcome,
    ProcessState,
    Status,
    StatusEvent,
    first_claim_key,
    idempotency_key,
)
from core.workflow import Kind, StepPolicy, UnknownWorkflow, Workflow, workflow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scheduler:
    """The scheduler's collaborators and settings."""

    store: StateStore
    publisher: Publisher
    instance: str
    #: The app settings' step policy (a step's own policy overrides it).
    defaults: StepPolicy
    #: remote service -> its agent's request queue.
    requests_queues: Mapping[str, str]
    responses_queue: str
    alerts_queue: str
    #: Nudges the scheduler again later (a line postponed while its remote is down).
    nudger: Nudger
    pending_timeout: timedelta
    #: Postponements in a row of one line (its remote down) that count as one failure.
    max_postponements: int
    #: The orders as this process last wrote them (adapters/wiring.Services holds the
    #: process's one); None: every decision reads the order first. A Scheduler is built per
    #: invocation (scheduler/blueprint.py), so a cache of its own would never hit.
    cache: OrderCache | None = None


def schedule(nudge: Nudge, *, scheduler: Scheduler, now: datetime) -> AgentRequest | None:
    """Claim the order's current line and send its agent request. None when there is
    nothing to send (the row is not Pending, another instance won the claim, the claim
    ended the order, or the nudge's snapshot is forged)."""
    first = _first_claim(nudge, scheduler, now)
    if first is not None:
        return first
    written = _apply(
        scheduler, nudge, now,
        lambda s, wf, ended: lifecycle.claim(
            s, wf, scheduler.instance, now, scheduler.defaults, ended, pending_timeout=scheduler.pending_timeout
        ),
    )
    if written is None:
        log.info("order %s not claimed by %s: unknown, not Pending or claimed elsewhere", nudge.order_id, scheduler.instance)
        telemetry.annotate(outcome="not_claimed")
        return None
    state, transition, read = written
    if transition.nudge_delay is not None:
        # A cancelled line that was postponed waits out its postponed attempt (lifecycle.claim).
        log.info("order %s: cancel waits %.0f s for %s %s: %s", state.order_id,
                 transition.nudge_delay.total_seconds(), state.kind.value, state.step, state.last_error)
        scheduler.nudger.nudge(Nudge(order_id=state.order_id, state=state), delay=transition.nudge_delay)
        return None
    return _carry_out(scheduler, state, transition, json.loads(read.document), read.results(), now)


def record(response: AgentResponse, *, scheduler: Scheduler, now: datetime) -> OrderState | None:
    """Apply an agent response if it is for the current attempt of a Processing row
    (fencing), and start what comes next; a duplicate or stale response changes
    nothing and returns None."""

    def decide(state: OrderState, definition: Workflow, _ended) -> Transition | None:
        if response.outcome is Outcome.POSTPONED:
            return lifecycle.postpone(state, response, now, scheduler.pending_timeout, scheduler.max_postponements)
        return lifecycle.complete(state, response, definition, scheduler.instance, now, scheduler.defaults)

    written = _apply(scheduler, response, now, decide)
    if written is None:
        log.info("response for order %s attempt %s ignored: unknown order, or stale", response.order_id, response.attempt)
        telemetry.annotate(outcome="stale")
        return None
    state, transition, read = written
    if response.outcome is not Outcome.POSTPONED:
        # The line ran from its claim (the row's UpdatedAt as read: the claim's; a line of a
        # group: its deadline less its timeout) to this response.
        seconds = (now - _claimed_at(read.state, response, scheduler.defaults)).total_seconds()
        telemetry.line_answered(response.step, response.kind, response.outcome, seconds)
    if transition.nudge_delay is not None:
        log.info("order %s: %s %s postponed for %.0f s: %s", state.order_id, response.kind.value, response.step,
                 transition.nudge_delay.total_seconds(), state.last_error)
        scheduler.nudger.nudge(Nudge(order_id=state.order_id, state=state), delay=transition.nudge_delay)
        return state
    results = read.results()
    if response.kind is Kind.ACTION and response.outcome is Outcome.SUCCEEDED:
        results[response.step] = response.result or {}
    _carry_out(scheduler, state, transition, json.loads(read.document), results, now)
    return state


def _claimed_at(state: OrderState, response: AgentResponse, defaults: StepPolicy) -> datetime:
    """When the line a response answers was claimed, as the row read before it says."""
    for line in state.group:
        if (line.step, line.attempt) == (response.step, response.attempt):
            step = workflow(state.workflow, state.workflow_version).steps[line.step_index]
            return line.complete_by - timedelta(seconds=step.policy_over(defaults).timeout_seconds)
    return state.updated_at


def _first_claim(nudge: Nudge, scheduler: Scheduler, now: datetime) -> AgentRequest | None:
    """An order's first claim without a read, from the nudge its submission sent.

    The nudge's snapshot says the order was never claimed; the claim's transaction
    proves it: If-Match on the snapshot's ETag (the row is unchanged since), and the
    deletion of the order's first-claim seal, a row written at submission whose key
    digests the workflow, the ReplyTo and the document (core.models.first_claim_key).
    The seal goes with the first write over the order, whoever writes (adapters/store.py):
    while it exists, the state row is the one the submission wrote, and the ETag it had
    then is the only one that passes. So a claim that passes both found the row exactly as
    :func:`core.lifecycle.new_order` made it: what :func:`pristine` requires of the
    snapshot's deciding fields, and the key matches only the workflow, ReplyTo and document
    the order was submitted with. Any lie about those, a write since the submission (a
    claim on a read, a cancel, a supervisor's verdict), or a lost race fails the whole
    transaction: None, and :func:`schedule` decides on the row as read instead.

    What the snapshot may still lie about (its times, note, trace, last error) is never
    written. The claim is a MERGE of the properties in which the claimed state differs from
    its base: those :func:`core.lifecycle.claim` sets, ProcessState, LockedBy, Attempt and
    MaxFailures (each differs from the value :func:`pristine` pins, the row's own), and
    CompleteBy and UpdatedAt (always written: the base is the snapshot without its times,
    :func:`_untimed`, as one naming the claim's own time would keep the row's). Their
    values come from the clock, this instance, the first step's policy and the pinned
    attempt 0; every other property is the same in the base and the claim, left out, the
    row keeping its own: the row ends as a claim on a read would leave it. Only what is
    sent carries the snapshot's other fields (the request's fence), which no decision reads
    and no write takes from a message. So a claim decided on a snapshot is not kept in the
    cache; where this process submitted the order, the claim is decided on the rows it
    wrote instead (its If-Match write proves them) and kept.
    """
    known = scheduler.cache.get(nudge.order_id, now) if scheduler.cache is not None else None
    if known is not None and pristine(known.state):
        state, document = known.state, known.document
    else:
        known, state, document = None, nudge.state, nudge.document
        if state is None or document is None or not concrete_etag(state.etag) or not pristine(state):
            return None
    definition = workflow(state.workflow, state.workflow_version)
    transition = lifecycle.claim(
        state, definition, scheduler.instance, now, scheduler.defaults, pending_timeout=scheduler.pending_timeout
    )
    if transition is None or not transition.dispatch:
        return None
    try:
        if known is None:
            seal = first_claim_key(state.workflow, state.workflow_version, state.reply_to, document)
            claimed = scheduler.store.write(_untimed(state), transition.state, transition.lines, consume=seal)
        else:  # its seal, as the record holds it, goes with the write
            claimed = write_transition(scheduler, known, transition, now).state
    except (ConcurrencyConflict, OrderNotFound):
        return None
    return _carry_out(scheduler, claimed, transition, json.loads(document), {}, now)


def _untimed(snapshot: OrderState) -> OrderState:
    """The base of the first claim's MERGE (the properties of the claim that differ from it
    are written): the snapshot with times no claim sets, so the claim's CompleteBy and
    UpdatedAt are written whatever times the snapshot names (they are not proven)."""
    return snapshot.model_copy(update={"complete_by": _NO_TIME, "updated_at": _NO_TIME})


_NO_TIME = datetime.min.replace(tzinfo=UTC)


def pristine(state: OrderState) -> bool:
    """A new order's state as submission writes it: Pending at the first step of a
    workflow the app has, never claimed nor cancelled (every field a decision reads is
    that of :func:`core.lifecycle.new_order`)."""
    try:
        definition = workflow(state.workflow, state.workflow_version)
    except UnknownWorkflow:
        return False
    return (
        state.process_state is ProcessState.PENDING
        and (state.step_index, state.kind, state.step) == (0, Kind.ACTION, definition.steps[0].name)
        and (state.attempt, state.failure_count, state.postponements) == (0, 0, 0)
        and (state.plan, state.failed, state.gave_up, state.max_failures) == ((), (), False, None)
        and state.locked_by is None and state.cause is None
        and (state.cancel_requested_at, state.cancel_reason, state.cancelled_by) == (None, None, None)
        and state.group == ()
    )


def trace_parent_of(message: Nudge | AgentResponse) -> telemetry.TraceContext | None:
    """The trace context a nudge or a response carries, else the order's own (from the
    state row it carries): the claim it leads to joins the order's trace."""
    if isinstance(message, Nudge):
        carried = telemetry.parent_from_traceparent(message.traceparent, message.tracestate)
        return carried or telemetry.parent_from_traceparent(message.state.trace_parent if message.state else None)
    return telemetry.parent_from_traceparent(message.context.fence.trace_parent)


Decide = Callable[[OrderState, Workflow, tuple[LineRecord, ...]], Transition | None]


def _apply(
    scheduler: Scheduler, message: Nudge | AgentResponse, now: datetime, decide: Decide
) -> tuple[OrderState, Transition, OrderRecord] | None:
    """Read the order (one partition query), decide on its state row and write the
    transition (If-Match on the ETag just read), on the definition the order started on.
    None when there is nothing to do: an unknown order, a decision of no change, or a
    forged message. A write that lost the race (412: someone else moved the row) is
    decided again on the row as it now is, up to :data:`DECISIONS` times: a move that
    ended the line (a reset, another scheduler) makes the message stale, while one that
    left it in flight (a cancel recorded meanwhile) lets the response still count.

    First, without a read, on the order as this process last wrote it, if it holds it
    (:func:`_on_cached`); that try is not one of the :data:`DECISIONS`. With a cache, one
    decision per order at a time in this process (:meth:`OrderCache.deciding`).
    """
    order_id = message.order_id
    if scheduler.cache is None:
        return _decide(scheduler, message, now, decide)
    with scheduler.cache.deciding(order_id):
        return _decide(scheduler, message, now, decide)


def _decide(
    scheduler: Scheduler, message: Nudge | AgentResponse, now: datetime, decide: Decide
) -> tuple[OrderState, Transition, OrderRecord] | None:
    order_id = message.order_id
    claimed = message.state if isinstance(message, Nudge) else message.context.fence
    cached = _on_cached(scheduler, order_id, claimed, now, decide)
    if cached is not None:
        return cached
    tries, limit = 0, DECISIONS
    while tries < limit:
        tries += 1
        try:
            read = scheduler.store.read(order_id)
        except OrderNotFound:
            return None
        state = read.state
        # In a group, a lost race is mostly a sibling line's answer: one more try per line.
        limit = DECISIONS + len(state.group)
        if forged(claimed, state):
            log.error("order %s: a message claims the row's current ETag with other contents: dropped as forged",
                      order_id)
            telemetry.message_dropped("nudge" if isinstance(message, Nudge) else "agent_response", names.DROP_FORGED)
            return None
        transition = _on_definition(state, now, lambda s, wf: decide(s, wf, read.lines))
        if transition is None:
            return None
        try:
            return write_transition(scheduler, read, transition, now).state, transition, read
        except OrderNotFound:
            return None
        except ConcurrencyConflict:
            continue
    return None


def _on_cached(
    scheduler: Scheduler, order_id: str, claimed: OrderState | None, now: datetime, decide: Decide
) -> tuple[OrderState, Transition, OrderRecord] | None:
    """The decision on the order as this process last wrote it, when it writes and the
    write (If-Match on that ETag) succeeds: the rows were then exactly those decided on.
    None otherwise, the entry dropped: no entry; nothing to do, or a forged claim, on rows
    that may be stale; a 412. :func:`_apply` then reads the order and decides again, so a
    message the row has moved on to accept is not lost, and a forgery is told on the row."""
    cache = scheduler.cache
    known = cache.get(order_id, now) if cache is not None else None
    if known is None:
        return None
    transition = None
    if not forged(claimed, known.state):
        transition = _on_definition(known.state, now, lambda s, wf: decide(s, wf, known.lines))
    if transition is None:
        cache.drop(order_id, known.state.etag)
        return None
    try:
        return write_transition(scheduler, known, transition, now).state, transition, known
    except (ConcurrencyConflict, OrderNotFound):
        return None


def write_transition(scheduler: Scheduler, record: OrderRecord, transition: Transition, now: datetime) -> OrderRecord:
    """Write ``transition`` over ``record`` (If-Match on its ETag; its first-claim seal, if
    the record holds one, deleted in the same transaction) and return the order as written,
    kept in the process's cache (an order that ended is dropped from it, and so is one
    whose write raised, applied or not)."""
    try:
        written = scheduler.store.write_over(record, transition.state, transition.lines)
    except BaseException:
        if scheduler.cache is not None:
            scheduler.cache.drop(record.state.order_id, record.state.etag)
        raise
    if scheduler.cache is not None:
        scheduler.cache.put(written, now)
    return written


#: Reads and decisions of one message when its writes keep losing the race (each loss is
#: another write to the order's row; past this, the message is dropped as stale would be),
#: and one more per line of a group in flight (its lines' answers write the row too).
DECISIONS = 3


def forged(claimed: OrderState | None, state: OrderState) -> bool:
    """A claim that names the row's current ETag but not its contents cannot come from
    this app (what it sends is the row as written, with the ETag of that write)."""
    if claimed is None or claimed.etag != state.etag:
        return False
    return any(getattr(claimed, name) != getattr(state, name) for name in _DECIDING)


#: The fields a decision reads (compared as they round-trip through the table exactly;
#: times are left out, as a store may keep them at a coarser precision).
_DECIDING = (
    "order_id", "process_state", "attempt", "failure_count", "workflow", "workflow_version", "step_index", "kind",
    "step", "plan", "failed", "gave_up", "max_failures", "postponements", "reply_to", "locked_by",
    "cancel_reason", "cancelled_by", "group",
)


def _on_definition(
    state: OrderState, now: datetime, decide: Callable[[OrderState, Workflow], Transition | None]
) -> Transition | None:
    """An order whose definition is gone cannot go on: it ends in Error for an operator."""
    try:
        definition = workflow(state.workflow, state.workflow_version)
    except UnknownWorkflow as error:
        return None if state.process_state.terminal else Transition(lifecycle.fail(state, str(error), now))
    return decide(state, definition)


def _carry_out(
    scheduler: Scheduler, state: OrderState, transition: Transition, order: dict[str, Any],
    results: dict[str, dict[str, Any]], now: datetime,
) -> AgentRequest | None:
    """After the write: close an order that ended, or send the claimed line to its agent.

    A crash between the write and the send leaves a Processing row whose deadline
    passes: the supervisor resets it and the line runs again.
    """
    for line in transition.lines:
        if line.kind is Kind.COMPENSATION:
            telemetry.compensation_ended(line.step, line.state)
    if state.process_state.terminal:
        close_order(
            state, store=scheduler.store, publisher=scheduler.publisher, alerts_queue=scheduler.alerts_queue, now=now
        )
        return None
    if not transition.dispatch:
        return None
    step = lifecycle.step_of(state, workflow(state.workflow, state.workflow_version))
    if step.waiting:  # a waiting step waits alone (never in a group: core/workflow.py Parallel)
        _wait(scheduler, state, step.wait_for, now)
        return None
    claim = names.SPAN_COMPENSATE if state.kind is Kind.COMPENSATION else names.SPAN_CLAIM
    sent = None
    for line in _lines_sent(state, transition):
        with telemetry.span(claim, order_id=state.order_id, step=line.step, kind=state.kind, attempt=line.attempt):
            telemetry.line_claimed(line.step, state.kind, retry=line.failure_count > 0)
            request = _send(scheduler, state, line, order, results, now)
        sent = sent or request
    return sent


@dataclass(frozen=True)
class _Line:
    """A claimed line as its request needs it: a lone line is the row's own; a line of a
    group is its GroupLine (core/models.py)."""

    step_index: int
    step: str
    attempt: int
    complete_by: datetime
    failure_count: int
    postponements: int


def _lines_sent(state: OrderState, transition: Transition) -> list[_Line]:
    """The lines ``transition`` claimed, each to go to its agent."""
    if not state.group:
        return [_Line(state.step_index, state.step or "", state.attempt, state.complete_by, state.failure_count,
                      state.postponements)]
    claimed = set(transition.claimed)
    return [
        _Line(line.step_index, line.step, line.attempt, line.complete_by, line.failure_count, line.postponements)
        for line in state.group if line.step_index in claimed
    ]


def _wait(scheduler: Scheduler, state: OrderState, event: str, now: datetime) -> None:
    """A waiting line was claimed: no agent request, only the submitter's status event.
    Its event (scheduler/events.py) or its deadline (the supervisor) ends it."""
    with telemetry.span(names.SPAN_WAIT, order_id=state.order_id, step=state.step, kind=state.kind,
                        attempt=state.attempt):
        telemetry.line_claimed(state.step, state.kind, retry=False)
        log.info("order %s attempt %s: %s waits for %s until %s", state.order_id, state.attempt, state.step, event,
                 state.complete_by.isoformat())
        scheduler.publisher.send_status(
            StatusEvent(
                order_id=state.order_id, status=Status.WAITING, time=now, step=state.step, attempt=state.attempt,
                detail=f"waiting for {event} until {state.complete_by.isoformat()}",
            ),
            queue=state.reply_to,
        )


def carry_out(
    scheduler: Scheduler, state: OrderState, transition: Transition, order: dict[str, Any],
    results: dict[str, dict[str, Any]], now: datetime,
) -> AgentRequest | None:
    """What follows a transition written outside this module (an external event's,
    scheduler/events.py): close the order, or send the line it claimed."""
    return _carry_out(scheduler, state, transition, order, results, now)


def _send(
    scheduler: Scheduler, state: OrderState, line: _Line, order: dict[str, Any], results: dict[str, dict[str, Any]],
    now: datetime,
) -> AgentRequest:
    """The claimed line's agent request, and the submitter's status event."""
    step = workflow(state.workflow, state.workflow_version).steps[line.step_index]
    policy = step.policy_over(scheduler.defaults)
    action = step.action_of(state.kind)
    request = AgentRequest(
        order_id=state.order_id,
        step=step.name,
        kind=state.kind,
        action=action,
        remote=step.remote,
        attempt=line.attempt,
        complete_by=line.complete_by,
        idempotency_key=idempotency_key(state.order_id, step.name, action),
        policy=AgentPolicy(
            max_calls=policy.agent_max_calls,
            backoff_initial=policy.agent_backoff_initial,
            backoff_max=policy.agent_backoff_max,
        ),
        result=results.get(step.name) if state.kind is Kind.COMPENSATION else None,
        lookup=step.lookup,
        # An earlier attempt of this line timed out, or was postponed (perhaps after a
        # call that timed out): its outcome may be unknown. Asking costs a GET, not a POST.
        settle_first=step.lookup and (line.failure_count > 0 or line.postponements > 0),
        context=Context(fence=state, order=order, results=results),
    )
    log.info(
        "order %s attempt %s: %s %s (%s) claimed by %s",
        state.order_id, line.attempt, state.kind.value, step.name, action, scheduler.instance,
    )
    scheduler.publisher.send_agent_request(
        request, queue=scheduler.requests_queues[step.remote], reply_to=scheduler.responses_queue, now=now
    )
    status = Status.COMPENSATING if state.kind is Kind.COMPENSATION else Status.PROCESSING
    scheduler.publisher.send_status(
        StatusEvent(
            order_id=state.order_id, status=status, time=now, step=step.name, attempt=line.attempt,
            detail=state.cause if state.kind is Kind.COMPENSATION else None,
        ),
        queue=state.reply_to,
    )
    return request
