"""What an internal message claims, checked before anything acts on it. Pure: no I/O.

A nudge, an agent request and an agent response are the app's own messages, but
whatever arrives on a queue may have been written by anyone who can send to it. Their
fields are claims, never credentials: the fence or state snapshot a message carries
(with its ETag) does not prove what the row holds, so the scheduler decides on the row
it reads, never on a snapshot (scheduler/dispatch.py). These checks drop at once what
no copy of this app could have sent (docs/failure-handling.md): each returns the
reason the message cannot be acted on, or None.
"""

from __future__ import annotations

import json
import math
import re

from core.models import ORDER_ID_PATTERN, AgentRequest, AgentResponse, LineRun, Nudge, OrderState, ProcessState
from core.workflow import Kind, UnknownWorkflow, Workflow, workflow

#: The one form of ETag Table Storage gives an entity (and Azurite does too): weak, a
#: ``datetime`` literal of the entity's Timestamp, URL-encoded, e.g.
#: ``W/"datetime'2026-11-24T23%3A25%3A17.1234567Z'"``. A wildcard (``*``) matches any
#: row: it is no ETag anyone read.
#: https://learn.microsoft.com/rest/api/storageservices/update-entity2 (If-Match)
ETAG_PATTERN = re.compile(
    r"""W/"datetime'[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}%3A[0-9]{2}%3A[0-9]{2}(\.[0-9]{1,7})?Z'\""""
)
#: The fencing token is a Table Int32 (every claim adds one).
MAX_ATTEMPT = 2**31 - 1
#: A step's result is kept on its line's row (a 64 KiB string property, UTF-16): a
#: larger one could never be written.
MAX_RESULT_CHARS = 16_000
#: A postponement waits for the remote's breaker to close again, never longer than a day.
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0

_ORDER_ID = re.compile(ORDER_ID_PATTERN)


class Untrusted(ValueError):
    """A message that cannot be acted on; the text says why."""


def concrete_etag(etag: str | None) -> bool:
    """True for an ETag of the form Table Storage returns; False for None, ``*``, or anything else."""
    return etag is not None and ETAG_PATTERN.fullmatch(etag) is not None


def check_nudge(nudge: Nudge) -> str | None:
    """The reason a nudge cannot be acted on, or None. Its snapshot is optional; one
    that is there must be about the same order and carry a concrete ETag."""
    return _reason(lambda: _nudge(nudge))


def check_response(response: AgentResponse) -> str | None:
    """The reason an agent response cannot be acted on, or None."""
    return _reason(lambda: _response(response))


def check_request(request: AgentRequest, remote: str) -> str | None:
    """The reason an agent request cannot be run by ``remote``'s agent, or None: the
    action and the remote must be the workflow's for the step and kind it names."""
    return _reason(lambda: _request(request, remote))


def _reason(check) -> str | None:
    try:
        check()
    except Untrusted as error:
        return str(error)
    return None


def _order_id(order_id: str) -> None:
    if not _ORDER_ID.fullmatch(order_id):
        raise Untrusted(f"order id {order_id[:120]!r} is not a valid order id (core/models.py ORDER_ID_PATTERN)")


def _nudge(nudge: Nudge) -> None:
    _order_id(nudge.order_id)
    state = nudge.state
    if state is None:
        return
    if state.order_id != nudge.order_id:
        raise Untrusted(f"its snapshot is of order {state.order_id[:120]!r}, not {nudge.order_id!r}")
    if state.etag is not None and not concrete_etag(state.etag):
        raise Untrusted(f"its snapshot's ETag {state.etag[:120]!r} is not one Table Storage returns")
    try:
        definition = workflow(state.workflow, state.workflow_version)
    except UnknownWorkflow:
        return  # the row decides: an order whose definition is gone ends in Error
    _within(state, definition)


