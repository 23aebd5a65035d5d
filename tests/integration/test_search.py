"""Search by customer and bulk resubmit by cause against Azurite with the real SDK: the
indexes through the app's own code (submission, close, resubmit), and the routes over HTTP
on a local host running the real function_app.py (the search and errors functions only,
so nothing else moves the orders a test seeds)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import requests

from adapters import search
from adapters.closing import close_order
from adapters.wiring import services
from api.orders import continuation_token
from core import lifecycle, names
from core.access import OPERATOR_ROLE, READER_ROLE
from core.models import OrderRequest, ProcessState, utcnow
from core.search import customer_partition
from core.workflow import ORDER_WORKFLOW, Kind
from devtools.orders import order_json
from scheduler.submission import submit
from supervisor.bulk import resubmit_group
from tests.integration.test_api import assert_refused, principal

FUNCTIONS = ("list_orders", "list_errors", "get_error_group", "resubmit_error_group")
PENDING = timedelta(seconds=30)
#: A refusal as the fake remote words it, with the order's id in it (core/search.py takes it out).
REFUSED = 'step charge refused: HTTP 422: {"error": "permanent", "order_id": "%s"}'


def submitted(order_id: str, customer: str) -> None:
    """An order through the app's submission (its customer row, then its transaction)."""
    s = services()
    body = order_json(order_id, customer_id=customer)
    result = submit(body, message_id=order_id, reply_to=None, content_type="application/json", store=s.store,
                    rejections=s.rejections, publisher=s.publisher, workflow=ORDER_WORKFLOW,
                    pending_timeout=PENDING, now=utcnow(), own_queues=())
    assert result.order_id == order_id


def in_error(order_id: str, error: str = REFUSED) -> None:
    """An order that stopped in Error undoing reserve, closed as the scheduler closes it."""
    s = services()
    order = OrderRequest.model_validate_json(order_json(order_id))
    state = lifecycle.new_order(order_id, ORDER_WORKFLOW, utcnow(), PENDING, None).model_copy(
        update={"process_state": ProcessState.PROCESSING, "kind": Kind.COMPENSATION, "attempt": 3}
    )
    s.store.import_order(order, state)
    current = s.store.get(order_id)
    ended = s.store.write(current, lifecycle.fail(current, error % order_id, utcnow()))
    close_order(ended, store=s.store, publisher=s.publisher, alerts_queue=s.settings.alerts_queue, now=utcnow())


@pytest.fixture
def api(app_settings, funchost) -> str:
    (host,) = funchost.start(env={names.API_AUTH_SETTING: "easyauth"}, functions=FUNCTIONS)
    return f"{host.http_url}/api"


def test_a_customers_orders_over_http_newest_first_in_pages_within_a_window(app_settings, api):
    for i in range(12):
        submitted(f"s-{i:02d}", "cust-1")
    submitted("other-1", "cust-2")
    reader = principal(READER_ROLE)
    shown, token, pages = [], None, 0
    while True:
        params = {"customer": "cust-1", "limit": "5", **({"continuation": token} if token else {})}
        page = requests.get(f"{api}/orders", params=params, headers=reader, timeout=30)
        assert page.status_code == 200, page.text
        body = page.json()
        shown += [o["order_id"] for o in body["orders"]]
        pages += 1
        token = body["continuation"]
        if token is None:
            break
    assert pages == 3 and shown == [f"s-{i:02d}" for i in range(11, -1, -1)]
    created = {o["order_id"]: o["created_at"] for o in
               requests.get(f"{api}/orders", params={"customer": "cust-1", "limit": "20"}, headers=reader,
                            timeout=30).json()["orders"]}
    window = {"customer": "cust-1", "since": created["s-03"], "until": created["s-06"]}
    within = requests.get(f"{api}/orders", params=window, headers=reader, timeout=30).json()
    assert [o["order_id"] for o in within["orders"]] == ["s-06", "s-05", "s-04", "s-03"]

    unknown = requests.get(f"{api}/orders", params={"customer": "nobody"}, headers=reader, timeout=30)
    assert unknown.status_code == 200 and unknown.json()["orders"] == [] and unknown.json()["continuation"] is None
    for params, words in (
        ({"customer": "bad/id"}, ("not a customer id",)),
        ({"customer": "_customer-x"}, ("not a customer id",)),
        ({"customer": "cust-1", "since": "yesterday"}, ("since", "ISO 8601")),
        ({"customer": "cust-1", "until": "2026-11-25T10:00:00"}, ("until", "with a zone")),
        ({"customer": "cust-1", "since": "2026-11-25T10:00:00Z", "until": "2026-11-24T10:00:00Z"}, ("is after until",)),
        ({"customer": "cust-1", "continuation": continuation_token("not-a-key")}, ("continuation",)),
        ({"customer": "cust-1", "limit": "0"}, ("limit",)),
        ({"customer": "cust-1", "state": "Error"}, ("unknown query parameter",)),
    ):
        assert_refused(requests.get(f"{api}/orders", params=params, headers=reader, timeout=30), 400,
                       "bad_request", *words)


