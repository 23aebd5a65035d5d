"""Writes Azure applied but reported failed (a 500 OperationTimedOut, a dropped
connection), through the real StateStore over the in-memory table, which replays the
SDK's retry of the same request (``MemoryTable.lose_answers``). Each case of
docs/scale.md, "Azure's push-back, and what the app does"; the same cases against
Azurite behind the fault proxy are in tests/integration/test_storage_faults.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.core.exceptions import IncompleteReadError, ServiceResponseError

from adapters.store import WRITE_ATTEMPTS, WRITE_ID, ConcurrencyConflict, OrderConflict, RejectionStore
from core import workflow as workflows
from core.models import LineState, Nudge, OrderRequest, ProcessState, Status
from core.workflow import Kind
from devtools.orders import order_dict, order_json
from scheduler import dispatch
from scheduler.submission import Result, submit
from tests.memtable import MemoryTable
from tests.unit.test_workflow import World


@pytest.mark.parametrize("retried", [True, False], ids=["retry answered 412", "connection dropped"])
def test_a_claim_applied_but_reported_failed_is_recognised_and_its_request_sent(retried):
    w = World()
    # The first claim: the state row's If-Match MERGE and the deletion of the order's
    # first-claim seal, in one transaction.
    w.submit(before_claim=lambda: w.table.lose_answers("transaction", retried=retried))
    assert w.sent() == [("action", "reserve")], "the claimed line was not sent"
    state = w.state()
    assert (state.process_state, state.attempt, state.locked_by) == (ProcessState.PROCESSING, 1, "host-1")
    assert w.store.recognised == {"write": 1}
    assert w.last.context.fence.etag == state.etag  # the fence carries the row's real ETag
    w.answer()  # and the response is recorded on it
    assert w.lines() == {("reserve", Kind.ACTION): LineState.DONE}


@pytest.mark.parametrize("retried", [True, False], ids=["retry answered 412", "connection dropped"])
def test_a_step_transaction_applied_but_reported_failed_is_recognised_and_the_next_step_sent(retried):
    w = World()
    w.submit()
    w.table.lose_answers("transaction", retried=retried)  # the step's row + the state row
    w.answer()
    assert w.sent() == [("action", "reserve"), ("action", "charge")], "the response's work was lost"
    assert w.lines() == {("reserve", Kind.ACTION): LineState.DONE}
    assert w.state().step == "charge" and w.store.recognised == {"write": 1}


@pytest.mark.parametrize("kind", ["update", "transaction"])
def test_a_write_applied_whose_answer_was_cut_short_is_recognised(kind):
    # The answer's status line came back but its body did not (azure-core raises
    # IncompleteReadError, status 2xx): the write may have been applied, as after a dropped
    # connection, so the partition says whether it was.
    w = World()
    w.submit()
    if kind == "update":
        state = w.state()
        w.table.lose_answers("update", error=IncompleteReadError("Connection broken: IncompleteRead"))
        written = w.store.write(state, state.model_copy(update={"note": "an operator"}))
        assert w.store.get("o-1").note == "an operator" and written.etag == w.state().etag
    else:
        w.table.lose_answers("transaction", error=IncompleteReadError("Connection broken: IncompleteRead"))
        w.answer()
        assert w.sent() == [("action", "reserve"), ("action", "charge")], "the response's work was lost"
    assert w.store.recognised == {"write": 1}


def test_someone_elses_write_is_still_a_conflict():
    w = World()
    w.submit()
    state = w.state()
    moved = w.store.write(state, state.model_copy(update={"note": "an operator"}))
    with pytest.raises(ConcurrencyConflict):
        w.store.write(state, state.model_copy(update={"note": "stale"}))
    assert w.store.get("o-1").note == "an operator" and w.store.get("o-1").etag == moved.etag
    assert w.store.recognised == {}


class _DroppedBeforeApplied(MemoryTable):
    """A connection dropped before the request reached the table: nothing applied."""

    def update_entity(self, *args, **kwargs):
        raise ServiceResponseError("Connection aborted")


class _DroppedOnceBeforeApplied(MemoryTable):
    """The first update's connection drops before it reaches the table; the next ones pass."""

    dropped = 0

    def update_entity(self, *args, **kwargs):
        if not type(self).dropped:
            type(self).dropped += 1
            raise ServiceResponseError("Connection aborted: Remote end closed connection without response")
        return super().update_entity(*args, **kwargs)


def test_an_ambiguous_write_that_is_never_applied_raises_after_its_tries_for_the_message_to_be_retried():
    w = World()
    w.submit()
    w.table.__class__ = _DroppedBeforeApplied
    state = w.state()
    with pytest.raises(ServiceResponseError):
        w.store.write(state, state.model_copy(update={"note": "mine"}))
    assert w.store.get("o-1") == state and w.store.recognised == {}
    assert w.store.ops["update"] == WRITE_ATTEMPTS


def test_an_unanswered_write_the_row_shows_unapplied_is_sent_again_and_applied_once():
    """azure-core does not retry a PATCH or POST after a dropped connection (only the methods
    it deems idempotent): the store reads the row, finds it as it was, and sends the write
    again under If-Match (the operator's resubmit failed on this in a push-back soak)."""
    w = World()
    w.submit()
    w.table.__class__ = _DroppedOnceBeforeApplied
    state = w.state()
    written = w.store.write(state, state.model_copy(update={"note": "mine"}))
    assert _DroppedOnceBeforeApplied.dropped == 1 and w.store.ops["update"] == 2
    assert w.store.get("o-1").note == "mine" and w.store.get("o-1").etag == written.etag
    assert w.store.recognised == {}


