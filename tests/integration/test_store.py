"""The state store against Azurite with the real SDK."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from azure.data.tables import TableClient, TableTransactionError

from adapters.clients import development_storage
from adapters.settings import Settings
from adapters.store import UNSHARDED_ACTIVE_PARTITION, ConcurrencyConflict, OrderConflict, OrderNotFound, StateStore
from adapters.wiring import Services
from core import lifecycle, names
from core.models import (
    FIRST_CLAIM_PREFIX,
    AgentResponse,
    Context,
    LineState,
    OrderRequest,
    Outcome,
    ProcessState,
    utcnow,
)
from core.workflow import ORDER_WORKFLOW, StepPolicy
from devtools.orders import order_json

PENDING = timedelta(seconds=30)
STEP = timedelta(seconds=30)
DEFAULTS = StepPolicy(timeout_seconds=30, max_failures=3, agent_max_calls=1, agent_backoff_initial=1, agent_backoff_max=1)


def new_order(store: StateStore, order_id: str | None = None, **fields):
    order = OrderRequest.model_validate_json(order_json(order_id, **fields))
    return order, store.create_order(
        order, workflow=ORDER_WORKFLOW, reply_to=None, now=utcnow(), pending_timeout=PENDING
    )


def claim(store: StateStore, order_id: str, instance: str, now, *, hint=None):
    """What the scheduler's claim writes: None if not Pending or the race was lost."""
    state = hint or store.get(order_id)
    transition = lifecycle.claim(state, ORDER_WORKFLOW, instance, now, DEFAULTS, pending_timeout=PENDING)
    return None if transition is None else store.transition(state, transition.state, transition.lines)


def test_create_writes_order_state_and_index(store):
    order, created = new_order(store)
    assert created.created and created.state.process_state is ProcessState.PENDING
    record = store.read(order.order_id)
    assert record.document == order.document()
    assert record.state == created.state and record.lines == ()
    assert [row[0] for row in store.active_ids()] == [order.order_id]


def test_a_transaction_with_a_failing_operation_leaves_no_row(orders_table: TableClient):
    orders_table.create_entity({"PartitionKey": "p1", "RowKey": "state", "X": 1})
    with pytest.raises(TableTransactionError):
        orders_table.submit_transaction(
            [
                ("create", {"PartitionKey": "p1", "RowKey": "order", "Document": "{}"}),
                ("create", {"PartitionKey": "p1", "RowKey": "state", "X": 2}),
            ]
        )
    rows = list(orders_table.query_entities("PartitionKey eq @pk", parameters={"pk": "p1"}))
    assert [(r["RowKey"], r["X"]) for r in rows] == [("state", 1)]


def test_same_order_again_is_a_no_op(store):
    order, first = new_order(store)
    again = store.create_order(
        order, workflow=ORDER_WORKFLOW, reply_to=None, now=utcnow() + timedelta(seconds=5), pending_timeout=PENDING
    )
    assert not again.created
    assert again.state == first.state  # nothing rewritten: same ETag, same times


def test_different_content_under_the_same_id_is_refused_and_changes_nothing(store):
    order, first = new_order(store)
    other = order.model_copy(update={"customer_id": "someone-else"})
    with pytest.raises(OrderConflict) as raised:
        store.create_order(other, workflow=ORDER_WORKFLOW, reply_to=None, now=utcnow(), pending_timeout=PENDING)
    assert raised.value.existing == order.document()
    record = store.read(order.order_id)
    assert record.document == order.document() and record.state == first.state


def test_times_are_stored_as_edm_datetime_and_filter_as_dates(store, orders_table):
    _, created = new_order(store)
    raw = orders_table.get_entity(created.state.order_id, "state")
    # The SDK returns a datetime only for a property typed Edm.DateTime; a string
    # would come back as str (and would compare as text in Azure's filters).
    assert isinstance(raw["CompleteBy"], datetime) and raw["CompleteBy"].tzinfo is not None
    later = created.state.complete_by + timedelta(seconds=1)
    hits = list(orders_table.query_entities("CompleteBy lt @t", parameters={"t": later}))
    assert [h["OrderId"] for h in hits] == [created.state.order_id]


