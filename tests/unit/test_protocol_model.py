"""The protocol, model-checked: a Hypothesis state machine explores interleavings of
submissions, two competing schedulers, agents, two overlapping supervisors, crashes,
lost, duplicated, delayed and stale messages, a forger's first-claim nudges, a breaker
opening and closing, the clock, an operator's resubmits and cancels, approvals and
rejections of orders on the approval workflow (``order-approval``: a waiting step), over
the REAL code:
``scheduler.submission.submit``, ``scheduler.dispatch.schedule`` / ``record``,
``supervisor.supervision.sweep`` / ``resubmit``, ``scheduler.cancellation.cancel``,
``scheduler.events.receive_message``, ``agents.agent.run`` and
``adapters.store.StateStore`` over the in-memory ETag-enforcing table (tests/memtable.py), each
scheduler instance with the cache of its own writes its process would hold
(``adapters.order_cache.OrderCache``, the orders it submitted too). Only the edges are the model's: the network
(a bag of messages any of which may be taken next), the clock, and the remote services
(a ledger per service that applies an action or a compensation at most once per
idempotency key).

After every event it checks the invariants (docs/workflows.md, "How the protocol is
checked"); once the faults stop it runs the clock forward, delivering everything, and
checks that every order ends within ``core.liveness.order_bound``.

Each run draws the step timeout T and the pending timeout P once (``TIMEOUTS``: T = P, T
under P, T over P), and the scheduler, the supervisor and the bound all run on them: some
deadlines are written as T from now, others as P, or T + P, and only T != P tells them
apart. The scripted tests run on T = P = 30 s (``DEFAULTS``, ``PENDING``).

A failure prints the shrunk sequence of events (each rule's call, and a ``note`` saying
what it did). ``PROTOCOL_MODEL_EXAMPLES=2000`` runs it longer (and
``PROTOCOL_MODEL_STEPS`` sets the events per run).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from adapters.order_cache import OrderCache
from adapters.store import RejectionStore, StateStore, line_key
from agents import agent
from agents.breaker import BreakerOpen
from agents.remote import DeadlineReached, PermanentRemoteError, TransientRemoteError
from core import liveness, retention
from core.lifecycle import SupervisorPolicy
from core.liveness import Timing
from core.models import (
    FIRST_CLAIM_PREFIX,
    AgentRequest,
    AgentResponse,
    LineRun,
    LineState,
    Nudge,
    OrderState,
    Outcome,
    ProcessState,
    idempotency_key,
)
from core.models import OrderEvent
from core.workflow import (
    APPROVAL_WORKFLOW,
    CURRENT,
    PARALLEL_WORKFLOW,
    Kind,
    StepPolicy,
    Workflow,
    remotes,
    shortest_timeout,
)
from devtools.orders import order_dict
from scheduler import cancellation, dispatch, events, submission
from supervisor import supervision
from tests.memtable import MemoryTable

# --- the model's settings ---------------------------------------------------------------
# Small limits, so that a few events reach every path: give-ups, postponements that count.

WORKFLOW = CURRENT
#: What an order runs on: the default workflow, the approval one (its waiting step ends on
#: an ``approval`` event, sent by the model's clients through scheduler.events), or the
#: parallel one (``order-parallel``: its first two steps run at once, as a group).
WORKFLOWS = (WORKFLOW, APPROVAL_WORKFLOW, PARALLEL_WORKFLOW)
T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
DEFAULTS = StepPolicy(
    timeout_seconds=30, max_failures=2, agent_max_calls=2, agent_backoff_initial=0.1, agent_backoff_max=1,
    # APPROVAL_TIMEOUT_SECONDS shorter than the step timeout (at T = 30 s): the sweep then reads
    # orders indexed 20 s ago (SupervisorPolicy.shortest_timeout, as supervision.policy_from sets it).
    wait_timeout_seconds=20,
)
PENDING = timedelta(seconds=30)
MAX_POSTPONEMENTS = 2
TIMING = Timing(
    supervisor_interval=timedelta(seconds=10), pending_timeout=PENDING, backoff_base=timedelta(seconds=2),
    backoff_cap=timedelta(seconds=60), breaker_open=timedelta(seconds=30), breaker_jitter=0.25,
    # A response awaited 10 s past its attempt's deadline (RESPONSE_GRACE_SECONDS): the
    # model's delayed responses land inside and after it, and the bound includes it.
    response_grace=timedelta(seconds=10),
)
POLICY = SupervisorPolicy(
    max_failures=DEFAULTS.max_failures, step_timeout=timedelta(seconds=DEFAULTS.timeout_seconds),
    pending_timeout=PENDING, backoff_base=TIMING.backoff_base, backoff_cap=TIMING.backoff_cap,
    response_grace=TIMING.response_grace, send_slack=timedelta(seconds=3),
    shortest_timeout=timedelta(seconds=shortest_timeout(DEFAULTS)),
)
#: (T, P) in seconds, one pair drawn per run: T = P first (a failure shrinks to it if it
#: shows there too), then a step timeout under, over, and a pending timeout under it.
TIMEOUTS = ((30, 30), (5, 30), (60, 30), (10, 5))

SCHEDULERS = ("scheduler-1", "scheduler-2")
#: How long a scheduler trusts what it wrote (the app: the pending timeout). Longer here, so
#: entries live past the deadlines, resets and other instances' claims that make them stale;
#: an entry too old is only a read more, which the model runs anyway.
CACHE_AGE = timedelta(minutes=10)
SUPERVISORS = ("supervisor-1", "supervisor-2")
MAX_ORDERS = 3
ALERTS = "alerts"

EXAMPLES = int(os.environ.get("PROTOCOL_MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("PROTOCOL_MODEL_STEPS", "80"))


#: Whether a taken message stays to be delivered again (at least once delivery).
AGAIN = st.sampled_from((False, False, True))
#: After how many effects (writes, sends) a handler dies: mostly never (0), then 1 to 3.
CRASH_AFTER = st.sampled_from((0, 0, 0, 1, 2, 3))


class Crash(BaseException):
    """The process dies here: a BaseException, so no ``except Exception`` of the app's
    can swallow it, as none could swallow a real crash."""


class Fuse:
    """Counts a handler's effects (table writes, messages sent) and blows after the n-th:
    the write or send is done, then the process dies before the next one."""

    def __init__(self) -> None:
        self.left: int | None = None

    def arm(self, after: int) -> None:
        self.left = after or None

    def effect(self) -> None:
        if self.left is None:
            return
        self.left -= 1
        if self.left == 0:
            self.left = None
            raise Crash


class FusedTable:
    """The in-memory table, with the fuse on every write (reads pass through); each
    write of a state row is shown to ``on_state`` (the partition key) as it lands."""

    def __init__(self, table: MemoryTable, fuse: Fuse, on_state) -> None:
        self._table = table
        self._fuse = fuse
        self._on_state = on_state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)  # reads: get_entity, query_entities, list_entities, rows

    def _write(self, name: str, *args, **kwargs):
        result = getattr(self._table, name)(*args, **kwargs)
        entities = [op[1] for op in args[0]] if name == "submit_transaction" else [args[0] if args else None]
        for entity in entities:
            if isinstance(entity, dict) and entity.get("RowKey") == "state":
                self._on_state(entity["PartitionKey"])
        self._fuse.effect()
        return result

    def create_entity(self, *args, **kwargs):
        return self._write("create_entity", *args, **kwargs)

    def update_entity(self, *args, **kwargs):
        return self._write("update_entity", *args, **kwargs)

    def upsert_entity(self, *args, **kwargs):
        return self._write("upsert_entity", *args, **kwargs)

    def delete_entity(self, *args, **kwargs):
        return self._write("delete_entity", *args, **kwargs)

    def submit_transaction(self, *args, **kwargs):
        return self._write("submit_transaction", *args, **kwargs)


# --- the network ----------------------------------------------------------------------


class Channel(str, Enum):
    """Which queue a message travels on (all of them Service Bus or storage queues:
    at-least-once, in no guaranteed order)."""

    ORDER = "order"
    NUDGE = "nudge"
    REQUEST = "request"
    RESPONSE = "response"
    EVENT = "event"  # order-events: an external event (approval), any client's


@dataclass
class Message:
    kind: Channel
    body: Any
    visible_at: datetime
    #: For an agent request: the end of its time-to-live (Service Bus drops it then).
    expires_at: datetime | None = None

    def __repr__(self) -> str:
        b = self.body
        if self.kind is Channel.ORDER:
            return f"order {b['order_id']}"
        if self.kind is Channel.NUDGE:
            snap = f"{b.state.process_state.value} attempt {b.state.attempt}" if b.state else "no snapshot"
            return f"nudge {b.order_id} ({snap})"
        if self.kind is Channel.REQUEST:
            return f"request {b.order_id} {b.kind.value} {b.step} attempt {b.attempt}"
        if self.kind is Channel.EVENT:
            return f"event {b.order_id} {b.name} {'approved' if b.approved else 'rejected'} by {b.by}"
        return f"response {b.order_id} {b.kind.value} {b.step} attempt {b.attempt} {b.outcome.value}"


class Network:
    """Every message sent and not yet taken: any visible one may be taken next (reordering),
    taken again (duplicate delivery), or lost."""

    def __init__(self, clock) -> None:
        self.messages: list[Message] = []
        self._clock = clock

    def put(self, message: Message) -> None:
        self.messages.append(message)

    def live(self) -> list[Message]:
        """Every message still there: an agent request whose time-to-live ended is gone
        (Service Bus drops it)."""
        now = self._clock()
        self.messages = [m for m in self.messages if m.expires_at is None or now < m.expires_at]
        return self.messages

    def visible(self, kind: Channel) -> list[Message]:
        now = self._clock()
        return [m for m in self.live() if m.kind is kind and m.visible_at <= now]

    def pick(self, kind: Channel, index: int) -> Message | None:
        found = self.visible(kind)
        return found[index % len(found)] if found else None

    def take(self, message: Message) -> None:
        self.messages.remove(message)


class ModelPublisher:
    """adapters.messaging.Publisher's interface, into the model's network."""

    def __init__(self, model: ProtocolModel) -> None:
        self.model = model
        self.alerts: list[Any] = []

    def send_agent_request(self, request: AgentRequest, *, queue: str, reply_to: str, now: datetime) -> bool:
        if request.complete_by - now <= timedelta(0):
            return False  # as the real one: an expired request is not sent
        self.model.sent_request(request, now)
        self.model.fuse_effect()
        return True

    def send_status(self, event, *, queue, key=None) -> bool:
        self.model.fuse_effect()
        return True

    def send_alert(self, alert, *, queue: str, attempt: int, ended=None) -> None:
        self.alerts.append(alert)
        self.model.fuse_effect()


class ModelNudger:
    """adapters.messaging.Nudger's interface, into the model's network."""

    def __init__(self, model: ProtocolModel) -> None:
        self.model = model

    def nudge(self, nudge: Nudge, *, delay: timedelta = timedelta(0)) -> None:
        # As adapters.messaging.Nudger: the visibility timeout in whole seconds, rounded up.
        seconds = max(0, int(delay.total_seconds() + 0.999))
        self.model.net.put(Message(Channel.NUDGE, nudge, self.model.now + timedelta(seconds=seconds)))
        if nudge.state is not None:
            self.model.snapshots.setdefault(nudge.order_id, []).append(nudge.state)
        self.model.fuse_effect()


# --- the remote services ---------------------------------------------------------------


class Behaviour(str, Enum):
    """What the remote service does with a call the agent makes."""

    ANSWER = "answer"  # applies (or replays) and answers 2xx
    REFUSE = "refuse"  # a permanent 4xx: nothing applied (sticky per action key)
    APPLY_LOSE_RESPONSE = "apply_lose_response"  # applied, but the answer never comes (unknown outcome)
    TIME_OUT = "time_out"  # never reached the service: nothing applied, no answer before complete-by


@dataclass
class Ledger:
    """One remote service's own record, by idempotency key."""

    applied: dict[str, dict] = field(default_factory=dict)
    #: Action keys the service refused: the same key is refused again.
    refused: set[str] = field(default_factory=set)


