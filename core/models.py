"""Message and state models: one pydantic model per message, parsed only at the edge.

- :class:`OrderRequest`: the body of a message on the ``orders`` queue (JSON Schema
  published in ``schemas/order.schema.json``).
- :class:`OrderState`: the process state of one order (the ``state`` row): where it
  stands in its workflow (the current line), with the fencing attempt and deadline.
- :class:`LineRecord`: how one line of the workflow ended (a step's action or its
  compensation; the ``step-NN-…`` / ``undo-NN-…`` rows).
- :class:`Nudge`: a storage-queue message asking the scheduler to look at an order.
- :class:`AgentRequest` / :class:`AgentResponse`: the agent's request/response pair.
- :class:`StatusEvent`: what a submitter receives on its ``ReplyTo`` queue.
- :class:`Alert`: what an operator receives on the ``alerts`` queue.
- :class:`CancelRequest`: the body of a message on the ``order-cancellations`` queue.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any

from core.workflow import WORKFLOWS, Kind, events
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

#: Order ids become Table PartitionKeys and Service Bus message ids. A conservative
#: alphabet keeps them clear of the Table key rules (no ``/ \\ # ?``, no control
#: characters) and of anything an OData filter or a URL could misread.
ORDER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}$"
MAX_ITEMS = 100
#: The MessageId every order message is sent with (:func:`message_id_for`), worded as the
#: docs/clients.md and the published schema state it (tests/infra/test_message_id_rule.py).
MESSAGE_ID_RULE = "the order id + ':' + the first 16 hex digits of the body's SHA-256"
#: The order document is kept as one Table string property (64 KiB = 32K UTF-16
#: characters); this bound leaves room under that limit.
MAX_DOCUMENT_CHARS = 30_000

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def without_control_characters(value: str) -> str:
    """``value`` with its control characters (C0, DEL, C1) taken out."""
    return _CONTROL.sub("", value)


def _no_control_characters(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    return value


def _money(value: Any) -> Any:
    # Money is exact: a JSON string such as "12.50". A JSON number would arrive as a
    # binary float and could already be off by a fraction of a cent.
    if isinstance(value, (float, int)) and not isinstance(value, bool):
        raise ValueError('money must be a decimal string such as "12.50", not a JSON number')
    if isinstance(value, str):
        # [0-9], not \d: in Python \d also matches other scripts' digits ("٢٥").
        if not re.fullmatch(r"[0-9]{1,10}(\.[0-9]{1,2})?", value):
            raise ValueError('money must look like "12.50": digits, at most two decimals, not negative')
        return Decimal(value)
    return value


MONEY_JSON_SCHEMA = {"type": "string", "pattern": r"^[0-9]{1,10}(\.[0-9]{1,2})?$", "examples": ["12.50"]}
Money = Annotated[Decimal, BeforeValidator(_money), WithJsonSchema(MONEY_JSON_SCHEMA)]
OrderId = Annotated[str, StringConstraints(pattern=ORDER_ID_PATTERN)]
Code = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$")]
Text = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_no_control_characters)]


def _known_workflow(value: str) -> str:
    known = sorted({w.name for w in WORKFLOWS.values()})
    if value not in known:
        raise ValueError(f"unknown workflow {value!r}; known: {', '.join(known)}")
    return value


WorkflowName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,39}$"),
    AfterValidator(_known_workflow),
    WithJsonSchema({"type": "string", "enum": sorted({w.name for w in WORKFLOWS.values()})}),
]


def _known_event(value: str) -> str:
    if value not in events():
        raise ValueError(f"no workflow waits for an event {value!r}; known: {', '.join(events())}")
    return value


#: The name of an event some workflow waits for (core/workflow.py, ``Step.wait_for``).
EventName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z][a-z0-9]{0,30}$"),
    AfterValidator(_known_event),
    WithJsonSchema({"type": "string", "enum": list(events())}),
]
#: The MessageId every order-event message is sent with (:func:`event_message_id`), worded
#: as docs/clients.md states it ("Sending order events").
EVENT_MESSAGE_ID_RULE = "the order id + ':' + the event name + ':' + the first 16 hex digits of the body's SHA-256"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OrderItem(_Message):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sku: Code
    quantity: int = Field(gt=0, le=10_000)
    unit_price: Money


class OrderRequest(_Message):
    """An order as any Service Bus client sends it (the body of an ``orders`` message)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        title="OrderRequest",
        json_schema_extra={"description": "Body of a message on the orders queue (content type application/json)."},
    )

    order_id: OrderId = Field(
        description=f"Unique order id. Send the order with MessageId = {MESSAGE_ID_RULE}: duplicate detection then "
        "drops an identical resend, while a corrected order (a new body) gets through."
    )
    customer_id: Code
    customer_name: Text | None = None
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. EUR")
    items: list[OrderItem] = Field(min_length=1, max_length=MAX_ITEMS)
    total: Money = Field(description="Must equal the sum of quantity * unit_price.")
    notes: Annotated[str, StringConstraints(max_length=2_000), AfterValidator(_no_control_characters)] | None = None
    workflow: WorkflowName | None = Field(
        None,
        description="The workflow the order runs on, by name (its newest version): order (reserve, charge, ship; "
        "the default when absent), order-approval (reserve, then wait for an approval until the deployment's "
        "deadline, APPROVAL_TIMEOUT_SECONDS, a day by default, then charge, ship) or order-parallel (reserve and "
        "charge at once, then ship). The client chooses: docs/workflows.md.",
    )

    @model_validator(mode="after")
    def _total_matches_items(self) -> OrderRequest:
        expected = sum((item.quantity * item.unit_price for item in self.items), Decimal(0))
        if expected != self.total:
            raise ValueError(f"total {self.total} does not equal the sum of the items ({expected})")
        if len(self.document()) > MAX_DOCUMENT_CHARS:
            raise ValueError(f"the order is larger than {MAX_DOCUMENT_CHARS} characters")
        return self

    def document(self) -> str:
        """The canonical JSON of this order (what is stored and compared for duplicates)."""
        return self.model_dump_json(exclude_none=True)

    def message_id(self) -> str:
        """The MessageId to send it with: the order id and a hash of its content, so the
        queue's duplicate detection drops an identical resend but lets a corrected order
        through (docs/clients.md, "Sending orders")."""
        return message_id_for(self.order_id, self.document().encode())