def test_claim_is_guarded_by_the_etag(store):
    _, created = new_order(store)
    now = utcnow()
    claimed = claim(store, created.state.order_id, "i1", now, hint=created.state)
    assert claimed.process_state is ProcessState.PROCESSING and claimed.attempt == 1
    # A second claimer with the same (now stale) snapshot is refused.
    assert claim(store, created.state.order_id, "i2", now, hint=created.state) is None
    # Writing any decision on the stale snapshot is refused.
    decided = lifecycle.claim(created.state, ORDER_WORKFLOW, "i3", now, DEFAULTS, pending_timeout=PENDING)
    with pytest.raises(ConcurrencyConflict):
        store.write(created.state, decided.state)
    assert store.get(created.state.order_id).locked_by == "i1"


@pytest.mark.parametrize("kind", ["complete", "fail", "reset"])
def test_each_transition_is_refused_on_a_stale_etag(store, kind):
    _, created = new_order(store)
    now = utcnow()
    claimed = claim(store, created.state.order_id, "i1", now)
    if kind == "complete":
        new = claimed.model_copy(update={"process_state": ProcessState.PROCESSED})
    elif kind == "fail":
        new = lifecycle.fail(claimed, "boom", now)
    else:
        new = claimed.model_copy(update={"process_state": ProcessState.PENDING, "failure_count": 1})
    moved = store.write(claimed, claimed.model_copy(update={"last_error": "someone else"}))
    with pytest.raises(ConcurrencyConflict):
        store.write(claimed, new)
    assert store.transition(claimed, new) is None
    assert store.get(claimed.order_id) == moved


def test_a_step_ends_and_the_next_starts_in_one_transaction_guarded_by_the_state_rows_etag(store, orders_table):
    _, created = new_order(store)
    now = utcnow()
    claimed = claim(store, created.state.order_id, "i1", now)
    response = AgentResponse(
        order_id=claimed.order_id, step="reserve", kind=claimed.kind, attempt=claimed.attempt,
        outcome=Outcome.SUCCEEDED, result={"hold": "h-1"}, context=Context(fence=claimed, order={}),
    )
    transition = lifecycle.complete(claimed, response, ORDER_WORKFLOW, "i1", now, DEFAULTS)
    moved = store.write(claimed, claimed.model_copy(update={"last_error": "someone else"}))
    # On a stale ETag the whole transaction is refused: no step row either.
    with pytest.raises(ConcurrencyConflict):
        store.write(claimed, transition.state, transition.lines)
    assert store.read(claimed.order_id).lines == ()
    store.ops.clear()
    written = store.write(moved, transition.state, transition.lines)
    assert store.ops == {"transaction": 1}
    record = store.read(claimed.order_id)
    assert record.state == written and written.step == "charge" and written.attempt == 2
    assert [(line.step, line.state, line.result) for line in record.lines] == [("reserve", LineState.DONE, {"hold": "h-1"})]
    assert record.results() == {"reserve": {"hold": "h-1"}}
    assert orders_table.get_entity(claimed.order_id, "step-01-reserve")["LineState"] == "Done"


def test_import_order_writes_a_finished_order_with_its_step_rows_in_one_transaction(store):
    """As the app leaves a finished order: order, Processed state and one row per step; not indexed."""
    now = utcnow()
    order = OrderRequest.model_validate_json(order_json("imported-1"))
    state = lifecycle.new_order("any-id", ORDER_WORKFLOW, now, PENDING, None)
    state = lifecycle.claim(state, ORDER_WORKFLOW, "i1", now, DEFAULTS, pending_timeout=PENDING).state
    lines = []
    for step in ORDER_WORKFLOW.steps:
        response = AgentResponse(
            order_id=state.order_id, step=step.name, kind=state.kind, attempt=state.attempt,
            outcome=Outcome.SUCCEEDED, result={"done": step.name}, context=Context(fence=state, order={}),
        )
        transition = lifecycle.complete(state, response, ORDER_WORKFLOW, "i1", now, DEFAULTS)
        state, lines = transition.state, [*lines, *transition.lines]
    assert state.process_state is ProcessState.PROCESSED

    store.ops.clear()
    store.import_order(order, state, lines)
    assert store.ops == {"transaction": 1}
    record = store.read("imported-1")
    assert record.document == order.document() and record.state.process_state is ProcessState.PROCESSED
    assert [(line.order_id, line.step, line.state) for line in record.lines] == [
        ("imported-1", step.name, LineState.DONE) for step in ORDER_WORKFLOW.steps
    ]
    assert record.results() == {step.name: {"done": step.name} for step in ORDER_WORKFLOW.steps}
    assert store.active_ids() == []


