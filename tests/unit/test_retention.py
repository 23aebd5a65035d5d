"""Retention's pure decisions (core/retention.py) and the finished index (adapters/finished.py)
through the real StateStore over the in-memory table that enforces ETags."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from adapters import finished
from adapters.closing import close_order
from adapters.store import StateStore
from benchmarks.sweep import finished_order
from core import lifecycle, names, retention
from core.models import OrderRequest, Outcome, ProcessState, Status
from core.retention import Disposal, dispose
from core.workflow import CURRENT
from devtools.orders import order_dict, order_json
from supervisor import supervision
from tests.memtable import MemoryTable
from tests.unit.test_workflow import POLICY, Publisher, World

NOW = datetime(2026, 11, 25, 12, 30, 15, 123456, tzinfo=UTC)


def test_a_finished_row_is_keyed_by_the_day_the_shard_and_the_time_it_ended():
    partition, row_key = retention.finished_row("o-1", NOW, 16)
    assert partition == f"_finished-2026-11-25-{names.active_shard('o-1', 16):03d}"
    assert row_key == "123015123456-o-1"
    # Within a day, row keys sort by the time the order ended.
    later = retention.finished_row("o-1", NOW + timedelta(seconds=1), 16)[1]
    assert row_key < later < retention.finished_row("a", NOW + timedelta(hours=1), 16)[1]
    # A moment in another zone is filed under its UTC day.
    east = NOW.astimezone(ZoneInfo("Asia/Tokyo"))
    assert retention.finished_row("o-1", east, 16) == (partition, row_key)


def test_due_ranges_are_the_days_before_the_cutoff_and_the_cutoffs_day_up_to_its_time():
    whole, cutoff_day = retention.due_ranges(NOW, 2)
    assert (whole.low, whole.high, whole.before) == ("_finished-", "_finished-2026-11-23-", None)
    assert (cutoff_day.low, cutoff_day.high) == ("_finished-2026-11-23-", "_finished-2026-11-23-~")
    assert cutoff_day.before == "123015123456"
    # Every shard of the cutoff's day is inside its range, no other day is.
    assert cutoff_day.low < names.finished_partition("2026-11-23", 255) < cutoff_day.high
    assert not cutoff_day.low <= names.finished_partition("2026-11-24", 0) < cutoff_day.high
    assert whole.low <= names.finished_partition("2026-11-22", 15) < whole.high
    # RETENTION_DAYS=0: everything that ended before now.
    assert retention.due_ranges(NOW, 0)[1].before == "123015123456"


def processed(order_id: str, at: datetime):
    state, lines = finished_order(order_id, at)
    return state


def test_dispose_archives_an_order_still_as_it_ended_and_only_then():
    state = processed("o-1", NOW)
    assert dispose(state, NOW, include_error=False) is Disposal.ARCHIVE
    # Gone, ended again later (a resubmit since), or in flight again: only the index row goes.
    assert dispose(None, NOW, include_error=False) is Disposal.STALE
    assert dispose(state, NOW - timedelta(seconds=1), include_error=True) is Disposal.STALE
    pending = state.model_copy(update={"process_state": ProcessState.PENDING})
    assert dispose(pending, NOW, include_error=True) is Disposal.STALE
    # Error: kept unless the setting says so.
    error = state.model_copy(update={"process_state": ProcessState.ERROR})
    assert dispose(error, NOW, include_error=False) is Disposal.KEEP
    assert dispose(error, NOW, include_error=True) is Disposal.ARCHIVE
    compensated = state.model_copy(update={"process_state": ProcessState.COMPENSATED})
    assert dispose(compensated, NOW, include_error=False) is Disposal.ARCHIVE


def test_days_and_blob_names():
    assert retention.parse_day("2026-11-25") == "2026-11-25"
    for bad in ("2026-13-01", "2026-11-25T00", "", None, "../x", "2026-1-1"):
        with pytest.raises(retention.BadDay):
            retention.parse_day(bad)
    assert retention.blob_name("2026-11-25") == "orders/2026-11-25.jsonl"
    assert retention.blob_name("2026-11-25", 2) == "orders/2026-11-25.2.jsonl"
    assert retention.part_of("orders/2026-11-25.jsonl", "2026-11-25") == 0
    assert retention.part_of("orders/2026-11-25.2.jsonl", "2026-11-25") == 2
    assert retention.part_of("orders/2026-11-25.x.jsonl", "2026-11-25") is None
    assert retention.part_of("orders/2026-11-26.jsonl", "2026-11-25") is None


def seed(store: StateStore, order_id: str, ended: datetime):
    """A Processed order (its rows as the app leaves them), still in the active index."""
    order = OrderRequest.model_validate_json(order_json(order_id))
    state, lines = finished_order(order_id, ended)
    store.import_order(order, state, lines)
    store.reindex(order_id, ended)
    return store.get(order_id)


def test_closing_an_order_indexes_it_by_day_before_it_leaves_the_active_index():
    table = MemoryTable()
    store = StateStore(table, shards=4)
    state = seed(store, "o-1", NOW)
    calls = []
    original = store.unindex

    def unindex(order_id, *args, **kwargs):
        # When the active row goes, the finished row is there already.
        calls.append(bool(finished.due_rows(store, NOW + timedelta(days=1), 0, limit=10)))
        return original(order_id, *args, **kwargs)

    store.unindex = unindex
    close_order(state, store=store, publisher=Publisher(), alerts_queue="alerts", now=NOW)
    assert calls == [True]
    (row,) = finished.due_rows(store, NOW + timedelta(days=1), 0, limit=10)
    assert (row.order_id, row.state, row.finished_at, row.batch) == ("o-1", "Processed", NOW, None)
    assert row.day == "2026-11-25"
    assert row.partition == names.finished_partition("2026-11-25", names.active_shard("o-1", 4))
    assert store.active_ids() == []


def test_a_crash_before_the_active_row_goes_is_healed_by_the_sweep_and_the_row_written_once():
    table = MemoryTable()
    store = StateStore(table, shards=4)
    state = seed(store, "o-1", NOW)
    # The scheduler wrote the end, then died before closing: the sweep closes it (heal)...
    close_order(state, store=store, publisher=Publisher(), alerts_queue="alerts", now=NOW)
    # ...and a second close (the scheduler's, late) writes the same row again, keeping a mark.
    (row,) = finished.due_rows(store, NOW + timedelta(days=1), 0, limit=10)
    finished.mark(store, [row], "b" * 32)
    close_order(state, store=store, publisher=Publisher(), alerts_queue="alerts", now=NOW + timedelta(minutes=1))
    (again,) = finished.due_rows(store, NOW + timedelta(days=1), 0, limit=10)
    assert (again.partition, again.row_key, again.batch) == (row.partition, row.row_key, "b" * 32)


def test_only_an_order_that_ended_is_indexed():
    store = StateStore(MemoryTable())
    pending = lifecycle.new_order("o-1", CURRENT, NOW, timedelta(seconds=30), None)
    with pytest.raises(ValueError, match="only a finished order"):
        finished.record_finished(pending, store=store)


def test_due_rows_read_the_due_days_only_oldest_first_and_at_most_the_limit():
    table = MemoryTable()
    store = StateStore(table, shards=4)
    for day in range(5):  # one order a day, 5 days, plus 3 on the cutoff's day either side of it
        finished.record_finished(processed(f"d-{day}", NOW - timedelta(days=day)), store=store)
    cutoff = NOW - timedelta(days=2)
    for n, delta in enumerate((-2, -1, 1)):
        finished.record_finished(processed(f"c-{n}", cutoff + timedelta(hours=delta)), store=store)
    rows = finished.due_rows(store, NOW, 2, limit=100)
    # d-4, d-3 (whole days), then on the cutoff's day d-2 (exactly at the cutoff: not before it) is not due.
    assert sorted(r.order_id for r in rows) == ["c-0", "c-1", "d-3", "d-4"]
    assert [r.day for r in rows] == sorted(r.day for r in rows)
    # One query per due range at most, however many rows; the limit stops the reading.
    before = table.ops["query"]
    assert [r.order_id for r in finished.due_rows(store, NOW, 2, limit=2)] == ["d-4", "d-3"]
    assert table.ops["query"] - before == 1  # the limit was reached within the days before the cutoff's
    # Deleted rows are not read again.
    finished.delete(store, rows)
    assert finished.due_rows(store, NOW, 2, limit=100) == []
    finished.delete(store, rows)  # already gone: no error


def test_a_mark_on_a_row_changed_since_it_was_read_is_left_out():
    store = StateStore(MemoryTable(), shards=1)
    for n in range(3):
        finished.record_finished(processed(f"o-{n}", NOW - timedelta(days=3)), store=store)
    rows = finished.due_rows(store, NOW, 1, limit=10)
    assert len(finished.mark(store, rows, "a" * 32)) == 3
    # The rows moved (marked) since `rows` was read: the stale ETags mark nothing.
    assert finished.mark(store, rows, "c" * 32) == []
    assert {r.batch for r in finished.due_rows(store, NOW, 1, limit=10)} == {"a" * 32}


def test_a_duplicate_submission_leaves_an_order_that_ended_but_was_not_closed_to_the_sweep():
    """An order's end was written but its close was not (a crash between: its active row
    still there, no finished-index row). A duplicate submission must not take that active
    row away, or the order is never closed (no status event, no alert, never archived):
    the sweep closes it. Once closed, a duplicate's own index write is removed as before.
    (Found by the protocol model's finished-index invariant.)"""
    w = World()
    w.submit()
    w.answer(Outcome.FAILED_PERMANENT)  # reserve refused: Compensated and closed
    state = w.store.get("o-1")
    assert state.process_state is ProcessState.COMPENSATED
    row = finished.finished_entity(state, w.store.shards)
    active = lambda: [r.order_id for r in w.store._all_index_rows()]  # noqa: E731
    assert active() == [] and w.table.get_entity(row["PartitionKey"], row["RowKey"])

    # The crash's state: ended, its active row back, its finished row not written.
    w.table.delete_entity(row["PartitionKey"], row["RowKey"])
    w.store.reindex("o-1", w.now)
    order = OrderRequest.model_validate(order_dict("o-1", lines=1))
    duplicate = w.store.create_order(
        order, workflow=w.definition, reply_to="replies", now=w.now, pending_timeout=timedelta(seconds=30)
    )
    assert not duplicate.created and active() == ["o-1"]  # left for the sweep
    w.now += timedelta(minutes=10)
    supervision.sweep(
        store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now, alerts_queue="alerts"
    )
    assert active() == [] and w.table.get_entity(row["PartitionKey"], row["RowKey"])

    # Closed: a duplicate's index write is taken away again.
    w.store.create_order(
        order, workflow=w.definition, reply_to="replies", now=w.now, pending_timeout=timedelta(seconds=30)
    )
    assert active() == []


def _error_order_left_open() -> World:
    """An order that ended in Error (charge refused, then the release refused) whose close
    died half-way: its active row still there, no finished-index row."""
    w = World()
    w.submit()
    w.answer()  # reserve done
    w.answer(Outcome.FAILED_PERMANENT)  # charge refused: release claimed
    w.answer(Outcome.FAILED_PERMANENT)  # release refused: Error, closed
    state = w.store.get("o-1")
    assert state.process_state is ProcessState.ERROR
    row = finished.finished_entity(state, w.store.shards)
    w.table.delete_entity(row["PartitionKey"], row["RowKey"])
    w.store.reindex("o-1", w.now)
    return w


def _resubmit(w: World) -> None:
    supervision.resubmit("o-1", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))


