"""The operator page's routes over HTTP, on a local host process running the real
function_app.py (the API and page functions only), against Azurite: the page and its
files, the caller's roles, the counts per state, an order's spans, and every refusal
(400, 401, 403, 404, 405) with its JSON reason. The page in a browser, on the whole
stack, is tests/e2e/test_operator_page.py.

Spans are read from JSON lines files in the format the hosts write
(adapters/telemetry.py, docs/observability.md), written here by the test.
"""

from __future__ import annotations

import json

import requests

from core import names
from core.access import OPERATOR_ROLE, READER_ROLE
from core.models import ProcessState
from tests.integration.test_api import API_FUNCTIONS, assert_refused, error_order, principal, seed

OPS_FUNCTIONS = (*API_FUNCTIONS, "ops_page", "ops_asset", "ops_me", "ops_counts", "get_order_trace")


def start(funchost, mode: str = "none", **env: str) -> str:
    (host,) = funchost.start(env={names.API_AUTH_SETTING: mode, **env}, functions=OPS_FUNCTIONS)
    return f"{host.http_url}/api"


def span(name: str, trace_id: str, span_id: str, start: str, instance: str = "host-a", **attributes) -> dict:
    """A span as a host writes it to its spans file."""
    return {
        "name": name, "kind": "INTERNAL", "trace_id": trace_id, "span_id": span_id, "parent_span_id": None,
        "start": start, "end": start, "duration_ms": 0.0, "status": "UNSET",
        "attributes": {**attributes, names.ATTR_INSTANCE: instance},
        "service": names.TELEMETRY_SERVICE, "instance": instance,
    }