class ModelRemote:
    """A RemoteClient-like object (``call``, ``lookup``) over a service's ledger, for one
    agent invocation; it checks the protocol's promises at the moment a call arrives."""

    def __init__(self, model: ProtocolModel, ledger: Ledger, behaviour: Behaviour) -> None:
        self.model = model
        self.ledger = ledger
        self.behaviour = behaviour

    def _breaker(self, request: AgentRequest) -> None:
        if self.model.breaker_open.get(request.remote):
            # As agents.breaker: the rest of the open time, plus the jitter (at its largest).
            opened, timing = self.model.breaker_open[request.remote], self.model.timing
            left = max((opened + timing.breaker_open - self.model.now).total_seconds(), 1.0)
            raise BreakerOpen(request.remote, left + timing.breaker_jitter * timing.breaker_open.total_seconds())

    async def lookup(self, request: AgentRequest, *, now) -> dict | None:
        self._breaker(request)
        self.model.counts["lookups"] += 1
        found = self.ledger.applied.get(request.idempotency_key)
        return dict(found) if found is not None else None

    async def call(self, request: AgentRequest, *, now) -> dict:
        self._breaker(request)  # open before any call: no call at all (postponed)
        model, key = self.model, request.idempotency_key
        assert now() < request.complete_by, f"{request.order_id}: {request.action} called past its Complete-By"
        if self.behaviour is Behaviour.TIME_OUT:
            raise DeadlineReached("the call never reached the service before complete-by")
        if request.kind is Kind.ACTION:
            if key in self.ledger.refused:
                raise PermanentRemoteError("HTTP 422: refused (again, same key)")
            if key not in self.ledger.applied:
                if self.behaviour is Behaviour.REFUSE:
                    self.ledger.refused.add(key)
                    raise PermanentRemoteError("HTTP 422: refused")
                model.check_action_may_apply(request)
                self.ledger.applied[key] = {"confirmation": f"{request.action}-{request.order_id}-{request.attempt}"}
                model.applied_log.append((model.now, request.order_id, model.index_of(request), Kind.ACTION))
        else:
            model.check_compensation_may_run(request)
            if key not in self.ledger.applied:
                if self.behaviour is Behaviour.REFUSE:
                    raise PermanentRemoteError("HTTP 409: cannot undo now")
                model.check_undone_in_reverse_order(request)
                action_key = idempotency_key(request.order_id, request.step, model.action_of(request.step))
                undid = action_key in self.ledger.applied
                self.ledger.applied[key] = {"undone": undid}
                model.undone.add((request.order_id, request.step))
                model.applied_log.append((model.now, request.order_id, model.index_of(request), Kind.COMPENSATION))
        result = dict(self.ledger.applied[key])
        if self.behaviour is Behaviour.APPLY_LOSE_RESPONSE:
            raise TransientRemoteError("ReadTimeout: the answer was lost", unknown=True)
        return result


def step_index(step: str, definition: Workflow = WORKFLOW) -> int:
    return next(i for i, s in enumerate(definition.steps) if s.name == step)


# --- the model ---------------------------------------------------------------------------

#: Figures over every run of the session (printed by the test).
STATS: Counter[str] = Counter()
WORST: dict[str, float] = {"ratio": 0.0}


def _agent_rule(name: str, behaviour: Behaviour):
    """A rule: an agent takes a request, and its remote behaves as ``behaviour``."""

    def handle(self, pick, again, crash_after):
        self.agent_handles(pick, behaviour, again, crash_after)

    handle.__name__ = handle.__qualname__ = name  # the name the shrunk sequence prints
    requests = precondition(lambda self: self.net.visible(Channel.REQUEST))
    return requests(rule(pick=st.integers(0, 7), again=AGAIN, crash_after=CRASH_AFTER)(handle))


