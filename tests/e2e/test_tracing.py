"""One trace per order, end to end on the local stack: the spans the hosts write to their
spans files (OTEL_SPANS_FILE), the traceparent headers the remote services received, and
the metric points (OTEL_METRICS_FILE). docs/observability.md describes the tree."""

from __future__ import annotations

import secrets
from collections import Counter

from adapters.wiring import services
from core import names
from core.models import ProcessState, utcnow
from devtools.orders import order_json
from supervisor.supervision import resubmit
from tests.e2e.conftest import ACTIONS, wait_until

#: The spans of a three-step order that runs without a hitch.
HAPPY = {
    names.SPAN_SUBMIT: 1,
    names.SPAN_SCHEDULE: 1,  # the submission's nudge
    names.SPAN_CLAIM: 3,
    names.SPAN_AGENT: 3,
    "POST /reserve": 1,
    "POST /charge": 1,
    "POST /ship": 1,
    names.SPAN_RECORD: 3,
    names.SPAN_CLOSE: 1,
}


def spans_when(stack, order_id: str, expected: dict[str, int], timeout: float = 15) -> list[dict]:
    """The order's spans once at least ``expected`` (name -> count) have been written."""

    def enough():
        spans = stack.spans(order_id)
        counts = Counter(span["name"] for span in spans)
        return spans if all(counts[name] >= n for name, n in expected.items()) else None

    return wait_until(enough, timeout=timeout, what=f"the spans of order {order_id}: {expected}")


def ancestors(span: dict, by_id: dict[str, dict]) -> list[str]:
    """The names of a span's ancestors, nearest first."""
    names_up = []
    while span["parent_span_id"] in by_id:
        span = by_id[span["parent_span_id"]]
        names_up.append(span["name"])
    return names_up


