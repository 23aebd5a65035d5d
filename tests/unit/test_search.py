"""Search by customer and Error orders by cause: the pure keys and normalisation (core/search.py),
and the indexes and the bulk resubmit through the real StateStore over the in-memory table
that enforces ETags (adapters/search.py, supervisor/bulk.py)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from adapters import search
from adapters.store import StateStore
from core import names
from core.models import OrderRequest, Outcome, ProcessState
from core.search import (
    check_group,
    created_of,
    customer_key_range,
    customer_partition,
    customer_row_key,
    error_cause,
    error_partition,
    normalise_error,
    order_of,
)
from core.workflow import ORDER_WORKFLOW
from devtools.orders import order_dict
from supervisor import supervision
from supervisor.bulk import resubmit_group
from tests.memtable import MemoryTable
from tests.unit.test_workflow import World

T0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)

# Errors as the app writes them (core/lifecycle.py, agents/remote.py, the fake remote's answers).
REFUSED_UNDO = (
    "could not undo step(s) reserve; the order was being undone because step ship refused: HTTP 422: "
    '{"error": "permanent", "message": "injected permanent failure: the request cannot be fulfilled; not applied", '
    '"order_id": "%s", "key": "%s:ship:action"}'
)
GAVE_UP = (
    "step ship: outcome unknown after 3 failed attempts, and it cannot be undone; check it at the remote service, "
    "then resubmit to run it again (same idempotency key). Last: gave up after 3 failed attempts; last: attempt %d "
    "did not complete by %s"
)
UNREACHABLE = (
    "ClientConnectorError: Cannot connect to host 127.0.0.1:%d ssl:default [Connect call failed ('127.0.0.1', %d)]; "
    "then no free call slot before complete-by"
)


# --- normalisation and grouping (pure) ---------------------------------------------------------


def test_the_same_cause_of_different_orders_normalises_to_one_text():
    a = normalise_error(REFUSED_UNDO % ("o-17", "o-17"), order_id="o-17")
    b = normalise_error(REFUSED_UNDO % ("order-9f3c2a", "order-9f3c2a"), order_id="order-9f3c2a")
    assert a == b
    # The cause stays readable: the step, the HTTP status, the JSON keys and the error code.
    assert a.startswith("could not undo step(s) reserve; the order was being undone because step ship refused: HTTP 422:")
    assert '"error": "permanent"' in a and '"message": "…"' in a and "o-17" not in a


def test_numbers_timestamps_guids_and_ports_are_taken_out():
    a = normalise_error(GAVE_UP % (7, "2026-11-25T02:14:45.123456+00:00"))
    b = normalise_error(GAVE_UP % (12, "2026-12-01T23:59:01Z"))
    assert a == b and "attempt # did not complete by #" in a
    assert normalise_error(UNREACHABLE % (7081, 7081)) == normalise_error(UNREACHABLE % (50123, 50123))
    guid = normalise_error("lock 0f8fad5b-d9cb-469f-a165-70867728950e lost after 61.5 s")
    assert guid == "lock # lost after # s"


def test_a_different_status_step_or_code_is_another_cause():
    base = dict(order_id="o-1", step="ship", kind="compensation", failed=("reserve",))
    refused = error_cause(**base, last_error="step ship refused: HTTP 422: {\"error\": \"permanent\"}")
    assert refused.group == error_cause(**base, last_error="step ship refused: HTTP 422: {\"error\": \"permanent\"}").group
    others = [
        error_cause(**base, last_error="step ship refused: HTTP 409: {\"error\": \"permanent\"}"),
        error_cause(**base, last_error="step ship refused: HTTP 422: {\"error\": \"card_declined\"}"),
        error_cause(**{**base, "failed": ("charge",)}, last_error=refused.error),
        error_cause(**{**base, "kind": "action"}, last_error=refused.error),
    ]
    assert len({refused.group, *(o.group for o in others)}) == 5
    assert check_group(refused.group) == refused.group and len(refused.group) == 12


@pytest.mark.parametrize("bad", [None, "", "ABCDEF012345", "abc", "0123456789abc", "../etc", "0123456789a "])
def test_a_group_id_that_is_not_twelve_hex_digits_is_refused(bad):
    with pytest.raises(ValueError, match="not an error group"):
        check_group(bad)


def test_newer_orders_sort_first_and_a_window_is_one_key_range():
    times = [T0 + timedelta(minutes=m) for m in range(5)]
    keys = [customer_row_key(t, f"o-{i}") for i, t in enumerate(times)]
    assert sorted(keys) == keys[::-1]
    assert created_of(keys[2]) == times[2] and order_of(keys[2]) == "o-2"
    window = customer_key_range(times[1], times[3])  # both ends inclusive
    assert [order_of(k) for k in sorted(keys) if window.lo <= k < window.hi] == ["o-3", "o-2", "o-1"]
    assert customer_key_range(None, None).lo is None and customer_key_range(None, None).hi is None
    with pytest.raises(ValueError, match="is after until"):
        customer_key_range(times[3], times[1])
    assert customer_partition("cust-7") == f"{names.CUSTOMER_PREFIX}-cust-7"


# --- the customer index ------------------------------------------------------------------------------


def submit(store, order_id: str, customer: str, at: datetime) -> None:
    """As scheduler/submission.py submits: the index row, then the order's transaction."""
    order = OrderRequest.model_validate(order_dict(order_id, customer_id=customer))
    search.index_customer(store, order, at)
    store.create_order(order, workflow=ORDER_WORKFLOW, reply_to=None, now=at, pending_timeout=timedelta(seconds=30))