class ProtocolModel(RuleBasedStateMachine):
    orders = Bundle("orders")

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        #: This run's step policy, pending timeout, bound's timing and supervisor policy
        #: (T = P = 30 s unless ``first_order`` draws other timeouts).
        self.defaults, self.pending, self.timing, self.policy = DEFAULTS, PENDING, TIMING, POLICY
        self.fuse = Fuse()
        self.memory = MemoryTable()
        self.table = FusedTable(self.memory, self.fuse, self.state_written)
        self.store = StateStore(self.table)
        self.rejections = RejectionStore(MemoryTable())
        self.net = Network(lambda: self.now)
        self.publisher = ModelPublisher(self)
        self.nudger = ModelNudger(self)
        self.schedulers = {
            name: dispatch.Scheduler(
                store=self.store, publisher=self.publisher, instance=name, defaults=self.defaults,
                requests_queues={remote: f"{remote}-requests" for remote in remotes()},
                responses_queue="agent-responses", alerts_queue=ALERTS, nudger=self.nudger,
                pending_timeout=self.pending, max_postponements=MAX_POSTPONEMENTS, cache=OrderCache(max_age=CACHE_AGE),
            )
            for name in SCHEDULERS
        }
        self.ledgers = {remote: Ledger() for remote in remotes()}
        #: remote -> when its breaker opened (absent: closed).
        self.breaker_open: dict[str, datetime] = {}
        self.order_ids: list[str] = []
        #: order -> the workflow it runs on (chosen by its order message's "workflow").
        self.workflows: dict[str, Workflow] = {}
        #: order -> the bodies of the events its clients sent that approve.
        self.approvals: dict[str, list[dict]] = {}
        #: Once the faults stop, the person answers each waiting line: approves, rejects, or never.
        self.person = "never answers"
        self.answered: set[tuple[str, int]] = set()
        #: order -> every state a nudge carried (stale snapshots for the schedulers).
        self.snapshots: dict[str, list[OrderState]] = {}
        #: order -> writes of its state row so far (its creation the first).
        self.state_writes: Counter[str] = Counter()
        #: (order, attempt) -> (step, kind, complete-by) of every agent request ever sent.
        self.attempts: dict[tuple[str, int], tuple[str, Kind, datetime]] = {}
        #: (order, step) of every action request ever sent, and of every action claimed
        #: (a Processing row written for it: it may have been sent before a crash).
        self.actions_sent: set[tuple[str, str]] = set()
        self.actions_claimed: set[tuple[str, str]] = set()
        #: (order, step) whose compensation reached the remote and was applied.
        self.undone: set[tuple[str, str]] = set()
        self.applied_log: list[tuple[datetime, str, int, Kind]] = []
        #: A supervisor's read of the expired rows, acted on later (a slow supervisor).
        self.stale_view: tuple[datetime, list[OrderState]] | None = None
        #: Orders an operator resubmitted (their failed undos run again, out of order).
        self.resubmitted: set[str] = set()
        #: order -> attempt of its last accepted postponement.
        self.postponed: dict[str, int] = {}
        #: Once the faults stop, this remote stays down for everyone this long first.
        self.outage, self.outage_remote = timedelta(0), None
        self.counts: Counter[str] = Counter()
        self.story: list[str] = []
        self.loop = asyncio.new_event_loop()

    # -- helpers ------------------------------------------------------------------------

    def say(self, text: str) -> None:
        """What an event did: a note in Hypothesis's report of a failing run, and the
        story of a scripted one."""
        self.story.append(text)
        if currently_in_test_context():
            note(text)

    def fuse_effect(self) -> None:
        self.fuse.effect()

    def run(self, what: str, handler, crash_after: int):
        """Run one handler with the fuse armed; True if it crashed."""
        self.fuse.arm(crash_after)
        try:
            return False, handler()
        except Crash:
            self.say(f"  ...crashed after {crash_after} effect(s) of {what}")
            self.counts["crashes"] += 1
            return True, None
        finally:
            self.fuse.arm(0)

    def sent_request(self, request: AgentRequest, now: datetime) -> None:
        line = (request.step, request.kind, request.complete_by)
        seen = self.attempts.setdefault((request.order_id, request.attempt), line)
        assert seen == line, (
            f"{request.order_id}: attempt {request.attempt} sent for two lines: {seen} and {line} "
            "(the fence is not unique)"
        )
        if request.kind is Kind.ACTION:
            self.actions_sent.add((request.order_id, request.step))
            # Handlers are atomic here: the row now is the claim this request is sent for.
            assert not self.rows(request.order_id)["state"].get("CancelRequestedAt"), (
                f"{request.order_id}: action {request.step} claimed and sent after the order's cancel was recorded"
            )
        self.net.put(Message(Channel.REQUEST, request, now, expires_at=request.complete_by))
        self.counts["requests"] += 1

    def state_written(self, order_id: str) -> None:
        rows = self.memory.rows(order_id)
        row = rows["state"]
        self.state_writes[order_id] += 1
        # The first-claim seal lives only while the state row is as the submission wrote it: the
        # first write over the order, whoever writes it, deletes the seal in its transaction.
        assert self.state_writes[order_id] == 1 or not any(key.startswith(FIRST_CLAIM_PREFIX) for key in rows), (
            f"{order_id}: write {self.state_writes[order_id]} of the state row left the first-claim seal"
        )
        waiting = row.get("Step") in {s.name for s in self.workflows[order_id].steps if s.waiting}
        if row.get("Group"):  # a group in flight: each of its lines claimed is
            for line in json.loads(row["Group"]):
                if line["state"] == LineRun.PROCESSING.value:
                    self.actions_claimed.add((order_id, line["step"]))
        elif row["ProcessState"] == ProcessState.PROCESSING.value and row["Kind"] == Kind.ACTION.value and not waiting:
            self.actions_claimed.add((order_id, row["Step"]))

    def workflow_of(self, order_id: str) -> Workflow:
        return self.workflows[order_id]

    def index_of(self, request: AgentRequest) -> int:
        return step_index(request.step, self.workflow_of(request.order_id))

    def action_of(self, step: str) -> str:
        return next(s.action for s in WORKFLOW.steps if s.name == step)

    def rows(self, order_id: str) -> dict[str, dict]:
        return self.memory.rows(order_id)

    def line_state(self, order_id: str, index: int, kind: Kind) -> str | None:
        row = self.rows(order_id).get(line_key(index, self.workflow_of(order_id).steps[index].name, kind))
        return row["LineState"] if row else None

    def check_action_may_apply(self, request: AgentRequest) -> None:
        """Steps in order (a waiting step approved; no line after a group before every line
        of the group is done; the lines of a group in any order), and never after the step's
        undo: checked when the action applies."""
        definition = self.workflow_of(request.order_id)
        steps, index = definition.steps, self.index_of(request)
        for earlier in range(index):
            if earlier in definition.stage_of(index):
                continue  # a line of the same group: they run at once
            assert self.line_state(request.order_id, earlier, Kind.ACTION) == LineState.DONE.value, (
                f"{request.order_id}: action {request.step} applied before step {steps[earlier].name} was Done"
            )
        assert (request.order_id, request.step) not in self.undone, (
            f"{request.order_id}: action {request.step} applied after its compensation ran (it stays applied)"
        )

    def check_compensation_may_run(self, request: AgentRequest) -> None:
        """Only of an action that was sent and not refused; in reverse order; never while
        the action may still take effect."""
        order_id, index = request.order_id, self.index_of(request)
        steps = self.workflow_of(order_id).steps
        # The scheduler cannot tell a claim that crashed before its send from a request
        # with no answer: both are unknown, and undone (the remote has nothing to undo).
        assert (order_id, request.step) in self.actions_claimed, (
            f"{order_id}: compensation of {request.step}, whose action was never claimed"
        )
        if (order_id, request.step) not in self.actions_sent:
            self.counts["undos of claims never sent"] += 1
        assert self.line_state(order_id, index, Kind.ACTION) != LineState.REFUSED.value, (
            f"{order_id}: compensation of {request.step}, whose action was refused (nothing applied)"
        )
        for later in range(index + 1, len(steps)):
            name = steps[later].name
            if (order_id, name) in self.actions_claimed and self.line_state(order_id, later, Kind.ACTION) != "Refused":
                assert self.line_state(order_id, later, Kind.COMPENSATION) is not None, (
                    f"{order_id}: {request.step} undone before {name} (not in reverse order)"
                )
        # No undo of the order runs while an action of it may still take effect: not the
        # action undone, nor (a group) a line of its group still in flight. A Done action was
        # applied at the remote under its idempotency key (an answer or a lookup said so): a
        # request of it delivered again is a replay there and applies nothing
        # (docs/fake-remote.md, "Compensations"); a Refused one is refused again (same key).
        # Only an action whose outcome the table does not know (claimed, in flight,
        # Exhausted, Cancelled) may still take effect.
        for message in self.net.messages:
            r = message.body
            if (
                message.kind is Channel.REQUEST and r.order_id == order_id and r.kind is Kind.ACTION
                and self.now < r.complete_by
                and self.line_state(order_id, self.index_of(r), Kind.ACTION) not in ("Done", "Refused")
            ):
                what = "its action" if r.step == request.step else f"the action of {r.step} (a line of its group)"
                raise AssertionError(
                    f"{order_id}: {request.step} undone while {what} may still take effect "
                    f"(attempt {r.attempt}'s request is deliverable until {r.complete_by:%H:%M:%S})"
                )

    def check_undone_in_reverse_order(self, request: AgentRequest) -> None:
        """When an undo applies: no earlier step's undo applied before it (unless an
        operator resubmitted the order since: then the undos that failed run again)."""
        if request.order_id in self.resubmitted:
            return
        for earlier in self.workflow_of(request.order_id).steps[: self.index_of(request)]:
            assert (request.order_id, earlier.name) not in self.undone, (
                f"{request.order_id}: {request.step} undone after {earlier.name} was (not in reverse order)"
            )

    def state(self, order_id: str) -> OrderState:
        return self.store.get(order_id)

    def use_timeouts(self, step_seconds: float, pending_seconds: float) -> None:
        """The step timeout T and the pending timeout P, for the schedulers, the supervisors
        and the bound (as adapters.settings and supervision.policy_from derive them)."""
        self.defaults = replace(DEFAULTS, timeout_seconds=step_seconds)
        self.pending = timedelta(seconds=pending_seconds)
        self.timing = replace(TIMING, pending_timeout=self.pending)
        self.policy = replace(
            POLICY, step_timeout=timedelta(seconds=step_seconds), pending_timeout=self.pending,
            shortest_timeout=timedelta(seconds=shortest_timeout(self.defaults)),
        )
        self.schedulers = {
            name: replace(scheduler, defaults=self.defaults, pending_timeout=self.pending)
            for name, scheduler in self.schedulers.items()
        }
        self.say(f"T = {step_seconds} s, P = {pending_seconds} s")

    # -- events ---------------------------------------------------------------------------

    @initialize(
        target=orders, outage=st.sampled_from((0, 0, 45, 200)), remote=st.sampled_from(remotes()),
        max_postponements=st.sampled_from((MAX_POSTPONEMENTS, 1)), definition=st.sampled_from(WORKFLOWS),
        person=st.sampled_from(("approves", "rejects", "never answers")), t_and_p=st.sampled_from(TIMEOUTS),
    )
    def first_order(self, outage, remote, max_postponements, definition, person, t_and_p):
        """The first order; whether, once the faults stop, ``remote`` stays down for
        everyone ``outage`` seconds more (its breakers open: its lines are postponed);
        and the postponements in a row that count as one failure (MAX_POSTPONEMENTS);
        what the person who approves orders does once the faults stop (``person``); the
        run's step timeout T and pending timeout P (``t_and_p``, seconds)."""
        self.person = person
        self.outage, self.outage_remote = timedelta(seconds=outage), remote
        self.use_timeouts(*t_and_p)
        self.schedulers = {
            name: replace(scheduler, max_postponements=max_postponements) for name, scheduler in self.schedulers.items()
        }
        return self._new_order(definition)

    @precondition(lambda self: len(self.order_ids) < MAX_ORDERS)
    @rule(target=orders, definition=st.sampled_from(WORKFLOWS))
    def new_order(self, definition: Workflow = WORKFLOW):
        return self._new_order(definition)

    def _new_order(self, definition: Workflow) -> str:
        order_id = f"o-{len(self.order_ids) + 1}"
        self.order_ids.append(order_id)
        self.workflows[order_id] = definition
        # The default workflow is the one an order that names none runs on (WORKFLOW).
        chosen = {} if definition is WORKFLOW else {"workflow": definition.name}
        self.net.put(Message(Channel.ORDER, order_dict(order_id, lines=1, **chosen), self.now))
        self.say(f"{self.now:%H:%M:%S} a client sends order {order_id} ({definition.name})")
        return order_id

    @precondition(lambda self: self.net.visible(Channel.ORDER))
    @rule(pick=st.integers(0, 3), crash_after=CRASH_AFTER, instance=st.sampled_from(SCHEDULERS))
    def submit(self, pick, crash_after, instance=SCHEDULERS[0]):
        """submit_order takes an orders message: index, rows, nudge (a crash between any two),
        on the process of a scheduler ``instance`` (which keeps the order it wrote)."""
        self._submit(self.net.pick(Channel.ORDER, pick), crash_after, instance)

    def _submit(self, message: Message, crash_after: int, instance: str = SCHEDULERS[0]) -> None:
        body = json.dumps(message.body).encode()

        def handle():
            result = submission.submit(
                body, message_id=message.body["order_id"], reply_to=None, content_type="application/json",
                store=self.store, rejections=self.rejections, publisher=self.publisher, workflow=WORKFLOW,
                now=self.now, pending_timeout=self.pending, cache=self.schedulers[instance].cache,
            )
            if result.nudge is not None:
                self.nudger.nudge(result.nudge)
            return result

        crashed, result = self.run("submit", handle, crash_after)
        if not crashed:
            self.net.take(message)  # completed; a crashed one is delivered again
        self.say(f"{self.now:%H:%M:%S} submit {message!r}: {'crashed' if crashed else result.result.value}")

    @precondition(lambda self: self.net.visible(Channel.NUDGE))
    @rule(
        pick=st.integers(0, 7), instance=st.sampled_from(SCHEDULERS), again=AGAIN,
        crash_after=CRASH_AFTER,
    )
    def schedule(self, pick, instance, again, crash_after):
        """A scheduler instance takes a nudge (``again``: it stays, and is delivered again)."""
        message = self.net.pick(Channel.NUDGE, pick)
        crashed, request = self.run(
            "schedule", lambda: dispatch.schedule(message.body, scheduler=self.schedulers[instance], now=self.now),
            crash_after,
        )
        if not (again or crashed):
            self.net.take(message)
        sent = f"sends {request.kind.value} {request.step} attempt {request.attempt}" if request else "sends nothing"
        self.say(f"{self.now:%H:%M:%S} {instance} takes {message!r}: {'crashed' if crashed else sent}")

    @precondition(lambda self: any(self.snapshots.values()))
    @rule(pick=st.integers(0, 7), age=st.integers(1, 4), instance=st.sampled_from(SCHEDULERS))
    def schedule_stale_snapshot(self, pick, age, instance):
        """A nudge carrying an old snapshot of the row (its ETag long gone)."""
        order_id = [o for o in self.order_ids if self.snapshots.get(o)][pick % len(
            [o for o in self.order_ids if self.snapshots.get(o)])]
        history = self.snapshots[order_id]
        snapshot = history[max(0, len(history) - 1 - age)]
        nudge = Nudge(order_id=order_id, state=snapshot)
        request = dispatch.schedule(nudge, scheduler=self.schedulers[instance], now=self.now)
        self.say(f"{self.now:%H:%M:%S} {instance} takes a stale nudge {order_id} "
             f"({snapshot.process_state.value} attempt {snapshot.attempt}): {'claimed' if request else 'nothing'}")

    @precondition(lambda self: any("state" in self.rows(o) for o in self.order_ids))
    @rule(pick=st.integers(0, 7), instance=st.sampled_from(SCHEDULERS))
    def schedule_forged_first_claim(self, pick, instance):
        """Someone who can send to the scheduler's queue, and has read the row's current ETag and
        the order's document, sends a first-claim nudge: a new order's snapshot with that ETag and
        the real document. Only a row still as its submission wrote it may be claimed by it (the
        seal proves that); any other is decided on as read, where the snapshot is forged."""
        written = [o for o in self.order_ids if "state" in self.rows(o)]
        order_id = written[pick % len(written)]
        row, before, sent = self.state(order_id), self.rows(order_id), len(self.net.messages)
        new = self.workflow_of(order_id).steps[0].name
        snapshot = row.model_copy(update={
            "group": (), "process_state": ProcessState.PENDING, "step_index": 0, "kind": Kind.ACTION, "step": new,
            "attempt": 0,
            "failure_count": 0, "postponements": 0, "plan": (), "failed": (), "gave_up": False, "max_failures": None,
            "locked_by": None, "cause": None, "last_error": None, "cancel_requested_at": None, "cancel_reason": None,
            "cancelled_by": None,
        })
        nudge = Nudge(order_id=order_id, state=snapshot, document=before["order"]["Document"])
        request = dispatch.schedule(nudge, scheduler=self.schedulers[instance], now=self.now)
        if not dispatch.pristine(row):
            assert request is None and self.rows(order_id) == before and len(self.net.messages) == sent, (
                f"{order_id}: a forged first-claim nudge moved a row that was not a new order's: {row!r}"
            )
        self.say(f"{self.now:%H:%M:%S} {instance} takes a forged first-claim nudge for {order_id} "
                 f"({row.process_state.value} attempt {row.attempt}): {'claimed' if request else 'nothing'}")

    # An agent takes a request and calls its remote, which answers, refuses, applies but
    # loses the answer, or is never reached before Complete-By; an open breaker postpones
    # the line with no call. ``again``: the request is delivered once more later. (One
    # rule per behaviour: the agents' events get their share of each sequence.)
    remote_answers = _agent_rule("remote_answers", Behaviour.ANSWER)
    remote_refuses = _agent_rule("remote_refuses", Behaviour.REFUSE)
    remote_applies_but_the_answer_is_lost = _agent_rule(
        "remote_applies_but_the_answer_is_lost", Behaviour.APPLY_LOSE_RESPONSE
    )
    remote_is_never_reached = _agent_rule("remote_is_never_reached", Behaviour.TIME_OUT)

    def agent_handles(self, pick: int, behaviour: Behaviour, again: bool, crash_after: int) -> None:
        message = self.net.pick(Channel.REQUEST, pick)
        request: AgentRequest = message.body
        remote = ModelRemote(self, self.ledgers[request.remote], behaviour)

        def handle():
            response = self.loop.run_until_complete(agent.run(request, remote=remote, now=lambda: self.now))
            if response is not None:
                self.net.put(Message(Channel.RESPONSE, response, self.now))
                self.fuse_effect()
            return response

        crashed, response = self.run("agent", handle, crash_after)
        if not (again or crashed):
            self.net.take(message)
        outcome = "crashed" if crashed else (response.outcome.value if response else "no response")
        self.say(f"{self.now:%H:%M:%S} agent takes {message!r} ({behaviour.value}): {outcome}")

    @precondition(lambda self: self.net.visible(Channel.RESPONSE))
    @rule(pick=st.integers(0, 7), instance=st.sampled_from(SCHEDULERS), again=AGAIN,
          crash_after=CRASH_AFTER)
    def record(self, pick, instance, again, crash_after):
        """A scheduler instance takes an agent response; a stale one changes nothing."""
        message = self.net.pick(Channel.RESPONSE, pick)
        response: AgentResponse = message.body
        before = self.state(response.order_id)
        stale = not in_flight(before, response)
        rows, sent = self.rows(response.order_id), len(self.net.messages)
        crashed, written = self.run("record", lambda: self.recorded(response, instance), crash_after)
        if stale:
            after = self.state(response.order_id)
            assert written is None and not crashed, f"a stale response was applied: {message!r}"
            assert self.rows(response.order_id) == rows and after.etag == before.etag, (
                f"a stale response changed the rows: {message!r}"
            )
            assert len(self.net.messages) == sent, f"a stale response sent something: {message!r}"
            self.counts["stale responses"] += 1
        elif written is not None and response.outcome is Outcome.POSTPONED:
            self.postponed[response.order_id] = response.attempt
        if not (again or crashed):
            self.net.take(message)
        if crashed or stale:
            what = "crashed" if crashed else "stale: nothing"
        else:
            what = written.process_state.value if written else "lost the race"
        self.say(f"{self.now:%H:%M:%S} {instance} records {message!r}: {what}")

    def recorded(self, response: AgentResponse, instance: str) -> OrderState | None:
        """``instance`` records ``response``; counted by whether it read the order first."""
        queries = self.store.ops["query"]
        written = dispatch.record(response, scheduler=self.schedulers[instance], now=self.now)
        if written is not None:
            self.counts["recorded without a read" if self.store.ops["query"] == queries else "recorded on a read"] += 1
        return written

    def losable(self) -> list[Message]:
        # Service Bus keeps an accepted order until it is completed (or dead-lettered, kept):
        # orders are not lost. A nudge, a request or a response may be, for the protocol.
        return [m for m in self.net.live() if m.kind is not Channel.ORDER]

    @precondition(lambda self: self.losable())
    @rule(pick=st.integers(0, 15))
    def lose(self, pick):
        """A message is lost (a function took it and died for good, or its TTL ended)."""
        message = self.losable()[pick % len(self.losable())]
        self.net.take(message)
        self.say(f"{self.now:%H:%M:%S} lost: {message!r}")

    @rule(who=st.sampled_from((*SUPERVISORS, "slow supervisor")), crash_after=CRASH_AFTER)
    def supervise(self, who, crash_after):
        """A sweep at the current clock (two in a row: overlapping supervisors). The slow
        supervisor reads the expired rows now and acts on that read, at the clock it read
        them, the next time it runs, whatever happened meanwhile."""
        if who != "slow supervisor":
            crashed, done = self.run("sweep", lambda: self._sweep(self.store, self.now), crash_after)
            self.say(f"{self.now:%H:%M:%S} {who} sweeps: {'crashed' if crashed else dict(done)}")
            return
        if self.stale_view is None:
            view = list(self.store.sweep(self.now, younger_than_cannot_expire=timedelta(0)))
            self.stale_view = (self.now, view)
            seen = [(s.order_id, s.process_state.value) for s in view]
            self.say(f"{self.now:%H:%M:%S} a slow supervisor reads {seen}")
            return
        at, view = self.stale_view
        self.stale_view = None

        class OldRead(StateStore):
            def sweep(self, now, *, younger_than_cannot_expire):
                return iter(view)

        crashed, done = self.run("slow sweep", lambda: self._sweep(OldRead(self.table), at), crash_after)
        self.say(f"{self.now:%H:%M:%S} the slow supervisor acts on its read of {at:%H:%M:%S}: "
                 f"{'crashed' if crashed else dict(done)}")

    def _sweep(self, store: StateStore, now: datetime):
        return supervision.sweep(
            store=store, publisher=self.publisher, nudger=self.nudger, policy=self.policy, now=now, alerts_queue=ALERTS,
            responses_since=self.responses_since,
        )

    def responses_since(self) -> datetime:
        """When the oldest response still on the network was sent (now if none), as the
        supervisor peeks the responses queue for it."""
        return min((m.visible_at for m in self.net.live() if m.kind is Channel.RESPONSE), default=self.now)

    @rule(by=st.sampled_from(("1 s", "10 s", "31 s", "300 s", "next nudge", "past next deadline")))
    def tick(self, by):
        """The clock runs on: by so long, to the next delayed nudge (a backoff, a
        postponement's wait), or just past the next Complete-By of an in-flight order."""
        if by == "next nudge":
            later = [m.visible_at for m in self.net.messages if m.visible_at > self.now]
            self.now = min(later, default=self.now)
        elif by == "past next deadline":
            deadlines = [
                s.complete_by for s in self.written() if not s.process_state.terminal and s.complete_by >= self.now
            ]
            self.now = min(deadlines, default=self.now - timedelta(seconds=1)) + timedelta(seconds=1)
        else:
            self.now += timedelta(seconds=int(by.split()[0]))
        self.say(f"{self.now:%H:%M:%S} (clock: {by})")

    @rule(remote=st.sampled_from(remotes()), is_open=st.booleans())
    def breaker(self, remote, is_open):
        """The agents' breaker for a service opens (its lines are postponed, no call) or closes."""
        if is_open:
            self.breaker_open.setdefault(remote, self.now)
        else:
            self.breaker_open.pop(remote, None)
        self.say(f"{self.now:%H:%M:%S} breaker {remote}: {'open' if is_open else 'closed'}")

    @rule(order_id=orders, crash_after=CRASH_AFTER)
    def resubmit(self, order_id, crash_after):
        """An operator resubmits an order (refused unless it is in Error)."""
        try:
            state = self.state(order_id)
        except Exception:  # noqa: BLE001 - not written yet
            return
        if state.process_state is not ProcessState.ERROR:
            return
        crashed, _ = self.run(
            "resubmit",
            lambda: supervision.resubmit(
                order_id, store=self.store, nudger=self.nudger, now=self.now, pending_timeout=self.pending
            ),
            crash_after,
        )
        self.resubmitted.add(order_id)
        self.counts["resubmits"] += 1
        self.say(f"{self.now:%H:%M:%S} operator resubmits {order_id}{': crashed' if crashed else ''}")

    @rule(order_id=orders, crash_after=CRASH_AFTER)
    def cancel(self, order_id, crash_after):
        """A client or an operator cancels an order: recorded on its row unless it ended
        Processed or in Error (refused), or was cancelled or Compensated before (a no-op)."""

        def handle():
            try:
                return cancellation.cancel(
                    order_id, reason="asked", by="model", store=self.store, publisher=self.publisher,
                    nudger=self.nudger, now=self.now,
                ).verdict.value
            except cancellation.NotCancellable:
                return "refused"
            except Exception as error:  # noqa: BLE001 - not written yet
                if type(error).__name__ != "OrderNotFound":
                    raise
                return "unknown order"

        crashed, verdict = self.run("cancel", handle, crash_after)
        self.counts[f"cancels {verdict or 'crashed'}"] += 1
        self.say(f"{self.now:%H:%M:%S} cancel {order_id}: {verdict or 'crashed'}")

    def waiting_orders(self) -> list[str]:
        """Orders whose row now waits for an event (Processing at a waiting step)."""
        return [
            state.order_id for state in self.written()
            if state.process_state is ProcessState.PROCESSING and state.kind is Kind.ACTION
            and self.workflow_of(state.order_id).steps[state.step_index].waiting
        ]

    @rule(
        to=st.sampled_from(("a waiting order", "a waiting order", "a waiting order", "any order")),
        pick=st.integers(0, 3), approved=st.sampled_from((True, True, False)), delay=st.sampled_from((0, 0, 0, 15, 40)),
    )
    def client_sends_event(self, to, pick, approved, delay):
        """A person approves or rejects an order: mostly one that waits now (none: no
        event), else any (one that waits for nothing, or not yet, or no longer, must refuse
        it); the message arrives after ``delay`` seconds (maybe past the waiting step's
        deadline, or after a cancel). Service Bus keeps it until it is completed."""
        candidates = self.waiting_orders() if to == "a waiting order" else self.order_ids
        if candidates:
            self.send_event(candidates[pick % len(candidates)], approved, delay)

    def send_event(self, order_id: str, approved: bool, delay: int) -> None:
        event = OrderEvent(order_id=order_id, name="approval", approved=approved, by=f"p-{len(self.net.messages)}")
        if approved:
            self.approvals.setdefault(order_id, []).append(event.body().result())
        self.net.put(Message(Channel.EVENT, event, self.now + timedelta(seconds=delay)))
        self.say(f"{self.now:%H:%M:%S} a client sends {self.net.messages[-1]!r} (visible in {delay} s)")

    @precondition(lambda self: self.net.visible(Channel.EVENT))
    @rule(pick=st.integers(0, 7), instance=st.sampled_from(SCHEDULERS), again=AGAIN, crash_after=CRASH_AFTER)
    def receive_event(self, pick, instance, again, crash_after):
        """receive_order_event takes an order-events message (scheduler.events, the app's
        path): accepted only by a line waiting for it before its deadline; otherwise
        nothing of the order changes and nothing is sent."""
        message = self.net.pick(Channel.EVENT, pick)
        crashed, delivered = self._receive_event(message, instance, crash_after)
        if not (again or crashed):
            self.net.take(message)
        what = "crashed" if crashed else delivered.outcome.value
        self.say(f"{self.now:%H:%M:%S} {instance} takes {message!r}: {what}")

    def _receive_event(self, message: Message, instance: str, crash_after: int):
        event: OrderEvent = message.body
        before = self.rows(event.order_id)
        waiting = None
        if "state" in before:
            state = self.state(event.order_id)
            step = self.workflow_of(event.order_id).steps[state.step_index]
            waiting = (
                state.process_state is ProcessState.PROCESSING and state.kind is Kind.ACTION and step.waiting
                and not state.gave_up and self.now < state.complete_by
            )
        sent = len(self.net.messages)

        def handle():
            try:
                return events.receive_message(
                    event.model_dump_json(exclude_none=True).encode(), message_id=event.message_id(),
                    content_type="application/json", scheduler=self.schedulers[instance], rejections=self.rejections,
                    now=self.now,
                )
            except events.Busy:
                raise Crash from None  # raised: Service Bus delivers the message again

        crashed, delivered = self.run("receive_event", handle, crash_after)
        if crashed:
            return crashed, delivered
        self.counts[f"events {delivered.outcome.value}"] += 1
        if delivered.outcome is events.Outcome.ACCEPTED:
            assert waiting, f"{event.order_id}: {message!r} accepted by a line that was not waiting for it"
        else:
            assert self.rows(event.order_id) == before and len(self.net.messages) == sent, (
                f"{event.order_id}: {message!r} {delivered.outcome.value}, yet it changed the order or sent something"
            )
        return crashed, delivered

    # -- invariants ---------------------------------------------------------------------

    def written(self) -> list[OrderState]:
        return [state for state, _ in self.partitions()]

    def partitions(self) -> list[tuple[OrderState, dict[str, dict]]]:
        """Each written order's state and its partition's rows, read once."""
        found = []
        for order_id in self.order_ids:
            rows = self.rows(order_id)
            if "state" in rows:
                found.append((self.state(order_id), rows))
        return found

    @invariant()
    def the_protocol_holds(self):
        """After every event: each state row is legal and supervised, the fence is
        unique, and nothing was applied twice (the other promises are checked at the
        remote, as each call arrives)."""
        partitions = self.partitions()
        self.every_state_row_is_legal(partitions)
        self.at_most_one_unfenced_request_per_order([state for state, _ in partitions])
        self.nothing_applied_twice()
        self.a_cancelled_order_never_ends_processed([state for state, _ in partitions])

    def a_cancelled_order_never_ends_processed(self, states) -> None:
        # A cancel is refused once Processed, and no action starts after it (sent_request).
        for state in states:
            assert not (state.cancel_requested_at and state.process_state is ProcessState.PROCESSED), (
                f"{state.order_id}: Processed after its cancel was recorded"
            )

    def every_state_row_is_legal(self, partitions) -> None:
        indexed = {order_id for order_id, *_ in self.store.active_ids()}
        for state, rows in partitions:
            problems = illegal(
                state, rows, self.schedulers[SCHEDULERS[0]].max_postponements, self.workflow_of(state.order_id)
            )
            assert not problems, f"{state.order_id}: illegal state row: {problems}\n{state!r}"
            if not state.process_state.terminal:
                assert state.order_id in indexed, f"{state.order_id} is in flight but not in the active index"
            elif state.order_id not in indexed:  # closed: retention's finished index names its end
                key = retention.finished_row(state.order_id, state.updated_at, self.store.shards)
                assert key[1] in self.table.rows(key[0]), f"{state.order_id} closed without its finished-index row {key}"

    def at_most_one_unfenced_request_per_order(self, states) -> None:
        for state in states:
            live = [
                m.body for m in self.net.live() if m.kind is Channel.REQUEST and m.body.order_id == state.order_id
            ]
            assert all(r.attempt <= state.attempt for r in live), (
                f"{state.order_id}: a request ahead of the row's attempt"
            )
            if state.group:  # each line of a group in flight has its own fence
                for line in state.group:
                    unfenced = {(r.step, r.kind) for r in live if r.attempt == line.attempt}
                    assert unfenced <= {(line.step, Kind.ACTION)}, (
                        f"{state.order_id}: attempt {line.attempt} of {line.step} fences requests {unfenced}"
                    )
                continue
            unfenced = {
                (r.step, r.kind, r.attempt) for r in live
                if state.process_state is ProcessState.PROCESSING and r.attempt == state.attempt
            }
            assert len(unfenced) <= 1, f"{state.order_id}: several un-fenced requests {unfenced}"
            for step, kind, _ in unfenced:
                assert (step, kind) == (state.step, state.kind), (
                    f"{state.order_id}: the un-fenced request is for {kind.value} {step}, the row for "
                    f"{state.kind.value} {state.step}"
                )

    def nothing_applied_twice(self) -> None:
        # A ledger applies a key once; the app must use one key per line, every time.
        lines = Counter((order_id, index, kind) for _, order_id, index, kind in self.applied_log)
        twice = [line for line, n in lines.items() if n > 1]
        assert not twice, f"applied twice at the remote: {twice}"

    # -- liveness ---------------------------------------------------------------------------

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:  # a run that already failed is reported as it is
                self.settle()
        finally:
            self.loop.close()

    def settle(self):
        """The faults stop: every message is delivered once, at once, agents answer, the
        supervisor ticks; the breakers close, but the outage's remote stays down for
        everyone that long first. Every order must end within its bound, counted from
        now (``core.liveness.order_bound`` of its current line, with the outage)."""
        self.breaker_open.clear()
        start = self.now
        if self.outage:
            self.breaker_open[self.outage_remote] = start
        outage = {"outage": self.outage, "outage_remote": self.outage_remote}
        bounds = {
            o: liveness.order_bound(self.workflow_of(o), self.defaults, self.timing, **outage)
            for o in self.order_ids if "state" not in self.rows(o)  # not written yet: from its first line
        }
        for state in self.written():
            if state.process_state.terminal:
                continue
            bound = liveness.order_bound(
                self.workflow_of(state.order_id), self.defaults, self.timing, step_index=state.step_index,
                kind=state.kind, **outage,
            )
            pending = state.process_state is ProcessState.PENDING
            postponed = pending and self.postponed.get(state.order_id) == state.attempt
            if state.group:  # a line of a group waits out its postponement while the others run
                postponed = any(line.state is LineRun.PENDING and line.postponements for line in state.group)
            pending_postponement = any(
                m.kind is Channel.RESPONSE and m.body.order_id == state.order_id and m.body.outcome is Outcome.POSTPONED
                for m in self.net.messages
            )
            if postponed or pending_postponement:
                bound += liveness.postponement_wait(self.timing)  # one wait already under way
            bounds[state.order_id] = bound
        ended: dict[str, datetime] = {}
        interval = self.timing.supervisor_interval
        limit = start + max([*bounds.values(), timedelta(0)]) + self.policy.step_timeout + 3 * interval
        self.say(
            f"{self.now:%H:%M:%S} faults stop ({self.outage_remote} down {self.outage.total_seconds():.0f} s more); "
            f"bounds {({o: b.total_seconds() for o, b in bounds.items()})}"
        )
        while True:
            if self.now >= start + self.outage:
                self.breaker_open.clear()
            self.drain()
            for state in self.written():
                if state.process_state.terminal:
                    ended.setdefault(state.order_id, self.now)
            in_flight = [s for s in self.written() if not s.process_state.terminal]
            if not in_flight and not self.store.active_ids() and all("state" in self.rows(o) for o in self.order_ids):
                break
            assert self.now <= limit, (
                f"not settled {(self.now - start).total_seconds():.0f} s after the faults stopped: "
                f"{[(s.order_id, s.process_state.value, s.kind.value, s.step, s.attempt) for s in in_flight]}, "
                f"indexed {self.store.active_ids()}"
            )
            # The supervisor ticks every interval; ticks before the next thing due find
            # nothing to do, so the clock goes straight to the first tick after it.
            due = self.next_due(start + self.outage)
            ticks = max(1, math.ceil((due - self.now) / interval))
            self.now += ticks * interval
            self._sweep(self.store, self.now)
        for order_id, bound in bounds.items():
            took = ended[order_id] - start
            assert took <= bound, (
                f"{order_id} took {took.total_seconds():.0f} s after the faults stopped, bound {bound}"
            )
            WORST["ratio"] = max(WORST["ratio"], took / bound)
        self.check_outcomes()
        STATS["runs"] += 1
        STATS[f"T {self.policy.step_timeout.total_seconds():.0f} P {self.pending.total_seconds():.0f}"] += 1
        STATS.update(self.counts)
        for state in self.written():
            STATS[state.process_state.value] += 1
            STATS[f"{self.workflow_of(state.order_id).name} {state.process_state.value}"] += 1

    def next_due(self, outage_end: datetime) -> datetime:
        """The earliest time something can happen: a nudge becomes visible, a deadline
        passes, the outage ends, or a finished order still indexed is due for healing.
        An in-flight row already past its deadline is due at once: the sweep may have
        passed it by (its index row is younger than any deadline, e.g. just re-indexed)."""
        times = [m.visible_at for m in self.net.live()]
        for state in self.written():
            if not state.process_state.terminal and state.complete_by <= self.now:
                return self.now
            terminal = state.process_state.terminal
            times.append(state.updated_at + self.policy.step_timeout if terminal else state.complete_by)
        if outage_end > self.now:
            times.append(outage_end)
        return min([t for t in times if t > self.now], default=self.now)

    def drain(self):
        """Deliver every visible message once, healthy: agents answer, nobody crashes."""
        while True:
            visible = [m for m in self.net.messages if m.visible_at <= self.now]
            if not visible and not self.answer_waiting_lines():
                return
            for message in visible:
                self.net.take(message)
                scheduler = self.schedulers[SCHEDULERS[0]]
                if message.kind is Channel.ORDER:
                    self.net.put(message)  # _submit takes it once it is done
                    self._submit(message, 0)
                elif message.kind is Channel.NUDGE:
                    dispatch.schedule(message.body, scheduler=scheduler, now=self.now)
                elif message.kind is Channel.EVENT:
                    self.net.put(message)  # taken once it is done (a crash-free run takes it)
                    self._receive_event(message, SCHEDULERS[0], 0)
                    self.net.take(message)
                elif message.kind is Channel.REQUEST:
                    request = message.body
                    if self.now < request.complete_by:
                        remote = ModelRemote(self, self.ledgers[request.remote], Behaviour.ANSWER)
                        response = self.loop.run_until_complete(
                            agent.run(request, remote=remote, now=lambda: self.now)
                        )
                        if response is not None:
                            self.net.put(Message(Channel.RESPONSE, response, self.now))
                else:
                    self.recorded(message.body, SCHEDULERS[0])

    def answer_waiting_lines(self) -> bool:
        """Once the faults stop, the person answers each line that waits, once, at once
        (unless they never answer: the deadline ends it); True if an event was sent."""
        if self.person == "never answers":
            return False
        sent = False
        for state in self.written():
            if state.order_id in self.waiting_orders() and (state.order_id, state.attempt) not in self.answered:
                self.answered.add((state.order_id, state.attempt))
                self.send_event(state.order_id, self.person == "approves", 0)
                sent = True
        return sent

    def check_outcomes(self):
        """Each final state against the remote services' own ledgers."""
        for state in self.written():
            steps = self.workflow_of(state.order_id).steps
            remote = [i for i, step in enumerate(steps) if not step.waiting]
            left = []  # steps whose action is applied and not undone
            for index in remote:
                step = steps[index]
                key = idempotency_key(state.order_id, step.name, step.action)
                if key in self.ledgers[step.remote].applied and (state.order_id, step.name) not in self.undone:
                    left.append(index)
            if state.process_state is ProcessState.PROCESSED:
                assert left == remote, f"{state.order_id} Processed, applied: {left}"
                assert not any(o == state.order_id for o, _ in self.undone), f"{state.order_id} Processed, but undone"
                for index, step in enumerate(steps):
                    row = self.rows(state.order_id)[line_key(index, step.name, Kind.ACTION)]
                    if step.waiting:  # its result is the body of an approval a client sent
                        assert json.loads(row["Result"]) in self.approvals.get(state.order_id, []), (
                            f"{state.order_id}: {step.name}'s result is no approval a client sent"
                        )
                        continue
                    key = idempotency_key(state.order_id, step.name, step.action)
                    assert json.loads(row["Result"]) == self.ledgers[step.remote].applied[key], (
                        f"{state.order_id}: the recorded result of {step.name} is not what the remote applied"
                    )
            elif state.process_state is ProcessState.COMPENSATED:
                assert left == [], f"{state.order_id} Compensated, yet still applied: {left}"
            else:
                assert state.process_state is ProcessState.ERROR
                if state.kind is Kind.ACTION:  # stopped at a step that cannot be undone: nothing was undone
                    allowed = set(range(state.step_index + 1))
                else:  # what could not be undone, and steps with no undo
                    allowed = set(state.failed) | {i for i, s in enumerate(steps) if s.compensate is None}
                assert set(left) <= allowed, f"{state.order_id} in Error leaves {left} applied, may leave {allowed}"