def test_one_order_is_one_trace_from_the_clients_message_to_its_final_state(stack):
    (host,) = stack.start_hosts()
    client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
    # The client's own trace context, as any W3C-aware Service Bus client sends it.
    stack.send([("tr-1", order_json("tr-1"))], properties={"traceparent": f"00-{client_trace}-{client_span}-01"})
    assert stack.wait_closed(["tr-1"], timeout=30)["tr-1"].process_state is ProcessState.PROCESSED

    spans = spans_when(stack, "tr-1", HAPPY)
    assert Counter(span["name"] for span in spans) == HAPPY
    # One trace: the client's. Its span is the submission's parent; every other span's
    # parent is a span of the order's, so the order is one tree under the client's span.
    assert {span["trace_id"] for span in spans} == {client_trace}
    assert stack.trace(client_trace) == spans  # nothing else landed in it
    by_id = {span["span_id"]: span for span in spans}
    (submit,) = [span for span in spans if span["name"] == names.SPAN_SUBMIT]
    assert submit["parent_span_id"] == client_span and submit["kind"] == "CONSUMER"
    assert all(span["parent_span_id"] in by_id for span in spans if span is not submit)
    assert submit["attributes"][names.ATTR_OUTCOME] == "created"
    assert stack.state("tr-1").trace_parent == f"00-{client_trace}-{submit['span_id']}-01"

    # Each claim, agent call and response, in order, with its step, kind and attempt.
    claims = sorted((s for s in spans if s["name"] == names.SPAN_CLAIM), key=lambda s: s["start"])
    assert [(s["attributes"][names.ATTR_STEP], s["attributes"][names.ATTR_ATTEMPT]) for s in claims] == [
        ("reserve", 1), ("charge", 2), ("ship", 3),
    ]
    assert {s["attributes"][names.ATTR_KIND] for s in claims} == {"action"}
    for span in spans:
        assert span["attributes"][names.ATTR_INSTANCE] == host.instance_id, span["name"]
        assert span["instance"] == host.instance_id and span["service"] == names.TELEMETRY_SERVICE
        assert span["status"] != "ERROR", span
    for span in (s for s in spans if s["name"] == names.SPAN_AGENT):
        assert span["attributes"][names.ATTR_OUTCOME] == "succeeded"
        assert ancestors(span, by_id)[0] == names.SPAN_CLAIM
    for span in (s for s in spans if s["name"].startswith("POST ")):
        assert span["kind"] == "CLIENT" and span["attributes"]["http.response.status_code"] == 200
        assert ancestors(span, by_id)[0] == names.SPAN_AGENT
    records = [s for s in spans if s["name"] == names.SPAN_RECORD]
    assert all(ancestors(s, by_id)[0] == names.SPAN_AGENT for s in records)
    (close,) = [span for span in spans if span["name"] == names.SPAN_CLOSE]
    assert close["attributes"][names.ATTR_STATE] == "Processed"
    assert ancestors(close, by_id)[:2] == [names.SPAN_RECORD, names.SPAN_AGENT]
    assert ancestors(close, by_id)[-1] == names.SPAN_SUBMIT

    # The remote services received that trace in traceparent: each call the context of its own HTTP span.
    received = stack.remote.traceparents("tr-1")
    assert sorted((call["service"], call["action"]) for call in received) == sorted(ACTIONS.items())
    http = {span["span_id"]: span["name"] for span in spans if span["name"].startswith("POST ")}
    for call in received:
        version, trace_id, span_id, flags = call["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", client_trace, "01")
        assert http[span_id] == f"POST /{call['action']}"

    # The metrics: one order closed Processed, three claims, no retry, no miss, no undo.
    def metrics_written():
        return stack.metric(names.METRIC_ORDERS_CLOSED, {names.ATTR_STATE: "Processed"}) == 1
    wait_until(metrics_written, timeout=10, what="the order's metric points")
    assert stack.metric(names.METRIC_ORDERS_SUBMITTED, {names.ATTR_OUTCOME: "created"}) == 1
    assert stack.metric(names.METRIC_STEPS_CLAIMED) == 3
    assert stack.metric(names.METRIC_STEP_RETRIES) == stack.metric(names.METRIC_DEADLINE_MISSES) == 0
    assert stack.metric(names.METRIC_COMPENSATIONS) == 0
    durations = [p for p in stack.metric_points() if p["name"] == names.METRIC_STEP_DURATION]
    assert {p["attributes"][names.ATTR_STEP] for p in durations} == {"reserve", "charge", "ship"}
    assert all(p["value"]["count"] == 1 and p["value"]["sum"] > 0 for p in durations)
    assert stack.metric(names.METRIC_MESSAGES_SENT, {names.ATTR_OPERATION: "agent_request"}) == 3
    assert stack.metric(names.METRIC_TABLE_OPERATIONS) > 0


def test_an_order_without_a_client_trace_starts_its_own_and_a_diagnostic_id_is_honoured(stack):
    stack.start_hosts()
    legacy_trace, legacy_span = secrets.token_hex(16), secrets.token_hex(8)
    stack.send([("tr-2", order_json("tr-2"))])
    # Older Azure SDKs send Diagnostic-Id (W3C format) only.
    stack.send([("tr-3", order_json("tr-3"))], properties={"Diagnostic-Id": f"00-{legacy_trace}-{legacy_span}-01"})
    stack.wait_closed(["tr-2", "tr-3"], timeout=30)

    own = spans_when(stack, "tr-2", HAPPY)
    (submit,) = [span for span in own if span["name"] == names.SPAN_SUBMIT]
    assert submit["parent_span_id"] is None and len({span["trace_id"] for span in own}) == 1
    legacy = spans_when(stack, "tr-3", HAPPY)
    (submit,) = [span for span in legacy if span["name"] == names.SPAN_SUBMIT]
    assert submit["parent_span_id"] == legacy_span and {span["trace_id"] for span in legacy} == {legacy_trace}


