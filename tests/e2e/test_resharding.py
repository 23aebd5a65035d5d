"""The active index's shard count changed with orders in flight (docs/scale.md, "The active
index, sharded"): hosts that wrote the index under one count are killed, hosts with another
count take over, and every order still finishes, once, with its index row gone."""

from __future__ import annotations

from adapters.wiring import services
from core import names
from core.models import ProcessState
from devtools.orders import order_json
from tests.e2e.conftest import processed, wait_until
from tests.e2e.test_lifecycle import assert_processed_once

BEFORE, AFTER = 2, 8


def test_hosts_restarted_with_another_shard_count_lose_no_order_in_flight(stack):
    ids = [f"r-{i:02d}" for i in range(12)]
    assert any(names.active_shard(o, BEFORE) != names.active_shard(o, AFTER) for o in ids)
    # The first charge of each order hangs: every order is in flight when its host goes.
    stack.remote.set_faults(script={f"{order_id}/charge": ["hang"] for order_id in ids}, slow_seconds=30)
    (first,) = stack.start_hosts(1, **{names.ACTIVE_INDEX_SHARDS_SETTING: str(BEFORE), "AGENT_MAX_CALLS": "1"})
    stack.send([(order_id, order_json(order_id)) for order_id in ids])

    def all_charging():
        states = stack.states(ids)
        charging = all(s is not None and s.process_state is ProcessState.PROCESSING and s.step == "charge"
                       for s in states.values())
        return states if charging else None

    wait_until(all_charging, timeout=30, what="every order's charge in flight", interval=0.25)
    rows = services().store._all_index_rows()  # noqa: SLF001 - where each row is, not only that it is
    assert {row.order_id: row.partition for row in rows} == {
        o: names.active_partition(names.active_shard(o, BEFORE)) for o in ids
    }
    first.kill()

    stack.start_hosts(1, **{names.ACTIVE_INDEX_SHARDS_SETTING: str(AFTER)})
    states = stack.wait_closed(ids, timeout=60)  # terminal, and no index row left anywhere
    assert processed(states) == len(ids)
    assert_processed_once(stack, ids)
    assert services().store.active_ids() == []