def _fence(order_id: str, step: str, kind, attempt: int, fence: OrderState) -> tuple[Workflow, int]:
    """The fence a request or response carries: the row as claimed for this attempt (in
    a group: with that line Processing). The workflow, and the index of the step named."""
    _order_id(order_id)
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise Untrusted(f"attempt {attempt} is not between 1 and {MAX_ATTEMPT}")
    if fence.order_id != order_id:
        raise Untrusted(f"its fence is of order {fence.order_id[:120]!r}, not {order_id!r}")
    index = fence.step_index
    if fence.group:
        line = next((line for line in fence.group if (line.step, line.attempt) == (step, attempt)), None)
        if line is None or line.state is not LineRun.PROCESSING or kind is not Kind.ACTION:
            raise Untrusted(f"its fence's group has no {kind.value} {step[:60]!r} in flight at attempt {attempt}")
        index = line.step_index
    elif (fence.attempt, fence.step, fence.kind) != (attempt, step, kind):
        raise Untrusted(
            f"its fence (attempt {fence.attempt}, {fence.kind.value} {str(fence.step)[:60]!r}) is not the line it names"
        )
    if fence.process_state is not ProcessState.PROCESSING:
        raise Untrusted(f"its fence is {fence.process_state.value}, not a claimed (Processing) line")
    if not concrete_etag(fence.etag):
        raise Untrusted(f"its fence's ETag {str(fence.etag)[:120]!r} is not one Table Storage returns")
    try:
        definition = workflow(fence.workflow, fence.workflow_version)
    except UnknownWorkflow as error:
        raise Untrusted(str(error)) from None
    _within(fence, definition)
    if definition.steps[index].action_of(kind) is None:
        raise Untrusted(f"step {step!r} has no {kind.value}")
    return definition, index


def _within(state: OrderState, definition: Workflow) -> None:
    """Indexes inside the workflow, and the step's name the one at its index."""
    count = len(definition.steps)
    if not 0 <= state.step_index < count:
        raise Untrusted(f"step index {state.step_index} is not a step of {definition} ({count} steps)")
    expected = definition.steps[state.step_index].name
    if state.step is not None and state.step != expected:
        raise Untrusted(f"step {state.step[:60]!r} is not step {state.step_index} of {definition} ({expected!r})")
    if any(not 0 <= i < count for i in (*state.plan, *state.failed)):
        raise Untrusted(f"its plan or failed steps name a step {definition} does not have")
    if state.attempt < 0 or state.attempt > MAX_ATTEMPT:
        raise Untrusted(f"attempt {state.attempt} is out of range")
    if state.group:
        stage = definition.stage_of(state.step_index)
        named = tuple((line.step_index, line.step) for line in state.group)
        if state.kind is not Kind.ACTION or named != tuple((i, definition.steps[i].name) for i in stage) or len(stage) < 2:
            raise Untrusted(f"its group's lines are not a group of {definition} starting at step {state.step_index}")
        if any(not 0 <= line.attempt <= state.attempt for line in state.group):
            raise Untrusted("a line of its group has an attempt the order never gave")


def _response(response: AgentResponse) -> None:
    _fence(response.order_id, response.step, response.kind, response.attempt, response.context.fence)
    if response.result is not None and len(json.dumps(response.result, separators=(",", ":"))) > MAX_RESULT_CHARS:
        raise Untrusted(f"its result is larger than {MAX_RESULT_CHARS} characters")
    wait = response.retry_after_seconds
    if wait is not None and not (math.isfinite(wait) and 0 <= wait <= MAX_RETRY_AFTER_SECONDS):
        raise Untrusted(f"retry_after_seconds {wait} is not between 0 and {MAX_RETRY_AFTER_SECONDS:.0f}")


def _request(request: AgentRequest, remote: str) -> None:
    definition, index = _fence(request.order_id, request.step, request.kind, request.attempt, request.context.fence)
    step = definition.steps[index]
    if request.remote != remote or step.remote != remote:
        raise Untrusted(f"step {step.name!r} runs at {step.remote!r}, not at {remote!r} (request names {request.remote[:60]!r})")
    if request.action != step.action_of(request.kind):
        raise Untrusted(f"action {request.action[:60]!r} is not the {request.kind.value} of step {step.name!r}")