def test_a_supervisor_reset_and_an_operator_resubmit_continue_the_orders_trace(stack):
    # The charge answers after its deadline once: the supervisor resets it and it runs again.
    # Every ship call hangs past its deadline: ship (no undo) gives up, the order stops in
    # Error; once shipping answers again, the operator resubmits it.
    stack.remote.set_faults(script={"tr-4/charge": ["slow"], "tr-4/ship": ["always:slow"]}, slow_seconds=3)
    stack.start_hosts(AGENT_MAX_CALLS="1", MAX_FAILURES="2")
    stack.send([("tr-4", order_json("tr-4"))])
    assert stack.wait_closed(["tr-4"], timeout=60)["tr-4"].process_state is ProcessState.ERROR

    stack.remote.set_faults(service="shipping")  # shipping answers again
    s = services()  # as ordersctl resubmit does it, in a process that exports no spans
    resubmit("tr-4", store=s.store, nudger=s.nudger, now=utcnow(), pending_timeout=s.settings.pending_timeout)
    assert stack.wait_closed(["tr-4"], timeout=30)["tr-4"].process_state is ProcessState.PROCESSED

    expected = {
        names.SPAN_SUBMIT: 1, f"{names.SPAN_SUPERVISOR_PREFIX}retry": 2, f"{names.SPAN_SUPERVISOR_PREFIX}give_up": 1,
        names.SPAN_CLAIM: 6, names.SPAN_CLOSE: 2,
    }
    spans = spans_when(stack, "tr-4", expected, timeout=20)
    (trace_id,) = {span["trace_id"] for span in spans}
    by_id = {span["span_id"]: span for span in spans}
    (submit,) = [span for span in spans if span["name"] == names.SPAN_SUBMIT]
    assert stack.state("tr-4").trace_parent.split("-")[1:3] == [trace_id, submit["span_id"]]
    # Every supervisor action hangs off the order's submission (its TraceParent)...
    supervisor = [span for span in spans if span["name"].startswith(names.SPAN_SUPERVISOR_PREFIX)]
    assert {span["parent_span_id"] for span in supervisor} == {submit["span_id"]}
    retry = next(s for s in supervisor if s["name"].endswith("retry") and s["attributes"][names.ATTR_STEP] == "charge")
    assert retry["attributes"][names.ATTR_OUTCOME] == "retry"
    # ...and the claim it leads to hangs off it: charge claimed again, in the same trace.
    claims = sorted((s for s in spans if s["name"] == names.SPAN_CLAIM), key=lambda s: s["start"])
    assert [(s["attributes"][names.ATTR_STEP], s["attributes"][names.ATTR_ATTEMPT]) for s in claims] == [
        ("reserve", 1), ("charge", 2), ("charge", 3), ("ship", 4), ("ship", 5), ("ship", 6),
    ]
    # Under the retry's span; or, when the retry's delayed nudge was slower to be taken than the
    # pending timeout (a loaded machine: the clean-clone run caught it once), under the renudge
    # the supervisor then sent in its place (lifecycle's RENUDGE), whichever nudge claimed it.
    # Either way a supervisor span under the submission, in the order's one trace.
    scheduled, reset = ancestors(claims[2], by_id)[:2]
    assert scheduled == names.SPAN_SCHEDULE
    assert reset in {f"{names.SPAN_SUPERVISOR_PREFIX}retry", f"{names.SPAN_SUPERVISOR_PREFIX}renudge"}
    # The resubmit (here with no exporter: the test process) hands on the order's context,
    # so the claim after it is in the trace too, right under the submission.
    assert ancestors(claims[-1], by_id) == [names.SPAN_SCHEDULE, names.SPAN_SUBMIT]
    ended = sorted((s for s in spans if s["name"] == names.SPAN_CLOSE), key=lambda s: s["start"])
    closes = [s["attributes"][names.ATTR_STATE] for s in ended]
    assert closes == ["Error", "Processed"]

    def metrics_written():
        return stack.metric(names.METRIC_ORDERS_CLOSED, {names.ATTR_STATE: "Processed"}) == 1
    wait_until(metrics_written, timeout=10, what="the order's metric points")
    assert stack.metric(names.METRIC_DEADLINE_MISSES, {names.ATTR_STEP: "charge", names.ATTR_VERDICT: "retry"}) == 1
    assert stack.metric(names.METRIC_DEADLINE_MISSES, {names.ATTR_STEP: "ship"}) == 2
    assert stack.metric(names.METRIC_STEP_RETRIES, {names.ATTR_STEP: "charge"}) == 1
    assert stack.metric(names.METRIC_ORDERS_CLOSED, {names.ATTR_STATE: "Error"}) == 1
