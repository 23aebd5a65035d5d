"""The multi-step workflow with compensation, decided by core.lifecycle and carried out
by scheduler.dispatch and supervisor.supervision through the real StateStore, over an
in-memory table that enforces ETags like Table Storage: no service needed.

Agents are played by the test: it answers each agent request the scheduler sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from adapters.closing import close_order
from adapters.messaging import ended_key
from adapters.order_cache import OrderCache
from adapters.store import StateStore
from core import lifecycle, names, workflow as workflows
from core.lifecycle import SupervisorPolicy
from core.models import (
    AgentRequest,
    AgentResponse,
    LineState,
    Nudge,
    OrderRequest,
    Outcome,
    ProcessState,
    Status,
    idempotency_key,
)
from core.workflow import Kind, Step, StepPolicy, Workflow
from devtools.orders import order_dict
from scheduler import dispatch
from supervisor import supervision
from tests.memtable import MemoryTable

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
DEFAULTS = StepPolicy(
    timeout_seconds=30, max_failures=3, agent_max_calls=3, agent_backoff_initial=0.1, agent_backoff_max=1,
    wait_timeout_seconds=names.DEFAULT_APPROVAL_TIMEOUT_SECONDS,
)
MAX_POSTPONEMENTS = 4
POLICY = SupervisorPolicy(
    max_failures=3,
    step_timeout=timedelta(seconds=30),
    pending_timeout=timedelta(seconds=30),
    backoff_base=timedelta(seconds=2),
    backoff_cap=timedelta(seconds=60),
)


class Publisher:
    """Records what the app sends."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, AgentRequest]] = []
        self.statuses = []
        #: The key each status event was sent with (adapters.messaging.status_message_id).
        self.status_keys = []
        self.alerts = []

    def send_agent_request(self, request, *, queue, reply_to, now):
        self.requests.append((queue, request))
        return True

    def send_status(self, event, *, queue, key=None):
        self.statuses.append(event)
        self.status_keys.append(key)
        return True

    def send_alert(self, alert, *, queue, attempt, ended=None):
        self.alerts.append(alert)


class Nudger:
    def __init__(self) -> None:
        self.nudges: list[tuple[Nudge, timedelta]] = []

    def nudge(self, nudge, *, delay=timedelta(0)):
        self.nudges.append((nudge, delay))


