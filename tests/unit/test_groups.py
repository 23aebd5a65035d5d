"""Steps that run at once (core/workflow.py ``Parallel``): the pure decisions on a group,
one transition at a time (whole orders, through the scheduler and the supervisor:
test_protocol_model.py and tests/e2e)."""

from datetime import UTC, datetime, timedelta

import pytest

from core import claims, lifecycle
from core.lifecycle import SupervisorPolicy, Verdict
from core.models import AgentResponse, Context, LineRun, LineState, OrderState, Outcome, ProcessState
from core.progress import RUNNING, WAITING, progress
from core.workflow import PARALLEL_WORKFLOW as WF
from core.workflow import Kind, Parallel, Step, StepPolicy, Workflow

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ETAG = 'W/"datetime\'2026-01-01T00%3A00%3A00.0000000Z\'"'
DEFAULTS = StepPolicy(timeout_seconds=30, max_failures=3, agent_max_calls=6, agent_backoff_initial=0.2, agent_backoff_max=5)
PENDING = timedelta(seconds=20)
POLICY = SupervisorPolicy(
    max_failures=3, step_timeout=timedelta(seconds=30), pending_timeout=PENDING,
    backoff_base=timedelta(seconds=2), backoff_cap=timedelta(seconds=60),
)
S = timedelta(seconds=1)


def started() -> OrderState:
    """A new order on the parallel workflow, its group (reserve, charge) claimed."""
    new = lifecycle.new_order("o-1", WF, T0, PENDING, None).model_copy(update={"etag": ETAG})
    transition = lifecycle.claim(new, WF, "i1", T0, DEFAULTS, pending_timeout=PENDING)
    assert transition.claimed == (0, 1) and transition.dispatch
    return transition.state.model_copy(update={"etag": ETAG})


def answer(state: OrderState, step: str, outcome=Outcome.SUCCEEDED, attempt=None, **more) -> AgentResponse:
    line = next(line for line in state.group if line.step == step)
    return AgentResponse(
        order_id="o-1", step=step, kind=Kind.ACTION, attempt=line.attempt if attempt is None else attempt,
        outcome=outcome, error="no stock" if outcome is Outcome.FAILED_PERMANENT else None, result={"ok": step},
        context=Context(fence=state, order={}), **more,
    )


def complete(state, response, now=T0 + S):
    return lifecycle.complete(state, response, WF, "i1", now, DEFAULTS)


def lines(state: OrderState) -> dict[str, tuple[LineRun, int]]:
    return {line.step: (line.state, line.attempt) for line in state.group}


def test_a_group_is_declared_as_data_and_flattened_into_the_steps():
    assert [s.name for s in WF.steps] == ["reserve", "charge", "ship"]
    assert WF.stages == ((0, 1), (2,)) and WF.in_group(1) and not WF.in_group(2) and WF.parallel
    step = Step("x", remote="r", action="a", compensate="u")
    with pytest.raises(ValueError, match="two steps or more"):
        Parallel(step)
    many = [Step(f"s{i}", remote="r", action=f"a{i}", compensate=f"u{i}") for i in range(11)]
    with pytest.raises(ValueError, match="at most 10"):
        Parallel(*many)
    assert len(Parallel(*many[:10]).steps) == 10
    with pytest.raises(ValueError, match="cannot be undone"):
        Parallel(step, Step("y", remote="r", action="b"))
    with pytest.raises(ValueError, match="do not nest"):
        Parallel(step, Parallel(step, step))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="waits for an event"):
        Parallel(step, Step("approve", wait_for="approval"))
    # Names stay unique across groups and steps, as in any workflow.
    with pytest.raises(ValueError):
        Workflow("w", 1, (Parallel(step, Step("y", remote="r", action="b", compensate="c")), step))


def test_a_group_starts_with_every_line_claimed_in_one_write_each_with_its_own_attempt_and_deadline():
    state = started()
    assert state.process_state is ProcessState.PROCESSING and (state.step_index, state.step) == (0, "reserve")
    assert lines(state) == {"reserve": (LineRun.PROCESSING, 1), "charge": (LineRun.PROCESSING, 2)}
    assert state.attempt == 2 and state.complete_by == T0 + 30 * S
    assert all(line.acts_until == line.complete_by for line in state.group)


