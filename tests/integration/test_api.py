"""The status API over HTTP, on a local host process running the real function_app.py
(its three API functions only, so nothing else moves the orders a test seeds), against
Azurite: every refusal (400, 401, 403, 404, 405, 409) with its JSON reason and never a
stack trace, the order document, paging by state, and a resubmit.

The orders are written straight into the test's table (``StateStore.import_order``) in
the states a test needs; the end-to-end happy path is in tests/e2e/test_api.py.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
import requests
from azure.storage.queue import QueueClient

from adapters.wiring import services
from core import lifecycle, names
from core.access import OPERATOR_ROLE, READER_ROLE
from core.models import LineRecord, LineState, OrderRequest, OrderState, ProcessState, utcnow
from core.progress import status_document
from core.workflow import ORDER_WORKFLOW, Kind
from devtools.corpus import odd_http
from devtools.corpus.odd_http import load_odd_http
from devtools.orders import order_json

API_FUNCTIONS = ("get_order", "list_orders", "resubmit_order")
PENDING = timedelta(seconds=30)


def principal(*roles: str) -> dict[str, str]:
    """The header App Service Authentication passes for an Entra ID caller with these app roles."""
    claims = [{"typ": "name", "val": "someone@example.test"}, *({"typ": "roles", "val": role} for role in roles)]
    value = {"auth_typ": "aad", "claims": claims, "name_typ": "name", "role_typ": "roles"}
    return {"X-MS-CLIENT-PRINCIPAL": base64.b64encode(json.dumps(value).encode()).decode()}


def seed(order_id: str, process_state: ProcessState, *, lines: tuple[LineRecord, ...] = (), **changes) -> OrderState:
    """An order written as the app would have left it in ``process_state``."""
    now = utcnow()
    order = OrderRequest.model_validate_json(order_json(order_id))
    state = lifecycle.new_order(order_id, ORDER_WORKFLOW, now, PENDING, None).model_copy(
        update={"process_state": process_state, **changes}
    )
    services().store.import_order(order, state, lines)
    return state


def line(order_id: str, index: int, step: str, state: LineState, kind: Kind = Kind.ACTION, **fields) -> LineRecord:
    action = ORDER_WORKFLOW.steps[index].action_of(kind)
    return LineRecord(order_id=order_id, step_index=index, step=step, kind=kind, action=action, state=state,
                      attempt=index + 1, updated_at=utcnow(), **fields)


def error_order(order_id: str) -> OrderState:
    """Stopped at ship (it gave up: it cannot be undone), reserve and charge done."""
    return seed(
        order_id, ProcessState.ERROR, step_index=2, step="ship", attempt=5, failure_count=3,
        last_error="step ship gave up after 3 failed attempts",
        lines=(line(order_id, 0, "reserve", LineState.DONE, result={"reservation": "r-9"}),
               line(order_id, 1, "charge", LineState.DONE, result={"charge": "c-9"}),
               line(order_id, 2, "ship", LineState.EXHAUSTED, failure_count=3, last_error="timed out")),
    )


@pytest.fixture
def api(app_settings, funchost):
    """Start a host with the API functions only, with API_AUTH as asked; its base URL."""

    def start(mode: str = "none", functions: tuple[str, ...] = API_FUNCTIONS) -> str:
        (host,) = funchost.start(env={names.API_AUTH_SETTING: mode}, functions=functions)
        return f"{host.http_url}/api"

    return start


def assert_refused(response: requests.Response, status: int, error: str, *words: str) -> dict:
    """A refusal: the status, JSON ``{"error", "reason"}``, the reason naming ``words``, no traceback."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "reason"} and body["error"] == error, body
    for word in words:
        assert word in body["reason"], (word, body["reason"])
    assert "Traceback" not in response.text and 'File "' not in response.text
    return body