class World:
    """One order's world: the store over an in-memory table (or ``store``), the scheduler
    (with ``cache``, the orders as its process last wrote them), a clock."""

    def __init__(
        self, definition: Workflow = workflows.ORDER_WORKFLOW, *, defaults: StepPolicy = DEFAULTS,
        store: StateStore | None = None, cache: OrderCache | None = None,
    ) -> None:
        self.table = MemoryTable()
        self.store = store or StateStore(self.table)
        self.publisher = Publisher()
        self.nudger = Nudger()
        self.now = T0
        self.definition = definition
        self.scheduler = dispatch.Scheduler(
            store=self.store,
            publisher=self.publisher,
            instance="host-1",
            defaults=defaults,
            requests_queues={remote: f"{remote}-requests" for remote in workflows.remotes()},
            responses_queue="agent-responses",
            alerts_queue="alerts",
            nudger=self.nudger,
            pending_timeout=timedelta(seconds=30),
            max_postponements=MAX_POSTPONEMENTS,
            cache=cache,
        )

    def submit(self, order_id: str = "o-1", *, before_claim: Callable[[], None] | None = None) -> str:
        order = OrderRequest.model_validate(order_dict(order_id, lines=1))
        created = self.store.create_order(
            order, workflow=self.definition, reply_to="replies", now=self.now, pending_timeout=timedelta(seconds=30)
        )
        if self.scheduler.cache is not None:  # as scheduler.submission keeps what it wrote
            self.scheduler.cache.put(created.record, self.now)
        if before_claim is not None:
            before_claim()
        dispatch.schedule(
            Nudge(order_id=order_id, state=created.state, document=order.document()),
            scheduler=self.scheduler, now=self.now,
        )
        return order_id

    @property
    def last(self) -> AgentRequest:
        return self.publisher.requests[-1][1]

    def answer(self, outcome: Outcome = Outcome.SUCCEEDED, request: AgentRequest | None = None, **fields):
        request = request or self.last
        response = AgentResponse(
            order_id=request.order_id, step=request.step, kind=request.kind, attempt=request.attempt,
            outcome=outcome, context=request.context,
            result=fields.get("result", {"confirmation": f"{request.action}-{request.attempt}"})
            if outcome is Outcome.SUCCEEDED else None,
            error=fields.get("error", "HTTP 422: no") if outcome is not Outcome.SUCCEEDED else None,
            retry_after_seconds=7.0 if outcome is Outcome.POSTPONED else None,
        )
        self.now += timedelta(seconds=1)
        return dispatch.record(response, scheduler=self.scheduler, now=self.now)

    def expire(self) -> None:
        """The current line's deadline passes without an answer; the supervisor sweeps
        and the scheduler takes its nudge."""
        self.now = self.store.get("o-1").complete_by + timedelta(seconds=1)
        supervision.sweep(
            store=self.store, publisher=self.publisher, nudger=self.nudger, policy=POLICY, now=self.now,
            alerts_queue="alerts",
        )
        nudge, delay = self.nudger.nudges[-1]
        self.now += delay
        dispatch.schedule(nudge, scheduler=self.scheduler, now=self.now)

    def lines(self, order_id: str = "o-1") -> dict[tuple[str, Kind], LineState]:
        return {(line.step, line.kind): line.state for line in self.store.read(order_id).lines}

    def sent(self) -> list[tuple[str, str]]:
        """(kind, action) of every agent request, in order."""
        return [(r.kind.value, r.action) for _, r in self.publisher.requests]

    def state(self, order_id: str = "o-1"):
        return self.store.get(order_id)


def test_steps_run_in_order_each_after_the_previous_success_is_recorded():
    w = World()
    w.submit()
    assert w.sent() == [("action", "reserve")]
    assert w.publisher.requests[-1][0] == "inventory-requests"
    w.answer()
    assert w.lines() == {("reserve", Kind.ACTION): LineState.DONE}
    assert w.sent() == [("action", "reserve"), ("action", "charge")]
    assert w.publisher.requests[-1][0] == "payments-requests"
    assert w.last.context.results["reserve"] == {"confirmation": "reserve-1"}
    w.answer()
    assert w.publisher.requests[-1][0] == "shipping-requests"
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.PROCESSED
    assert w.lines() == {(s, Kind.ACTION): LineState.DONE for s in ("reserve", "charge", "ship")}
    assert [(e.status, e.step) for e in w.publisher.statuses] == [
        (Status.PROCESSING, "reserve"), (Status.PROCESSING, "charge"), (Status.PROCESSING, "ship"),
        (Status.PROCESSED, None),
    ]
    assert w.store.active_ids() == []


def test_recording_a_step_and_starting_the_next_is_one_partition_read_and_one_transaction():
    """The response's fence is a claim, not the row: the scheduler reads the order's
    partition (state, document, results so far) once and writes once."""
    w = World()
    w.submit()
    before = w.table.ops.copy()
    w.answer()
    used = w.table.ops - before
    assert used == {"query": 1, "transaction": 1}, used


def test_refusal_at_step_2_undoes_step_1_only_and_ends_compensated():
    w = World()
    w.submit()
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT, error="HTTP 422: card declined")
    assert w.sent()[-1] == ("compensation", "release")
    assert w.last.result == {"confirmation": "reserve-1"}  # the forward result travels with the undo
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED
    assert "charge refused" in state.last_error
    assert w.lines() == {
        ("reserve", Kind.ACTION): LineState.DONE,
        ("charge", Kind.ACTION): LineState.REFUSED,
        ("reserve", Kind.COMPENSATION): LineState.DONE,
    }
    assert ("compensation", "refund") not in w.sent()  # a refused step applied nothing
    assert [e.status for e in w.publisher.statuses][-2:] == [Status.COMPENSATING, Status.COMPENSATED]
    assert w.publisher.alerts == []