def test_a_window_before_1970_or_after_2286_is_clamped_over_http_and_by_ordersctl(app_settings, api):
    """The customer index's keys hold 13 digits of inverted milliseconds (1970 to 2286): a
    since/until outside them is answered as the window it means, never misread as a key."""
    import json

    from typer.testing import CliRunner

    from ordersctl.cli import app as ordersctl

    for i in range(3):
        submitted(f"e-{i}", "cust-e")
    everything = ["e-2", "e-1", "e-0"]
    reader = principal(READER_ROLE)

    def shown(**window: str) -> list[str]:
        page = requests.get(f"{api}/orders", params={"customer": "cust-e", **window}, headers=reader, timeout=30)
        assert page.status_code == 200, page.text
        return [o["order_id"] for o in page.json()["orders"]]

    assert shown(since="1970-01-01T00:00:00Z") == everything
    assert shown(since="1969-01-01T00:00:00Z", until="9999-12-31T23:59:59Z") == everything
    assert shown(until="2286-11-20T17:46:40.001Z") == everything
    assert shown(until="1969-01-01T00:00:00Z") == []
    assert shown(until="1970-01-01T00:00:00Z") == []
    assert shown(since="2286-11-20T17:46:40.001Z") == []
    # ordersctl list --customer reads through the same function.
    for args, expected in ((["--since", "1970-01-01T00:00:00Z"], everything),
                           (["--until", "1969-01-01T00:00:00Z"], [])):
        result = CliRunner().invoke(ordersctl, ["list", "--customer", "cust-e", *args])
        assert result.exit_code == 0, result.output
        assert [o["order_id"] for o in json.loads(result.output)["orders"]] == expected, args


def test_the_error_groups_over_http_and_a_group_resubmit_for_operators_only(app_settings, api):
    for i in range(6):
        in_error(f"e-{i}")
    in_error("x-1", "step ship gave up after %s failed attempts")
    reader, operator = principal(READER_ROLE), principal(OPERATOR_ROLE)
    listed = requests.get(f"{api}/errors", headers=reader, timeout=30)
    assert listed.status_code == 200, listed.text
    groups = {g["count"]: g for g in listed.json()["groups"]}
    assert sorted(groups) == [1, 6] and listed.json()["continuation"] is None
    big = groups[6]
    assert (big["step"], big["kind"], big["failed_compensations"]) == ("reserve", "compensation", [])
    assert big["error"] == 'step charge refused: HTTP 422: {"error": "permanent", "order_id": "…"}'
    assert big["sample_order"].startswith("e-") and big["sample_error"] == REFUSED % big["sample_order"]
    one = requests.get(f"{api}/errors/{big['group']}", params={"limit": "4"}, headers=reader, timeout=30).json()
    assert one["count"] == 6 and [o["order_id"] for o in one["orders"]] == ["e-0", "e-1", "e-2", "e-3"]
    assert one["continuation"] is not None

    url = f"{api}/errors/{big['group']}/resubmit"
    assert_refused(requests.post(url, headers=reader, timeout=30), 403, "forbidden")
    assert_refused(requests.get(url, headers=operator, timeout=30), 405, "method_not_allowed")
    assert_refused(requests.post(f"{api}/errors/NOT-A-GROUP/resubmit", headers=operator, timeout=30), 400,
                   "bad_request", "not an error group")
    assert_refused(requests.get(f"{api}/errors/{'0' * 12}", headers=reader, timeout=30), 404, "not_found")
    done = requests.post(url, headers=operator, timeout=60)
    assert done.status_code == 200, done.text
    assert done.json() | {"orders": sorted(done.json()["orders"])} == {
        "group": big["group"], "resubmitted": 6, "skipped": 0, "orders": [f"e-{i}" for i in range(6)],
        "done": True, "continuation": None,
    }
    assert {services().store.get(f"e-{i}").process_state for i in range(6)} == {ProcessState.PENDING}
    after = requests.get(f"{api}/errors", headers=reader, timeout=30).json()["groups"]
    assert [g["count"] for g in after] == [1]
    again = requests.post(url, headers=operator, timeout=60).json()
    assert (again["resubmitted"], again["done"]) == (0, True)


