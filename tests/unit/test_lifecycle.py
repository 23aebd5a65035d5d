from datetime import UTC, datetime, timedelta

import pytest

from core import lifecycle
from core.lifecycle import SupervisorPolicy, Verdict
from core.models import AgentResponse, OrderState, Outcome, ProcessState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = SupervisorPolicy(
    max_failures=3,
    step_timeout=timedelta(seconds=30),
    pending_timeout=timedelta(seconds=20),
    backoff_base=timedelta(seconds=2),
    backoff_cap=timedelta(seconds=60),
)


def pending() -> OrderState:
    return lifecycle.new_order("o-1", T0, timedelta(seconds=20), None).model_copy(update={"etag": "e0"})


def processing(attempt=1, failures=0) -> OrderState:
    return pending().model_copy(
        update={
            "process_state": ProcessState.PROCESSING,
            "attempt": attempt,
            "failure_count": failures,
            "locked_by": "i1",
            "complete_by": T0 + timedelta(seconds=30),
        }
    )


def response(attempt=1, outcome=Outcome.SUCCEEDED) -> AgentResponse:
    return AgentResponse(order_id="o-1", step="fulfil", attempt=attempt, outcome=outcome, error="nope")


def test_claim_takes_a_new_attempt_and_deadline():
    claimed = lifecycle.claim(pending(), "i1", T0, timedelta(seconds=30))
    assert claimed.process_state is ProcessState.PROCESSING
    assert claimed.attempt == 1 and claimed.locked_by == "i1"
    assert claimed.complete_by == T0 + timedelta(seconds=30)
    assert lifecycle.claim(claimed, "i2", T0, timedelta(seconds=30)) is None


def test_response_is_fenced_by_attempt_and_state():
    assert lifecycle.complete(processing(attempt=2), response(attempt=1), T0) is None
    done = lifecycle.complete(processing(attempt=2), response(attempt=2), T0)
    assert done.process_state is ProcessState.PROCESSED and done.locked_by is None
    assert lifecycle.complete(done, response(attempt=2), T0) is None


def test_permanent_failure_is_error_with_reason():
    failed = lifecycle.complete(processing(), response(outcome=Outcome.FAILED_PERMANENT), T0)
    assert failed.process_state is ProcessState.ERROR and failed.last_error == "nope"


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


def test_expired_processing_at_threshold_gives_up():
    decision = lifecycle.supervise(processing(failures=2), T0 + timedelta(seconds=31), POLICY)
    assert decision.verdict is Verdict.GIVE_UP
    assert decision.next_state.process_state is ProcessState.ERROR
    assert decision.next_state.failure_count == 3
    assert "gave up after 3" in decision.next_state.last_error


def test_expired_pending_is_renudged_without_counting_a_failure():
    decision = lifecycle.supervise(pending(), T0 + timedelta(seconds=21), POLICY)
    assert decision.verdict is Verdict.RENUDGE
    assert decision.next_state.failure_count == 0
    assert decision.next_state.process_state is ProcessState.PENDING


def test_terminal_rows_only_leave_the_index():
    done = lifecycle.complete(processing(), response(), T0)
    assert lifecycle.supervise(done, T0 + timedelta(days=1), POLICY).verdict is Verdict.DROP_INDEX


def test_backoff_doubles_and_is_capped():
    delays = [lifecycle.backoff(n, timedelta(seconds=2), timedelta(seconds=10)) for n in range(6)]
    assert [d.total_seconds() for d in delays] == [0, 2, 4, 8, 10, 10]


def test_resubmit_only_from_error_and_clears_failures():
    failed = lifecycle.fail(processing(attempt=3, failures=3), "boom", T0)
    again = lifecycle.resubmit(failed, T0, timedelta(seconds=20))
    assert again.process_state is ProcessState.PENDING and again.failure_count == 0 and again.attempt == 3
    assert lifecycle.resubmit(pending(), T0, timedelta(seconds=20)) is None