def test_refusal_at_step_3_undoes_steps_2_and_1_in_reverse_order():
    w = World()
    w.submit()
    w.answer()
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT)
    w.answer()
    w.answer()
    assert w.sent() == [
        ("action", "reserve"), ("action", "charge"), ("action", "ship"),
        ("compensation", "refund"), ("compensation", "release"),
    ]
    assert w.state().process_state is ProcessState.COMPENSATED


def test_refusal_at_step_1_ends_compensated_with_nothing_to_undo():
    w = World()
    w.submit()
    w.answer(Outcome.FAILED_PERMANENT)
    assert w.sent() == [("action", "reserve")]
    assert w.state().process_state is ProcessState.COMPENSATED


def test_a_step_that_exhausts_its_failures_is_undone_too_since_it_may_have_been_applied():
    w = World()
    w.submit()
    w.answer()
    charge_key = w.last.idempotency_key
    for _ in range(3):  # three attempts of charge time out
        w.expire()
    assert [k for k, a in w.sent()].count("action") == 4  # reserve + 3 charge attempts
    assert {r.idempotency_key for _, r in w.publisher.requests if r.action == "charge"} == {charge_key}
    assert w.sent()[-1] == ("compensation", "refund")
    assert w.last.result is None  # outcome unknown: no result to undo by
    assert w.last.idempotency_key != charge_key
    assert w.last.idempotency_key == idempotency_key("o-1", "charge", "refund")
    w.answer()
    assert w.sent()[-1] == ("compensation", "release")
    w.answer()
    assert w.state().process_state is ProcessState.COMPENSATED
    assert w.lines()[("charge", Kind.ACTION)] is LineState.EXHAUSTED
    assert [e.step for e in w.publisher.statuses if e.status is Status.RETRYING] == ["charge", "charge"]


def test_a_step_that_cannot_be_undone_and_exhausts_its_failures_stops_in_error_for_an_operator():
    w = World()
    w.submit()
    w.answer()
    w.answer()
    ship_key = w.last.idempotency_key
    for _ in range(3):
        w.expire()
    state = w.state()
    assert state.process_state is ProcessState.ERROR
    assert "cannot be undone" in state.last_error
    assert [k for k, _ in w.sent()].count("compensation") == 0
    assert len(w.publisher.alerts) == 1

    # The operator resubmits: ship runs again, same key, and the order completes.
    supervision.resubmit("o-1", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
    dispatch.schedule(w.nudger.nudges[-1][0], scheduler=w.scheduler, now=w.now)
    assert w.sent()[-1] == ("action", "ship") and w.last.idempotency_key == ship_key
    w.answer()
    assert w.state().process_state is ProcessState.PROCESSED


def test_a_compensation_that_keeps_failing_ends_in_error_with_one_alert_and_resubmit_finishes_it():
    w = World()
    w.submit()
    w.answer()
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT)  # ship refused: undo charge, then reserve
    w.answer()  # refund done
    release_key = w.last.idempotency_key
    assert w.sent()[-1] == ("compensation", "release")
    for _ in range(3):
        w.expire()
    state = w.state()
    assert state.process_state is ProcessState.ERROR
    assert "reserve" in state.last_error
    assert len(w.publisher.alerts) == 1
    assert w.publisher.alerts[0].failed_compensations == ["reserve"]
    assert w.lines()[("reserve", Kind.COMPENSATION)] is LineState.FAILED

    supervision.resubmit("o-1", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
    dispatch.schedule(w.nudger.nudges[-1][0], scheduler=w.scheduler, now=w.now)
    assert w.sent()[-1] == ("compensation", "release")  # only the failed undo: refund is not redone
    assert w.last.idempotency_key == release_key
    assert w.last.result == {"confirmation": "reserve-1"}
    w.answer()
    assert w.state().process_state is ProcessState.COMPENSATED
    assert w.sent().count(("compensation", "refund")) == 1
    assert len(w.publisher.alerts) == 1


def test_a_refused_compensation_is_recorded_and_the_others_still_run():
    w = World()
    w.submit()
    w.answer()
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT)
    w.answer(Outcome.FAILED_PERMANENT, error="HTTP 409: already settled")  # refund refused
    assert w.sent()[-1] == ("compensation", "release")
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.ERROR
    assert w.publisher.alerts[0].failed_compensations == ["charge"]


