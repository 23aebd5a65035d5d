"""Orders through the whole local stack with the order state over two storage accounts of
Azurite (STATE_STORAGE_ACCOUNTS) and every one of the scheduler's queues in use: each order
ends, lives in the account its id picks, and is found by ``ordersctl status`` and the
status API, which list, count (the operator page) and resubmit across the accounts. And a
nudge left in the single scheduler queue of before the sharding is still handled."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from azure.data.tables import TableServiceClient

from adapters import clients, telemetry, wiring
from adapters.accounts import ShardedStateStore
from adapters.wiring import services
from core import names
from core.models import Nudge, OrderRequest, ProcessState, utcnow
from core.workflow import CURRENT
from devtools import azurite as azurite_launcher
from devtools.orders import order_json
from tests.e2e.test_api import ordersctl_status

ACCOUNTS = azurite_launcher.STATE_ACCOUNTS[:2]
IDS = [f"acct-{i:02d}" for i in range(32)]
#: Shipping refuses it and inventory refuses its release: it stops in Error, to be resubmitted.
STUCK = IDS[5]


@pytest.fixture
def two_accounts(stack, azurite, monkeypatch) -> list[str]:
    """The stack's settings with the order state over two accounts, for the hosts, this
    process and ``ordersctl`` (each reads STATE_STORAGE_ACCOUNTS)."""
    connections = [azurite.account_connection_string(account) for account in ACCOUNTS]
    value = ",".join(connections)
    monkeypatch.setenv(names.STATE_STORAGE_ACCOUNTS_SETTING, value)
    stack.settings[names.STATE_STORAGE_ACCOUNTS_SETTING] = value
    wiring.reset()
    assert isinstance(services().store, ShardedStateStore)
    return connections


def test_orders_over_two_accounts_and_every_scheduler_queue_end_and_are_found(stack, two_accounts, tmp_path):
    homes = {order_id: names.state_account(order_id, len(ACCOUNTS)) for order_id in IDS}
    queues = {order_id: names.scheduler_queue_shard(order_id) for order_id in IDS}
    assert set(homes.values()) == {0, 1} and set(queues.values()) == set(range(names.SCHEDULER_QUEUE_SHARDS))

    stack.remote.set_faults(script={f"{STUCK}/ship": ["permanent"], f"{STUCK}/release": ["permanent"]})
    (host,) = stack.start_hosts(API_AUTH="none")
    stack.send([(order_id, order_json(order_id)) for order_id in IDS])
    states = stack.wait_closed(IDS, timeout=45)
    assert {order_id for order_id, s in states.items() if s.process_state is not ProcessState.PROCESSED} == {STUCK}
    assert states[STUCK].process_state is ProcessState.ERROR

    # Each order's rows are in its own account, none in the other.
    table = stack.settings[names.ORDERS_TABLE_SETTING]
    clients = [TableServiceClient.from_connection_string(c).get_table_client(table) for c in two_accounts]
    for account, client in enumerate(clients):
        held = {row["PartitionKey"] for row in client.query_entities("RowKey eq 'state'")}
        assert held == {order_id for order_id, home in homes.items() if home == account}

    # Every scheduler queue's function ran; nothing went to the single queue of before.
    ran = {names.schedule_function(shard): len(host.invocations(names.schedule_function(shard)))
           for shard in range(names.SCHEDULER_QUEUE_SHARDS)}
    assert all(ran.values()), ran
    assert host.invocations("schedule_order") == []

    # Found by the API and by ordersctl, alike, in either account.
    api = f"{host.http_url}/api"
    for order_id in (next(i for i in IDS if homes[i] == 0), next(i for i in IDS if homes[i] == 1), STUCK):
        response = requests.get(f"{api}/orders/{order_id}", timeout=10)
        assert response.status_code == 200, response.text
        assert response.json() == ordersctl_status(stack, tmp_path, order_id)
    # Listed by state across both accounts, page by page.
    listed, continuation = [], None
    while True:
        params = {"state": "Processed", "limit": 7, **({"continuation": continuation} if continuation else {})}
        page = requests.get(f"{api}/orders", params=params, timeout=10).json()
        listed += [o["order_id"] for o in page["orders"]]
        if (continuation := page["continuation"]) is None:
            break
    assert listed == sorted(set(IDS) - {STUCK})
    # The operator page's counts read both accounts.
    totals = requests.get(f"{api}/ops/counts", params={"hours": 1}, timeout=10).json()["totals"]
    assert (totals["Processed"], totals["Error"]) == (len(IDS) - 1, 1)

    # Resubmitted over the API once inventory takes the release again: it ends Compensated.
    stack.remote.set_faults(service="inventory", script=None)
    assert requests.post(f"{api}/orders/{STUCK}/resubmit", timeout=10).status_code == 202
    assert stack.wait_closed([STUCK], timeout=30)[STUCK].process_state is ProcessState.COMPENSATED
    stack.assert_remote_clean()


def test_a_nudge_left_in_the_single_queue_of_before_is_still_handled(stack):
    """An upgrade from one scheduler queue to eight loses no nudge: ``schedule_order`` still
    reads the old queue. The order's deadline is minutes away, so only that nudge moves it."""
    s = services()
    order = OrderRequest.model_validate_json(order_json("legacy-1"))
    s.store.create_order(order, workflow=CURRENT, reply_to=None, now=utcnow(), pending_timeout=timedelta(minutes=5))
    legacy = clients.queue_client(s.settings, s.settings.scheduler_queue)
    legacy.create_queue()
    legacy.send_message(telemetry.stamp(Nudge(order_id="legacy-1")).model_dump_json(exclude_none=True))
    (host,) = stack.start_hosts()
    assert stack.wait_closed(["legacy-1"], timeout=30)["legacy-1"].process_state is ProcessState.PROCESSED
    assert len(host.invocations("schedule_order")) == 1