def every_page(store, customer: str, *, limit: int, **window) -> list[list[str]]:
    pages, after = [], None
    key_range = customer_key_range(window.get("since"), window.get("until"))
    while True:
        page = search.by_customer(store, customer, key_range=key_range, limit=limit, after=after)
        pages.append([s.order_id for s in page.orders])
        if page.next_key is None:
            return pages
        after = page.next_key


def test_a_customers_orders_read_newest_first_in_pages_and_no_one_elses():
    store = StateStore(MemoryTable())
    for i in range(7):
        submit(store, f"a-{i}", "cust-a", T0 + timedelta(seconds=i))
        submit(store, f"b-{i}", "cust-b", T0 + timedelta(seconds=i))
    assert every_page(store, "cust-a", limit=3) == [["a-6", "a-5", "a-4"], ["a-3", "a-2", "a-1"], ["a-0"]]
    assert every_page(store, "cust-a", limit=7) == [[f"a-{i}" for i in range(6, -1, -1)]]
    window = every_page(store, "cust-b", limit=2, since=T0 + timedelta(seconds=2), until=T0 + timedelta(seconds=4))
    assert window == [["b-4", "b-3"], ["b-2"]]
    assert every_page(store, "nobody", limit=5) == [[]]


def test_a_window_reaching_past_the_times_a_key_can_hold_is_clamped_not_misread():
    """A key holds 13 digits of inverted milliseconds (1970-01-01T00:00:00.001Z to 2286): a
    bound outside them bounds nothing, or leaves nothing, as no order was created there."""
    store = StateStore(MemoryTable())
    for i in range(3):
        submit(store, f"c-{i}", "cust-c", T0 + timedelta(seconds=i))
    everything = [["c-2", "c-1", "c-0"]]
    epoch, last = datetime(1970, 1, 1, tzinfo=UTC), datetime(2286, 11, 20, 17, 46, 40, tzinfo=UTC)
    for since in (epoch, datetime(1969, 1, 1, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)):
        assert every_page(store, "cust-c", limit=5, since=since) == everything, since
        assert every_page(store, "cust-c", limit=5, until=since) == [[]], since
    for until in (last, last + timedelta(milliseconds=1), datetime(9999, 12, 31, tzinfo=UTC)):
        assert every_page(store, "cust-c", limit=5, until=until) == everything, until
        assert every_page(store, "cust-c", limit=5, since=datetime(1969, 1, 1, tzinfo=UTC), until=until) == everything
    assert every_page(store, "cust-c", limit=5, since=last + timedelta(milliseconds=1)) == [[]]
    # The first and last times a key holds are bounds as any other.
    assert every_page(store, "cust-c", limit=5, since=epoch + timedelta(milliseconds=1)) == everything
    assert every_page(store, "cust-c", limit=5, until=epoch + timedelta(milliseconds=1)) == [[]]
    assert every_page(store, "cust-c", limit=5, since=last) == [[]]
    assert every_page(store, "cust-c", limit=5, since=T0 + timedelta(seconds=1), until=last) == [["c-2", "c-1"]]
    assert every_page(store, "cust-c", limit=5, since=epoch, until=T0 + timedelta(seconds=1)) == [["c-1", "c-0"]]


