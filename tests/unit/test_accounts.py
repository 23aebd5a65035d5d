"""The order state over several accounts (adapters/accounts.py), each account an in-memory
table that enforces ETags like Table Storage: every order lives whole in the account its id
picks, the workflow runs through the router unchanged, and the lists, sweeps and pages read
every account. And STATE_STORAGE_ACCOUNTS is refused, clearly, when it is malformed."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from pydantic import ValidationError

from adapters.accounts import AccountLayoutChanged, ShardedStateStore, check_layout, state_store
from adapters.settings import Settings
from adapters.store import StateStore
from core import names
from core.models import ProcessState
from supervisor import supervision
from tests.factories import every_page
from tests.memtable import MemoryTable
from tests.unit.test_workflow import POLICY, World

ACCOUNTS = 2
IDS = [f"acc-{i:03d}" for i in range(24)]


def sharded_world() -> tuple[World, list[MemoryTable]]:
    w = World()
    tables = [MemoryTable() for _ in range(ACCOUNTS)]
    w.store = ShardedStateStore([StateStore(table, shards=4) for table in tables])
    w.scheduler = replace(w.scheduler, store=w.store)
    return w, tables


def test_each_order_lives_whole_in_the_account_its_id_picks():
    w, tables = sharded_world()
    for order_id in IDS:
        w.submit(order_id)
    homes = {order_id: names.state_account(order_id, ACCOUNTS) for order_id in IDS}
    assert set(homes.values()) == set(range(ACCOUNTS)), "the test's ids reach every account"
    for order_id, home in homes.items():
        for account, table in enumerate(tables):
            rows = table.rows(order_id)
            index = table.rows(names.active_partition(names.active_shard(order_id, 4)))
            if account == home:
                assert {"order", "state"} <= set(rows) and order_id in index
            else:
                assert not rows and order_id not in index, f"{order_id} leaked into account {account}"
        assert w.store.get(order_id).process_state is ProcessState.PROCESSING  # claimed through the router


def test_the_workflow_runs_to_its_end_through_the_router():
    w, _ = sharded_world()
    for order_id in IDS:
        w.submit(order_id)
    while [r for r in w.publisher.requests if w.store.get(r[1].order_id).process_state is ProcessState.PROCESSING]:
        pending = {r[1].order_id: r[1] for r in w.publisher.requests}
        for request in pending.values():
            if w.store.get(request.order_id).process_state is ProcessState.PROCESSING:
                w.answer(request=request)
    assert {w.store.get(order_id).process_state for order_id in IDS} == {ProcessState.PROCESSED}
    assert w.store.active_ids() == []
    assert sorted(s.order_id for s in w.store.list_states()) == IDS


def test_the_sweep_reads_every_account():
    w, _ = sharded_world()
    for order_id in IDS:
        w.submit(order_id)
    w.now += timedelta(seconds=31)
    done = supervision.sweep(store=w.store, publisher=w.publisher, nudger=w.nudger, policy=POLICY, now=w.now,
                             alerts_queue="alerts")
    assert done["retry"] == len(IDS)
    assert {nudge.order_id for nudge, _ in w.nudger.nudges} == set(IDS)


def test_lists_and_pages_merge_the_accounts_in_order_id_order():
    w, _ = sharded_world()
    for order_id in IDS:
        w.submit(order_id)
    ids = [order_id for order_id, _, _ in w.store.active_ids()]
    assert ids == IDS
    states, more = w.store.in_flight(limit=10)
    assert [s.order_id for s in states] == IDS[:10] and more
    paged = every_page(w.store, ProcessState.PROCESSING, limit=5)
    assert paged == IDS, "every order once, in order, across the accounts"
    assert len(w.store.list_by_state(ProcessState.PROCESSING, limit=100)) == len(IDS)
    rows, more = w.store.states_updated_since(w.now - timedelta(hours=1), limit=100)
    assert sorted(order_id for order_id, _, _ in rows) == IDS and not more
    assert sum(w.store.ops.values()) > 0


def test_one_account_is_the_plain_store():
    store = StateStore(MemoryTable())
    assert state_store([store]) is store


def settings(accounts: str) -> Settings:
    return Settings(AzureWebJobsStorage="UseDevelopmentStorage=true", ServiceBusConnection="Endpoint=sb://x/",
                    STATE_STORAGE_ACCOUNTS=accounts)


def test_the_accounts_setting_takes_names_uris_and_connection_strings():
    s = settings(
        " stateone , https://statetwo.table.core.windows.net,AccountName=x;AccountKey=y;TableEndpoint=http://h/x"
    )
    assert s.state_accounts() == ("stateone", "https://statetwo.table.core.windows.net",
                                  "AccountName=x;AccountKey=y;TableEndpoint=http://h/x")


@pytest.mark.parametrize(("value", "says"), [
    ("stateone,,statetwo", "empty entry"),
    ("stateone,stateone", "twice"),
    ("State_One", "not a storage account name"),
    ("ab", "not a storage account name"),
    (",".join(f"state{i:03d}" for i in range(names.MAX_STATE_STORAGE_ACCOUNTS + 1)), "at most"),
])
def test_a_malformed_accounts_setting_is_refused_with_a_clear_error(value, says):
    with pytest.raises(ValidationError, match=says) as error:
        settings(value)
    assert names.STATE_STORAGE_ACCOUNTS_SETTING in str(error.value)


def test_the_accounts_layout_is_recorded_once_and_a_changed_list_is_refused():
    """Orders live where they were created: the same accounts in the same order start again;
    a reordered list, one more account, or one fewer, is refused naming the setting."""
    a, b, c = MemoryTable(), MemoryTable(), MemoryTable()
    check_layout([a, b])
    check_layout([a, b])  # a restart, or a second instance
    assert a.rows("_accounts")["layout"]["Position"] == 0 and b.rows("_accounts")["layout"]["Accounts"] == 2
    for changed in ([b, a], [a, b, c], [a]):
        with pytest.raises(AccountLayoutChanged, match=names.STATE_STORAGE_ACCOUNTS_SETTING):
            check_layout(changed)
    assert "_accounts" not in {s.order_id for s in StateStore(a).list_states()}, "the layout row is no order"


def test_the_router_offers_every_public_method_of_the_store():
    """A method added to StateStore must be routed too (to the order's account, or to every
    account): otherwise a deployment with several accounts fails where one account works."""
    public = {name for name in vars(StateStore) if not name.startswith("_") and callable(getattr(StateStore, name))}
    missing = sorted(name for name in public if not hasattr(ShardedStateStore, name))
    assert missing == [], f"route these in adapters/accounts.py: {missing}"
