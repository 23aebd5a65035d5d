"""The order state over two storage accounts of Azurite (AZURITE_ACCOUNTS, devtools/azurite.py)
and the scheduler's queues, through the app's own functions and the real SDKs: orders are
created in the account their id picks, claimed from their own queue's nudges, swept, listed
by state across the accounts, and resubmitted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.data.tables import TableServiceClient

from adapters import wiring
from adapters.accounts import AccountLayoutChanged, ShardedStateStore
from adapters.wiring import services
from core import names
from core.models import OrderRequest, ProcessState, utcnow
from devtools import azurite as azurite_launcher
from devtools.orders import order_json
from scheduler import dispatch
from scheduler.blueprint import scheduler, submit_order
from supervisor.supervision import policy_from, resubmit, sweep
from tests.factories import every_page, servicebus_message
from tests.fixtures.app import as_host, take_nudges

submit_handler = as_host(submit_order)  # its nudge goes through a queue output binding
ACCOUNTS = azurite_launcher.STATE_ACCOUNTS[:2]
IDS = [f"two-{i:02d}" for i in range(12)]


@pytest.fixture
def two_accounts(app_settings, azurite, monkeypatch) -> list[str]:
    """The app's settings with the order state over two accounts (connection strings, as locally)."""
    connections = [azurite.account_connection_string(account) for account in ACCOUNTS]
    monkeypatch.setenv(names.STATE_STORAGE_ACCOUNTS_SETTING, ",".join(connections))
    wiring.reset()
    assert isinstance(services().store, ShardedStateStore)
    yield connections
    wiring.reset()


def rows_in(connection: str, table: str, partition: str) -> set[str]:
    client = TableServiceClient.from_connection_string(connection).get_table_client(table)
    return {row["RowKey"] for row in client.query_entities("PartitionKey eq @pk", parameters={"pk": partition})}


def submit_all() -> None:
    for order_id in IDS:
        submit_handler(servicebus_message(order_json(order_id), message_id=order_id))


def test_orders_are_created_claimed_swept_and_listed_across_the_accounts(two_accounts, app_settings):
    s = services()
    submit_all()
    table = app_settings[names.ORDERS_TABLE_SETTING]
    homes = {order_id: names.state_account(order_id, len(ACCOUNTS)) for order_id in IDS}
    assert set(homes.values()) == {0, 1}, "the ids reach both accounts"
    for order_id, home in homes.items():
        rows = rows_in(two_accounts[home], table, order_id)
        seals = {row for row in rows if row.startswith("first-claim-")}  # until the first claim
        assert rows - seals == {"order", "state"} and len(seals) == 1
        assert rows_in(two_accounts[1 - home], table, order_id) == set(), f"{order_id} in the other account"
        index = names.active_partition(names.active_shard(order_id, s.settings.active_index_shards))
        assert order_id in rows_in(two_accounts[home], table, index)

    # Each submission's nudge waited in its order's own queue (take_nudges checks); claim them.
    nudges = take_nudges(s.nudger)
    assert sorted(n.order_id for n in nudges) == IDS
    assert len({s.nudger.queue_for(order_id) for order_id in IDS}) > 1, "the ids reach several queues"
    for nudge in nudges:
        assert dispatch.schedule(nudge, scheduler=scheduler(s), now=utcnow()) is not None
    assert {s.store.get(order_id).process_state for order_id in IDS} == {ProcessState.PROCESSING}

    # Listed by state across the accounts: by the index (in-flight) and in pages by order id.
    assert [order_id for order_id, _, _ in s.store.active_ids()] == IDS
    assert {st.order_id for st in s.store.list_by_state(ProcessState.PROCESSING, limit=100)} == set(IDS)
    paged = every_page(s.store, ProcessState.PROCESSING, limit=5)
    assert paged == IDS

    # Swept: the attempts expire; the supervisor finds them in both accounts and retries each,
    # its retry nudges (delayed by the backoff) in each order's queue.
    later = utcnow() + s.settings.step_timeout + timedelta(seconds=1)
    done = sweep(store=s.store, publisher=s.publisher, nudger=s.nudger, policy=policy_from(s.settings), now=later,
                 alerts_queue=s.settings.alerts_queue)
    assert done["retry"] == len(IDS)
    states = {order_id: s.store.get(order_id) for order_id in IDS}
    assert {(st.process_state, st.failure_count) for st in states.values()} == {(ProcessState.PENDING, 1)}


def test_an_order_in_error_is_resubmitted_in_its_account_and_nudged_on_its_queue(two_accounts, app_settings):
    s = services()
    submit_all()
    take_nudges(s.nudger)
    order_id = IDS[3]
    home = names.state_account(order_id, len(ACCOUNTS))
    # Put it in Error as the supervisor would (give-up written through the router).
    current = s.store.get(order_id)
    s.store.write(current, current.model_copy(update={"process_state": ProcessState.ERROR, "last_error": "down"}))
    s.store.unindex(order_id)
    assert order_id not in [i for i, _, _ in s.store.active_ids()]
    assert [st.order_id for st in s.store.list_by_state(ProcessState.ERROR)] == [order_id]

    state = resubmit(order_id, store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
    assert state.process_state is ProcessState.PENDING
    assert order_id in [i for i, _, _ in s.store.active_ids()]
    table = app_settings[names.ORDERS_TABLE_SETTING]
    index = names.active_partition(names.active_shard(order_id, s.settings.active_index_shards))
    assert order_id in rows_in(two_accounts[home], table, index)
    assert [n.order_id for n in take_nudges(s.nudger)] == [order_id]  # on its own queue (checked)
    assert OrderRequest.model_validate_json(order_json(order_id)) == s.store.get_order(order_id)


def test_the_app_refuses_to_start_on_the_accounts_in_another_order(two_accounts, monkeypatch):
    services()  # the layout is written on first use
    monkeypatch.setenv(names.STATE_STORAGE_ACCOUNTS_SETTING, ",".join(reversed(two_accounts)))
    wiring.reset()
    with pytest.raises(AccountLayoutChanged, match="fixed for the deployment's life"):
        services()
    monkeypatch.setenv(names.STATE_STORAGE_ACCOUNTS_SETTING, ",".join(two_accounts))
    wiring.reset()
    assert isinstance(services().store, ShardedStateStore)  # as it was: it starts