def test_duplicate_and_stale_responses_during_compensation_change_nothing():
    w = World()
    w.submit()
    w.answer()
    charge = w.last
    w.answer(Outcome.FAILED_PERMANENT)
    release = w.last
    before = (w.state(), w.table.rows("o-1"), len(w.publisher.requests))
    # the refusal again (duplicate), and a late success of the same charge attempt (stale)
    assert w.answer(Outcome.FAILED_PERMANENT, request=charge) is None
    assert w.answer(Outcome.SUCCEEDED, request=charge) is None
    assert (w.state(), w.table.rows("o-1"), len(w.publisher.requests)) == before
    w.answer(request=release)
    assert w.answer(request=release) is None  # the undo's answer again
    assert w.state().process_state is ProcessState.COMPENSATED


def test_a_response_after_the_supervisor_reset_the_line_is_fenced_out():
    w = World()
    w.submit()
    first = w.last
    w.expire()  # attempt 1 timed out; attempt 2 was claimed and sent
    assert w.last.attempt == first.attempt + 1
    assert w.answer(request=first) is None
    assert w.state().step == "reserve"
    w.answer()
    assert w.state().step == "charge"


def test_overlapping_supervisors_act_once_on_an_expired_line():
    w = World()
    w.submit()
    w.now = w.state().complete_by + timedelta(seconds=1)
    stale = w.state()
    done = supervision.sweep(
        store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now, alerts_queue="alerts"
    )
    assert done["retry"] == 1
    # a second supervisor decided on the row as it was before the first one wrote
    assert w.store.transition(stale, lifecycle.supervise(stale, w.now, POLICY).next_state) is None
    assert w.state().failure_count == 1


def test_competing_schedulers_claim_a_line_once():
    w = World()
    order_id = "o-1"
    order = OrderRequest.model_validate(order_dict(order_id, lines=1))
    created = w.store.create_order(
        order, workflow=w.definition, reply_to=None, now=w.now, pending_timeout=timedelta(seconds=30)
    )
    nudge = Nudge(order_id=order_id, state=created.state, document=order.document())
    first = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    second = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert first is not None and second is None
    assert len(w.publisher.requests) == 1


def test_the_supervisor_never_names_a_business_step():
    import inspect

    source = inspect.getsource(supervision) + inspect.getsource(lifecycle.supervise)
    for step in workflows.ORDER_WORKFLOW.steps:
        for name in (step.name, step.action, step.compensate, step.remote):
            if name:
                assert name not in source


def test_an_order_in_flight_finishes_on_the_definition_it_started_with(monkeypatch):
    w = World()
    w.submit()
    w.answer()  # reserve done on v1
    v2 = Workflow("order", 2, (Step("charge", remote="payments", action="charge", compensate="refund"),))
    monkeypatch.setitem(workflows.WORKFLOWS, v2.key, v2)
    monkeypatch.setattr(workflows, "CURRENT", v2)
    w.answer()
    w.answer()
    assert w.sent() == [("action", "reserve"), ("action", "charge"), ("action", "ship")]
    state = w.state()
    assert (state.workflow, state.workflow_version, state.process_state) == ("order", 1, ProcessState.PROCESSED)