def test_a_page_costs_one_query_and_a_read_per_order_never_a_scan():
    table = MemoryTable()
    store = StateStore(table)
    for i in range(20):
        submit(store, f"a-{i}", "cust-a", T0 + timedelta(seconds=i))
    before = table.ops.copy()
    search.by_customer(store, "cust-a", key_range=customer_key_range(None, None), limit=5)
    assert table.ops - before == {"query": 1, "read": 5}


def test_an_index_row_without_its_order_is_skipped_and_a_duplicates_row_removed():
    table = MemoryTable()
    store = StateStore(table)
    submit(store, "a-1", "cust-a", T0)
    # A submission that died between its two writes: the index row only (young: kept for now).
    order = OrderRequest.model_validate(order_dict("a-2", customer_id="cust-a"))
    search.index_customer(store, order, datetime.now(UTC))
    # The same order delivered again later: a second index row, at the later time, for one order.
    again = OrderRequest.model_validate(order_dict("a-1", customer_id="cust-a"))
    search.index_customer(store, again, T0 + timedelta(minutes=5))
    assert store.create_order(again, workflow=ORDER_WORKFLOW, reply_to=None, now=T0 + timedelta(minutes=5),
                              pending_timeout=timedelta(seconds=30)).created is False
    assert every_page(store, "cust-a", limit=10) == [["a-1"]]
    # The duplicate's row is gone; the young orphan is kept (its order may still be written).
    assert sorted(order_of(k) for k in table.rows(customer_partition("cust-a"))) == ["a-1", "a-2"]


# --- Error orders by cause ------------------------------------------------------------------------------


def to_error(w: World, order_id: str, refusal: str = "HTTP 422: card declined for order %s") -> None:
    """reserve done, charge refused, the release refused too: the order stops in Error."""
    w.submit(order_id)
    w.answer()
    w.answer(Outcome.FAILED_PERMANENT, error=refusal % order_id)
    w.answer(Outcome.FAILED_PERMANENT, error=f"HTTP 409: release of {order_id} refused")
    assert w.state(order_id).process_state is ProcessState.ERROR