def in_flight(state: OrderState, response: AgentResponse) -> bool:
    """Whether the row has the line a response answers in flight: the row's own (its
    attempt), or a Processing line of its group (step and attempt)."""
    if state.process_state is not ProcessState.PROCESSING:
        return False
    if state.group:
        return any(
            line.state is LineRun.PROCESSING and (line.step, line.attempt) == (response.step, response.attempt)
            and response.kind is Kind.ACTION for line in state.group
        )
    return state.attempt == response.attempt


def illegal_group(state: OrderState, rows: dict[str, dict], definition: Workflow) -> list[str]:
    """What makes a group in flight impossible: its lines are the group's at the row's step,
    each fenced below the row's attempt, the ended ones ended on their rows, the row summing
    the open ones up (Processing while one is, due at the earliest deadline)."""
    problems = []
    stage = definition.stage_of(state.step_index)
    if state.kind is not Kind.ACTION or state.process_state.terminal:
        problems.append(f"a group on a {state.kind.value} {state.process_state.value} row")
    if tuple(line.step_index for line in state.group) != stage or len(stage) < 2:
        problems.append(f"group lines {[line.step for line in state.group]} are not the group at {state.step}")
        return problems
    attempts = [line.attempt for line in state.group]
    if len(set(attempts)) != len(attempts) or max(attempts) > state.attempt or min(attempts) < 1:
        problems.append(f"group attempts {attempts} are not unique fences up to the row's {state.attempt}")
    open_lines = [line for line in state.group if line.state.open]
    if not open_lines:
        problems.append("a group with no line open is still on the row")
    elif state.complete_by != min(line.complete_by for line in open_lines):
        problems.append("the row is not due at its group's earliest deadline")
    processing = any(line.state is LineRun.PROCESSING for line in state.group)
    if processing != (state.process_state is ProcessState.PROCESSING):
        problems.append("the row is Processing exactly when a line of its group is")
    for line in state.group:
        limit = line.max_failures or POLICY.max_failures
        if line.failure_count > limit or (line.failure_count == limit and line.state.open and not line.gave_up):
            problems.append(f"{line.step}: {line.failure_count} failures of {limit} without giving up")
        if line.gave_up and line.state is not LineRun.PENDING:
            problems.append(f"{line.step}: given up, yet {line.state.value}")
        if line.state.open:
            continue
        row = rows.get(line_key(line.step_index, line.step, Kind.ACTION))
        if not row or row["LineState"] != line.state.value:
            problems.append(f"{line.step}: {line.state.value} in the group, not on its line's row")
    if not (state.cause or state.cancel_requested_at) and any(
        line.state in (LineRun.REFUSED, LineRun.EXHAUSTED) for line in state.group
    ):
        problems.append("a line failed, yet the group has no cause (nor a cancel) to undo it for")
    return problems


