"""``POST /api/orders/{id}/cancel`` over HTTP, on a local host running the real
function_app.py (the API functions only, so nothing else moves the orders a test seeds),
against Azurite: 202 with the order document (recorded, or a no-op), 409 after Processed
or Error, 404, 400 for a bad id or body, the operator role, and never a 500."""

from __future__ import annotations

import json

import pytest
import requests

from adapters.wiring import services
from core.access import OPERATOR_ROLE, READER_ROLE
from core.models import CANCEL_REASON_MAX_CHARS, ProcessState
from core.progress import status_document
from tests.integration.test_api import api  # noqa: F401 - the fixture: a host with the API functions given
from tests.integration.test_api import assert_json_refusal, assert_refused, error_order, principal, seed

API_FUNCTIONS = ("get_order", "cancel_order_api")




def test_cancel_records_the_request_and_answers_the_order_document(api):
    seed("c-1", ProcessState.PROCESSING, step="charge", step_index=1, attempt=2)
    base = api(functions=API_FUNCTIONS)
    response = requests.post(f"{base}/orders/c-1/cancel", json={"reason": "customer called"}, timeout=10)
    assert response.status_code == 202, response.text
    document = response.json()
    record = services().store.read("c-1")
    assert document == status_document(record.state, record.document, record.lines)  # = GET /api/orders/{id}
    assert document["state"] == "Processing" and document["step"] == "charge"  # the line in flight settles first
    assert document["cancel"]["reason"] == "customer called"
    assert document["cancel"]["by"] == "the status API"
    assert record.state.cancel_requested_at is not None
    assert requests.get(f"{base}/orders/c-1", timeout=10).json()["cancel"] == document["cancel"]

    # Twice: a no-op, 202 with the same document; the first reason stays.
    again = requests.post(f"{base}/orders/c-1/cancel", json={"reason": "other"}, timeout=10)
    assert again.status_code == 202 and again.json()["cancel"] == document["cancel"]
    # No body at all is fine too.
    seed("c-2", ProcessState.PENDING)
    assert requests.post(f"{base}/orders/c-2/cancel", timeout=10).status_code == 202
    assert services().store.get("c-2").cancel_reason is None


def test_cancel_is_refused_after_processed_or_error_and_a_no_op_when_compensated(api):
    seed("p-1", ProcessState.PROCESSED)
    error_order("e-1")
    seed("k-1", ProcessState.COMPENSATED)
    base = api(functions=API_FUNCTIONS)
    assert_refused(requests.post(f"{base}/orders/p-1/cancel", timeout=10), 409, "conflict", "Processed")
    assert_refused(requests.post(f"{base}/orders/e-1/cancel", timeout=10), 409, "conflict", "Error", "resubmit")
    for order_id in ("p-1", "e-1"):
        assert services().store.get(order_id).cancel_requested_at is None  # nothing changed
    response = requests.post(f"{base}/orders/k-1/cancel", timeout=10)
    assert response.status_code == 202 and response.json()["state"] == "Compensated"
    assert services().store.get("k-1").cancel_requested_at is None  # a no-op writes nothing
    assert_refused(requests.post(f"{base}/orders/no-such-order/cancel", timeout=10), 404, "not_found")
    assert_refused(requests.post(f"{base}/orders/bad%20id/cancel", timeout=10), 400, "bad_request", "order id")
    get = requests.get(f"{base}/orders/p-1/cancel", timeout=10)
    assert get.status_code == 405 and get.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"not json", ("not JSON",)),
        (b"[1]", ("JSON object",)),
        (b'{"reason": 5}', ("reason",)),
        (b'{"reason": ""}', ("reason",)),
        (b'{"reason": "a\\u0007b"}', ("control characters",)),
        (b'{"why": "x"}', ("unknown field", "why")),
        (json.dumps({"reason": "x" * (CANCEL_REASON_MAX_CHARS + 1)}).encode(), ("reason",)),
        (b'{"reason": "' + b"x" * 5000 + b'"}', ("larger than",)),
        (b"\xff\xfe", ("not JSON",)),
    ],
)
def test_a_bad_body_is_refused_with_its_reason_and_changes_nothing(api, body, words):
    seed("b-1", ProcessState.PENDING)
    base = api(functions=API_FUNCTIONS)
    response = requests.post(f"{base}/orders/b-1/cancel", data=body, headers={"Content-Type": "application/json"},
                             timeout=10)
    assert_refused(response, 400, "bad_request", *words)
    assert services().store.get("b-1").cancel_requested_at is None


def test_cancel_takes_the_operator_role_and_records_who_asked(api):
    seed("r-1", ProcessState.PENDING)
    base = api("easyauth", API_FUNCTIONS)
    assert_refused(requests.post(f"{base}/orders/r-1/cancel", timeout=10), 401, "unauthorized")
    assert_refused(requests.post(f"{base}/orders/r-1/cancel", headers=principal(READER_ROLE), timeout=10),
                   403, "forbidden", OPERATOR_ROLE)
    # A cross-site page may not cancel with the operator's session cookie.
    other_site = {**principal(OPERATOR_ROLE), "Origin": "https://evil.example"}
    assert_refused(requests.post(f"{base}/orders/r-1/cancel", headers=other_site, timeout=10), 403, "forbidden")
    assert services().store.get("r-1").cancel_requested_at is None
    response = requests.post(f"{base}/orders/r-1/cancel", headers=principal(OPERATOR_ROLE),
                             json={"reason": "duplicate order"}, timeout=10)
    assert response.status_code == 202, response.text
    assert response.json()["cancel"]["by"] == "someone@example.test"
    assert_json_refusal(response)