def test_an_order_whose_definition_is_gone_ends_in_error_with_an_alert(monkeypatch):
    w = World()
    w.submit()
    monkeypatch.delitem(workflows.WORKFLOWS, ("order", 1))
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.ERROR and "no workflow order v1" in state.last_error
    assert len(w.publisher.alerts) == 1


def test_per_step_policy_overrides_the_app_defaults(monkeypatch):
    slow = Workflow(
        "slow", 1,
        (Step("reserve", remote="inventory", action="reserve", compensate="release",
              policy=StepPolicy(timeout_seconds=120, max_failures=1, agent_max_calls=9)),),
    )
    monkeypatch.setitem(workflows.WORKFLOWS, slow.key, slow)
    w = World(slow)
    w.submit()
    state = w.state()
    assert state.complete_by == w.now + timedelta(seconds=120)
    assert state.max_failures == 1
    assert w.last.policy.max_calls == 9
    assert w.last.policy.backoff_initial == DEFAULTS.agent_backoff_initial
    w.expire()  # one failure is the limit: given up at once, undone
    assert w.sent()[-1] == ("compensation", "release")


@pytest.mark.parametrize("kind", list(Kind))
def test_idempotency_keys_differ_between_an_action_and_its_compensation_and_between_orders(kind):
    step = workflows.ORDER_WORKFLOW.steps[0]
    key = idempotency_key("o-1", step.name, step.action_of(kind))
    assert key == idempotency_key("o-1", step.name, step.action_of(kind))
    assert key != idempotency_key("o-2", step.name, step.action_of(kind))
    assert idempotency_key("o-1", step.name, step.action) != idempotency_key("o-1", step.name, step.compensate)


def test_progress_shows_every_step_and_every_compensation_as_the_order_goes():
    from core.progress import progress

    w = World()

    def view():
        record = w.store.read("o-1")
        return [(v.step, v.kind.value, v.state) for v in progress(record.state, w.definition, record.lines)]

    w.submit()
    assert view() == [("reserve", "action", "Running"), ("charge", "action", "NotStarted"), ("ship", "action", "NotStarted")]
    w.answer()
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT)  # ship refused: undo charge now, reserve next
    assert view() == [
        ("reserve", "action", "Done"), ("charge", "action", "Done"), ("ship", "action", "Refused"),
        ("charge", "compensation", "Running"), ("reserve", "compensation", "Planned"),
    ]
    w.answer()
    w.answer()
    assert view()[-2:] == [("charge", "compensation", "Done"), ("reserve", "compensation", "Done")]
    record = w.store.read("o-1")
    charge = progress(record.state, w.definition, record.lines)[1]
    assert charge.result == {"confirmation": "charge-2"} and charge.attempt == 2


def test_a_postponed_line_waits_without_a_failure_and_the_supervisor_counts_no_miss():
    w = World()
    w.submit()
    w.answer()  # reserve done
    charge = w.last
    w.answer(Outcome.POSTPONED, request=charge)
    state = w.state()
    assert (state.process_state, state.step, state.failure_count) == (ProcessState.PENDING, "charge", 0)
    nudge, delay = w.nudger.nudges[-1]
    assert delay == timedelta(seconds=7)
    # Before the wait is over the supervisor has nothing to do...
    w.now += timedelta(seconds=6)
    assert not supervision.sweep(
        store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now, alerts_queue="alerts"
    )
    # ...and after it the scheduler runs the same line again, same key, no failure counted;
    # payments offers the lookup, and a postponed line may have timed out first: ask.
    w.now += delay
    dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert (w.last.step, w.last.idempotency_key, w.last.settle_first) == ("charge", charge.idempotency_key, True)
    assert w.state().failure_count == 0