def illegal(state: OrderState, rows: dict[str, dict], max_postponements: int, definition: Workflow) -> list[str]:
    """What makes a state row impossible for the lifecycle (empty: a legal state)."""
    problems = []
    steps = definition.steps
    if not 0 <= state.step_index < len(steps) or state.step != steps[state.step_index].name:
        problems.append("step and step index disagree")
        return problems
    if state.group:
        problems += illegal_group(state, rows, definition)
    processing = state.process_state is ProcessState.PROCESSING
    if processing != (state.locked_by is not None):
        problems.append("LockedBy is set exactly when Processing")
    if processing and state.attempt < 1:
        problems.append("Processing without an attempt")
    if state.process_state.terminal and (state.gave_up or state.postponements):
        problems.append("a terminal row still carries GaveUp or postponements")
    if state.failure_count < state.postponements // max_postponements:
        problems.append("postponements reached the limit without counting a failure")
    limit = state.max_failures or POLICY.max_failures
    at_limit = state.failure_count == limit and not state.gave_up and not state.process_state.terminal
    if state.failure_count > limit or at_limit:
        problems.append(f"{state.failure_count} failures of {limit} without giving up")
    if state.gave_up and state.process_state is not ProcessState.PENDING:
        problems.append("GaveUp on a row that is not Pending")
    if state.kind is Kind.ACTION:
        if state.plan or state.failed:
            problems.append("a plan of undos while running actions")
        for earlier in range(state.step_index):
            row = rows.get(line_key(earlier, steps[earlier].name, Kind.ACTION))
            if not row or row["LineState"] != LineState.DONE.value:
                problems.append(f"at step {state.step} while {steps[earlier].name} is not Done")
        if state.process_state is ProcessState.PROCESSED and state.step_index != len(steps) - 1:
            problems.append("Processed before the last step")
        if state.process_state is ProcessState.COMPENSATED:
            problems.append("Compensated while running actions")
    else:
        if not state.cause:
            problems.append("undoing without a cause")
        if any(i >= state.step_index for i in state.plan) or list(state.plan) != sorted(state.plan, reverse=True):
            problems.append(f"plan {state.plan} is not the steps before {state.step_index}, newest first")
        if state.process_state is ProcessState.PROCESSED:
            problems.append("Processed while undoing")
        if state.process_state is ProcessState.COMPENSATED and (state.plan or state.failed):
            problems.append("Compensated with undos left or failed")
    return problems


