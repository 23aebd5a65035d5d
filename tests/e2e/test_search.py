"""Search by customer and bulk resubmit by cause on the whole local stack: 50 orders sent as
a client sends them, run by the real function_app.py on a local host until the remote
stops them in Error; found by their customer over HTTP, page by page, newest first; grouped
by cause; resubmitted as one group while the remote still refuses some of them."""

from __future__ import annotations

import json

import requests
from typer.testing import CliRunner

from core.models import ProcessState
from devtools.orders import order_json
from ordersctl.cli import app as ordersctl
from tests.e2e.conftest import net_zero

ORDERS = [f"g-{i:02d}" for i in range(50)]
#: The orders whose release the remote still refuses after the resubmit.
STILL_FAILING = ORDERS[:20]


def cli(*args: str) -> dict:
    """An ordersctl command in this process (its settings from the environment, as the stack's)."""
    result = CliRunner().invoke(ordersctl, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_customers_orders_by_page_and_a_group_of_50_resubmitted_while_the_remote_still_refuses_some(stack):
    # Shipping refuses every order, so the charge is refunded; inventory refuses the release:
    # every order stops in Error for one cause, its reservation applied. Every call refused
    # ("always"), and a step timeout the busy test machine cannot reach: a refusal answered
    # late is never taken for a lost answer and retried into another outcome.
    stack.remote.set_faults(service="shipping", script={f"{o}/ship": ["always:permanent"] for o in ORDERS})
    stack.remote.set_faults(service="inventory", script={f"{o}/release": ["always:permanent"] for o in ORDERS})
    (host,) = stack.start_hosts(API_AUTH="none", STEP_TIMEOUT_SECONDS="20")
    api = f"{host.http_url}/api"
    stack.send([(o, order_json(o, customer_id="cust-e2e")) for o in ORDERS])
    assert {s.process_state for s in stack.wait_closed(ORDERS, timeout=150).values()} == {ProcessState.ERROR}

    # The customer's orders, 20 a page, newest first (creation order is arrival order).
    pages, token = [], None
    while True:
        params = {"customer": "cust-e2e", "limit": "20", **({"continuation": token} if token else {})}
        body = requests.get(f"{api}/orders", params=params, timeout=30).json()
        pages.append(body["orders"])
        token = body["continuation"]
        if token is None:
            break
    shown = [o for page in pages for o in page]
    assert [len(page) for page in pages] == [20, 20, 10] and sorted(o["order_id"] for o in shown) == ORDERS
    # Newest first to the millisecond the index keys carry (orders of one millisecond by id).
    created = [o["created_at"][:23] for o in shown]
    assert created == sorted(created, reverse=True)
    assert cli("list", "--customer", "cust-e2e", "--limit", "50")["orders"] == shown

    # One cause, 50 orders.
    (group,) = requests.get(f"{api}/errors", timeout=30).json()["groups"]
    assert (group["count"], group["step"], group["kind"], group["failed_compensations"]) == (
        50, "reserve", "compensation", ["reserve"])
    assert "step ship refused: HTTP 422" in group["error"]
    assert cli("errors")["groups"] == [group]

    # The operator resubmits the group while inventory still refuses 20 of the releases.
    stack.remote.set_faults(service="inventory", script={f"{o}/release": ["always:permanent"] for o in STILL_FAILING})
    done = requests.post(f"{api}/errors/{group['group']}/resubmit", timeout=120)
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["resubmitted"], body["skipped"], body["done"]) == (50, 0, True)
    assert sorted(body["orders"]) == ORDERS  # each once
    states = stack.wait_closed(ORDERS, timeout=150)
    assert {o for o, s in states.items() if s.process_state is ProcessState.ERROR} == set(STILL_FAILING)
    assert {o for o, s in states.items() if s.process_state is ProcessState.COMPENSATED} == set(ORDERS[20:])
    # Each order's release ran once before the resubmit and once after: one resubmit each.
    releases = {o: sum(1 for c in stack.claims(o) if c.action == "release") for o in ORDERS}
    assert set(releases.values()) == {2}, releases
    # Those refused again are back in their group, alone in it.
    (again,) = requests.get(f"{api}/errors", timeout=30).json()["groups"]
    assert (again["group"], again["count"]) == (group["group"], 20)
    # Nothing applied twice at a remote; the compensated orders hold nothing there.
    stack.assert_remote_clean()
    assert all(net_zero(stack.remote.net(o)) for o in ORDERS[20:])
    assert all(stack.remote.net(o)["inventory"]["reserve"] == 1 for o in STILL_FAILING)