def test_a_group_resubmitted_by_two_callers_at_once_resubmits_each_order_once(app_settings):
    ids = [f"c-{i:02d}" for i in range(24)]
    for order_id in ids:
        in_error(order_id)
    s = services()
    (group,), _ = search.groups(s.store, limit=10)
    assert group.count == 24
    results, barrier = [], threading.Barrier(2)

    def operator() -> None:
        barrier.wait()
        results.append(resubmit_group(group.group, store=s.store, nudger=s.nudger, pending_timeout=PENDING,
                                      per_second=200, batch=100, now=utcnow))

    threads = [threading.Thread(target=operator) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    first, second = (set(r.resubmitted) for r in results)
    assert not first & second and first | second == set(ids)
    assert {o: s.store.get(o).attempt for o in ids} == {o: 3 for o in ids}  # one resubmit each, no claim yet
    assert search.groups(s.store, limit=10) == ([], None)


def test_the_customer_row_is_written_before_the_order_and_forget_removes_it(app_settings):
    submitted("f-1", "cust-9")
    s = services()
    rows = list(s.store.table.query_entities("PartitionKey eq @pk", parameters={"pk": customer_partition("cust-9")}))
    assert [row["OrderId"] for row in rows] == ["f-1"]
    order, state = s.store.get_order("f-1"), s.store.get("f-1")
    search.forget(s.store, order, state)
    assert list(s.store.table.query_entities("PartitionKey eq @pk", parameters={"pk": customer_partition("cust-9")})) == []


def test_ordersctl_resubmits_a_group_batch_after_batch_until_it_is_done(app_settings, monkeypatch):
    import json

    from typer.testing import CliRunner

    from ordersctl.cli import app as ordersctl

    for i in range(5):
        in_error(f"b-{i}")
    monkeypatch.setenv(names.BULK_RESUBMIT_BATCH_SETTING, "2")  # three calls: 2, 2 and 1
    (group,), _ = search.groups(services().store, limit=10)
    result = CliRunner().invoke(ordersctl, ["resubmit", "--group", group.group])
    assert result.exit_code == 0, result.output
    calls = [json.loads(line) for line in result.output.splitlines()]
    assert [(c["resubmitted"], c["done"]) for c in calls] == [(2, False), (2, False), (1, True)]
    assert sorted(o for c in calls for o in c["orders"]) == [f"b-{i}" for i in range(5)]
    assert {services().store.get(f"b-{i}").process_state for i in range(5)} == {ProcessState.PENDING}
    for args in ([], ["b-1", "--group", group.group]):
        refused = CliRunner().invoke(ordersctl, ["resubmit", *args])
        assert refused.exit_code == 2 and "give an ORDER_ID or --group GROUP" in refused.output
    bad = CliRunner().invoke(ordersctl, ["resubmit", "--group", "nope"])
    assert bad.exit_code == 1 and "not an error group" in bad.output