def test_a_line_postponed_again_and_again_counts_failures_and_ends_in_the_failure_path():
    """A remote that stays down, or fails this one line every time, cannot keep an order
    waiting forever: every MAX_POSTPONEMENTS-th postponement in a row is a failed
    attempt, and at MAX_FAILURES the line is given up (here: charge, undone with reserve)."""
    w = World()
    w.submit()
    w.answer()  # reserve done

    def postpone_until_counted():
        for n in range(1, MAX_POSTPONEMENTS + 1):
            w.answer(Outcome.POSTPONED)
            state = w.state()
            assert state.postponements % MAX_POSTPONEMENTS == n % MAX_POSTPONEMENTS  # the count is kept
            nudge, delay = w.nudger.nudges[-1]
            w.now += delay
            dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)

    postpone_until_counted()
    state = w.state()
    assert (state.step, state.failure_count, state.postponements) == ("charge", 1, MAX_POSTPONEMENTS)
    assert f"postponed {MAX_POSTPONEMENTS} times in a row" in state.last_error
    postpone_until_counted()
    assert w.state().failure_count == 2
    postpone_until_counted()  # the third failure gives up: charge's outcome is unknown, undo it and reserve
    assert w.sent()[-1] == ("compensation", "refund")
    w.answer()
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED and state.postponements == 0
    assert w.lines()[("charge", Kind.ACTION)] is LineState.EXHAUSTED


def test_a_line_given_up_while_postponed_is_handed_back_only_once_its_attempt_can_no_longer_act():
    """Service Bus delivers at least once: the postponed attempt's request may reach an agent
    whose breaker is closed and act until its Complete-By, so the give-up (and the undo it
    starts) waits until then (a case the protocol model found, tests/unit/test_protocol_model.py)."""
    w = World()
    w.submit()
    claimed = w.state()
    request = w.last
    response = AgentResponse(
        order_id=request.order_id, step=request.step, kind=request.kind, attempt=request.attempt,
        outcome=Outcome.POSTPONED, context=request.context, retry_after_seconds=1.0, error="inventory unavailable",
    )
    last_failure = claimed.model_copy(update={"failure_count": claimed.max_failures - 1})
    pending = timedelta(seconds=30)
    handed_back = lifecycle.postpone(last_failure, response, w.now, pending, max_postponements=1)
    assert handed_back.state.gave_up and handed_back.state.process_state is ProcessState.PENDING
    assert handed_back.nudge_delay == claimed.complete_by - w.now > timedelta(0)
    assert handed_back.state.complete_by == claimed.complete_by + pending
    # Past its Complete-By the attempt can no longer act: handed back at once.
    late = w.now + (claimed.complete_by - w.now) + timedelta(seconds=1)
    assert lifecycle.postpone(last_failure, response, late, pending, max_postponements=1).nudge_delay == timedelta(0)


def test_postponements_are_counted_per_line():
    w = World()
    w.submit()
    for _ in range(MAX_POSTPONEMENTS - 1):
        w.answer(Outcome.POSTPONED)
        nudge, delay = w.nudger.nudges[-1]
        w.now += delay
        dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    w.answer()  # reserve done at last: charge starts with no postponement and no failure
    assert (w.state().step, w.state().postponements, w.state().failure_count) == ("charge", 0, 0)
    w.answer(Outcome.POSTPONED)
    assert (w.state().postponements, w.state().failure_count) == (1, 0)


def test_after_an_attempt_timed_out_the_agent_is_asked_to_settle_first_where_the_remote_offers_a_lookup():
    w = World()
    w.submit()
    assert w.last.settle_first is False
    w.expire()
    assert (w.last.step, w.last.settle_first) == ("reserve", True)  # inventory offers the lookup
    w.answer()
    w.answer()
    w.expire()
    assert (w.last.step, w.last.settle_first) == ("ship", False)  # shipping does not


def test_the_alert_of_a_step_that_cannot_be_undone_names_the_step():
    w = World()
    w.submit()
    w.answer()
    w.answer()
    for _ in range(3):
        w.expire()
    (alert,) = w.publisher.alerts
    assert alert.step == "ship" and alert.failed_compensations == []
    assert "step ship could not be completed and cannot be undone" in alert.reason