def test_the_page_and_its_files(app_settings, funchost):
    base = start(funchost)
    page = requests.get(f"{base}/ops", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert 'src="/api/ops/static/ops.js"' in page.text and "{{base}}" not in page.text
    assert requests.get(f"{base}/ops/", timeout=10).text == page.text  # a trailing slash changes nothing
    for name, kind in (("ops.js", "text/javascript"), ("ops.css", "text/css"),
                       ("uPlot.iife.min.js", "text/javascript"), ("uPlot.LICENSE", "text/plain")):
        response = requests.get(f"{base}/ops/static/{name}", timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"].startswith(kind), name
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    # Files of the page's folder only, by name.
    for name in ("nope.js", "ops.html", "..%2F..%2Ffunction_app.py", "%2E%2E"):
        assert_refused(requests.get(f"{base}/ops/static/{name}", timeout=10), 404, "not_found")
    assert_refused(requests.post(f"{base}/ops", timeout=10), 405, "method_not_allowed", "GET")


def test_who_is_calling(app_settings, funchost):
    assert requests.get(f"{start(funchost)}/ops/me", timeout=10).json() == {
        "auth": "none", "name": None, "roles": [], "can_read": True, "can_operate": True,
    }


def test_who_is_calling_with_easyauth(app_settings, funchost):
    base = start(funchost, "easyauth")
    reader = requests.get(f"{base}/ops/me", headers=principal(READER_ROLE), timeout=10).json()
    assert reader == {"auth": "easyauth", "name": "someone@example.test", "roles": [READER_ROLE],
                      "can_read": True, "can_operate": False}
    operator = requests.get(f"{base}/ops/me", headers=principal(OPERATOR_ROLE), timeout=10).json()
    assert (operator["can_read"], operator["can_operate"]) == (True, True)
    assert_refused(requests.get(f"{base}/ops/me", timeout=10), 401, "unauthorized")
    assert_refused(requests.get(f"{base}/ops/me", headers=principal("Other"), timeout=10), 403, "forbidden")
    # The page, its files and its data take the reader role, as the API does.
    for path in ("ops", "ops/static/ops.js", "ops/counts", "orders/x-1/trace"):
        assert_refused(requests.get(f"{base}/{path}", timeout=10), 401, "unauthorized")
        assert requests.get(f"{base}/{path}", headers=principal(READER_ROLE), timeout=10).status_code in (200, 404)


def test_counts_per_state(app_settings, funchost):
    for n in range(3):
        seed(f"c-p{n}", ProcessState.PROCESSED)
    seed("c-c1", ProcessState.COMPENSATED)
    error_order("c-e1")
    seed("c-q1", ProcessState.PENDING)
    base = start(funchost)
    body = requests.get(f"{base}/ops/counts", timeout=10).json()
    assert (body["hours"], body["bucket_seconds"]) == (3, 60)
    assert len(body["times"]) == 180 and body["times"] == sorted(body["times"])
    assert body["totals"] == {"Pending": 1, "Processing": 0, "Processed": 3, "Compensated": 1, "Error": 1}
    assert all(len(values) == 180 for values in body["series"].values())
    assert sum(body["series"]["Processed"][-2:]) == 3  # seeded just now: the last minute or the one before
    assert body["in_flight"] == {"Pending": 1, "Processing": 0} and body["truncated"] is False
    day = requests.get(f"{base}/ops/counts", params={"hours": "24"}, timeout=10).json()
    assert (day["bucket_seconds"], len(day["times"]), day["totals"]["Processed"]) == (600, 144, 3)
    for query, words in [("hours=0", ("hours",)), ("hours=25", ("1 to 24",)), ("hours=two", ("hours",)),
                         ("hour=2", ("unknown query parameter 'hour'",))]:
        assert_refused(requests.get(f"{base}/ops/counts?{query}", timeout=10), 400, "bad_request", *words)


def test_an_orders_spans(app_settings, funchost, tmp_path):
    error_order("t-1")
    error_order("t-2")
    mine, other = "a" * 32, "b" * 32
    (tmp_path / "spans-1.jsonl").write_text("".join(json.dumps(s) + "\n" for s in [
        span("order.submit", mine, "1" * 16, "2026-01-01T00:00:00.000000Z", **{names.ATTR_ORDER_ID: "t-1"}),
        span("order.claim", mine, "2" * 16, "2026-01-01T00:00:01.000000Z",
             **{names.ATTR_ORDER_ID: "t-1", names.ATTR_STEP: "reserve", names.ATTR_ATTEMPT: 1}),
        span("order.submit", other, "3" * 16, "2026-01-01T00:00:00.500000Z", **{names.ATTR_ORDER_ID: "t-2"}),
    ]) + '{"name": "half a line still being writ')
    (tmp_path / "spans-2.jsonl").write_text(json.dumps(
        span("agent.run", mine, "4" * 16, "2026-01-01T00:00:00.500000Z", "host-b", **{names.ATTR_ORDER_ID: "t-1"})
    ) + "\n" + json.dumps(span("azure.sdk.call", mine, "5" * 16, "2026-01-01T00:00:02.000000Z", "host-b")) + "\n")
    base = start(funchost, **{names.TRACE_SPANS_FILES_SETTING: str(tmp_path / "spans-*.jsonl")})
    body = requests.get(f"{base}/orders/t-1/trace", timeout=10).json()
    assert (body["order_id"], body["source"], body["trace_ids"], body["truncated"]) == ("t-1", "files", [mine], False)
    # Its spans from every host, and the other spans of its trace, by start time; no other order's.
    assert [(s["name"], s["instance"]) for s in body["spans"]] == [
        ("order.submit", "host-a"), ("agent.run", "host-b"), ("order.claim", "host-a"), ("azure.sdk.call", "host-b"),
    ]
    assert [s["name"] for s in requests.get(f"{base}/orders/t-2/trace", timeout=10).json()["spans"]] == [
        "order.submit"
    ]
    assert_refused(requests.get(f"{base}/orders/no-such-order/trace", timeout=10), 404, "not_found", "no-such-order")
    for bad in ("-dash", "has%20space", "x" * 101):
        assert_refused(requests.get(f"{base}/orders/{bad}/trace", timeout=10), 400, "bad_request", "order id")
    assert_refused(requests.post(f"{base}/orders/t-1/trace", timeout=10), 405, "method_not_allowed")


def test_no_spans_source_says_why(app_settings, funchost, monkeypatch):
    monkeypatch.delenv(names.SPANS_FILE_SETTING, raising=False)
    monkeypatch.delenv(names.TRACE_SPANS_FILES_SETTING, raising=False)
    error_order("n-1")
    body = requests.get(f"{start(funchost)}/orders/n-1/trace", timeout=10).json()
    assert (body["source"], body["spans"], body["trace_ids"]) == ("none", [], [])
    assert "telemetry is off" in body["note"]


def test_a_cross_site_resubmit_is_refused(app_settings, funchost):
    error_order("x-1")
    base = start(funchost)
    host = base.split("/")[2]
    assert_refused(requests.post(f"{base}/orders/x-1/resubmit", headers={"Origin": "https://elsewhere.example"},
                                 timeout=10), 403, "forbidden", "cross-site")
    assert_refused(requests.post(f"{base}/orders/x-1/resubmit", headers={"Origin": "null"}, timeout=10),
                   403, "forbidden")
    # From the page itself (its own origin), or from a client that sends no Origin: it goes on.
    same = requests.post(f"{base}/orders/x-1/resubmit", headers={"Origin": f"http://{host}"}, timeout=10)
    assert same.status_code == 202, same.text
