"""Waiting steps (an approval): the pure decisions (core.lifecycle.receive_event, the
give-up of a waiting line) and whole orders of the approval workflow carried out by
scheduler.dispatch, scheduler.events and the supervisor over the in-memory ETag table."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import lifecycle, liveness
from core.lifecycle import EventVerdict
from core.models import AgentResponse, Context, EventBody, LineState, OrderEvent, ProcessState, Status
from core.models import Outcome as AgentOutcome
from core.workflow import APPROVAL_WORKFLOW, ORDER_WORKFLOW, Kind, Step, StepPolicy, events, remotes, shortest_timeout
from scheduler import dispatch
from scheduler import events as order_events
from supervisor import supervision
from scheduler.events import Outcome
from tests.unit.test_workflow import DEFAULTS, POLICY, World

APPROVE = EventBody(approved=True, by="alice", note="ok up to 5,000")
REJECT = EventBody(approved=False, by="bob", note="customer on hold")


def waiting_world() -> World:
    """An approval-workflow order whose reserve is done: it now waits for its approval."""
    w = World(APPROVAL_WORKFLOW)
    w.submit()
    w.answer(result={"hold": "h-1"})
    return w


def send(w: World, body: EventBody = APPROVE, name: str = "approval"):
    return order_events.deliver("o-1", name, body, scheduler=w.scheduler, now=w.now)


# --- the declaration ----------------------------------------------------------------


def test_a_waiting_step_has_no_remote_no_undo_and_one_attempt():
    step = APPROVAL_WORKFLOW.steps[1]
    assert (step.name, step.wait_for, step.waiting, step.compensate) == ("approve", "approval", True, None)
    assert step.policy.max_failures == 1 and step.action_of(Kind.ACTION) is None
    assert events() == ("approval",)
    assert remotes() == ("inventory", "payments", "shipping")  # no agent, no queue for a wait


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"remote": "inventory"}, "calls no remote"),
        ({"policy": StepPolicy(timeout_seconds=60, max_failures=3)}, "one attempt"),
        ({"wait_for": "Approval!"}, "lower-case"),
    ],
)
def test_a_waiting_step_is_refused_unless_well_declared(fields, problem):
    declared = {"wait_for": "approval", "policy": StepPolicy(timeout_seconds=60), **fields}
    with pytest.raises(ValueError, match=problem):
        Step("approve", **declared)


def test_a_waiting_steps_deadline_is_the_approval_setting_unless_its_workflow_fixes_one():
    defaults = replace(DEFAULTS, timeout_seconds=30, wait_timeout_seconds=7)
    approve = APPROVAL_WORKFLOW.steps[1]
    assert approve.policy.timeout_seconds is None  # the workflow fixes none: APPROVAL_TIMEOUT_SECONDS decides
    assert (approve.policy_over(defaults).timeout_seconds, approve.policy_over(defaults).max_failures) == (7, 1)
    fixed = Step("approve", wait_for="approval", policy=StepPolicy(timeout_seconds=60))
    assert fixed.policy_over(defaults).timeout_seconds == 60
    # A step that calls a remote keeps STEP_TIMEOUT_SECONDS; the wait's default is not its.
    assert APPROVAL_WORKFLOW.steps[0].policy_over(defaults).timeout_seconds == 30
    # The supervisor's sweep skips no order whose shortest line may have expired.
    assert shortest_timeout(defaults) == 7 and shortest_timeout(replace(defaults, wait_timeout_seconds=90)) == 30
    with pytest.raises(ValueError, match="no deadline"):
        approve.policy_over(replace(defaults, wait_timeout_seconds=None))


def test_the_waiting_lines_complete_by_is_its_claim_plus_the_approval_setting():
    w = World(APPROVAL_WORKFLOW, defaults=replace(DEFAULTS, wait_timeout_seconds=5))
    w.submit()
    w.answer(result={"hold": "h-1"})
    state = w.state()
    assert (state.step, state.process_state) == ("approve", ProcessState.PROCESSING)
    assert state.complete_by == state.updated_at + timedelta(seconds=5)


def test_a_wait_shorter_than_the_step_timeout_is_given_up_by_the_first_sweep_past_its_deadline():
    defaults = replace(DEFAULTS, wait_timeout_seconds=5)  # STEP_TIMEOUT_SECONDS is 30
    w = World(APPROVAL_WORKFLOW, defaults=defaults)
    w.submit()
    w.answer(result={"hold": "h-1"})
    policy = replace(POLICY, shortest_timeout=timedelta(seconds=shortest_timeout(defaults)))
    w.now = w.state().complete_by + timedelta(seconds=1)  # 7 s after the order was indexed
    done = supervision.sweep(
        store=w.store, publisher=w.publisher, nudger=w.nudger, policy=policy, now=w.now, alerts_queue="alerts"
    )
    assert done == {"give_up": 1} and w.state().gave_up


def test_the_liveness_bound_of_a_waiting_line_is_its_deadline_plus_one_expiry():
    timing = liveness.Timing(
        supervisor_interval=timedelta(seconds=15), pending_timeout=timedelta(seconds=30),
        backoff_base=timedelta(seconds=2), backoff_cap=timedelta(seconds=60),
    )
    policy = APPROVAL_WORKFLOW.steps[1].policy_over(DEFAULTS)
    assert liveness.line_bound(policy, timing) == timedelta(days=1) + 2 * timedelta(seconds=15) + timedelta(seconds=30)
    # The waiting line's deadline counts once; it has no undo of its own.
    lines = liveness.remaining_lines(APPROVAL_WORKFLOW, 1, Kind.ACTION)
    assert (1, Kind.COMPENSATION) not in lines and (1, Kind.ACTION) in lines


# --- whole orders ---------------------------------------------------------------------


def test_the_waiting_step_sends_no_request_and_tells_the_submitter_until_when():
    w = waiting_world()
    state = w.state()
    assert (state.process_state, state.step, state.kind) == (ProcessState.PROCESSING, "approve", Kind.ACTION)
    assert state.complete_by == w.now + timedelta(days=1) and state.max_failures == 1
    assert w.sent() == [("action", "reserve")]
    waiting = w.publisher.statuses[-1]
    assert (waiting.status, waiting.step) == (Status.WAITING, "approve")
    assert "approval" in waiting.detail and state.complete_by.isoformat() in waiting.detail
    assert lifecycle.waiting_for(state, APPROVAL_WORKFLOW) == "approval"


def test_approved_on_time_the_body_is_the_steps_result_and_the_workflow_goes_on_to_processed():
    w = waiting_world()
    before = w.table.ops.copy()
    delivered = send(w)
    assert delivered.outcome is Outcome.ACCEPTED
    assert w.table.ops - before == {"query": 1, "transaction": 1}  # one read, one conditional write
    assert w.lines()[("approve", Kind.ACTION)] is LineState.DONE
    (approve,) = [line for line in w.store.read("o-1").lines if line.step == "approve"]
    assert approve.result == {"approved": True, "by": "alice", "note": "ok up to 5,000"}
    assert w.sent()[-1] == ("action", "charge")
    assert w.last.context.results["approve"] == approve.result
    w.answer()
    w.answer()
    assert w.state().process_state is ProcessState.PROCESSED
    assert w.sent() == [("action", "reserve"), ("action", "charge"), ("action", "ship")]


def test_rejected_the_earlier_step_is_undone_once_and_the_order_ends_compensated_naming_who_and_why():
    w = waiting_world()
    assert send(w, REJECT).outcome is Outcome.ACCEPTED
    assert w.sent()[-1] == ("compensation", "release") and w.last.result == {"hold": "h-1"}
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED
    assert state.cause == "step approve: approval rejected by bob: customer on hold" == state.last_error
    assert w.lines() == {
        ("reserve", Kind.ACTION): LineState.DONE,
        ("approve", Kind.ACTION): LineState.REFUSED,
        ("reserve", Kind.COMPENSATION): LineState.DONE,
    }
    assert w.sent().count(("compensation", "release")) == 1


def test_timed_out_the_supervisors_generic_expiry_gives_up_and_the_scheduler_undoes_the_earlier_step():
    w = waiting_world()
    w.expire()  # the deadline passes: one attempt, so the supervisor gives up at once
    assert w.sent()[-1] == ("compensation", "release")
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED
    assert state.cause.startswith("step approve timed out waiting for approval")
    assert w.lines()[("approve", Kind.ACTION)] is LineState.EXHAUSTED
    # A late approval changes nothing.
    assert send(w).outcome is Outcome.NOT_WAITING and w.state() == state


def test_the_same_event_twice_is_a_no_op_and_a_different_one_is_refused():
    w = waiting_world()
    send(w)
    state, sent = w.state(), w.sent()
    assert send(w).outcome is Outcome.DUPLICATE
    assert (w.state(), w.sent()) == (state, sent)
    refused = send(w, REJECT)
    assert refused.outcome is Outcome.NOT_WAITING and "charge" in refused.reason
    assert (w.state(), w.sent()) == (state, sent)


def test_an_event_for_an_order_that_does_not_wait_is_refused_and_changes_nothing():
    w = World(ORDER_WORKFLOW)
    w.submit()
    state = w.state()
    refused = send(w)
    assert refused.outcome is Outcome.NOT_WAITING and "no step waits for approval" in refused.reason
    assert w.state() == state and w.sent() == [("action", "reserve")]
    assert order_events.deliver("nope", "approval", APPROVE, scheduler=w.scheduler, now=w.now).outcome is (
        Outcome.UNKNOWN_ORDER
    )


def test_an_event_at_or_after_the_deadline_is_refused_even_before_the_supervisor_acts():
    w = waiting_world()
    w.now = w.state().complete_by
    refused = send(w)
    assert refused.outcome is Outcome.NOT_WAITING and "stopped waiting" in refused.reason
    assert w.state().process_state is ProcessState.PROCESSING


def test_racing_the_deadline_exactly_one_of_the_approval_and_the_expiry_is_written():
    """Both decided on the same row (ETag): whichever writes first wins, the other's
    If-Match fails; the event is then decided again on the new row and refused."""
    w = waiting_world()
    read = w.store.read("o-1")
    deadline = read.state.complete_by
    decision = lifecycle.receive_event(
        read.state, read.lines, APPROVAL_WORKFLOW, "approval", APPROVE.result(), "host-1",
        deadline - timedelta(seconds=1), DEFAULTS,
    )
    assert decision.verdict is EventVerdict.ACCEPTED
    expiry = lifecycle.supervise(read.state, deadline + timedelta(seconds=1), POLICY)
    assert w.store.transition(read.state, expiry.next_state) is not None  # the expiry wins
    assert w.store.transition(read.state, decision.transition.state, decision.transition.lines) is None
    # Delivered now, the event meets the given-up row: refused, nothing written.
    w.now = deadline - timedelta(seconds=1)
    assert send(w).outcome is Outcome.NOT_WAITING
    assert w.state().gave_up and "approve" not in {line.step for line in w.store.read("o-1").lines}


def test_an_undo_skips_the_waiting_step_nothing_was_done_there():
    w = waiting_world()
    send(w)
    w.answer(AgentOutcome.FAILED_PERMANENT, error="HTTP 422: card declined")
    assert w.sent()[-1] == ("compensation", "release")
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED and state.failed == ()
    assert ("approve", Kind.COMPENSATION) not in w.lines()


def test_an_agent_response_can_never_end_a_waiting_line():
    w = waiting_world()
    state = w.state()
    forged = AgentResponse(order_id="o-1", step="approve", kind=Kind.ACTION, attempt=state.attempt,
                           outcome=AgentOutcome.SUCCEEDED, result={}, context=Context(fence=state, order={}))
    assert lifecycle.complete(state, forged, APPROVAL_WORKFLOW, "host-1", w.now, DEFAULTS) is None


def test_the_event_message_names_its_order_and_a_known_event_and_has_one_message_id_rule():
    event = OrderEvent(order_id="o-1", name="approval", approved=True, by="alice")
    assert event.message_id() == event.message_id() and event.message_id().startswith("o-1:approval:")
    assert event.body() == EventBody(approved=True, by="alice")
    with pytest.raises(ValueError, match="no workflow waits"):
        OrderEvent(order_id="o-1", name="payment", approved=True, by="alice")
    with pytest.raises(ValueError):
        EventBody.model_validate_json(b'{"approved": "yes", "by": "alice"}')


# --- interleavings: events (on time, late, twice, rejected) against the deadline --------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("event"), st.booleans(), st.sampled_from(["alice", "bob"])),
        st.tuples(st.just("tick"), st.integers(0, 2 * 24 * 60 * 60)),
        st.tuples(st.just("answer"), st.booleans()),
    ),
    max_size=12,
)


class Driver:
    """One approval-workflow order waiting for its approval, driven by a list of events:
    an event (approved or not, by whom), the clock moving on (the supervisor sweeps, the
    scheduler takes the nudges that are due), an agent answering the newest request (an
    action succeeds or is refused; an undo succeeds)."""

    def __init__(self) -> None:
        self.w = waiting_world()
        self.deadline = self.w.state().complete_by
        self.delivered: list[tuple[object, bool, Outcome, EventBody]] = []
        self.answered: set[int] = set()
        self.due: list[tuple[object, object]] = []  # (when, nudge)

    def event(self, approved: bool, by: str) -> None:
        body = EventBody(approved=approved, by=by)
        self.delivered.append((self.w.now, approved, send(self.w, body).outcome, body))

    def tick(self, seconds: int) -> None:
        w = self.w
        w.now += timedelta(seconds=seconds)
        supervision.sweep(store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now,
                          alerts_queue="alerts")
        self.due += [(w.now + delay, nudge) for nudge, delay in w.nudger.nudges]
        w.nudger.nudges.clear()
        ready = [nudge for when, nudge in self.due if when <= w.now]
        self.due = [(when, nudge) for when, nudge in self.due if when > w.now]
        for nudge in ready:
            dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)

    def answer(self, succeed: bool) -> None:
        fresh = [i for i in range(len(self.w.publisher.requests)) if i not in self.answered]
        if fresh:
            self.answered.add(fresh[-1])
            request = self.w.publisher.requests[fresh[-1]][1]
            # A remote may refuse an action; an undo it refuses ends in Error (tested elsewhere): not here.
            succeed = succeed or request.kind is Kind.COMPENSATION
            outcome = AgentOutcome.SUCCEEDED if succeed else AgentOutcome.FAILED_PERMANENT
            self.w.answer(outcome, request=request)

    def finish(self) -> None:
        for _ in range(20):
            if self.w.state().process_state.terminal:
                return
            for _ in range(len(self.w.publisher.requests)):
                self.answer(True)
            self.tick(3 * 24 * 60 * 60)
        raise AssertionError(f"not terminal: {self.w.state()}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OPS)
def test_of_an_event_and_the_deadline_exactly_one_ends_the_wait_and_nothing_runs_twice(ops):
    d = Driver()
    for op, *args in ops:
        getattr(d, op)(*args)
    d.finish()
    w, state = d.w, d.w.state()
    accepted = [(at, approved, body) for at, approved, outcome, body in d.delivered if outcome is Outcome.ACCEPTED]
    assert len(accepted) <= 1, accepted  # one event ends the wait, once
    assert all(at < d.deadline for at, *_ in accepted)  # never at or after the deadline
    lines = w.store.read("o-1").lines
    (line,) = [line for line in lines if line.step == "approve"]
    # Undone as a whole, unless an undo itself gave up (its agent never answered: Error, as for any undo).
    undo_failed = any(x.kind is Kind.COMPENSATION and x.state is LineState.FAILED for x in lines)
    undone = ProcessState.ERROR if undo_failed else ProcessState.COMPENSATED
    if not accepted:  # the deadline ended it: the earlier step undone, the cause names the timeout
        assert line.state is LineState.EXHAUSTED
        assert state.process_state is undone and "timed out waiting for approval" in state.cause
    else:
        (_, approved, body) = accepted[0]
        assert line.result == body.result()
        assert line.state is (LineState.DONE if approved else LineState.REFUSED)
        if not approved:
            assert state.process_state is undone and "rejected by" in state.cause
        # The same event again after it was accepted is a duplicate; any other is refused.
        later = d.delivered[[o for *_, o, _ in d.delivered].index(Outcome.ACCEPTED) + 1 :]
        for _, _, outcome, other in later:
            assert outcome is (Outcome.DUPLICATE if other == body else Outcome.NOT_WAITING)
    # At the remotes: charge only after an approval; the reservation released only if it was
    # not approved or a later step was refused; each line's key sent for one line only.
    sent = w.sent()
    assert (("action", "charge") in sent) == bool(accepted and accepted[0][1])
    if state.process_state is ProcessState.COMPENSATED:
        assert w.lines()[("reserve", Kind.COMPENSATION)] is LineState.DONE
    assert ("compensation", "release") in sent or state.process_state is not ProcessState.COMPENSATED
    keys = {(r.step, r.kind): r.idempotency_key for _, r in w.publisher.requests}
    assert len(set(keys.values())) == len(keys)


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"order_id": "o-1", "name": "approval", "approved": True, "by": "alice"}, True),
        ({"order_id": "o-1", "name": "approval", "approved": False, "by": "bob", "note": "no"}, True),
        ({"order_id": "o-1", "name": "payment", "approved": True, "by": "alice"}, False),
        ({"order_id": "o-1", "name": "approval", "approved": "yes", "by": "alice"}, False),
        ({"order_id": "o-1", "name": "approval", "approved": True}, False),
        ({"order_id": "o 1", "name": "approval", "approved": True, "by": "alice"}, False),
        ({"order_id": "o-1", "name": "approval", "approved": True, "by": "alice", "extra": 1}, False),
    ],
)
def test_the_published_event_schema_is_the_models_and_they_agree(body, valid):
    import json

    import jsonschema

    from core.schema import EVENT_SCHEMA_PATH, render_event

    assert EVENT_SCHEMA_PATH.read_text(encoding="utf-8") == render_event(), "run `python -m core.schema`"
    schema = json.loads(render_event())
    try:
        OrderEvent.model_validate_json(json.dumps(body))
        model_ok = True
    except ValueError:
        model_ok = False
    assert jsonschema.Draft202012Validator(schema).is_valid(body) == model_ok == valid