class _AppliedLate(MemoryTable):
    """The first update gets no answer and is not applied yet (the store's read of the row
    finds it unchanged); it is applied on its way, just before the next try arrives (which
    then meets a row that moved: 412)."""

    late: tuple | None = None

    def update_entity(self, *args, **kwargs):
        if type(self).late is None:
            type(self).late = (args, kwargs)
            raise ServiceResponseError("Connection aborted: Remote end closed connection without response")
        if type(self).late:
            late_args, late_kwargs = type(self).late
            type(self).late = ()
            super().update_entity(*late_args, **late_kwargs)
        return super().update_entity(*args, **kwargs)


def test_a_try_applied_after_the_row_looked_unapplied_is_recognised_when_the_next_try_meets_it():
    """Every try of one write carries the same write id: the first, late, is recognised by
    the second's 412, not taken for someone else's write (a claim would have sent no request,
    a supervisor's retry no nudge, an operator's resubmit would have been refused)."""
    w = World()
    w.submit()
    w.table.__class__ = _AppliedLate
    state = w.state()
    written = w.store.write(state, state.model_copy(update={"note": "mine"}))
    assert _AppliedLate.late == () and w.store.ops["update"] == 2
    assert w.store.get("o-1").note == "mine" and w.store.get("o-1").etag == written.etag
    assert w.store.recognised == {"write": 1}


def test_every_state_row_write_carries_a_new_write_id():
    w = World()
    w.submit()
    ids = {w.table.rows("o-1")["state"][WRITE_ID]}
    w.answer()
    ids.add(w.table.rows("o-1")["state"][WRITE_ID])
    assert len(ids) == 2 and all(len(i) == 32 for i in ids)


def _submit(table: MemoryTable, publisher, order_id="o-1", store=None):
    from adapters.store import StateStore

    return submit(
        order_json(order_id), message_id=order_id, reply_to="replies", content_type="application/json",
        store=store or StateStore(table), rejections=RejectionStore(MemoryTable()), publisher=publisher,
        workflow=workflows.ORDER_WORKFLOW, now=World().now, pending_timeout=timedelta(seconds=30),
    )


@pytest.mark.parametrize("retried", [True, False], ids=["retry answered 409", "connection dropped"])
def test_a_create_applied_but_reported_failed_is_the_submissions_own_it_nudges_and_says_received(retried):
    w = World()
    w.table.lose_answers("transaction", retried=retried)  # the order + state rows
    submission = _submit(w.table, w.publisher, store=w.store)
    assert submission.result is Result.CREATED, "the submission took its own write for a duplicate"
    assert submission.nudge is not None and submission.nudge.document is not None
    assert [e.status for e in w.publisher.statuses] == [Status.RECEIVED]
    assert w.store.recognised == {"create": 1}
    dispatch.schedule(submission.nudge, scheduler=w.scheduler, now=w.now)
    assert w.sent() == [("action", "reserve")]


def test_a_real_duplicate_is_still_a_duplicate_and_a_conflict_still_a_conflict():
    w = World()
    assert _submit(w.table, w.publisher, store=w.store).result is Result.CREATED
    again = _submit(w.table, w.publisher, store=w.store)
    assert again.result is Result.DUPLICATE and again.nudge is not None  # still Pending: nudged again
    assert [e.status for e in w.publisher.statuses] == [Status.RECEIVED]
    other = OrderRequest.model_validate(order_dict("o-1", lines=3))
    with pytest.raises(OrderConflict):
        w.store.create_order(other, workflow=workflows.ORDER_WORKFLOW, reply_to=None, now=w.now,
                             pending_timeout=timedelta(seconds=30))


def test_an_index_delete_applied_then_retried_meets_404_and_succeeds():
    w = World()
    w.submit()
    w.table.lose_answers("delete")
    w.store.unindex("o-1")
    assert w.store.active_ids() == []


def test_a_second_nudge_from_a_retried_send_claims_nothing():
    w = World()
    order = OrderRequest.model_validate(order_dict("o-1", lines=1))
    created = w.store.create_order(order, workflow=w.definition, reply_to=None, now=w.now,
                                   pending_timeout=timedelta(seconds=30))
    nudge = Nudge(order_id="o-1", state=created.state, document=order.document())
    assert dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now) is not None
    assert dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now) is None  # the duplicate
    assert w.sent() == [("action", "reserve")] and w.state().attempt == 1


def test_a_rejection_written_again_by_a_retry_is_one_row():
    table = MemoryTable()
    rejections = RejectionStore(table)
    table.lose_answers("upsert")
    rejections.add(body=b"{", reason="malformed", now=World().now, message_id="m-1")
    assert len(rejections.list()) == 1


class _DroppedAfterSomeoneElse(MemoryTable):
    """Someone else's write lands first; ours then meets 412 and its answer is dropped on the way back."""

    def update_entity(self, entity, *args, **kwargs):
        try:
            return super().update_entity(entity, *args, **kwargs)
        except Exception as error:
            raise ServiceResponseError("Connection aborted") from error


def test_an_unanswered_write_over_a_row_that_moved_on_is_a_conflict():
    w = World()
    w.submit()
    state = w.state()
    w.store.write(state, state.model_copy(update={"note": "someone else"}))
    w.table.__class__ = _DroppedAfterSomeoneElse
    with pytest.raises(ConcurrencyConflict):
        w.store.write(state, state.model_copy(update={"note": "mine"}))
    assert w.store.get("o-1").note == "someone else" and w.store.recognised == {}