class EventBody(BaseModel):
    """An external event's answer (the body of ``POST /api/orders/{id}/events/{name}``):
    approved or not, by whom, with an optional note. Ends a waiting step: approved, the
    workflow goes on and this is the step's result; rejected, the earlier steps are undone."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    approved: bool
    by: Text
    note: Annotated[str, StringConstraints(max_length=500), AfterValidator(_no_control_characters)] | None = None

    def result(self) -> dict[str, Any]:
        """As recorded on the line (and compared to tell a duplicate)."""
        return self.model_dump(mode="json", exclude_none=True)


class OrderEvent(EventBody):
    """An external event as any Service Bus client sends it (the body of an
    ``order-events`` message): the order, the event's name, and its answer."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        title="OrderEvent",
        json_schema_extra={"description": "Body of a message on the order-events queue (content type application/json)."},
    )

    order_id: OrderId = Field(
        description=f"The order whose step waits for the event. Send the message with MessageId = {EVENT_MESSAGE_ID_RULE}:"
        " duplicate detection then drops an identical resend."
    )
    name: EventName = Field(description="The event the order's waiting step waits for (e.g. approval).")

    def body(self) -> EventBody:
        return EventBody(approved=self.approved, by=self.by, note=self.note)

    def message_id(self) -> str:
        """:data:`EVENT_MESSAGE_ID_RULE`: duplicate detection drops an identical resend."""
        return event_message_id(self.order_id, self.name, self.model_dump_json(exclude_none=True).encode())


def event_message_id(order_id: str, name: str, body: bytes) -> str:
    """The MessageId of an order-event message: :data:`EVENT_MESSAGE_ID_RULE`."""
    return f"{order_id}:{name}:{hashlib.sha256(body).hexdigest()[:16]}"


class ProcessState(str, Enum):
    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    COMPENSATED = "Compensated"
    ERROR = "Error"

    @property
    def terminal(self) -> bool:
        return self in (ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.ERROR)


class LineRun(str, Enum):
    """Where one line of a group in flight stands (:class:`GroupLine`): not ended
    (Pending, Processing), or how it ended (the :class:`LineState` of its row)."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    DONE = "Done"
    REFUSED = "Refused"
    EXHAUSTED = "Exhausted"
    #: Not run again: its group stopped (a sibling failed, or a cancel) while it waited
    #: for a retry; its earlier attempts, settled, are undone with the others.
    CANCELLED = "Cancelled"

    @property
    def open(self) -> bool:
        return self in (LineRun.PENDING, LineRun.PROCESSING)


class GroupLine(BaseModel):
    """One line of a group of steps that run at once (core/workflow.py ``Parallel``),
    while the group is in flight: the generic part of a line, kept per line on the state
    row (``OrderState.group``). The supervisor reads it as it reads a lone line's fields on
    the row: deadline, failures, attempt; never what the step does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_index: int
    step: str
    state: LineRun
    #: The fencing token of its last claim (from the order's one counter, ``OrderState.attempt``).
    attempt: int = 0
    #: Processing: its attempt's Complete-By. Pending: when it is due, plus the pending timeout.
    complete_by: AwareDatetime
    #: The latest Complete-By of any attempt of it: no request of the line acts after it.
    acts_until: AwareDatetime | None = None
    failure_count: int = 0
    max_failures: int | None = None
    postponements: int = 0
    gave_up: bool = False
    last_error: str | None = None