def test_the_order_moves_past_the_group_only_when_every_line_is_done():
    state = started()
    first = complete(state, answer(state, "charge"))
    assert first.lines[0].step == "charge" and first.lines[0].state is LineState.DONE and not first.dispatch
    assert lines(first.state)["charge"][0] is LineRun.DONE and first.state.step_index == 0
    both = complete(first.state, answer(first.state, "reserve"), T0 + 2 * S)
    assert [line.step for line in both.lines] == ["reserve"]
    assert (both.state.step, both.state.step_index, both.state.group) == ("ship", 2, ())
    assert both.state.attempt == 3 and both.dispatch


def test_a_response_for_a_line_not_in_flight_or_a_duplicate_changes_nothing():
    state = started()
    assert complete(state, answer(state, "charge", attempt=1)) is None  # reserve's attempt, charge's name
    assert complete(state, answer_for(state, "ship")) is None
    done = complete(state, answer(state, "charge")).state
    assert complete(done, answer(state, "charge")) is None  # the same answer again


def test_a_refused_line_lets_the_other_settle_then_undoes_the_group():
    state = started()
    refused = complete(state, answer(state, "reserve", Outcome.FAILED_PERMANENT))
    assert refused.lines[0].state is LineState.REFUSED and not refused.dispatch
    assert refused.state.process_state is ProcessState.PROCESSING  # charge is still in flight
    assert refused.state.cause == "step reserve refused: no stock"
    undo = complete(refused.state, answer(refused.state, "charge"), T0 + 2 * S)
    assert undo.lines[0].step == "charge" and undo.lines[0].state is LineState.DONE
    # Charge was applied: undone; reserve was refused: nothing to undo there.
    assert (undo.state.kind, undo.state.step, undo.state.plan, undo.state.group) == (Kind.COMPENSATION, "charge", (), ())
    assert undo.dispatch and undo.state.cause == "step reserve refused: no stock"


def test_a_line_given_up_by_the_supervisor_is_undone_with_its_siblings_once_every_line_settled():
    state = started()
    charged = complete(state, answer(state, "charge")).state
    now = T0 + 30 * S
    for failures in (1, 2):
        decision = lifecycle.supervise(charged, now, POLICY)
        assert decision.verdict is Verdict.RETRY and decision.missed == (("reserve", Verdict.RETRY),)
        line = decision.next_state.group[0]
        assert line.state is LineRun.PENDING and line.failure_count == failures
        now += decision.nudge_delay
        claimed = lifecycle.claim(decision.next_state, WF, "i2", now, DEFAULTS, pending_timeout=PENDING)
        assert claimed.claimed == (0,) and claimed.state.group[0].attempt == charged.attempt + 1
        charged = claimed.state
        now = charged.group[0].complete_by
    decision = lifecycle.supervise(charged, now, POLICY)
    assert decision.verdict is Verdict.GIVE_UP and decision.next_state.group[0].gave_up
    undo = lifecycle.claim(decision.next_state, WF, "i2", now, DEFAULTS, pending_timeout=PENDING)
    assert [(line.step, line.state) for line in undo.lines] == [("reserve", LineState.EXHAUSTED)]
    # Both undone, the highest index first: reserve's outcome is unknown, charge was applied.
    assert (undo.state.kind, undo.state.step, undo.state.plan) == (Kind.COMPENSATION, "charge", (0,))
    assert "gave up" in undo.state.cause