def test_the_protocol_keeps_its_invariants_and_ends_every_order_within_the_bound(report_figure):
    STATS.clear()
    WORST["ratio"] = 0.0
    # The app's warnings (resets, give-ups) by the thousand would bury the shrunk sequence
    # of events, which says what happened: the rules' calls and their notes.
    logging.disable(logging.ERROR)
    try:
        run_state_machine_as_test(
            ProtocolModel,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,  # a loaded machine's timing is not the protocol's
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        logging.disable(logging.NOTSET)
    report_figure(
        f"protocol model: {STATS['runs']} runs; {STATS['requests']} agent requests, {STATS['crashes']} crashes, "
        f"{STATS['stale responses']} stale responses, {STATS['resubmits']} resubmits, {STATS['lookups']} lookups, "
        f"{STATS['cancels recorded']} cancels recorded ({STATS['cancels refused']} refused); "
        f"ended Processed {STATS['Processed']}, Compensated {STATS['Compensated']}, Error {STATS['Error']} "
        f"(on {APPROVAL_WORKFLOW.name}: {STATS[f'{APPROVAL_WORKFLOW.name} Processed']}, "
        f"{STATS[f'{APPROVAL_WORKFLOW.name} Compensated']}, {STATS[f'{APPROVAL_WORKFLOW.name} Error']}; "
        f"on {PARALLEL_WORKFLOW.name}: {STATS[f'{PARALLEL_WORKFLOW.name} Processed']}, "
        f"{STATS[f'{PARALLEL_WORKFLOW.name} Compensated']}, {STATS[f'{PARALLEL_WORKFLOW.name} Error']}); "
        f"events accepted {STATS['events accepted']}, duplicate {STATS['events duplicate']}, "
        f"not waiting {STATS['events not_waiting']}; responses recorded on the instance's cache "
        f"{STATS['recorded without a read']}, on a read {STATS['recorded on a read']}; "
        f"slowest order after the faults stopped: {WORST['ratio']:.0%} of its bound; runs by T and P (s): "
        + ", ".join(f"{t}/{p} {STATS[f'T {t} P {p}']}" for t, p in TIMEOUTS)
    )
    assert STATS["runs"] > 0





# --- sequences kept as scripted tests ---------------------------------------------------
# The same machine, driven by hand: each test is a sequence of the model's events and
# fails with the story of what happened, as a failing run of the model does.


@contextmanager
def scripted(t_and_p: tuple[float, float] | None = None):
    m = ProtocolModel()
    if t_and_p is not None:
        m.use_timeouts(*t_and_p)
    logging.disable(logging.ERROR)
    try:
        yield m
    except Exception as error:
        raise AssertionError(f"{type(error).__name__}: {error}\nevents:\n" + "\n".join(m.story)) from error
    finally:
        logging.disable(logging.NOTSET)
        m.loop.close()


def index_of(model: ProtocolModel, of: Channel, **match) -> int:
    """The ``pick`` that takes the visible message of kind ``of`` whose body matches."""
    for i, message in enumerate(model.net.visible(of)):
        if all(getattr(message.body, k) == v for k, v in match.items()):
            return i
    raise AssertionError(f"no visible {of.value} with {match}: {model.net.messages}")


def answer(m: ProtocolModel, rule=None) -> None:
    """The order's one request is taken by its agent, whose remote answers (or does as
    ``rule`` says), and the response is recorded (which claims the next line)."""
    (rule or m.remote_answers)(pick=0, again=False, crash_after=0)
    m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)