def test_import_order_indexes_an_order_in_flight(store):
    now = utcnow()
    order = OrderRequest.model_validate_json(order_json("imported-2"))
    state = lifecycle.new_order("imported-2", ORDER_WORKFLOW, now, PENDING, None)
    store.import_order(order, state)
    assert store.read("imported-2").lines == ()
    assert [row[0] for row in store.active_ids()] == ["imported-2"]


def test_missing_order_is_not_found(store):
    with pytest.raises(OrderNotFound):
        store.get("nope")
    with pytest.raises(OrderNotFound):
        store.read("nope")


def test_unindex_succeeds_when_already_gone(store):
    _, created = new_order(store)
    store.unindex(created.state.order_id)
    store.unindex(created.state.order_id)
    assert store.active_ids() == []


def test_sweep_reads_only_in_flight_rows(store):
    """A table full of finished orders costs the sweep nothing: it reads the index."""
    now = utcnow()
    finished, in_flight = [], []
    for i in range(40):
        _, created = new_order(store)
        claimed = claim(store, created.state.order_id, "i1", now, hint=created.state)
        if i < 30:
            done = store.write(claimed, claimed.model_copy(update={"process_state": ProcessState.PROCESSED}))
            store.unindex(done.order_id)
            finished.append(done.order_id)
        else:
            in_flight.append(claimed.order_id)
    store.ops.clear()
    expired = store.list_expired(now + STEP + timedelta(seconds=1))
    assert sorted(s.order_id for s in expired) == sorted(in_flight)
    assert store.ops["index_query"] == store.shards + 2  # one query per index partition, whatever the table holds
    assert store.ops["read"] == len(in_flight), "the sweep read rows that are not in flight"


def test_sweep_skips_orders_too_young_to_have_expired(store):
    new_order(store)
    store.ops.clear()
    assert store.list_expired(utcnow(), younger_than_cannot_expire=timedelta(minutes=5)) == []
    assert store.ops["read"] == 0


def test_sweep_heals_an_index_row_whose_order_is_terminal_or_missing(store, orders_table):
    _, created = new_order(store)
    claimed = claim(store, created.state.order_id, "i1", utcnow())
    store.write(claimed, claimed.model_copy(update={"process_state": ProcessState.PROCESSED}))
    # An orphan: index row without order rows, older than the grace period.
    orders_table.upsert_entity(
        {"PartitionKey": UNSHARDED_ACTIVE_PARTITION, "RowKey": "ghost", "IndexedAt": utcnow() - timedelta(hours=1)}
    )
    terminal = list(store.sweep(utcnow(), younger_than_cannot_expire=timedelta(0)))
    assert [s.order_id for s in terminal] == [created.state.order_id]  # handed to the supervisor to finish
    assert [row[0] for row in store.active_ids()] == [created.state.order_id]


def test_race_eight_claimers_per_order_exactly_one_winner(store, orders_table, storage_connection_string, report_figure):
    orders = [new_order(store)[1].state for _ in range(200)]
    per_thread = threading.local()

    def own_store() -> StateStore:
        # One client per thread, as competing scheduler instances would each have.
        if not hasattr(per_thread, "store"):
            per_thread.store = StateStore(
                TableClient.from_connection_string(storage_connection_string, orders_table.table_name)
            )
        return per_thread.store

    winners: Counter[str] = Counter()
    lock = threading.Lock()
    now = utcnow()

    def attempt(order_id: str, claimer: int) -> None:
        if claim(own_store(), order_id, f"claimer-{claimer}", now) is not None:
            with lock:
                winners[order_id] += 1

    # Eight claims per order, queued next to each other so the eight threads race on it.
    tasks = [(state.order_id, c) for state in orders for c in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda t: attempt(*t), tasks))
    single = sum(1 for state in orders if winners[state.order_id] == 1)
    double = sum(1 for state in orders if winners[state.order_id] > 1)
    report_figure(f"claims: {len(orders)} orders, {single} single winners, {double} double")
    assert (single, double) == (200, 0)
    assert {store.get(state.order_id).attempt for state in orders} == {1}


