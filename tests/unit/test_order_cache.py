"""The orders as the scheduler's process last wrote them (adapters/order_cache.py): what it
keeps is what a read returns, a hit reads nothing, and a stale entry ends in the decision
taken without one. Through the real StateStore over the in-memory ETag table; the same
records against Azurite in tests/integration/test_store.py."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

from adapters.order_cache import OrderCache
from adapters.store import OrderRecord, StateStore
from core.models import FIRST_CLAIM_PREFIX, LineState, Nudge, OrderRequest, OrderState, Outcome, ProcessState
from core.workflow import Kind
from devtools.orders import order_dict
from scheduler import dispatch
from tests.unit.test_cancel import cancel
from tests.unit.test_forged_messages import edited, response_to
from tests.unit.test_workflow import POLICY, T0, World

AGE = timedelta(seconds=30)


def cached_world(store: StateStore | None = None) -> World:
    """A world whose scheduler keeps what it writes, long enough for a line to time out
    (its entries go stale, not old: the age limit has a test of its own)."""
    return World(store=store, cache=OrderCache(max_age=timedelta(minutes=10)))


def kept(w: World, order_id: str = "o-1") -> OrderRecord | None:
    return w.scheduler.cache.get(order_id, w.now)


def written_as_read(store: StateStore | None = None) -> list[str]:
    """An order through its creation, first claim, a step, a postponement, a claim after it,
    a refusal that claims an undo, and that undo (the order Compensated): after each write,
    what the cache keeps is what ``store.read`` returns. The writes, in order."""
    w = cached_world(store)
    seen = []

    def same(what: str) -> None:
        assert kept(w) == w.store.read("o-1"), what
        seen.append(what)

    w.submit(before_claim=lambda: same("creation"))
    same("first claim")
    w.answer()
    same("step")
    w.answer(Outcome.POSTPONED)
    same("postponement")
    nudge, delay = w.nudger.nudges[-1]
    w.now += delay
    dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    same("claim after the postponement")
    w.answer(Outcome.FAILED_PERMANENT)
    same("refusal, undo claimed")
    assert w.last.kind is Kind.COMPENSATION and kept(w).lines[-1].state is LineState.REFUSED
    w.answer()
    assert w.state().process_state is ProcessState.COMPENSATED and kept(w) is None, "an order that ended is dropped"
    return seen


def test_what_is_kept_after_each_write_is_what_a_read_returns():
    assert len(written_as_read()) == 6


def test_a_line_written_again_replaces_its_row_in_the_kept_record():
    """A line's row is upserted: the record keeps one row per line, in the order a read gives."""
    w = cached_world()
    w.submit()
    w.answer()
    record = kept(w)
    line = record.lines[0]
    again = line.model_copy(update={"attempt": 9, "updated_at": line.updated_at + timedelta(seconds=5)})
    after = record.after(record.state, [again], "w")
    assert after.lines == (again,) and after.write_id == "w"


def test_a_hit_reads_nothing():
    def queries(w: World) -> int:
        before = w.store.ops["query"]
        w.answer()
        return w.store.ops["query"] - before

    plain, cached = World(), cached_world()
    for w in (plain, cached):
        w.submit()
    assert [queries(plain), queries(plain)] == [1, 1]
    assert [queries(cached), queries(cached)] == [0, 0]
    assert cached.sent() == plain.sent() and cached.store.read("o-1").lines == plain.store.read("o-1").lines


def test_the_first_claim_of_an_order_this_process_wrote_is_decided_on_its_rows_and_kept():
    """The nudge is only what starts it: a snapshot with the row's ETag whose other fields
    lie (here the note, and a trace of the sender's) is not what is claimed or sent."""
    w = cached_world()
    order = OrderRequest.model_validate(order_dict("o-1", lines=1))
    created = w.store.create_order(order, workflow=w.definition, reply_to="replies", now=w.now, pending_timeout=AGE)
    w.scheduler.cache.put(created.record, w.now)
    sender = f"00-{'1' * 32}-{'2' * 16}-01"
    lying = created.state.model_copy(update={"note": "from the message", "trace_parent": sender})
    nudge = Nudge(order_id="o-1", state=lying, document=order.document())
    request = dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)
    assert request is not None and request.context.fence.note is None and request.context.fence.trace_parent is None
    assert w.table.ops["query"] == 0 and kept(w) == w.store.read("o-1")
    assert not any(key.startswith(FIRST_CLAIM_PREFIX) for key in w.table.rows("o-1"))
    w.submit("o-2", before_claim=lambda: w.scheduler.cache.drop("o-2"))  # submitted by another instance
    assert w.state("o-2").process_state is ProcessState.PROCESSING and kept(w, "o-2") is None, (
        "a claim decided on a nudge's snapshot is not kept: the snapshot's other fields are the message's"
    )


