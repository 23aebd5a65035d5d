"""The order saga as the Temporal peer runs it: plain data, derived from the app's own
definition (``core.workflow.CURRENT``) and step policies, so both sides run the same
steps with the same retry and timeout policy.

Temporal's retry policy and timeouts stand in for the app's (docs/benchmarks.md, phase
``temporal``):

==============================  =============================================================
the app                         the peer's activity
==============================  =============================================================
REMOTE_CALL_TIMEOUT_SECONDS     ``start_to_close_timeout``: one call
AGENT_BACKOFF_INITIAL/MAX       ``RetryPolicy.initial_interval`` / ``maximum_interval`` (×2)
AGENT_MAX_CALLS × MAX_FAILURES  ``RetryPolicy.maximum_attempts``: the agent's calls per
                                attempt times the supervisor's attempts
STEP_TIMEOUT_SECONDS ×          ``schedule_to_close_timeout``: the step's deadline over every
MAX_FAILURES                    attempt
a 4xx refusal (never retried)   ``ApplicationError(type=PERMANENT, non_retryable=True)``
==============================  =============================================================

This module is imported by the workflow through the sandbox's pass-through (it is
deterministic data), by the activities and by the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from adapters.settings import Settings
from core.workflow import CURRENT, StepPolicy, Workflow

#: The task queue the peer's workers poll.
TASK_QUEUE = "order-saga"
#: The workflow type's name.
WORKFLOW = "OrderSaga"
#: The activity type's name: one activity for every step's action and compensation, as
#: the app has one agent per remote service with the action in the request.
ACTIVITY = "call_remote"
#: The ApplicationError type of a refusal (a 4xx other than 408/429): never retried.
PERMANENT = "PermanentRemoteError"
#: The ApplicationError type of an answer worth another try (408, 429, 5xx, a bad body).
TRANSIENT = "TransientRemoteError"


@dataclass(frozen=True)
class ActivityPolicy:
    """One step's retry and timeout policy as Temporal takes it (see the module's table)."""

    call_timeout: timedelta
    step_deadline: timedelta
    retry: RetryPolicy


@dataclass(frozen=True)
class SagaStep:
    name: str
    remote: str
    action: str
    compensate: str | None
    lookup: bool
    policy: ActivityPolicy


@dataclass
class SagaInput:
    """One order: its id and document (the order message's body, parsed)."""

    order_id: str
    order: dict[str, Any]


@dataclass
class RemoteCall:
    """One call of a step's action or compensation, as the app's agent request carries it."""

    order_id: str
    step: str
    remote: str
    action: str
    #: ``"action"`` or ``"compensation"`` (``core.workflow.Kind``).
    kind: str
    order: dict[str, Any]
    #: For a compensation: the forward action's result (None when its outcome is unknown).
    result: dict[str, Any] | None = None
    #: The remote offers a lookup by idempotency key for this action.
    lookup: bool = False


@dataclass
class SagaResult:
    order_id: str
    #: ``core.models.ProcessState``'s value: Processed, Compensated or Error.
    state: str
    #: Each step's result, by step name.
    results: dict[str, Any] = field(default_factory=dict)
    #: The compensations run, in the order they ran: the remote's answers.
    undone: list[dict[str, Any]] = field(default_factory=list)
    #: The steps whose compensation failed, and why the order stopped.
    failed: list[str] = field(default_factory=list)
    reason: str | None = None


def activity_policy(policy: StepPolicy, call_timeout: float) -> ActivityPolicy:
    """A step's policy (every field set: :meth:`StepPolicy.over` the defaults) for Temporal."""
    return ActivityPolicy(
        call_timeout=timedelta(seconds=call_timeout),
        step_deadline=timedelta(seconds=policy.timeout_seconds * policy.max_failures),
        retry=RetryPolicy(
            initial_interval=timedelta(seconds=policy.agent_backoff_initial),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=policy.agent_backoff_max),
            maximum_attempts=policy.agent_max_calls * policy.max_failures,
            non_retryable_error_types=[PERMANENT],
        ),
    )


def saga_steps(definition: Workflow = CURRENT, settings: Settings | None = None) -> tuple[SagaStep, ...]:
    """The definition's steps with the app settings' policies (by default, the app's defaults:
    the benchmark runs both sides with them)."""
    settings = settings or Settings.model_construct()  # every field at its default, no connection needed
    defaults = settings.step_defaults()
    return tuple(
        SagaStep(step.name, step.remote, step.action, step.compensate, step.lookup,
                 activity_policy(step.policy_over(defaults), settings.remote_call_timeout_seconds))
        for step in definition.steps
    )


#: The steps the workflow runs (the app's current definition, the app's default policies).
STEPS = saga_steps()