def test_a_rejected_body_larger_than_a_row_is_kept_whole_in_part_rows(orders_table: TableClient):
    from adapters.store import RejectionStore

    rejections = RejectionStore(orders_table)
    body = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB: a Premium namespace's message can be larger
    now = utcnow()
    rejections.add(body=body, reason="too big", now=now, message_id="m-big", content_type="application/json")
    rejections.add(body=b"{}", reason="small", now=now + timedelta(milliseconds=5), message_id="m-small")
    rows = rejections.list()
    assert [(row["MessageId"], row["Reason"]) for row in rows] == [("m-small", "small"), ("m-big", "too big")]
    assert rows[1]["Body"] == body and rows[1]["BodyBytes"] == len(body)
    assert rows[0]["Body"] == b"{}"


def test_the_tables_live_in_the_state_account_when_one_is_named(
    monkeypatch, table_service, storage_connection_string, unique_name
):
    """StateStorage names the order state's own account: the app's tables go there, the
    scheduler's queue stays with AzureWebJobsStorage (here an account where nothing listens,
    so any table call that went there would fail)."""
    tables = {names.ORDERS_TABLE_SETTING: unique_name("orders"), names.REJECTIONS_TABLE_SETTING: unique_name("rejections")}
    for key, value in {
        names.STORAGE_CONNECTION: development_storage(blob=1, queue=1, table=1),
        names.STATE_STORAGE_CONNECTION: storage_connection_string,
        names.SERVICEBUS_CONNECTION: "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=a2V5",
        **tables,
    }.items():
        monkeypatch.setenv(key, value)
    services = Services.from_settings(Settings())
    try:
        _, created = new_order(services.store, "o-state")  # a real write: the table is where Azurite listens
        assert created.created and services.store.get("o-state").order_id == "o-state"
        assert all(":1/" in queue.url for queue in services.nudger.queues)  # the nudges stay with the host's account
    finally:
        services.publisher.close()
        for name in tables.values():
            table_service.delete_table(name)



def test_what_the_scheduler_keeps_after_each_write_is_what_a_read_returns(store):
    """adapters/order_cache.py against Azurite: the ETag of a write's answer is the one a
    query gives, times come back at the precision they were written, and a line's row
    reads as it was written (tests/unit/test_order_cache.py runs the same order in memory)."""
    from tests.unit.test_order_cache import written_as_read

    assert written_as_read(store) == [
        "creation", "first claim", "step", "postponement", "claim after the postponement", "refusal, undo claimed",
    ]


def test_the_first_write_over_an_order_deletes_its_seal_in_the_same_transaction(store):
    """Against Azurite: a read shows the order's first-claim seal (Created.record too) until the first write over the
    order; that write deletes it in its own transaction, over the order as read (write_over) or over its state row
    read alone (transition, which reads the partition first). A write over a record naming a seal the partition no
    longer holds fails whole: the batch's 404 on the seal undoes its If-Match MERGE, and the row is as it was."""
    _, created = new_order(store, "o-seal-a")
    record = store.read("o-seal-a")
    assert record.seal is not None and record.seal.startswith(FIRST_CLAIM_PREFIX) and record.seal == created.record.seal
    cancelled = lifecycle.request_cancel(record.state, utcnow(), "asked", "ops").next_state
    written = store.write_over(record, cancelled)
    assert written.seal is None and store.read("o-seal-a") == written

    _, created = new_order(store, "o-seal-b")
    renudged = created.state.model_copy(update={"complete_by": utcnow() + PENDING, "updated_at": utcnow()})
    assert store.transition(created.state, renudged) is not None and store.read("o-seal-b").seal is None

    _, created = new_order(store, "o-seal-c")
    row = store.read("o-seal-c")
    store.table.delete_entity("o-seal-c", row.seal)  # gone behind the record's back
    claimed = lifecycle.claim(row.state, ORDER_WORKFLOW, "i1", utcnow(), DEFAULTS, pending_timeout=PENDING)
    with pytest.raises(ConcurrencyConflict):
        store.write_over(row, claimed.state)
    assert store.read("o-seal-c") == replace(row, seal=None)  # the MERGE was not applied
    assert store.write_over(store.read("o-seal-c"), claimed.state).state.process_state is ProcessState.PROCESSING