def take_nudge(w: World) -> None:
    nudge, delay = w.nudger.nudges[-1]
    w.now += delay
    dispatch.schedule(nudge, scheduler=w.scheduler, now=w.now)


def outcome(w: World) -> tuple:
    """What an order came to: its rows (the ETag and write id aside) and every message sent."""
    record = w.store.read("o-1")
    return record.state.model_copy(update={"etag": None}), record.lines, w.sent(), w.publisher.statuses


def test_after_a_reset_by_the_supervisor_the_decisions_are_those_taken_without_a_cache():
    def run(w: World) -> tuple:
        w.submit()
        first = w.last
        w.expire()  # reset, nudged and claimed again: attempt 2
        w.answer(request=first)  # the first attempt's answer, late: stale
        w.answer()
        return outcome(w)

    assert run(cached_world()) == run(World())


def test_after_a_cancel_the_response_in_flight_is_decided_on_the_cancelled_row():
    def run(w: World) -> tuple:
        w.submit()
        w.answer()
        cancel(w)  # charge in flight: the cache holds its claim, the row has the cancel
        w.answer()  # charge done: undone with reserve, as the row says
        while w.last.kind is Kind.COMPENSATION and w.state().process_state is ProcessState.PROCESSING:
            w.answer()
        return outcome(w)

    cached = run(cached_world())
    assert cached == run(World())
    assert cached[0].process_state is ProcessState.COMPENSATED
    assert cached[2] == [("action", "reserve"), ("action", "charge"), ("compensation", "refund"),
                         ("compensation", "release")]


def test_a_response_the_stale_entry_would_refuse_is_decided_on_a_fresh_read_and_counts():
    """This process claimed attempt 1; a reset and another instance's claim made attempt 2.
    On the entry, attempt 2's answer is stale; on the row it is the current attempt."""
    w = cached_world()
    w.submit()
    w.now = w.state().complete_by + timedelta(seconds=1)
    from supervisor import supervision

    supervision.sweep(store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now,
                      alerts_queue="alerts")
    other = replace(w.scheduler, instance="host-2", cache=OrderCache(max_age=AGE))
    nudge, delay = w.nudger.nudges[-1]
    w.now += delay
    dispatch.schedule(nudge, scheduler=other, now=w.now)
    assert kept(w).state.attempt == 1 and w.state().attempt == 2
    queries = w.store.ops["query"]
    assert w.answer() is not None and w.last.step == "charge"
    assert w.store.ops["query"] == queries + 1 and kept(w) == w.store.read("o-1")


def test_a_write_that_loses_on_the_entry_is_not_one_of_the_decisions():
    """The entry's write answers 412, then the fresh reads' writes lose the race to a cancel
    and to other writes up to the last of the DECISIONS: the response still counts."""
    w = cached_world()
    w.submit()
    real, writes = w.store.write_over, []

    def moved_first(record, new, lines=()):
        writes.append(record.state.etag)
        if len(writes) == 1:
            w.store.write_over = real  # the cancel's own write (over the order as it reads it)
            cancel(w)  # the row moves after the entry was kept: the entry's write loses
            w.store.write_over = moved_first
        elif len(writes) <= dispatch.DECISIONS:
            state = w.store.get("o-1")
            w.store.write(state, state.model_copy(update={"note": f"touched {len(writes)}"}))
        return real(record, new, lines)

    w.store.write_over = moved_first
    assert w.answer() is not None
    assert len(writes) == 1 + dispatch.DECISIONS
    assert w.lines()[("reserve", Kind.ACTION)] is LineState.DONE and w.sent()[-1] == ("compensation", "release")


def test_a_forged_fence_with_the_entrys_etag_is_told_on_the_row_and_dropped(caplog):
    w = cached_world()
    w.submit()
    w.answer()
    row = w.store.read("o-1")
    assert kept(w) == row
    forged = edited(response_to(w.last, Outcome.SUCCEEDED), context__fence__failure_count=2)
    queries = w.store.ops["query"]
    with caplog.at_level(logging.ERROR):
        assert dispatch.record(forged, scheduler=w.scheduler, now=w.now) is None
    assert "dropped as forged" in caplog.text and w.store.ops["query"] == queries + 1
    assert w.store.read("o-1") == row and kept(w) is None