def test_a_definition_longer_than_one_transaction_can_write_is_refused():
    steps = tuple(workflows.Step(f"s{i}", remote="inventory", action=f"a{i}") for i in range(workflows.MAX_STEPS + 1))
    with pytest.raises(ValueError, match="100 entities of one Table Storage transaction"):
        workflows.Workflow("long", 1, steps)
    assert workflows.Workflow("long", 1, steps[:-1]).steps[-1].name == f"s{workflows.MAX_STEPS - 1}"


class CountingTable(MemoryTable):
    """Records how many entities each entity-group transaction holds."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions: list[int] = []

    def submit_transaction(self, operations):
        operations = list(operations)
        self.transactions.append(len(operations))
        return super().submit_transaction(operations)


def test_every_transaction_of_the_longest_definition_fits_in_one_entity_group_transaction(monkeypatch):
    """The worst case the bound allows: MAX_STEPS steps, none with an undo but the first,
    the last refused. Undoing writes the state row, the refused line and a Failed row for
    every step that has no undo in one transaction; an imported finished order writes two
    rows per step. Both stay within Azure's 100 entities per transaction."""
    steps = (
        workflows.Step("s0", remote="inventory", action="a0", compensate="u0"),
        *(workflows.Step(f"s{i}", remote="inventory", action=f"a{i}") for i in range(1, workflows.MAX_STEPS)),
    )
    longest = workflows.Workflow("longest", 1, steps)
    monkeypatch.setitem(workflows.WORKFLOWS, longest.key, longest)
    w = World(longest)
    w.table = w.store.table = CountingTable()
    w.submit()
    for _ in range(workflows.MAX_STEPS - 1):
        w.answer()
    w.answer(Outcome.FAILED_PERMANENT)  # the last step refused: undo everything before it
    w.answer()  # s0's undo done; the 47 steps between could not be undone
    assert w.state().process_state is ProcessState.ERROR
    assert max(w.table.transactions) == 1 + 1 + (workflows.MAX_STEPS - 2), w.table.transactions
    # The order imported as it ended (a migration, a benchmark's history): order, state and
    # every line's row in one transaction, which the table refuses past 100 entities.
    record = w.store.read("o-1")
    imported = OrderRequest.model_validate(order_dict("o-2", lines=1))
    w.store.import_order(imported, record.state.model_copy(update={"order_id": "o-2"}), record.lines)
    assert w.table.transactions[-1] == 2 + len(record.lines) <= 100


def test_a_late_answer_still_recorded_and_the_sweep_peeks_only_for_rows_in_their_grace():
    """An agent answered before Complete-By; its response reaches the scheduler after it, held
    up on the responses queue. The supervisor waits while the queue holds a message sent by
    then (one peek a sweep, only with a row in its grace), so the answer counts: no failure."""
    graced = replace(POLICY, response_grace=timedelta(seconds=60), send_slack=timedelta(seconds=5))
    w = World()
    w.submit()
    sent_at = w.now
    peeks: list[datetime] = []

    def sweep(backlog_since: datetime) -> dict:
        def responses_since() -> datetime:
            peeks.append(w.now)
            return backlog_since

        return supervision.sweep(store=w.store, publisher=w.publisher, nudger=w.nudger, policy=graced, now=w.now,
                                 alerts_queue="alerts", responses_since=responses_since)

    assert not sweep(sent_at) and not peeks, "peeked with no row past its deadline"
    w.now = w.state().complete_by + timedelta(seconds=20)
    assert not sweep(sent_at) and len(peeks) == 1  # the answer may still be queued: wait
    w.answer()  # recorded 21 s late: the line is done, the next one claimed
    assert w.state().step == "charge" and w.state().failure_count == 0
    w.now = w.state().complete_by + timedelta(seconds=6)
    assert sweep(w.now) == {"retry": 1} and len(peeks) == 2  # nothing queued from before: the miss counts