def postpone_until_spent(m: ProtocolModel, order_id: str, remote: str, kind: Kind) -> None:
    """The line's remote is down for everyone: each attempt is postponed (no call), and
    each request is delivered twice (at least once delivery), until the postponements
    have counted as the line's last failure; then the service is back, and whatever the
    scheduler is nudged to do next is done."""
    m.breaker(remote=remote, is_open=True)
    for _ in range(2 * DEFAULTS.max_failures * MAX_POSTPONEMENTS):
        state = m.state(order_id)
        if state.gave_up or state.kind is not kind or state.process_state is not ProcessState.PENDING:
            break  # the line's failures are spent (and, today, it is handed back at once)
        if not [n for n in m.net.visible(Channel.NUDGE) if n.body.order_id == order_id]:
            m.tick(by="next nudge")
        m.schedule(pick=index_of(m, Channel.NUDGE, order_id=order_id), instance=SCHEDULERS[0], again=False,
                   crash_after=0)
        latest = index_of(m, Channel.REQUEST, attempt=m.state(order_id).attempt)
        m.remote_answers(pick=latest, again=True, crash_after=0)  # postponed; delivered again later
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
    m.breaker(remote=remote, is_open=False)
    while [n for n in m.net.visible(Channel.NUDGE) if n.body.order_id == order_id]:
        m.schedule(pick=index_of(m, Channel.NUDGE, order_id=order_id), instance=SCHEDULERS[1], again=False,
                   crash_after=0)


def undo_first_then_everything(m: ProtocolModel, step: str) -> None:
    """The undo of ``step``, if one was claimed, is taken first; then every other request
    (the postponed attempt's second delivery); then the faults stop."""
    undo = [r for r in m.net.visible(Channel.REQUEST) if r.body.kind is Kind.COMPENSATION and r.body.step == step]
    if undo:
        m.remote_answers(pick=m.net.visible(Channel.REQUEST).index(undo[0]), again=False, crash_after=0)
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
    while m.net.visible(Channel.REQUEST):
        m.remote_answers(pick=0, again=False, crash_after=0)
        if m.net.visible(Channel.RESPONSE):
            m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
    m.settle()


def test_an_action_given_up_while_postponed_is_not_undone_while_its_request_may_still_run():
    """A line postponed until its failures run out is handed back for the give-up at
    once; its undo must still wait until the postponed attempt's request, which Service
    Bus may deliver again, can no longer act (its Complete-By). Otherwise the action is
    applied after its undo, and a Compensated order leaves stock reserved."""
    with scripted() as m:
        m.new_order()
        m.submit(pick=0, crash_after=0)
        postpone_until_spent(m, "o-1", "inventory", Kind.ACTION)  # reserve's failures spent
        undo_first_then_everything(m, "reserve")


def test_an_undo_given_up_while_postponed_lets_no_earlier_undo_run_before_it_can_no_longer_act():
    """The same for an undo: refund postponed until it gives up; release must not run
    while the refund's request may still be delivered, or the refund lands after the
    release (not in reverse order) and the Error's alert names an undo that was done."""
    with scripted() as m:
        m.new_order()
        m.submit(pick=0, crash_after=0)
        m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve claimed
        answer(m)  # reserve done, charge claimed
        answer(m)  # charge done, ship claimed
        answer(m, m.remote_refuses)  # ship refused: refund claimed
        m.lose(pick=index_of(m, Channel.REQUEST, kind=Kind.COMPENSATION))
        m.tick(by="past next deadline")
        m.supervise(who=SUPERVISORS[0], crash_after=0)  # refund: failure 1 of 2
        postpone_until_spent(m, "o-1", "payments", Kind.COMPENSATION)  # refund's failures spent
        undo_first_then_everything(m, "reserve")


def charge_postponed_then_cancelled(m) -> None:
    """reserve done; charge postponed (its remote down for everyone), its request to be
    delivered again (at least once); the breaker closed again; then the order cancelled."""
    m.new_order()
    m.submit(pick=0, crash_after=0)
    m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve claimed
    answer(m)  # reserve done, charge claimed
    m.breaker(remote="payments", is_open=True)
    m.remote_answers(pick=0, again=True, crash_after=0)  # postponed; the request is delivered again later
    m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
    m.breaker(remote="payments", is_open=False)
    m.cancel(order_id="o-1", crash_after=0)


def test_a_line_cancelled_while_postponed_is_not_undone_while_its_request_may_still_run():
    """Charge is postponed (its remote down for everyone), its request to be delivered
    again (at least once); then the order is cancelled. The undo of charge must wait until
    that request can no longer act, or the charge lands after its refund (applied and
    never undone, in a Compensated order); and no forward step starts after the cancel."""
    with scripted() as m:
        charge_postponed_then_cancelled(m)
        while m.net.visible(Channel.NUDGE):
            m.schedule(pick=0, instance=SCHEDULERS[1], again=False, crash_after=0)
        assert not [r for r in m.net.visible(Channel.REQUEST) if r.body.kind is Kind.COMPENSATION]
        undo_first_then_everything(m, "charge")
        state = m.state("o-1")
        assert state.process_state is ProcessState.COMPENSATED and "cancelled by model" in state.cause


@pytest.mark.parametrize("t_and_p", TIMEOUTS, ids=[f"T {t} s, P {p} s" for t, p in TIMEOUTS])
def test_a_cancel_nudge_delivered_twice_does_not_undo_a_postponed_line_while_its_request_may_still_run(t_and_p):
    """As above, and the cancel's nudge is delivered twice (at least once delivery): the
    first hands the postponed line back after T, the second must not start its undo
    early. Found with T under P (the line's CompleteBy was now + 2T, due at 2T - P: at
    once), where the redelivered charge then lands after its refund; T = P hides it."""
    with scripted(t_and_p) as m:
        charge_postponed_then_cancelled(m)
        cancel_nudge = index_of(m, Channel.NUDGE, order_id="o-1")
        m.schedule(pick=cancel_nudge, instance=SCHEDULERS[1], again=True, crash_after=0)  # handed back after T
        while m.net.visible(Channel.NUDGE):  # the cancel's nudge again: nothing is due yet
            m.schedule(pick=0, instance=SCHEDULERS[1], again=False, crash_after=0)
        assert not [r for r in m.net.visible(Channel.REQUEST) if r.body.kind is Kind.COMPENSATION]
        undo_first_then_everything(m, "charge")
        assert m.state("o-1").process_state is ProcessState.COMPENSATED