def test_the_sweeps_heal_leaves_an_order_resubmitted_since_it_read_it_in_flight_and_indexed():
    """The sweep read the Error order (terminal, still indexed: its close died), then an
    operator resubmitted it (a new index row, then Pending), then the sweep got to it: it
    must not close it again (no Failed event for an order in flight) nor drop the row the
    resubmit wrote, or nothing ever supervises the order again."""
    w = _error_order_left_open()
    w.now += timedelta(minutes=10)
    swept = w.store.sweep

    def sweep_then_resubmit(now, **kwargs):
        read = list(swept(now, **kwargs))  # what the sweep read...
        _resubmit(w)  # ...then the operator's resubmit, before the sweep acts on it
        yield from read

    w.store.sweep = sweep_then_resubmit
    events = len(w.publisher.statuses)
    done = supervision.sweep(
        store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now, alerts_queue="alerts"
    )
    assert done["healed"] == 0
    assert w.store.get("o-1").process_state is ProcessState.PENDING
    assert [r.order_id for r in w.store._all_index_rows()] == ["o-1"]
    assert all(event.status is not Status.FAILED for event in w.publisher.statuses[events:])


def test_a_duplicate_submission_leaves_the_index_row_of_a_resubmit_that_came_between():
    """A duplicate of a closed Error order writes its index row, finds the order closed and
    takes that row away again; an operator's resubmit in between wrote its own row (the
    order in flight again): that row stays."""
    w = _error_order_left_open()
    w.now += timedelta(minutes=10)
    supervision.sweep(  # the close is healed: closed, not indexed
        store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now, alerts_queue="alerts"
    )
    assert w.store._all_index_rows() == []
    closed = w.store._closed

    def closed_then_resubmit(state):
        found = closed(state)
        _resubmit(w)  # between the duplicate's read and its unindex
        return found

    w.store._closed = closed_then_resubmit
    order = OrderRequest.model_validate(order_dict("o-1", lines=1))
    duplicate = w.store.create_order(
        order, workflow=w.definition, reply_to="replies", now=w.now, pending_timeout=timedelta(seconds=30)
    )
    assert not duplicate.created
    assert w.store.get("o-1").process_state is ProcessState.PENDING
    assert [r.order_id for r in w.store._all_index_rows()] == ["o-1"]