def test_an_order_closed_in_error_joins_its_causes_group_and_leaves_it_on_resubmit():
    w = World()
    for order_id in ("e-1", "e-2", "e-3"):
        to_error(w, order_id)
    to_error(w, "e-4", refusal="HTTP 402: payment required (%s)")
    found, more = search.groups(w.store, limit=10)
    assert more is None
    by_count = sorted(((g.count, g.cause.step, g.cause.kind, g.cause.failed) for g in found), reverse=True)
    assert by_count == [(3, "reserve", "compensation", ("reserve",)), (1, "reserve", "compensation", ("reserve",))]
    big = max(found, key=lambda g: g.count)
    assert big.sample_order in {"e-1", "e-2", "e-3"} and "card declined" in big.sample
    assert [m.order_id for m in search.members(w.store, big.group, limit=10)[0]] == ["e-1", "e-2", "e-3"]

    supervision.resubmit("e-2", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
    assert [m.order_id for m in search.members(w.store, big.group, limit=10)[0]] == ["e-1", "e-3"]
    assert search.group(w.store, big.group).count == 2


def test_a_resubmitted_order_that_fails_again_is_back_in_its_group_and_keeps_its_new_row():
    w = World()
    to_error(w, "e-1")
    (group,), _ = search.groups(w.store, limit=10)
    failed = w.state("e-1")
    supervision.resubmit("e-1", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
    # The release runs again and is refused again: a new Error, at a later attempt.
    nudge, _ = w.nudger.nudges[-1]
    from scheduler import dispatch

    dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    w.answer(Outcome.FAILED_PERMANENT, error="HTTP 409: release of e-1 refused")
    again = w.state("e-1")
    assert again.process_state is ProcessState.ERROR and again.attempt > failed.attempt
    (member,), _ = search.members(w.store, group.group, limit=10)
    assert (member.order_id, member.attempt) == ("e-1", again.attempt)
    # The first Error's removal, late (a resubmit that died before it), leaves the new row alone.
    search.unindex_error(w.store, failed)
    assert [m.attempt for m in search.members(w.store, group.group, limit=10)[0]] == [again.attempt]


def test_an_error_at_the_same_attempt_but_later_keeps_its_row_when_the_earlier_one_leaves():
    """A resubmitted undo of a step that has none fails again at once, at the same attempt
    (no claim): when the resubmit then takes the earlier Error out of its group, the row the
    new Error wrote stays (it records a later end)."""
    w = World()
    to_error(w, "e-1")
    earlier = w.state("e-1")
    later = earlier.model_copy(update={"updated_at": earlier.updated_at + timedelta(seconds=2)})
    search.index_error(w.store, later)  # the new Error's row: same attempt, same cause
    search.unindex_error(w.store, earlier)
    (member,), _ = search.members(w.store, search.cause_of(later).group, limit=10)
    assert member.order_id == "e-1"
    search.unindex_error(w.store, later)  # and that Error's own resubmit takes it out
    assert search.members(w.store, search.cause_of(later).group, limit=10) == ([], False)


def test_forget_removes_an_orders_rows_from_both_indexes():
    w = World()
    order = OrderRequest.model_validate(order_dict("e-1", lines=1))
    search.index_customer(w.store, order, w.now)
    to_error(w, "e-1")
    state = w.state("e-1")
    group = error_partition(search.groups(w.store, limit=1)[0][0].group)
    assert w.table.rows(group) and w.table.rows(customer_partition(order.customer_id))
    search.forget(w.store, order, state)
    search.forget(w.store, order, state)  # gone already: fine
    assert not w.table.rows(group) and not w.table.rows(customer_partition(order.customer_id))


# --- the bulk resubmit -----------------------------------------------------------------------------------


class Clock:
    """A clock the pacing sleeps on: time passes only when the resubmit waits."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def errors_world(count: int) -> tuple[World, str]:
    w = World()
    for i in range(count):
        to_error(w, f"e-{i:02d}")
    (group,), _ = search.groups(w.store, limit=10)
    return w, group.group


def test_a_group_is_resubmitted_in_bounded_paced_batches_that_continue_where_they_stopped():
    w, group = errors_world(12)
    clock, done, after = Clock(), [], None
    calls = 0
    while True:
        progress = resubmit_group(
            group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30), per_second=4, batch=5,
            after=after, now=lambda: w.now, sleep=clock.sleep, clock=clock,
        )
        calls += 1
        assert len(progress.resubmitted) <= 5
        done += progress.resubmitted
        if progress.continuation is None:
            break
        after = progress.continuation
    assert calls == 3 and done == [f"e-{i:02d}" for i in range(12)]
    assert all(w.state(o).process_state is ProcessState.PENDING for o in done)
    # 4 per second: within a batch of 5, the 2nd to 5th each waited a quarter of a second.
    assert clock.slept == [0.25] * 4 + [0.25] * 4 + [0.25]
    assert search.groups(w.store, limit=10) == ([], None)
    again = resubmit_group(group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30),
                           per_second=4, batch=5, now=lambda: w.now, sleep=clock.sleep, clock=clock)
    assert again.document()["resubmitted"] == 0 and again.document()["done"] is True


def test_two_operators_resubmitting_one_group_at_once_resubmit_each_order_once():
    w, group = errors_world(30)
    results, barrier = [], threading.Barrier(2)

    def operator() -> None:
        barrier.wait()
        results.append(resubmit_group(
            group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30), per_second=1000, batch=100,
            now=lambda: w.now,
        ))

    threads = [threading.Thread(target=operator) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first, second = (set(r.resubmitted) for r in results)
    assert not first & second and first | second == {f"e-{i:02d}" for i in range(30)}
    nudged = [n.order_id for n, _ in w.nudger.nudges if n.state is not None and n.state.process_state is ProcessState.PENDING]
    assert sorted(o for o in nudged if o in first | second) == sorted(first | second)  # one nudge each


def test_a_row_left_by_a_resubmit_that_died_is_skipped_and_removed():
    w, group = errors_world(3)
    (member, *_), _ = search.members(w.store, group, limit=10)
    state = w.state(member.order_id)
    # The resubmit's write landed, then the host died before the order left the group.
    from core import lifecycle

    w.store.reindex(member.order_id, w.now)
    w.store.write(state, lifecycle.resubmit(state, w.now, timedelta(seconds=30)))
    progress = resubmit_group(group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30),
                              per_second=1000, batch=10, now=lambda: w.now)
    assert progress.skipped == [member.order_id] and len(progress.resubmitted) == 2
    assert search.members(w.store, group, limit=10) == ([], False)


def test_a_bulk_resubmit_leaves_an_order_that_failed_again_after_its_check():
    """Between the group's check of an order and its resubmit's read, another operator
    resubmits it and it fails again: the group's call must not resubmit that new Error (a
    new attempt, its own row; the next call, or its cause's group if another, takes it)."""
    from scheduler import dispatch
    from supervisor import supervision

    w, group = errors_world(2)
    first = w.state("e-00")
    read, raced = w.store.read, []

    def read_after_a_race(order_id, *args, **kwargs):
        if order_id == "e-00" and not raced:
            raced.append(order_id)
            supervision.resubmit("e-00", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
            nudge, _ = w.nudger.nudges[-1]
            dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)  # the release claimed again...
            w.answer(Outcome.FAILED_PERMANENT, error="HTTP 410: release of e-00 gone for good")  # ...and refused
        return read(order_id, *args, **kwargs)

    w.store.read = read_after_a_race
    progress = resubmit_group(group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30),
                              per_second=1000, batch=10, now=lambda: w.now)
    assert raced and progress.skipped == ["e-00"] and progress.resubmitted == ["e-01"]
    again = w.state("e-00")
    assert again.process_state is ProcessState.ERROR and again.attempt > first.attempt


def test_a_slow_rate_shortens_the_batch_so_a_call_answers_within_a_minute():
    w, group = errors_world(8)
    clock = Clock()
    progress = resubmit_group(group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30),
                              per_second=0.1, batch=100, now=lambda: w.now, sleep=clock.sleep, clock=clock)
    assert len(progress.resubmitted) == 6 and progress.continuation == "e-05"  # 6 slots of 10 s: 50 s of waits
    assert sum(clock.slept) == 50