def test_get_an_order_with_its_steps(api):
    state = error_order("g-1")
    base = api()
    response = requests.get(f"{base}/orders/g-1", timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    document = response.json()
    record = services().store.read("g-1")
    assert document == status_document(record.state, record.document, record.lines)  # = ordersctl status --json
    assert (document["order_id"], document["state"], document["step"]) == ("g-1", "Error", "ship")
    assert document["order"]["order_id"] == "g-1"
    assert [(s["step"], s["kind"], s["state"]) for s in document["steps"]] == [
        ("reserve", "action", "Done"), ("charge", "action", "Done"), ("ship", "action", "Exhausted"),
    ]
    assert document["last_error"] == state.last_error


def test_unknown_ids_bad_ids_and_wrong_methods(api):
    base = api()
    assert_refused(requests.get(f"{base}/orders/no-such-order", timeout=10), 404, "not_found", "no-such-order")
    for bad in ("-starts-with-a-dash", "has%20space", "x" * 101, "%C3%A9t%C3%A9", "a%0A"):
        assert_refused(requests.get(f"{base}/orders/{bad}", timeout=10), 400, "bad_request", "is not an order id")
        assert_refused(requests.post(f"{base}/orders/{bad}/resubmit", timeout=10), 400, "bad_request", "order id")
    assert_refused(requests.post(f"{base}/orders/no-such-order/resubmit", timeout=10), 404, "not_found")
    wrong = requests.delete(f"{base}/orders/o-1", timeout=10)
    assert_refused(wrong, 405, "method_not_allowed", "DELETE", "GET")
    assert wrong.headers["Allow"] == "GET"
    assert requests.get(f"{base}/orders/o-1/resubmit", timeout=10).headers["Allow"] == "POST"
    assert_refused(requests.post(f"{base}/orders", timeout=10), 405, "method_not_allowed")


def test_bad_list_queries(api):
    base = api()
    for query, words in [
        ("", ("give the state",)),
        ("state=Lost", ("'Lost' is not one of", "Pending", "Error")),
        ("state=Error&limit=0", ("limit",)),
        ("state=Error&limit=1001", ("limit", "1000")),
        ("state=Error&limit=ten", ("limit",)),
        ("state=Error&continuation=%21%21", ("continuation",)),
        ("state=Error&continuation=" + base64.urlsafe_b64encode(b"-bad id").decode(), ("continuation",)),
        ("sate=Error", ("unknown query parameter 'sate'",)),
    ]:
        assert_refused(requests.get(f"{base}/orders?{query}", timeout=10), 400, "bad_request", *words)


def test_list_by_state_in_pages(api):
    for n in range(1, 6):
        seed(f"p-{n}", ProcessState.PROCESSED)
    error_order("e-1")
    seed("q-1", ProcessState.PENDING)
    seed("q-2", ProcessState.PENDING)
    seed("r-1", ProcessState.PROCESSING, attempt=1, locked_by="host-a")
    base = api()

    def pages(state: str, limit: int) -> list[list[str]]:
        found, token = [], None
        while True:
            params = {"state": state, "limit": limit, **({"continuation": token} if token else {})}
            body = requests.get(f"{base}/orders", params=params, timeout=10).json()
            assert body["state"] == state
            found.append([order["order_id"] for order in body["orders"]])
            token = body["continuation"]
            if token is None:
                return found
            assert len(found) < 10, found

    assert pages("Processed", 2) == [["p-1", "p-2"], ["p-3", "p-4"], ["p-5"]]
    assert pages("Processed", 5) == [["p-1", "p-2", "p-3", "p-4", "p-5"]]
    assert pages("Error", 50) == [["e-1"]]
    assert pages("Compensated", 50) == [[]]
    # In-flight states are read through the active index.
    assert pages("Pending", 1) == [["q-1"], ["q-2"]]
    assert pages("Processing", 10) == [["r-1"]]
    body = requests.get(f"{base}/orders", params={"state": "error"}, timeout=10).json()  # any case
    (row,) = body["orders"]
    assert row["order_id"] == "e-1" and row["state"] == "Error" and row["step"] == "ship"
    assert set(row) == {"order_id", "state", "step", "kind", "attempt", "failure_count", "last_error",
                        "complete_by", "created_at", "updated_at"}


def test_resubmit_an_error_order_and_refuse_any_other(api, app_settings, storage_connection_string):
    error_order("e-2")
    seed("done-1", ProcessState.PROCESSED)
    seed("wait-1", ProcessState.PENDING)
    base = api()
    for order_id, state in (("done-1", "Processed"), ("wait-1", "Pending")):
        response = requests.post(f"{base}/orders/{order_id}/resubmit", timeout=10)
        assert_refused(response, 409, "conflict", state, "not Error")

    response = requests.post(f"{base}/orders/e-2/resubmit", timeout=10)
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["order_id"], body["state"], body["step"], body["failure_count"]) == ("e-2", "Pending", "ship", 0)
    state = services().store.get("e-2")
    assert state.process_state is ProcessState.PENDING and state.failure_count == 0
    assert "e-2" in {order_id for order_id, _, _ in services().store.active_ids()}  # back under supervision
    its_queue = app_settings[names.scheduler_queue_setting(names.scheduler_queue_shard("e-2"))]  # the order's own
    queue = QueueClient.from_connection_string(storage_connection_string, its_queue)
    nudges = [json.loads(base64.b64decode(m.content)) for m in queue.receive_messages(max_messages=32)]
    assert [n["order_id"] for n in nudges] == ["e-2"]  # the scheduler is asked to go on
    # A second resubmit finds it Pending.
    assert_refused(requests.post(f"{base}/orders/e-2/resubmit", timeout=10), 409, "conflict", "Pending")