def test_a_cancel_during_an_undo_changes_nothing_of_it():
    with scripted() as m:
        m.new_order()
        m.submit(pick=0, crash_after=0)
        m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        answer(m)
        answer(m, m.remote_refuses)  # charge refused: release claimed
        m.cancel(order_id="o-1", crash_after=0)
        m.cancel(order_id="o-1", crash_after=0)  # twice: a no-op
        answer(m)
        m.settle()
        state = m.state("o-1")
        assert state.process_state is ProcessState.COMPENSATED and state.cause.startswith("step charge refused")
        assert m.counts["cancels recorded"] == 1 and m.counts["cancels already"] == 1


def test_a_done_step_is_undone_at_once_and_its_request_delivered_again_applies_nothing():
    """The protocol model's counterexample (issue 24 follow-up): reserve is answered and
    its request stays to be delivered again (at least once delivery); charge is refused.
    reserve is Done, so its undo runs at once, not after the redelivered request's
    Complete-By: that request carries reserve's idempotency key, which the remote has
    applied, so it is a replay there and applies nothing after the undo."""
    with scripted() as m:
        m.new_order()
        m.submit(pick=0, crash_after=0)
        m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve claimed
        m.remote_answers(pick=0, again=True, crash_after=0)  # applied; the request stays deliverable
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve Done, charge claimed
        redelivered = m.net.visible(Channel.REQUEST)[index_of(m, Channel.REQUEST, step="reserve")]
        m.remote_refuses(pick=index_of(m, Channel.REQUEST, step="charge"), again=False, crash_after=0)
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # charge Refused: release claimed
        state = m.state("o-1")
        assert (state.process_state, state.kind, state.step) == (ProcessState.PROCESSING, Kind.COMPENSATION, "reserve")
        assert m.now < redelivered.body.complete_by  # the undo is claimed while reserve's request is deliverable
        m.remote_answers(pick=index_of(m, Channel.REQUEST, kind=Kind.COMPENSATION), again=False, crash_after=0)
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve undone
        assert m.state("o-1").process_state is ProcessState.COMPENSATED
        again = index_of(m, Channel.REQUEST, step="reserve", kind=Kind.ACTION)
        m.remote_answers(pick=again, again=False, crash_after=0)  # reserve's request, delivered again
        assert m.applied_log[-1][3] is Kind.COMPENSATION  # the replay applied nothing after the undo
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # its response is stale
        m.settle()  # Compensated leaves nothing applied at the remotes


def test_an_undo_is_flagged_while_an_action_not_done_may_still_take_effect():
    """The invariant spares only Done actions: reserve claimed and its request in flight
    (outcome unknown), an undo reaching the remote now is a violation."""
    with scripted() as m:
        m.new_order()
        m.submit(pick=0, crash_after=0)
        m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve claimed, request sent
        action = m.net.visible(Channel.REQUEST)[0].body
        undo = action.model_copy(
            update={"kind": Kind.COMPENSATION, "action": "release",
                    "idempotency_key": idempotency_key("o-1", "reserve", "release")}
        )
        with pytest.raises(AssertionError, match="reserve undone while its action may still take effect"):
            m.check_compensation_may_run(undo)


def test_a_line_given_up_while_postponed_is_not_undone_on_a_nudge_delivered_early():
    """A line postponed until its failures run out is due for its give-up only at its
    last attempt's Complete-By; the submission's nudge, delivered again meanwhile (at
    least once delivery), must not start the undo early: the postponed requests may
    still be delivered to an agent whose breaker has closed, and apply after the undo."""
    with scripted() as m:
        m.new_order()
        m.submit(pick=0, crash_after=0)
        m.breaker(remote="inventory", is_open=True)

        def early_nudge() -> None:  # the submission's nudge, delivered once more
            pick = index_of(m, Channel.NUDGE, state=m.snapshots["o-1"][0])
            m.schedule(pick=pick, instance=SCHEDULERS[0], again=True, crash_after=0)

        for _ in range(DEFAULTS.max_failures * MAX_POSTPONEMENTS):
            early_nudge()  # claims the next attempt
            m.remote_answers(pick=index_of(m, Channel.REQUEST, attempt=m.state("o-1").attempt), again=True,
                             crash_after=0)  # postponed; the request stays deliverable
            m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        given_up = m.state("o-1")
        assert given_up.gave_up and m.now < given_up.complete_by - PENDING  # due at the last attempt's Complete-By
        m.breaker(remote="inventory", is_open=False)
        early_nudge()
        assert m.state("o-1") == given_up  # not due: nothing claimed, no undo
        m.remote_answers(pick=index_of(m, Channel.REQUEST, attempt=1), again=False, crash_after=0)  # reserve applies
        undo_first_then_everything(m, "reserve")  # the undo comes with the give-up's own nudge, and ends it
        assert m.state("o-1").process_state is ProcessState.COMPENSATED and ("o-1", "reserve") in m.undone


def waiting_for_approval(m: ProtocolModel) -> str:
    """An approval order whose reserve is Done: it waits for its approval (20 s)."""
    m.new_order(APPROVAL_WORKFLOW)
    m.submit(pick=0, crash_after=0)
    m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # reserve claimed
    answer(m)  # reserve Done, approve claimed: waiting
    assert m.waiting_orders() == ["o-1"]
    return "o-1"


def test_an_approval_delivered_twice_and_one_after_a_cancel_start_nothing_more():
    """Approved (delivered twice: the second is a duplicate); a second order's approval
    lands after its cancel was recorded: refused, no action claimed; both orders end
    within their bounds (Processed; Compensated, the reservation released)."""
    with scripted() as m:
        waiting_for_approval(m)
        m.client_sends_event(to="a waiting order", pick=0, approved=True, delay=0)
        m.receive_event(pick=0, instance=SCHEDULERS[0], again=True, crash_after=0)
        m.receive_event(pick=0, instance=SCHEDULERS[1], again=False, crash_after=0)
        assert (m.counts["events accepted"], m.counts["events duplicate"]) == (1, 1)
        assert (m.state("o-1").step, m.state("o-1").kind) == ("charge", Kind.ACTION)
        m.new_order(APPROVAL_WORKFLOW)
        m.submit(pick=0, crash_after=0)
        m.schedule(pick=index_of(m, Channel.NUDGE, order_id="o-2"), instance=SCHEDULERS[0], again=False, crash_after=0)
        m.remote_answers(pick=index_of(m, Channel.REQUEST, order_id="o-2"), again=False, crash_after=0)
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)  # o-2 waits
        m.client_sends_event(to="any order", pick=1, approved=True, delay=0)
        m.cancel("o-2", crash_after=0)
        m.receive_event(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        assert m.counts["events not_waiting"] == 1 and ("o-2", "charge") not in m.actions_claimed
        m.settle()
        assert m.state("o-1").process_state is ProcessState.PROCESSED
        assert m.state("o-2").process_state is ProcessState.COMPENSATED


def test_an_approval_delivered_past_the_deadline_changes_nothing_and_the_order_is_undone():
    with scripted() as m:
        waiting_for_approval(m)
        m.client_sends_event(to="a waiting order", pick=0, approved=True, delay=40)
        m.tick(by="31 s")
        m.tick(by="10 s")  # the event is visible now, 21 s past the waiting line's deadline
        m.receive_event(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        assert m.counts["events not_waiting"] == 1 and ("o-1", "charge") not in m.actions_claimed
        m.settle()
        assert m.state("o-1").process_state is ProcessState.COMPENSATED and ("o-1", "reserve") in m.undone


def test_a_group_line_postponed_while_the_other_is_refused_is_not_undone_while_its_request_may_still_run():
    """order-parallel: reserve and charge are sent at once. Payments is down for everyone:
    the charge is postponed, its request to be delivered again (at least once); then the
    reserve is refused. Nothing may be undone while that charge request can still act (it
    would land after its refund), and nothing after the group (ship) may start; once the
    charge's attempt has passed its Complete-By, the charge (outcome unknown) is undone,
    and the refused reserve is not."""
    with scripted() as m:
        m.new_order(PARALLEL_WORKFLOW)
        m.submit(pick=0, crash_after=0)
        m.schedule(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        assert sorted(r.body.step for r in m.net.visible(Channel.REQUEST)) == ["charge", "reserve"]
        m.breaker(remote="payments", is_open=True)
        charge = index_of(m, Channel.REQUEST, step="charge")
        m.remote_answers(pick=charge, again=True, crash_after=0)  # postponed; delivered again later
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        m.breaker(remote="payments", is_open=False)
        reserve = index_of(m, Channel.REQUEST, step="reserve")
        m.remote_refuses(pick=reserve, again=False, crash_after=0)
        m.record(pick=0, instance=SCHEDULERS[0], again=False, crash_after=0)
        state = m.state("o-1")
        assert state.kind is Kind.ACTION and state.cause.startswith("step reserve refused")
        while m.net.visible(Channel.NUDGE):  # the postponement's nudge: the charge may still act
            m.tick(by="next nudge")
            m.schedule(pick=0, instance=SCHEDULERS[1], again=False, crash_after=0)
            if m.now >= state.group[1].acts_until:
                break
        undos = [r for r in m.net.visible(Channel.REQUEST) if r.body.kind is Kind.COMPENSATION]
        assert not undos or m.now >= state.group[1].acts_until
        m.settle()
        state = m.state("o-1")
        assert state.process_state is ProcessState.COMPENSATED and state.cause.startswith("step reserve refused")
        lines = {key: row["LineState"] for key, row in m.rows("o-1").items() if key.startswith(("step", "undo"))}
        assert lines == {"step-01-reserve": "Refused", "step-02-charge": "Cancelled", "undo-02-charge": "Done"}
        assert ("o-1", "ship") not in m.actions_claimed
