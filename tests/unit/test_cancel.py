"""Cancel, decided by core.lifecycle and carried out by scheduler.cancellation,
scheduler.dispatch and supervisor.supervision through the real StateStore over the
in-memory table that enforces ETags: a cancel is one If-Match write; the line in flight
settles first; then every applied or unknown action is undone, newest first."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from pydantic import ValidationError

from adapters.store import OrderNotFound, RejectionStore
from core import lifecycle
from core.lifecycle import CancelVerdict
from core.models import (
    CANCEL_REASON_MAX_CHARS,
    CancelRequest,
    LineState,
    Nudge,
    Outcome,
    ProcessState,
    Status,
    cancel_message_id,
)
from core.workflow import APPROVAL_WORKFLOW, ORDER_WORKFLOW, Kind
from scheduler import cancellation, dispatch
from tests.memtable import MemoryTable
from tests.unit.test_workflow import DEFAULTS, World


def cancel(w: World, reason: str | None = "customer asked", order_id: str = "o-1"):
    return cancellation.cancel(
        order_id, reason=reason, by="ops@example.com", store=w.store, publisher=w.publisher, nudger=w.nudger,
        now=w.now,
    )


def take_nudge(w: World) -> None:
    """The scheduler takes the last nudge (after its delay)."""
    nudge, delay = w.nudger.nudges[-1]
    w.now += delay
    dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)


def statuses(w: World) -> list[Status]:
    return [e.status for e in w.publisher.statuses]


def test_a_cancel_is_recorded_on_the_state_row_in_one_conditional_write_and_changes_no_line():
    w = World()
    w.submit()
    before, ops = w.state(), w.table.ops.copy()
    done = cancel(w)
    assert done.verdict is CancelVerdict.RECORDED
    assert w.table.ops - ops == {"query": 1, "update": 1}  # the partition read: no seal left to delete
    after = w.state()
    assert (after.cancel_requested_at, after.cancel_reason, after.cancelled_by) == (w.now, "customer asked", "ops@example.com")
    for field in ("process_state", "step", "kind", "attempt", "complete_by", "locked_by", "plan"):
        assert getattr(after, field) == getattr(before, field), field
    assert statuses(w)[-1] is Status.CANCELLING
    assert w.nudger.nudges == []  # Processing: the line in flight settles first, no nudge


def test_cancel_before_the_first_claim_ends_compensated_with_nothing_sent():
    w = World()
    w.submit(before_claim=lambda: cancel(w))  # the submission's nudge then meets a moved row
    assert w.sent() == []
    take_nudge(w)  # the cancel's own nudge: nothing left to claim
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED
    assert state.cause.startswith("cancelled by ops@example.com") and "customer asked" in state.cause
    assert state.last_error == state.cause
    assert w.lines() == {("reserve", Kind.ACTION): LineState.CANCELLED}
    assert statuses(w) == [Status.CANCELLING, Status.COMPENSATED]
    assert w.store.active_ids() == []


def test_cancel_while_an_action_is_in_flight_settles_it_first_then_undoes_it():
    w = World()
    w.submit()
    w.answer()  # reserve done, charge claimed and in flight
    cancel(w)
    assert w.sent() == [("action", "reserve"), ("action", "charge")]  # nothing new yet
    w.answer()  # charge succeeds after the cancel: it is undone, ship never starts
    assert w.sent()[-1] == ("compensation", "refund")
    assert w.last.result == {"confirmation": "charge-2"}
    w.answer()
    w.answer()
    assert w.sent() == [("action", "reserve"), ("action", "charge"), ("compensation", "refund"),
                        ("compensation", "release")]
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED
    assert "customer asked" in state.cause
    assert statuses(w)[-1] is Status.COMPENSATED and Status.CANCELLING in statuses(w)


def test_cancel_then_the_action_in_flight_is_refused_undoes_the_steps_before_it_only():
    w = World()
    w.submit()
    w.answer()
    cancel(w)
    w.answer(Outcome.FAILED_PERMANENT)
    w.answer()
    assert w.sent()[2:] == [("compensation", "release")]
    assert w.state().process_state is ProcessState.COMPENSATED
    assert "customer asked" in w.state().cause


def test_cancel_then_the_action_in_flight_times_out_undoes_it_too_once_its_deadline_passed():
    w = World()
    w.submit()
    w.answer()
    cancel(w)
    w.expire()  # charge's deadline passes: the supervisor resets it; the scheduler does not run it again
    assert w.sent()[2:] == [("compensation", "refund")]
    assert w.last.result is None  # outcome unknown
    assert w.lines()[("charge", Kind.ACTION)] is LineState.CANCELLED
    w.answer()
    w.answer()
    assert w.sent()[3:] == [("compensation", "release")]
    assert w.state().process_state is ProcessState.COMPENSATED


def test_cancel_during_an_undo_lets_it_go_on_with_no_second_undo():
    w = World()
    w.submit()
    w.answer()
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT)  # ship refused: refund in flight
    cancel(w)
    w.answer()
    w.answer()
    assert w.sent()[3:] == [("compensation", "refund"), ("compensation", "release")]
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED
    assert state.cause.startswith("step ship refused")  # already being undone for its own cause
    assert state.cancel_requested_at is not None


def test_cancel_after_processed_is_refused_and_changes_nothing():
    w = World()
    w.submit()
    w.answer(), w.answer(), w.answer()
    before = w.state()
    with pytest.raises(cancellation.NotCancellable, match="Processed"):
        cancel(w)
    assert w.state() == before


def test_cancel_of_an_order_in_error_is_refused():
    w = World()
    w.submit()
    w.answer(), w.answer()
    for _ in range(3):
        w.expire()  # ship gives up: cannot be undone, Error
    assert w.state().process_state is ProcessState.ERROR
    with pytest.raises(cancellation.NotCancellable, match="Error"):
        cancel(w)


def test_cancel_twice_is_a_no_op_and_so_is_a_cancel_of_a_compensated_order():
    w = World()
    w.submit()
    assert cancel(w).verdict is CancelVerdict.RECORDED
    ops = w.table.ops.copy()
    again = cancel(w, reason="again")
    assert again.verdict is CancelVerdict.ALREADY and "already" in again.reason
    assert w.table.ops - ops == {"query": 1}  # nothing written
    assert w.state().cancel_reason == "customer asked"
    assert statuses(w).count(Status.CANCELLING) == 1
    w.answer()
    w.answer()
    assert w.state().process_state is ProcessState.COMPENSATED
    assert cancel(w).verdict is CancelVerdict.ALREADY


def test_cancel_of_an_unknown_order_raises_not_found():
    w = World()
    with pytest.raises(OrderNotFound):
        cancel(w, order_id="o-404")


def test_a_response_that_races_the_cancel_write_makes_it_decide_again_on_the_new_row():
    """The response is recorded between the cancel's read and its write: the cancel's
    If-Match fails (412), it reads the new row and writes the cancel on it."""
    w = World()
    w.submit()
    real_read, raced = w.store.read, []

    def read_then_race(order_id):
        record = real_read(order_id)
        if not raced:
            raced.append(True)
            w.answer()  # reserve's response lands after our read
        return record

    w.store.read = read_then_race
    done = cancel(w)
    w.store.read = real_read
    assert done.verdict is CancelVerdict.RECORDED
    assert done.state.step == "charge"  # written on the row the response left
    w.answer()  # charge settles: undone, with reserve
    w.answer()
    w.answer()
    assert w.sent()[2:] == [("compensation", "refund"), ("compensation", "release")]
    assert w.state().process_state is ProcessState.COMPENSATED


def test_a_supervisor_reset_racing_the_cancel_and_a_late_response_apply_nothing_twice():
    w = World()
    w.submit()
    w.answer()
    charge = w.last
    cancel(w)
    w.expire()  # reset, then undo claimed: refund of an unknown outcome
    refund = w.last
    assert refund.action == "refund"
    assert w.answer(request=charge) is None  # charge's late answer: stale, fenced out
    w.answer(request=refund)
    w.answer()
    assert [a for _, a in w.sent()].count("refund") == 1
    assert w.state().process_state is ProcessState.COMPENSATED


def test_cancel_while_the_last_step_is_in_flight_and_it_succeeds_ends_in_error_not_processed():
    w = World()
    w.submit()
    w.answer(), w.answer()
    cancel(w)
    w.answer()  # ship done after the cancel: it cannot be undone
    w.answer(), w.answer()
    state = w.state()
    assert state.process_state is ProcessState.ERROR
    assert "could not undo step(s) ship" in state.last_error and "cancelled" in state.last_error
    assert len(w.publisher.alerts) == 1


def test_a_pending_line_after_a_retry_is_cancelled_at_once_and_undone_with_its_step():
    w = World()
    w.submit()
    w.answer()
    w.now = w.state().complete_by + timedelta(seconds=1)
    from supervisor import supervision
    from tests.unit.test_workflow import POLICY

    supervision.sweep(store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now,
                      alerts_queue="alerts")
    assert w.state().process_state is ProcessState.PENDING and w.nudger.nudges[-1][1] > timedelta(0)
    cancel(w)
    nudge, delay = w.nudger.nudges[-1]
    assert delay == timedelta(0)  # the cancel nudges at once, not after the backoff
    dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert w.sent()[-1] == ("compensation", "refund")
    assert w.lines()[("charge", Kind.ACTION)] is LineState.CANCELLED


def test_a_postponed_line_is_undone_only_after_the_postponed_attempts_deadline():
    w = World()
    w.submit()
    w.answer()
    w.answer(Outcome.POSTPONED)  # charge postponed: its request may still be delivered elsewhere
    cancel(w)
    take_nudge(w)
    state = w.state()
    assert state.process_state is ProcessState.PENDING and state.gave_up
    nudge, delay = w.nudger.nudges[-1]
    assert delay == timedelta(seconds=30)  # the line's timeout: the postponed attempt has ended by then
    assert w.sent()[-1] == ("action", "charge")  # nothing new sent
    take_nudge(w)
    assert w.sent()[-1] == ("compensation", "refund")
    w.answer(), w.answer()
    assert w.state().process_state is ProcessState.COMPENSATED
    assert "customer asked" in w.state().cause


# --- the message and its model -----------------------------------------------------------


def test_the_cancel_request_model_validates_the_id_and_the_reason():
    assert CancelRequest.model_validate_json(b'{"order_id": "o-1"}').reason is None
    assert CancelRequest.model_validate_json(b'{"order_id": "o-1", "reason": " late "}').reason == "late"
    for bad in (
        b'{"order_id": "o 1"}', b'{"reason": "x"}', b'{"order_id": "o-1", "reason": ""}',
        b'{"order_id": "o-1", "reason": "a\\u0000b"}', b'{"order_id": "o-1", "extra": 1}',
        b'{"order_id": "o-1", "reason": 5}',
        ('{"order_id": "o-1", "reason": "%s"}' % ("x" * (CANCEL_REASON_MAX_CHARS + 1))).encode(),
    ):
        with pytest.raises(ValidationError):
            CancelRequest.model_validate_json(bad)
    assert cancel_message_id("o-1") == "cancel:o-1"


def _message(w: World, body: bytes, content_type="application/json"):
    rejections = RejectionStore(MemoryTable())
    outcome = cancellation.cancel_message(
        body, message_id=cancel_message_id("o-1"), content_type=content_type, store=w.store, rejections=rejections,
        publisher=w.publisher, nudger=w.nudger, now=w.now,
    )
    return outcome, rejections.list()


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (b"not json", "application/json", "invalid cancel request"),
        (b'{"order_id": "o-1", "reason": 3}', None, "reason"),
        (b'{"order_id": "o-404"}', "application/json", "no order 'o-404'"),
        (b'{"order_id": "o-1"}', "text/plain", "unsupported content type"),
    ],
)
def test_a_cancel_message_that_cannot_be_acted_on_is_kept_with_its_reason(body, content_type, reason):
    w = World()
    w.submit()
    outcome, kept = _message(w, body, content_type)
    assert outcome.result == "rejected" and reason in outcome.reason
    assert len(kept) == 1 and kept[0]["Body"] == body and reason in kept[0]["Reason"]
    assert kept[0]["Source"] == "order-cancellations"
    assert w.state().cancel_requested_at is None


def test_a_cancel_message_records_the_cancel_and_a_repeat_is_a_no_op():
    w = World()
    w.submit()
    outcome, kept = _message(w, b'{"order_id": "o-1", "reason": "changed my mind"}')
    assert (outcome.result, kept) == ("recorded", [])
    assert w.state().cancel_reason == "changed my mind"
    assert w.state().cancelled_by == "a Service Bus message"
    assert _message(w, b'{"order_id": "o-1"}')[0].result == "already"


def test_a_cancel_message_for_a_processed_order_is_kept_with_the_refusal():
    w = World()
    w.submit()
    w.answer(), w.answer(), w.answer()
    outcome, kept = _message(w, b'{"order_id": "o-1"}')
    assert outcome.result == "rejected" and "Processed" in kept[0]["Reason"]


def test_cancel_cause_names_who_and_why():
    w = World()
    w.submit()
    cancel(w, reason=None)
    assert lifecycle.cancel_cause(w.state()).endswith(": no reason given")


# --- a line with nothing in flight (a step that waits for an external event) --------------


def test_a_line_waiting_for_an_event_is_cancelled_at_once_with_no_deadline_to_wait_for():
    definition = APPROVAL_WORKFLOW  # reserve, then approve (waits for the event approval), charge, ship
    w = World()
    w.submit()
    w.answer()  # reserve done; the row is now Processing at step 2, here the waiting step
    waiting = w.state().model_copy(update={"step": "approve", "workflow": definition.name})
    assert lifecycle.nothing_in_flight(waiting, definition)
    decision = lifecycle.request_cancel(waiting, w.now, "no longer wanted", "ops", definition)
    assert decision.next_state.process_state is ProcessState.PENDING
    assert decision.next_state.complete_by == w.now and decision.next_state.locked_by is None
    claimed = lifecycle.claim(
        decision.next_state, definition, "host-1", w.now, DEFAULTS, pending_timeout=timedelta(seconds=30)
    )
    assert claimed.state.kind is Kind.COMPENSATION and claimed.state.step == "reserve"  # release at once
    (record,) = claimed.lines
    assert (record.step, record.state) == ("approve", LineState.CANCELLED)
    # A line with a remote call in flight keeps waiting for it to settle.
    assert not lifecycle.nothing_in_flight(waiting, ORDER_WORKFLOW)
    assert lifecycle.request_cancel(waiting, w.now, None, None, ORDER_WORKFLOW).next_state.process_state is (
        ProcessState.PROCESSING
    )


def test_a_response_whose_write_loses_to_a_cancel_is_decided_again_and_still_counts():
    """The cancel is written between the response's read and its write: the response's
    If-Match fails (412), it reads the row again (the line is still in flight, the same
    attempt) and is recorded on it: the action applied, so it is undone at once."""
    w = World()
    w.submit()
    real_write, raced = w.store.write_over, []

    def cancel_first(record, new, lines=(), **kwargs):
        if not raced:
            raced.append(True)
            w.store.write_over = real_write
            cancel(w)  # moves the row under the response's decision
        return real_write(record, new, lines, **kwargs)

    w.store.write_over = cancel_first
    assert w.answer() is not None  # recorded, not dropped as stale
    assert w.sent()[-1] == ("compensation", "release")
    assert w.lines()[("reserve", Kind.ACTION)] is LineState.DONE


@pytest.mark.parametrize("timeout_seconds", [5, 60], ids=["timeout under the pending timeout", "timeout over it"])
def test_a_line_cancelled_while_postponed_is_undone_exactly_once_its_request_can_no_longer_act(timeout_seconds):
    """Charge is postponed (its request may still be delivered again and act until its
    deadline, at most the step's timeout T from now), then the order is cancelled. A nudge
    before T undoes nothing; the nudge sent for T starts the undo then, whether T is under
    or over the pending timeout (30 s here), not only when the two are equal."""
    defaults = dataclasses.replace(DEFAULTS, timeout_seconds=timeout_seconds)
    w = World(defaults=defaults)
    w.submit()
    w.answer()  # reserve done, charge claimed
    w.answer(Outcome.POSTPONED)  # the breaker refused charge's call: Pending, postponed
    assert cancel(w).verdict is CancelVerdict.RECORDED
    sent = len(w.sent())
    timeout = timedelta(seconds=timeout_seconds)
    dispatch.schedule(Nudge(order_id="o-1"), scheduler=w.scheduler, now=w.now)  # the claim: handed back after T
    handed_back, delay = w.nudger.nudges[-1]
    assert delay == timeout and w.state().gave_up
    start = w.now
    w.now = start + timeout - timedelta(seconds=1)  # an early nudge (delivered at least once)
    dispatch.schedule(Nudge(order_id="o-1"), scheduler=w.scheduler, now=w.now)
    assert len(w.sent()) == sent  # nothing undone while charge's request may still act
    w.now = start + timeout
    dispatch.schedule(handed_back, scheduler=w.scheduler, now=w.now)
    assert w.sent()[sent:] == [("compensation", "refund")]
    w.answer()
    w.answer()
    state = w.state()
    assert state.process_state is ProcessState.COMPENSATED and "customer asked" in state.cause


def test_a_cancel_whose_order_kept_moving_is_busy_not_refused(monkeypatch):
    """Others' writes won every try: the API answers 503 with Retry-After (not 409, which
    says the order cannot be cancelled), and a cancel message is left to Service Bus to
    deliver again (not kept as a rejection)."""
    from adapters.store import ConcurrencyConflict
    from api import cancel as cancel_api

    w = World()
    w.submit()

    def lost(*args, **kwargs):
        raise ConcurrencyConflict("moved")

    monkeypatch.setattr(w.store, "write_over", lost)
    with pytest.raises(cancellation.Busy):
        cancel(w)
    reply = cancel_api.cancel_order(
        "o-1", b"", by="ops", store=w.store, publisher=w.publisher, nudger=w.nudger, now=w.now
    )
    assert reply.status == 503 and reply.headers.get("Retry-After") == "1" and reply.body["error"] == "busy"
    rejections = RejectionStore(MemoryTable())
    with pytest.raises(cancellation.Busy):
        cancellation.cancel_message(
            CancelRequest(order_id="o-1").model_dump_json().encode(), message_id="cancel:o-1",
            content_type="application/json", store=w.store, rejections=rejections, publisher=w.publisher,
            nudger=w.nudger, now=w.now,
        )
    assert rejections.list() == []


def test_a_line_whose_postponements_just_counted_a_failure_is_still_waited_out_by_a_cancel():
    """The MAX_POSTPONEMENTS-th postponement counts a failure (the line goes on); its
    attempt's request may still be delivered and act until that attempt's Complete-By: a
    cancel then must wait that out too, not undo at once (found by a read-only review: the
    count started again at 0 and the cancel took the line for one never postponed)."""
    from tests.unit.test_workflow import MAX_POSTPONEMENTS

    w = World()
    w.submit()
    w.answer()  # reserve done, charge claimed
    for n in range(MAX_POSTPONEMENTS):
        w.answer(Outcome.POSTPONED)
        if n < MAX_POSTPONEMENTS - 1:
            nudge, delay = w.nudger.nudges[-1]
            w.now += delay
            dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    state = w.state()
    assert (state.process_state, state.failure_count, state.gave_up) == (ProcessState.PENDING, 1, False)
    assert cancel(w).verdict is CancelVerdict.RECORDED
    sent = len(w.sent())
    dispatch.schedule(Nudge(order_id="o-1"), scheduler=w.scheduler, now=w.now)  # the cancel's claim
    assert len(w.sent()) == sent and w.state().gave_up  # handed back after the step's timeout
    w.now += timedelta(seconds=DEFAULTS.timeout_seconds - 1)
    dispatch.schedule(Nudge(order_id="o-1"), scheduler=w.scheduler, now=w.now)  # an early nudge
    assert len(w.sent()) == sent  # nothing undone while charge's last request may still act
    w.now += timedelta(seconds=1)
    dispatch.schedule(Nudge(order_id="o-1"), scheduler=w.scheduler, now=w.now)
    assert w.sent()[sent:] == [("compensation", "refund")]