def test_a_workflow_that_would_break_orders_at_run_time_is_refused_when_it_is_defined():
    """Caught when the workflow is written, not after an order's claim: a step that cannot
    be undone before one that can (its undo would stop there in Error, and a resubmit stop
    there again), two steps waiting for one event (a repeat of the first approval would end
    the second), an undo that is its own action (one idempotency key for both), policies
    no order can run with, two definitions under one name and version."""
    from core.workflow import Step, StepPolicy, Workflow, registry

    reserve = Step("reserve", remote="inventory", action="reserve", compensate="release")
    notify = Step("notify", remote="shipping", action="notify")
    with pytest.raises(ValueError, match="'notify' cannot be undone, so it must come after every step that can"):
        Workflow("w", 1, (notify, reserve))
    Workflow("w", 1, (reserve, notify))  # last: fine
    with pytest.raises(ValueError, match="two steps wait for the same event"):
        Workflow("w", 1, (reserve, Step("a1", wait_for="approval"), Step("a2", wait_for="approval")))
    with pytest.raises(ValueError, match="compensation must be another action"):
        Step("toggle", remote="inventory", action="toggle", compensate="toggle")
    for bad in ({"timeout_seconds": -5}, {"timeout_seconds": float("inf")}, {"timeout_seconds": 1e12},
                {"max_failures": 0}, {"agent_max_calls": 0}, {"agent_backoff_initial": 0},
                {"agent_backoff_max": float("nan")}):
        with pytest.raises(ValueError):
            StepPolicy(**bad)
    with pytest.raises(ValueError, match="two definitions of workflow w v1"):
        registry(Workflow("w", 1, (reserve,)), Workflow("w", 1, (reserve, notify)))


def test_an_orders_end_is_sent_with_its_end_time_so_a_later_end_at_the_same_attempt_is_a_new_event():
    """The status event of an order's end carries when it ended (its id's key): the same end
    closed again (the sweep after a crash) is the same event, and an undo resubmitted that
    fails again at once, at the same attempt, is a new one, which a reply queue's duplicate
    detection must not drop."""
    w = World()
    w.submit()
    for _ in range(3):
        w.answer()
    done = w.state()
    assert (w.publisher.statuses[-1].status, w.publisher.status_keys[-1]) == (
        Status.PROCESSED, ended_key(done.updated_at))
    failed = done.model_copy(update={"process_state": ProcessState.ERROR, "last_error": "undo refused"})
    again = failed.model_copy(update={"updated_at": failed.updated_at + timedelta(seconds=2)})
    for state in (failed, failed, again):
        close_order(state, store=w.store, publisher=w.publisher, alerts_queue="alerts", now=w.now)
    assert w.publisher.status_keys[-3:] == [ended_key(failed.updated_at)] * 2 + [ended_key(again.updated_at)]
    assert ended_key(failed.updated_at) != ended_key(again.updated_at)


def test_a_rejection_is_sent_with_the_rejected_messages_id_so_another_message_is_a_new_event():
    """Two different invalid messages naming one order id are two rejections (their events'
    keys differ); the same message delivered again is the same event (the same key)."""
    from adapters.store import RejectionStore
    from scheduler.submission import Result, submit

    w = World()

    def reject(message_id: str, body: bytes) -> None:
        result = submit(
            body, message_id=message_id, reply_to="replies", content_type="application/json", store=w.store,
            rejections=RejectionStore(MemoryTable()), publisher=w.publisher, workflow=workflows.ORDER_WORKFLOW,
            now=w.now, pending_timeout=timedelta(seconds=30),
        )
        assert result.result is Result.REJECTED

    for message_id, body in (("m-1", b'{"order_id": "o-9"}'), ("m-1", b'{"order_id": "o-9"}'),
                             ("m-2", b'{"order_id": "o-9", "items": []}')):
        reject(message_id, body)
    assert [(e.status, e.order_id) for e in w.publisher.statuses] == [(Status.REJECTED, "o-9")] * 3
    first, again, other = w.publisher.status_keys
    assert first == again and first != other
