"""Lifecycle decisions as pure functions: no I/O, no ``azure.*`` import.

Each function takes the state as read (with its ETag) and returns the next state,
or ``None`` when the transition does not apply. The store writes the result with
If-Match on the ETag that came with the input, so a decision made on a row that
someone else has moved since is never written.

::

    Pending ──claim──► Processing ──response(succeeded)────────► Processed
       ▲                   │  └─────response(failed_permanent)─► Error ◄─┐
       │                   └──expired, failures < max──┐                 │
       └───────────────────────────────────────────────┘   expired, failures = max
       └──────────────resubmit (operator)────────────────────── Error
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from core.models import AgentResponse, OrderState, Outcome, ProcessState

#: LastError is a Table string property: keep it far below the 64 KiB limit.
MAX_ERROR_CHARS = 2_000


def _error(text: str | None) -> str | None:
    return None if text is None else text[:MAX_ERROR_CHARS]


def new_order(order_id: str, now: datetime, pending_timeout: timedelta, reply_to: str | None) -> OrderState:
    """The state of a just-submitted order: Pending, to be claimed before ``now + pending_timeout``."""
    return OrderState(
        order_id=order_id,
        process_state=ProcessState.PENDING,
        complete_by=now + pending_timeout,
        reply_to=reply_to,
        created_at=now,
        updated_at=now,
    )


def claim(state: OrderState, instance: str, now: datetime, step_timeout: timedelta) -> OrderState | None:
    """Pending -> Processing for this instance, with a new attempt (fencing token)."""
    if state.process_state is not ProcessState.PENDING:
        return None
    return state.model_copy(
        update={
            "process_state": ProcessState.PROCESSING,
            "locked_by": instance,
            "complete_by": now + step_timeout,
            "attempt": state.attempt + 1,
            "updated_at": now,
        }
    )


def accepts_response(state: OrderState, response: AgentResponse) -> bool:
    """Fencing: only a response for the current attempt of a Processing row counts."""
    return state.process_state is ProcessState.PROCESSING and state.attempt == response.attempt


def complete(state: OrderState, response: AgentResponse, now: datetime) -> OrderState | None:
    """Processing -> Processed (succeeded) or Error (failed_permanent); None if stale."""
    if not accepts_response(state, response):
        return None
    if response.outcome is Outcome.SUCCEEDED:
        return state.model_copy(
            update={"process_state": ProcessState.PROCESSED, "locked_by": None, "last_error": None, "updated_at": now}
        )
    return fail(state, response.error or "the remote service refused the step", now)


def fail(state: OrderState, reason: str, now: datetime) -> OrderState:
    """Any non-terminal state -> Error with the reason."""
    return state.model_copy(
        update={"process_state": ProcessState.ERROR, "locked_by": None, "last_error": _error(reason), "updated_at": now}
    )


def resubmit(state: OrderState, now: datetime, pending_timeout: timedelta) -> OrderState | None:
    """Operator: Error -> Pending with the failure count cleared. The next claim takes a
    new attempt number, so any late response of the failed attempts stays fenced out."""
    if state.process_state is not ProcessState.ERROR:
        return None
    return state.model_copy(
        update={
            "process_state": ProcessState.PENDING,
            "failure_count": 0,
            "locked_by": None,
            "complete_by": now + pending_timeout,
            "updated_at": now,
        }
    )


def backoff(failure_count: int, base: timedelta, cap: timedelta) -> timedelta:
    """The wait before the next try after ``failure_count`` failures: base * 2**(n-1), capped."""
    if failure_count <= 0:
        return timedelta(0)
    return min(cap, base * (2 ** min(failure_count - 1, 30)))


class Verdict(str, Enum):
    NONE = "none"  # not expired, or terminal: nothing to do
    RETRY = "retry"  # expired Processing below the threshold: back to Pending, nudge later
    GIVE_UP = "give_up"  # expired Processing at the threshold: Error + alert
    RENUDGE = "renudge"  # expired Pending: the nudge was lost, nudge again
    DROP_INDEX = "drop_index"  # terminal: only the active index still names it


@dataclass(frozen=True)
class SupervisorPolicy:
    max_failures: int
    step_timeout: timedelta
    pending_timeout: timedelta
    backoff_base: timedelta
    backoff_cap: timedelta


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: The state to write (If-Match), or None when nothing is written to the state row.
    next_state: OrderState | None = None
    #: How long the scheduler nudge waits before it becomes visible.
    nudge_delay: timedelta = timedelta(0)


def supervise(state: OrderState, now: datetime, policy: SupervisorPolicy) -> Decision:
    """The supervisor's verdict on one row. Only expired rows are acted on."""
    if state.process_state.terminal:
        return Decision(Verdict.DROP_INDEX)
    if state.complete_by > now:
        return Decision(Verdict.NONE)
    if state.process_state is ProcessState.PENDING:
        # A Pending row past its deadline lost its nudge (or the scheduler crashed
        # before claiming). Not a failure of the step: no count, just a new deadline.
        renewed = state.model_copy(update={"complete_by": now + policy.pending_timeout, "updated_at": now})
        return Decision(Verdict.RENUDGE, renewed)
    failures = state.failure_count + 1
    reason = f"attempt {state.attempt} did not complete by {state.complete_by.isoformat()}"
    if failures >= policy.max_failures:
        failed = fail(state, f"gave up after {failures} failed attempts; last: {reason}", now)
        return Decision(Verdict.GIVE_UP, failed.model_copy(update={"failure_count": failures}))
    delay = backoff(failures, policy.backoff_base, policy.backoff_cap)
    reset = state.model_copy(
        update={
            "process_state": ProcessState.PENDING,
            "locked_by": None,
            "failure_count": failures,
            "last_error": _error(reason),
            # The retry is due after the backoff; give the scheduler its pending window from then.
            "complete_by": now + delay + policy.pending_timeout,
            "updated_at": now,
        }
    )
    return Decision(Verdict.RETRY, reset, delay)
