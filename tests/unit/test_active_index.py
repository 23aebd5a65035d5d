"""The active index spread over shards (adapters/store.py, core/names.py), through the real
StateStore over the in-memory table that enforces ETags."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from adapters.store import UNSHARDED_ACTIVE_PARTITION, StateStore
from core import names
from core.models import OrderRequest, ProcessState, utcnow
from core.workflow import ORDER_WORKFLOW
from devtools.orders import order_json
from tests.memtable import MemoryTable


def test_the_shard_is_a_stable_hash_of_the_order_id():
    # Fixed values: the same id lands in the same shard in every process and every version
    # (Python's hash() is salted per process and would scatter the index on every restart).
    assert [names.active_shard(f"o-{i}", 16) for i in range(8)] == [13, 2, 10, 0, 4, 10, 12, 9]
    assert names.active_partition(7) == "_active-007"
    assert names.active_shard("o-1", 1) == 0


def test_the_shards_share_the_orders_evenly():
    counts = Counter(names.active_shard(f"o-{i}", 16) for i in range(16_000))
    assert len(counts) == 16
    assert max(counts.values()) < 1.1 * 1_000 and min(counts.values()) > 0.9 * 1_000


@pytest.mark.parametrize("shards", [0, names.MAX_ACTIVE_INDEX_SHARDS + 1])
def test_a_shard_count_out_of_range_is_refused(shards):
    with pytest.raises(ValueError, match="1 to 256 shards"):
        StateStore(MemoryTable(), shards=shards)


def create(store: StateStore, order_id: str, now=None):
    order = OrderRequest.model_validate_json(order_json(order_id))
    return store.create_order(
        order, workflow=ORDER_WORKFLOW, reply_to=None, now=now or utcnow(), pending_timeout=timedelta(seconds=30)
    ).state


def test_each_index_row_is_written_to_its_shard_and_every_shard_is_read():
    table = MemoryTable()
    store = StateStore(table, shards=8)
    ids = [f"o-{i}" for i in range(40)]
    for order_id in ids:
        create(store, order_id)
    for shard in range(8):
        partition = names.active_partition(shard)
        assert set(table.rows(partition)) == {o for o in ids if names.active_shard(o, 8) == shard}
    assert [row[0] for row in store.active_ids()] == sorted(ids)


def test_a_sweep_moves_rows_from_another_count_to_their_shard_and_loses_none():
    table = MemoryTable()
    before = utcnow() - timedelta(minutes=5)
    old = StateStore(table, shards=16)
    ids = [f"o-{i}" for i in range(30)]
    for order_id in ids:
        create(old, order_id, now=before)
    # A row of the single partition of before the sharding, too.
    unsharded = StateStore(table, shards=1)
    create(unsharded, "o-legacy", now=before)
    row = table.rows(names.active_partition(0))["o-legacy"]
    table.delete_entity(names.active_partition(0), "o-legacy")
    table.upsert_entity({"PartitionKey": UNSHARDED_ACTIVE_PARTITION, "RowKey": "o-legacy", **row})

    new = StateStore(table, shards=4)
    expired = {s.order_id for s in new.sweep(utcnow() + timedelta(minutes=1), younger_than_cannot_expire=timedelta(0))}
    assert expired == {*ids, "o-legacy"}  # every pending order past its nudge time, wherever its row was
    for shard in range(16):
        rows = table.rows(names.active_partition(shard))
        assert all(names.active_shard(o, 4) == shard for o in rows), "a row was left outside its shard"
    assert table.rows(UNSHARDED_ACTIVE_PARTITION) == {}
    assert [row[0] for row in new.active_ids()] == sorted([*ids, "o-legacy"])
    assert {row[1] for row in new.active_ids()} == {before}  # moved with the time it was indexed at


def test_pages_of_in_flight_orders_run_in_order_id_order_across_shards_and_a_change_of_count():
    table = MemoryTable()
    old = StateStore(table, shards=3)
    ids = sorted(f"o-{i:03d}" for i in range(25))
    for order_id in ids:
        create(old, order_id)
    new = StateStore(table, shards=5)
    seen, after = [], None
    while True:
        page, after = new.page_by_state(ProcessState.PENDING, limit=4, after=after)
        seen += [s.order_id for s in page]
        if after is None:
            break
    assert seen == ids
