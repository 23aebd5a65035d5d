"""The pure lifecycle decisions, one transition at a time (whole orders: test_workflow.py)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from core import claims, lifecycle
from core.lifecycle import SupervisorPolicy, Verdict
from core.models import AgentResponse, Context, LineState, Nudge, OrderState, Outcome, ProcessState
from core.workflow import ORDER_WORKFLOW as WF
from core.workflow import Kind, StepPolicy

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: An ETag of the form Table Storage returns.
ETAG = 'W/"datetime\'2026-01-01T00%3A00%3A00.0000000Z\'"'
DEFAULTS = StepPolicy(timeout_seconds=30, max_failures=3, agent_max_calls=6, agent_backoff_initial=0.2, agent_backoff_max=5)
POLICY = SupervisorPolicy(
    max_failures=3,
    step_timeout=timedelta(seconds=30),
    pending_timeout=timedelta(seconds=20),
    backoff_base=timedelta(seconds=2),
    backoff_cap=timedelta(seconds=60),
)


def pending() -> OrderState:
    return lifecycle.new_order("o-1", WF, T0, timedelta(seconds=20), None).model_copy(update={"etag": "e0"})


def processing(attempt=1, failures=0, index=0, kind=Kind.ACTION, **more) -> OrderState:
    return pending().model_copy(
        update={
            "process_state": ProcessState.PROCESSING,
            "attempt": attempt,
            "failure_count": failures,
            "locked_by": "i1",
            "complete_by": T0 + timedelta(seconds=30),
            "step_index": index,
            "step": WF.steps[index].name,
            "kind": kind,
            **more,
        }
    )


def response(state: OrderState, attempt=None, outcome=Outcome.SUCCEEDED) -> AgentResponse:
    return AgentResponse(
        order_id="o-1", step=state.step, kind=state.kind, attempt=state.attempt if attempt is None else attempt,
        outcome=outcome, error="nope", result={"ok": 1}, context=Context(fence=state, order={}),
    )


def test_a_new_order_is_pending_at_its_first_step_on_the_current_definition():
    state = pending()
    assert (state.workflow, state.workflow_version, state.step_index, state.step, state.kind) == (
        "order", 1, 0, "reserve", Kind.ACTION,
    )


def test_claim_takes_a_new_attempt_and_the_steps_deadline():
    claimed = lifecycle.claim(pending(), WF, "i1", T0, DEFAULTS, pending_timeout=POLICY.pending_timeout).state
    assert claimed.process_state is ProcessState.PROCESSING
    assert claimed.attempt == 1 and claimed.locked_by == "i1"
    assert claimed.complete_by == T0 + timedelta(seconds=30)
    assert claimed.max_failures == 3
    assert lifecycle.claim(claimed, WF, "i2", T0, DEFAULTS, pending_timeout=POLICY.pending_timeout) is None


def test_response_is_fenced_by_attempt_step_and_state():
    state = processing(attempt=2)
    assert lifecycle.complete(state, response(state, attempt=1), WF, "i1", T0, DEFAULTS) is None
    other = processing(attempt=2, index=1)
    assert lifecycle.complete(other, response(state), WF, "i1", T0, DEFAULTS) is None
    nxt = lifecycle.complete(state, response(state), WF, "i1", T0, DEFAULTS)
    assert nxt.state.step == "charge" and nxt.state.attempt == 3 and nxt.dispatch
    assert [(line.step, line.state, line.result) for line in nxt.lines] == [("reserve", LineState.DONE, {"ok": 1})]


def test_the_last_step_done_is_processed():
    state = processing(index=2)
    done = lifecycle.complete(state, response(state), WF, "i1", T0, DEFAULTS)
    assert done.state.process_state is ProcessState.PROCESSED and not done.dispatch and done.state.locked_by is None


def test_a_refusal_starts_undoing_the_steps_before_it():
    state = processing(index=2)
    undo = lifecycle.complete(state, response(state, outcome=Outcome.FAILED_PERMANENT), WF, "i1", T0, DEFAULTS)
    assert (undo.state.kind, undo.state.step, undo.state.plan) == (Kind.COMPENSATION, "charge", (0,))
    assert undo.state.cause == "step ship refused: nope"
    assert [line.state for line in undo.lines] == [LineState.REFUSED]


@pytest.mark.parametrize("state", [pending(), processing()])
def test_supervisor_leaves_unexpired_rows_alone(state):
    assert lifecycle.supervise(state, T0 + timedelta(seconds=1), POLICY).verdict is Verdict.NONE


def test_expired_processing_below_threshold_is_reset_with_backoff():
    now = T0 + timedelta(seconds=31)
    decision = lifecycle.supervise(processing(failures=1), now, POLICY)
    assert decision.verdict is Verdict.RETRY
    assert decision.next_state.process_state is ProcessState.PENDING
    assert decision.next_state.locked_by is None
    assert decision.next_state.failure_count == 2
    assert decision.nudge_delay == timedelta(seconds=4)
    assert decision.next_state.complete_by == now + timedelta(seconds=4) + POLICY.pending_timeout


def test_expired_processing_at_threshold_is_handed_back_to_the_scheduler():
    decision = lifecycle.supervise(processing(failures=2), T0 + timedelta(seconds=31), POLICY)
    assert decision.verdict is Verdict.GIVE_UP
    assert decision.next_state.process_state is ProcessState.PENDING and decision.next_state.gave_up
    assert decision.next_state.failure_count == 3
    assert "gave up after 3" in decision.next_state.last_error
    assert decision.nudge_delay == timedelta(0)


def test_the_lines_own_failure_limit_wins_over_the_default():
    decision = lifecycle.supervise(processing(failures=0, max_failures=1), T0 + timedelta(seconds=31), POLICY)
    assert decision.verdict is Verdict.GIVE_UP


def test_an_answer_is_awaited_for_the_response_grace_past_the_deadline():
    """The agent stops at Complete-By; its answer may still be queued in the app's own
    plumbing. Within the grace the row keeps its attempt (a response for it still counts);
    after it the miss is counted as before. A Pending row gets no grace (its nudge was lost)."""
    graced = replace(POLICY, response_grace=timedelta(seconds=15))
    state = processing(failures=1)
    assert lifecycle.supervise(state, T0 + timedelta(seconds=44), graced).verdict is Verdict.NONE
    answered = lifecycle.complete(state, response(state), WF, "i1", T0 + timedelta(seconds=44), DEFAULTS)
    assert answered is not None and answered.state.step == WF.steps[1].name
    decision = lifecycle.supervise(state, T0 + timedelta(seconds=45), graced)
    assert decision.verdict is Verdict.RETRY and decision.next_state.failure_count == 2
    assert lifecycle.supervise(pending(), T0 + timedelta(seconds=21), graced).verdict is Verdict.RENUDGE


def test_an_answer_is_awaited_only_while_one_sent_in_time_can_still_be_on_the_queue():
    """After the send slack, the supervisor judges as soon as the responses queue holds
    nothing sent by then (every answer sent in time was recorded); a backlog older than
    that keeps it waiting, an unknown one too, but never past the grace."""
    graced = replace(POLICY, response_grace=timedelta(seconds=60), send_slack=timedelta(seconds=7))
    state = processing()  # Complete-By T0 + 30 s
    at = T0 + timedelta(seconds=40)
    for backlog, awaited in [(at, False), (T0 + timedelta(seconds=38), False), (T0 + timedelta(seconds=37), True),
                             (T0 + timedelta(seconds=12), True), (None, True)]:
        assert lifecycle.awaiting_answer(state, at, graced, backlog) is awaited, backlog
        assert lifecycle.supervise(state, at, graced, backlog).verdict is (Verdict.NONE if awaited else Verdict.RETRY)
    # Within the send slack an answer may still be on its way out of the agent, queue empty or not.
    assert lifecycle.awaiting_answer(state, T0 + timedelta(seconds=36), graced, T0 + timedelta(seconds=36))
    # Never past the grace, whatever the queue holds.
    assert not lifecycle.awaiting_answer(state, T0 + timedelta(seconds=90), graced, T0)
    # No grace: judged at the deadline, as before.
    assert not lifecycle.awaiting_answer(state, T0 + timedelta(seconds=30), POLICY, None)


def test_expired_pending_is_renudged_without_counting_a_failure():
    decision = lifecycle.supervise(pending(), T0 + timedelta(seconds=21), POLICY)
    assert decision.verdict is Verdict.RENUDGE
    assert decision.next_state.failure_count == 0
    assert decision.next_state.process_state is ProcessState.PENDING


def test_terminal_rows_only_leave_the_index():
    state = processing(index=2)
    done = lifecycle.complete(state, response(state), WF, "i1", T0, DEFAULTS).state
    assert lifecycle.supervise(done, T0 + timedelta(days=1), POLICY).verdict is Verdict.DROP_INDEX


def test_backoff_doubles_and_is_capped():
    delays = [lifecycle.backoff(n, timedelta(seconds=2), timedelta(seconds=10)) for n in range(6)]
    assert [d.total_seconds() for d in delays] == [0, 2, 4, 8, 10, 10]


def test_resubmit_only_from_error_and_clears_failures():
    failed = lifecycle.fail(processing(attempt=3, failures=3), "boom", T0)
    again = lifecycle.resubmit(failed, T0, timedelta(seconds=20))
    assert again.process_state is ProcessState.PENDING and again.failure_count == 0 and again.attempt == 3
    assert lifecycle.resubmit(pending(), T0, timedelta(seconds=20)) is None


def test_resubmit_after_failed_undos_runs_only_those_in_reverse_order():
    failed = lifecycle.fail(processing(index=0, kind=Kind.COMPENSATION, failed=(0, 1)), "could not undo", T0)
    again = lifecycle.resubmit(failed, T0, timedelta(seconds=20))
    assert (again.kind, again.step_index, again.plan, again.failed) == (Kind.COMPENSATION, 1, (0,), ())
    # The row names the line it now stands at (its nudges are checked against it: a
    # resubmitted order whose row named the last line run had every nudge dropped).
    assert again.step == "charge"
    assert claims.check_nudge(Nudge(order_id=again.order_id, state=again.model_copy(update={"etag": ETAG}))) is None