def test_the_backfill_indexes_the_orders_written_before_the_index_once():
    table = MemoryTable()
    store = StateStore(table)
    for i in range(3):  # written without their customer row, as before the index existed
        order = OrderRequest.model_validate(order_dict(f"old-{i}", customer_id="cust-old"))
        store.create_order(order, workflow=ORDER_WORKFLOW, reply_to=None, now=T0 + timedelta(seconds=i),
                           pending_timeout=timedelta(seconds=30))
    assert every_page(store, "cust-old", limit=10) == [[]]
    assert search.backfill_customers(store) == 3
    assert search.backfill_customers(store) == 3  # again: the same rows
    assert every_page(store, "cust-old", limit=10) == [["old-2", "old-1", "old-0"]]
    assert len(table.rows(customer_partition("cust-old"))) == 3


def test_over_several_accounts_each_orders_rows_are_in_its_account_and_the_readers_merge():
    from adapters.accounts import ShardedStateStore
    from tests.unit.test_accounts import sharded_world

    w, tables = sharded_world()
    assert isinstance(w.store, ShardedStateStore)
    for i in range(9):
        submit(w.store, f"m-{i}", "cust-m", T0 + timedelta(seconds=i))
    holders = {i for i, table in enumerate(tables) if table.rows(customer_partition("cust-m"))}
    assert len(holders) > 1  # the customer's rows are spread with its orders
    for i, table in enumerate(tables):
        ids = {order_of(k) for k in table.rows(customer_partition("cust-m"))}
        assert all(w.store.store_for(o).table is table for o in ids)
    assert every_page(w.store, "cust-m", limit=4) == [
        ["m-8", "m-7", "m-6", "m-5"], ["m-4", "m-3", "m-2", "m-1"], ["m-0"]]

    for i in range(6):
        to_error(w, f"x-{i}")
    (group,), _ = search.groups(w.store, limit=10)
    assert group.count == 6
    assert [m.order_id for m in search.members(w.store, group.group, limit=4)[0]] == [f"x-{i}" for i in range(4)]
    progress = resubmit_group(group.group, store=w.store, nudger=w.nudger, pending_timeout=timedelta(seconds=30),
                              per_second=1000, batch=100, now=lambda: w.now)
    assert sorted(progress.resubmitted) == [f"x-{i}" for i in range(6)]
    assert search.groups(w.store, limit=10) == ([], None)