def test_with_easyauth_each_call_needs_its_role(api):
    error_order("e-3")
    base = api("easyauth")
    # No principal (Easy Auth would have stopped such a caller; a forged header is no better).
    assert_refused(requests.get(f"{base}/orders/e-3", timeout=10), 401, "unauthorized")
    assert_refused(requests.get(f"{base}/orders/e-3", headers={"X-MS-CLIENT-PRINCIPAL": "e30K!"}, timeout=10),
                   401, "unauthorized")
    # A caller without the app role.
    assert_refused(requests.get(f"{base}/orders/e-3", headers=principal("Something.Else"), timeout=10),
                   403, "forbidden", READER_ROLE)
    assert_refused(requests.get(f"{base}/orders", params={"state": "Error"}, headers=principal(), timeout=10),
                   403, "forbidden")
    # A reader reads, but may not resubmit.
    reader = principal(READER_ROLE)
    assert requests.get(f"{base}/orders/e-3", headers=reader, timeout=10).status_code == 200
    assert requests.get(f"{base}/orders", params={"state": "Error"}, headers=reader, timeout=10).status_code == 200
    assert_refused(requests.post(f"{base}/orders/e-3/resubmit", headers=reader, timeout=10),
                   403, "forbidden", OPERATOR_ROLE)
    assert services().store.get("e-3").process_state is ProcessState.ERROR
    # An operator reads and resubmits.
    operator = principal(OPERATOR_ROLE)
    assert requests.get(f"{base}/orders/e-3", headers=operator, timeout=10).status_code == 200
    assert requests.post(f"{base}/orders/e-3/resubmit", headers=operator, timeout=10).status_code == 202
    # The caller is checked first: an unknown order tells an anonymous caller nothing.
    assert requests.get(f"{base}/orders/no-such-order", timeout=10).status_code == 401


def test_disabled_refuses_every_call(api):
    error_order("e-4")
    base = api("disabled")
    for response in (
        requests.get(f"{base}/orders/e-4", headers=principal(OPERATOR_ROLE), timeout=10),
        requests.get(f"{base}/orders", params={"state": "Error"}, timeout=10),
        requests.post(f"{base}/orders/e-4/resubmit", headers=principal(OPERATOR_ROLE), timeout=10),
    ):
        assert_refused(response, 403, "forbidden", "API_AUTH")
    assert services().store.get("e-4").process_state is ProcessState.ERROR


def test_api_auth_is_disabled_unless_set(app_settings, funchost, monkeypatch):
    monkeypatch.delenv(names.API_AUTH_SETTING, raising=False)
    (host,) = funchost.start(functions=API_FUNCTIONS, settings=funchost.log_dir / "no-local-settings.json")
    assert_refused(requests.get(f"{host.http_url}/api/orders/x-1", timeout=10), 403, "forbidden", "API_AUTH")


def assert_json_refusal(response: requests.Response) -> None:
    """Whatever the input: never a 500, and any refusal is JSON with its reason."""
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.headers["Content-Type"] == "application/json", response.headers
        body = response.json()
        assert set(body) == {"error", "reason"} and body["reason"], body


def test_odd_headers_paths_and_bodies_get_a_json_refusal_never_a_500(api):
    """devtools/corpus/odd_http.json through the real host: an Origin that does not parse
    (it answered 500 with an empty body), principals that are not one, odd paths,
    queries, headers and bodies."""
    corpus = load_odd_http()
    error_order("f-1")
    base = api("easyauth")
    operator = principal(OPERATOR_ROLE)
    for origin in map(odd_http.text, corpus["origins"]):
        response = requests.post(f"{base}/orders/f-1/resubmit", headers={**operator, "Origin": origin}, timeout=10)
        assert_refused(response, 403, "forbidden", "Origin")
    assert services().store.get("f-1").process_state is ProcessState.ERROR  # none of them resubmitted it
    for spec in corpus["principals"]:
        response = requests.get(f"{base}/orders/f-1", headers={"X-MS-CLIENT-PRINCIPAL": odd_http.principal_header(spec)},
                                timeout=10)
        assert_refused(response, spec["expect"], "unauthorized" if spec["expect"] == 401 else "forbidden")
    for case in corpus["requests"]:
        response = requests.request(
            case["method"], f"{base}/{odd_http.text(case['path'])}", headers={**operator, **case.get("headers", {})},
            data=odd_http.body(case.get("body")), timeout=10,
        )
        assert_json_refusal(response)