def test_a_write_applied_but_reported_failed_is_recognised_and_kept_as_written():
    w = cached_world()
    w.submit()
    w.table.lose_answers("transaction", retried=True)
    w.answer()
    assert w.store.recognised == {"write": 1} and kept(w) == w.store.read("o-1")
    w.answer()
    assert w.sent()[-1] == ("action", "ship")


def entry(order_id: str, document: str = "{}", state: ProcessState = ProcessState.PROCESSING) -> OrderRecord:
    return OrderRecord(document, OrderState(order_id=order_id, process_state=state, complete_by=T0, created_at=T0,
                                            updated_at=T0, etag=f"e-{order_id}"), ())


def test_the_least_recently_used_go_first_past_the_bound():
    cache = OrderCache(AGE, most=2)
    for order_id in ("a", "b"):
        cache.put(entry(order_id), T0)
    assert cache.get("a", T0) is not None  # a used after b
    cache.put(entry("c"), T0)
    assert [o for o in "abc" if cache.get(o, T0)] == ["a", "c"] and len(cache) == 2


def test_documents_are_bounded_too():
    cache = OrderCache(AGE, most_characters=10)
    cache.put(entry("a", "x" * 6), T0)
    cache.put(entry("b", "x" * 6), T0)
    assert cache.get("a", T0) is None and cache.get("b", T0) is not None
    cache.put(entry("c", "x" * 11), T0)
    assert cache.get("c", T0) is None and cache.get("b", T0) is not None


def test_an_entry_older_than_the_age_limit_is_never_used():
    cache = OrderCache(AGE)
    cache.put(entry("a"), T0)
    assert cache.get("a", T0 + AGE) is not None
    assert cache.get("a", T0 + AGE + timedelta(microseconds=1)) is None and len(cache) == 0


def test_an_order_that_ended_is_dropped_and_a_drop_spares_a_newer_entry():
    cache = OrderCache(AGE)
    cache.put(entry("a"), T0)
    cache.put(entry("a", state=ProcessState.PROCESSED), T0)
    assert cache.get("a", T0) is None
    cache.put(entry("b"), T0)
    cache.drop("b", etag="an older write's")
    assert cache.get("b", T0) is not None
    cache.drop("b", etag="e-b")
    assert cache.get("b", T0) is None


def test_threads_putting_getting_and_dropping_at_once_keep_the_bounds():
    cache = OrderCache(AGE, most=16, most_characters=16 * 40)
    ids = [f"o-{i}" for i in range(100)]

    def work(seed: int) -> None:
        for n in range(2_000):
            order_id = ids[(seed * 31 + n * 7) % len(ids)]
            if n % 3 == 0:
                cache.put(entry(order_id, "x" * (n % 50)), T0)
            elif n % 3 == 1:
                cache.get(order_id, T0)
            else:
                cache.drop(order_id, etag=f"e-{order_id}" if n % 2 else None)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    kept_documents = [cache.get(order_id, T0) for order_id in ids]
    assert len(cache) <= 16
    assert sum(len(r.document) for r in kept_documents if r is not None) == cache._characters <= 16 * 40


def test_decisions_on_one_order_take_turns_and_other_orders_do_not_wait():
    import threading

    cache = OrderCache(max_age=timedelta(seconds=30))
    inside, overlap = [], []
    first_in, release = threading.Event(), threading.Event()

    def decide(order_id: str, hold: bool) -> None:
        with cache.deciding(order_id):
            if inside and inside[-1] == order_id:
                overlap.append(order_id)
            inside.append(order_id)
            if hold:
                first_in.set()
                release.wait(5)
            inside.remove(order_id)

    first = threading.Thread(target=decide, args=("o-1", True))
    first.start()
    assert first_in.wait(5)
    second = threading.Thread(target=decide, args=("o-1", False))
    second.start()
    other = threading.Thread(target=decide, args=("o-2", False))
    other.start()
    other.join(5)
    assert not other.is_alive()  # another order is not held up
    assert second.is_alive()  # the same order waits for the first decision
    release.set()
    for thread in (first, second):
        thread.join(5)
    assert overlap == [] and not cache._deciding  # no two at once; nothing left behind