def test_a_time_read_back_to_the_millisecond_keeps_its_key():
    from core.search import created_millis, millis

    # A state row's CreatedAt read back (to the microsecond, or cut to the millisecond) gives its key's time.
    exact = datetime(2026, 11, 25, 2, 14, 45, 123000, tzinfo=UTC)
    for when in (exact, exact.replace(microsecond=123999), exact + timedelta(days=3653, microseconds=7)):
        key = customer_row_key(when, "o-1")
        assert created_millis(key) == millis(when) == millis(when.replace(microsecond=when.microsecond // 1000 * 1000))


def test_a_cause_with_no_order_left_is_dropped_by_the_listing_unless_a_new_order_rewrote_it():
    w, group = errors_world(2)
    for order_id in ("e-00", "e-01"):
        supervision.resubmit(order_id, store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
    query = {"query_filter": "PartitionKey eq @pk", "parameters": {"pk": names.ERROR_GROUPS_PARTITION}}
    (read,) = list(w.store.table.query_entities(**query))  # a listing reads the cause's row...
    to_error(w, "e-02")  # ...the same cause again rewrites it...
    supervision.resubmit("e-02", store=w.store, nudger=w.nudger, now=w.now, pending_timeout=timedelta(seconds=30))
    assert search._build(group, [(read, w.store)], [w.store]).count == 0  # ...and the listing counts none
    assert set(w.table.rows(names.ERROR_GROUPS_PARTITION)) == {group}  # kept: If-Match refused the delete
    assert search.groups(w.store, limit=10) == ([], None)  # a listing that read the row as it is
    assert w.table.rows(names.ERROR_GROUPS_PARTITION) == {}  # drops the empty cause