class OrderState(BaseModel):
    """The process state of one order (the ``state`` row of its partition).

    The supervisor reads only the generic part (``process_state``, ``complete_by``,
    ``failure_count``, ``max_failures``, ``attempt``); the workflow part (``step_index``,
    ``kind``, ``plan``, ``failed``) is the scheduler's.
    """

    model_config = ConfigDict(frozen=True)

    order_id: str
    process_state: ProcessState
    complete_by: AwareDatetime
    locked_by: str | None = None
    #: Failed attempts of the current line (reset when the next line starts).
    failure_count: int = 0
    #: Fencing token: increases on every claim, of any line. A response for any other attempt is stale.
    attempt: int = 0
    last_error: str | None = None
    reply_to: str | None = None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    # -- where the order stands in its workflow ------------------------------------
    workflow: str = "order"
    workflow_version: int = 1
    #: The current line: step ``step_index`` (0-based), its action or its compensation.
    step_index: int = 0
    kind: Kind = Kind.ACTION
    #: The current step's name (for readers: the supervisor's events, the operator).
    step: str | None = None
    #: While compensating: the steps still to undo after the current one, in order.
    plan: tuple[int, ...] = ()
    #: Steps whose compensation could not be done (the order ends in Error).
    failed: tuple[int, ...] = ()
    #: Why the order is being undone (the refusal, or the step that gave up).
    cause: str | None = None
    #: Set by the supervisor when the current line ran out of failures: the scheduler
    #: decides what that means (compensate, or go on compensating the others).
    gave_up: bool = False
    #: The current line's failure limit, set at its claim (None: the supervisor's default).
    max_failures: int | None = None
    #: Times in a row the current line was postponed because its remote service was
    #: down (an agent's circuit breaker was open); a cap turns a long wait into a failure.
    postponements: int = 0
    #: Set at submission for the operator: e.g. why the order's ReplyTo was ignored.
    note: str | None = None
    #: The W3C ``traceparent`` of the order's submission, set once: the supervisor's
    #: resets and an operator's resubmit continue the order's trace from it.
    trace_parent: str | None = None
    #: A cancel recorded on the row (core/lifecycle.request_cancel): when, why and who
    #: asked. Set once, never cleared; no forward step starts after it.
    cancel_requested_at: AwareDatetime | None = None
    cancel_reason: str | None = None
    cancelled_by: str | None = None
    #: The lines of a group of steps that run at once, while the group is in flight (its
    #: actions; empty otherwise). The current line is then the group's first step, and
    #: ``process_state``, ``complete_by`` and ``attempt`` sum the lines up: Processing while
    #: one is with its agent, the earliest deadline of the open ones, the last attempt given.
    group: tuple[GroupLine, ...] = ()
    #: The row's ETag when it was read (not stored); every transition is If-Match on it.
    etag: str | None = None

    @property
    def compensating(self) -> bool:
        return self.kind is Kind.COMPENSATION


class LineState(str, Enum):
    """How a line of the workflow ended."""

    DONE = "Done"
    #: The remote refused the action permanently: nothing was applied.
    REFUSED = "Refused"
    #: The action ran out of failures: its outcome is unknown.
    EXHAUSTED = "Exhausted"
    #: The compensation could not be done (refused, exhausted, or none declared).
    FAILED = "Failed"
    #: The action's line was ended by a cancel before it could be claimed again: not run
    #: since (its earlier attempts, if any, are undone with the steps before it).
    CANCELLED = "Cancelled"


class Line(BaseModel):
    """One line of a workflow: a step's action or its compensation, and how it went."""

    model_config = ConfigDict(frozen=True)

    step: str
    kind: Kind
    action: str | None
    #: The attempt (fencing token) of the line's last claim.
    attempt: int | None = None
    failure_count: int = 0
    last_error: str | None = None
    #: The remote service's answer (kept for later steps and for the compensation).
    result: dict[str, Any] | None = None