def test_a_waiting_line_is_not_run_again_once_the_group_fails_and_is_undone_when_settled():
    state = started()
    decision = lifecycle.supervise(state, T0 + 30 * S, POLICY)  # both lines missed their deadline
    assert decision.missed == (("reserve", Verdict.RETRY), ("charge", Verdict.RETRY))
    retrying = decision.next_state
    assert retrying.process_state is ProcessState.PENDING and retrying.locked_by is None
    again = lifecycle.claim(retrying, WF, "i1", T0 + 32 * S, DEFAULTS, pending_timeout=PENDING)
    assert again.claimed == (0, 1)
    refused = complete(again.state, answer(again.state, "reserve", Outcome.FAILED_PERMANENT), T0 + 33 * S).state
    # charge is in flight: it settles by its answer; then, settled, both are ended.
    undo = complete(refused, answer(refused, "charge", Outcome.FAILED_PERMANENT), T0 + 34 * S)
    assert (undo.state.process_state, undo.state.cause) == (ProcessState.COMPENSATED, "step reserve refused: no stock")


def test_a_postponed_line_that_may_still_act_is_waited_for_before_the_undo():
    state = started()
    postponed = lifecycle.postpone(state, answer(state, "charge", Outcome.POSTPONED, retry_after_seconds=5),
                                   T0 + S, PENDING, 3)
    assert postponed.nudge_delay == 5 * S and lines(postponed.state)["charge"][0] is LineRun.PENDING
    refused = complete(postponed.state, answer(postponed.state, "reserve", Outcome.FAILED_PERMANENT), T0 + 2 * S)
    # charge's postponed attempt may still be delivered and act until its Complete-By (T0 + 30 s).
    assert refused.state.kind is Kind.ACTION and lines(refused.state)["charge"][0] is LineRun.PENDING
    early = lifecycle.claim(refused.state, WF, "i1", T0 + 6 * S, DEFAULTS, pending_timeout=PENDING)
    assert early.claimed == () and early.nudge_delay == 24 * S and early.state.complete_by == T0 + 50 * S
    undo = lifecycle.claim(early.state, WF, "i1", T0 + 30 * S, DEFAULTS, pending_timeout=PENDING)
    assert [(line.step, line.state) for line in undo.lines] == [("charge", LineState.CANCELLED)]
    assert (undo.state.kind, undo.state.step, undo.state.plan) == (Kind.COMPENSATION, "charge", ())


def test_a_cancel_during_a_group_lets_both_lines_settle_then_undoes_both():
    state = started()
    cancel = lifecycle.request_cancel(state, T0 + S, "changed my mind", "ops", WF)
    assert cancel.verdict is lifecycle.CancelVerdict.RECORDED and cancel.next_state.group == state.group
    one = complete(cancel.next_state, answer(cancel.next_state, "reserve"), T0 + 2 * S).state
    assert one.kind is Kind.ACTION and lines(one)["charge"][0] is LineRun.PROCESSING
    undo = complete(one, answer(one, "charge"), T0 + 3 * S)
    assert (undo.state.step, undo.state.plan) == ("charge", (0,)) and undo.state.cause.startswith("cancelled by ops")


def test_a_group_after_a_step_undoes_that_step_too_newest_first():
    wf = Workflow("w", 1, (Step("a", remote="ra", action="a", compensate="ua"),
                           Parallel(Step("b", remote="rb", action="b", compensate="ub"),
                                    Step("c", remote="rc", action="c", compensate="uc"))))
    new = lifecycle.new_order("o-1", wf, T0, PENDING, None)
    first = lifecycle.claim(new, wf, "i1", T0, DEFAULTS, pending_timeout=PENDING).state
    done = lifecycle.complete(first, answer_for(first, "a"), wf, "i1", T0 + S, DEFAULTS)
    assert done.claimed == (1, 2) and done.state.attempt == 3
    state = done.state
    refused = lifecycle.complete(state, answer(state, "c", Outcome.FAILED_PERMANENT), wf, "i1", T0 + 2 * S, DEFAULTS).state
    undo = lifecycle.complete(refused, answer(refused, "b"), wf, "i1", T0 + 3 * S, DEFAULTS)
    assert (undo.state.step, undo.state.plan) == ("b", (0,))


def answer_for(state: OrderState, step: str) -> AgentResponse:
    return AgentResponse(order_id="o-1", step=step, kind=Kind.ACTION, attempt=state.attempt,
                         outcome=Outcome.SUCCEEDED, result={}, context=Context(fence=state, order={}))