class LineRecord(Line):
    """How one line ended: the step rows."""

    order_id: str
    step_index: int
    state: LineState
    updated_at: AwareDatetime


class Nudge(_Message):
    """Asks the scheduler to look at an order.

    ``state`` (with its ETag) and ``document`` are a snapshot the sender already had: a
    claim, never the row. Only an order's first claim uses them instead of a read, and
    its transaction proves them (the first-claim seal: :func:`first_claim_key`); any
    other nudge is decided on the row as read (scheduler/dispatch.py).
    """

    order_id: str
    state: OrderState | None = None
    document: str | None = None
    #: The sender's trace context (W3C), so the claim it leads to joins the order's trace.
    traceparent: str | None = None
    tracestate: str | None = None


class AgentPolicy(_Message):
    """How the agent retries one attempt (from the step's policy)."""

    max_calls: int = Field(ge=1)
    backoff_initial: float = Field(gt=0)
    backoff_max: float = Field(gt=0)


class Context(_Message):
    """What the scheduler hands along with a request and gets back with the response:
    opaque to the agent, echoed unchanged. A claim only: the scheduler checks it
    (core/claims.py) and decides on the rows it reads, never on this."""

    #: The state row as claimed for this attempt (with its ETag): the fence.
    fence: OrderState
    #: The order document.
    order: dict[str, Any]
    #: Results of the steps done so far, by step name.
    results: dict[str, dict[str, Any]] = Field(default_factory=dict)


class AgentRequest(_Message):
    order_id: str
    step: str
    kind: Kind
    #: ``POST {remote}/{action}``.
    action: str
    remote: str
    attempt: int
    complete_by: AwareDatetime
    idempotency_key: str
    policy: AgentPolicy
    #: For a compensation: the forward action's result (None when its outcome is unknown).
    result: dict[str, Any] | None = None
    #: The remote offers a lookup by idempotency key for this action (the step declares
    #: it): after a call whose outcome is unknown, the agent asks before sending again.
    lookup: bool = False
    #: The previous attempt's outcome is unknown (it timed out) and the remote offers a
    #: lookup by idempotency key: ask before sending the action again.
    settle_first: bool = False
    context: Context

    @property
    def order(self) -> dict[str, Any]:
        return self.context.order


class Outcome(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED_PERMANENT = "failed_permanent"
    #: The remote service is down (the agent's circuit breaker is open): the line was not
    #: run and did not fail; it waits ``retry_after_seconds`` and runs again.
    POSTPONED = "postponed"


class AgentResponse(_Message):
    order_id: str
    step: str
    kind: Kind
    attempt: int
    outcome: Outcome
    result: dict[str, Any] | None = None
    error: str | None = None
    #: With POSTPONED: how long until the remote service may be called again.
    retry_after_seconds: float | None = None
    context: Context


class Status(str, Enum):
    RECEIVED = "received"
    PROCESSING = "processing"
    RETRYING = "retrying"
    #: A cancel was recorded: the line in flight settles, then the order is undone.
    CANCELLING = "cancelling"
    COMPENSATING = "compensating"
    #: A waiting step began: the detail names the event and its deadline.
    WAITING = "waiting"
    PROCESSED = "processed"
    COMPENSATED = "compensated"
    FAILED = "failed"
    #: The order message was refused (invalid, or another order under the same id): the
    #: detail says why; fix it and send it again (docs/clients.md, "Sending orders").
    REJECTED = "rejected"


class StatusEvent(_Message):
    order_id: str
    status: Status
    time: AwareDatetime
    #: The step it is about (processing, retrying, compensating).
    step: str | None = None
    detail: str | None = None
    attempt: int | None = None


class Alert(_Message):
    order_id: str
    failure_count: int
    last_error: str | None
    time: AwareDatetime
    reason: str
    #: The step the order stopped at.
    step: str | None = None
    #: The steps whose compensation could not be done.
    failed_compensations: list[str] = Field(default_factory=list)


#: A cancel's reason: short text, no control characters (core/lifecycle.py keeps it in Cause).
CANCEL_REASON_MAX_CHARS = 500
CancelReason = Annotated[
    str, StringConstraints(min_length=1, max_length=CANCEL_REASON_MAX_CHARS, strip_whitespace=True),
    AfterValidator(_no_control_characters),
    WithJsonSchema({
        "type": "string", "minLength": 1, "maxLength": CANCEL_REASON_MAX_CHARS,
        "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
        "description": "Why: kept on the order and named in its cause. No control characters; leading and "
        "trailing white space is dropped (white space alone is refused).",
    }),
]
#: The MessageId every cancel message is sent with (:func:`cancel_message_id`), worded as
#: docs/clients.md states it: one cancel per order, so duplicate detection drops any repeat.
CANCEL_MESSAGE_ID_RULE = "'cancel:' + the order id"


class CancelRequest(_Message):
    """A request to cancel an order: the body of a message on the ``order-cancellations``
    queue, and of ``POST /api/orders/{id}/cancel`` (without ``order_id``, which the route names)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        title="CancelRequest",
        json_schema_extra={
            "description": "Body of a message on the order-cancellations queue (content type application/json)."
        },
    )

    order_id: OrderId = Field(
        description=f"The order to cancel. Send the message with MessageId = {CANCEL_MESSAGE_ID_RULE}: duplicate "
        "detection then drops a resend within a day; a cancel is idempotent after that."
    )
    reason: CancelReason | None = None


def cancel_message_id(order_id: str) -> str:
    """The MessageId of a cancel message: :data:`CANCEL_MESSAGE_ID_RULE`."""
    return f"cancel:{order_id}"


_KEY_NAMESPACE = uuid.UUID("6c1f2f55-3c1b-4f7e-9a51-4d9e3b0c2a11")


def idempotency_key(order_id: str, step: str, action: str) -> str:
    """The key the remote service sees for one action (or compensation) of a step: the
    same for every retry of it (the agent's own retries, the supervisor's re-runs and
    operator resubmits), and different between a step's action and its compensation."""
    return str(uuid.uuid5(_KEY_NAMESPACE, f"{order_id}/{step}/{action}"))


def message_id_for(order_id: str, body: bytes) -> str:
    """The MessageId of an order message: :data:`MESSAGE_ID_RULE`. Every sender of orders
    (``ordersctl send-order``, the demo, the soak, the benchmarks, the tests) uses this."""
    return f"{order_id}:{hashlib.sha256(body).hexdigest()[:16]}"


_HOST = re.compile(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:[0-9]+)?$")


def queue_key(name: str) -> str:
    """A Service Bus queue name as the broker resolves it, to compare two spellings.

    Entity names are case-insensitive in Service Bus, and an entity is addressed as the
    path of ``sb://<namespace>.servicebus.windows.net/<path>``, with ``/`` separating
    segments; a subqueue is a segment after the queue (``orders/$DeadLetterQueue``).
    https://learn.microsoft.com/rest/api/servicebus/send-message (namespace and paths),
    https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues
    So ``ORDERS``, ``orders/``, ``/orders``, `` orders ``, ``orders/$DeadLetterQueue``,
    ``sb://ns.servicebus.windows.net/orders`` and ``ns.servicebus.windows.net/orders``
    all give ``orders``. Errs towards "the same": used to keep a client's ReplyTo off
    the app's own queues, where a false match only costs the client its status events.
    """
    text = name.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    parts = [part.strip() for part in text.split("/") if part.strip()]
    if len(parts) > 1 and _HOST.match(parts[0]) and "." in parts[0]:
        parts = parts[1:]  # a namespace's host name in front of the entity path
    while len(parts) > 1 and parts[-1].startswith("$"):
        parts = parts[:-1]  # $DeadLetterQueue, $Transfer/$DeadLetterQueue, $management
    return "/".join(parts).casefold()


FIRST_CLAIM_PREFIX = "first-claim-"


def first_claim_key(workflow: str, version: int, reply_to: str | None, document: str) -> str:
    """The RowKey of the row that seals an order's first claim: written with the order at
    submission, deleted by the first write over the order (its first claim, or a cancel,
    a supervisor's verdict before it) in that write's transaction (adapters/store.py). It
    names what the first claim takes from the nudge instead of reading it (the
    workflow, the ReplyTo and the document), so a nudge that lies about any of them, or
    one for an order written over since, finds no such row and its claim fails whole
    (scheduler/dispatch.py)."""
    digest = hashlib.sha256(f"{workflow}\n{version}\n{reply_to or ''}\n{document}".encode()).hexdigest()
    return f"{FIRST_CLAIM_PREFIX}{digest[:32]}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def explain(error: ValidationError, most: int = 10) -> str:
    """A validation error as ``field.path: message`` per problem (the first ``most`` of them)."""
    problems = error.errors(include_url=False)
    lines = [f"{'.'.join(str(part) for part in p['loc']) or 'body'}: {p['msg']}" for p in problems[:most]]
    if len(problems) > most:
        lines.append(f"and {len(problems) - most} more problems")
    return "; ".join(lines)