def test_a_forged_fence_for_one_line_of_a_group_is_refused():
    state = started()
    assert claims.check_response(answer(state, "charge")) is None
    assert "has no action 'charge' in flight at attempt 1" in claims.check_response(answer(state, "charge", attempt=1))
    forged = state.model_copy(update={"group": (state.group[1], state.group[0])})
    reason = claims.check_response(answer(state, "charge").model_copy(update={"context": Context(fence=forged, order={})}))
    assert "not a group of order-parallel v1" in reason
    done = complete(state, answer(state, "charge")).state.model_copy(update={"etag": ETAG})
    assert "in flight" in claims.check_response(answer(done, "charge"))


def test_the_status_shows_each_open_line_of_a_group():
    state = started()
    charged = complete(state, answer(state, "charge"))
    views = progress(charged.state, WF, list(charged.lines))
    assert [(v.step, v.state) for v in views] == [("reserve", RUNNING), ("charge", "Done"), ("ship", "NotStarted")]
    decision = lifecycle.supervise(charged.state, T0 + 30 * S, POLICY)
    views = progress(decision.next_state, WF, list(charged.lines))
    assert views[0].state == WAITING and views[0].failure_count == 1


def test_an_approval_before_a_group_starts_every_line_of_it_in_the_same_write():
    wf = Workflow("w", 1, (Step("a", remote="ra", action="a", compensate="ua"), Step("ok", wait_for="approval", policy=StepPolicy(timeout_seconds=60)),
                           Parallel(Step("b", remote="rb", action="b", compensate="ub"),
                                    Step("c", remote="rc", action="c", compensate="uc"))))
    state = lifecycle.new_order("o-1", wf, T0, PENDING, None)
    state = lifecycle.claim(state, wf, "i1", T0, DEFAULTS, pending_timeout=PENDING).state
    state = lifecycle.complete(state, answer_for(state, "a"), wf, "i1", T0 + S, DEFAULTS).state
    decision = lifecycle.receive_event(state, [], wf, "approval", {"approved": True, "by": "ops"}, "i1", T0 + 2 * S,
                                       DEFAULTS)
    assert decision.verdict is lifecycle.EventVerdict.ACCEPTED
    assert decision.transition.claimed == (2, 3) and lines(decision.transition.state) == {
        "b": (LineRun.PROCESSING, 3), "c": (LineRun.PROCESSING, 4),
    }


def test_an_undo_of_a_group_that_fails_ends_in_error_and_a_resubmit_runs_it_again():
    state = started()
    refused = complete(state, answer(state, "reserve", Outcome.FAILED_PERMANENT)).state
    undo = complete(refused, answer(refused, "charge"), T0 + 2 * S).state  # refund claimed
    failed = lifecycle.complete(undo, answer_for(undo, "charge").model_copy(update={
        "kind": Kind.COMPENSATION, "outcome": Outcome.FAILED_PERMANENT, "error": "HTTP 409"}),
        WF, "i1", T0 + 3 * S, DEFAULTS).state
    assert failed.process_state is ProcessState.ERROR and failed.failed == (1,) and failed.group == ()
    again = lifecycle.resubmit(failed, T0 + 60 * S, PENDING)
    assert (again.process_state, again.kind, again.step, again.plan) == (ProcessState.PENDING, Kind.COMPENSATION,
                                                                         "charge", ())
    rerun = lifecycle.claim(again, WF, "i1", T0 + 61 * S, DEFAULTS, pending_timeout=PENDING)
    assert rerun.dispatch and rerun.state.kind is Kind.COMPENSATION and rerun.state.attempt == failed.attempt + 1


def test_the_liveness_bound_of_a_group_is_the_same_lines_in_sequence():
    from core import liveness
    from core.workflow import ORDER_WORKFLOW

    timing = liveness.Timing(supervisor_interval=timedelta(seconds=15), pending_timeout=PENDING,
                             backoff_base=timedelta(seconds=2), backoff_cap=timedelta(seconds=60))
    assert liveness.order_bound(WF, DEFAULTS, timing) == liveness.order_bound(ORDER_WORKFLOW, DEFAULTS, timing)
