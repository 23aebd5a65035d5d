"""Cancel end to end, on one local stack (the real function_app.py on a local host, the
Service Bus emulator, Azurite, the fake remote services) shared by every case, which run
side by side: a cancel during a step's in-flight call (by the API, and by a message on the
``order-cancellations`` queue), during an undo (by ``ordersctl``), after Processed, twice,
and a cancel message that cannot be acted on. The fake remote holds a call in flight by
answering it late (``slow``: applied at once, answered after ``slow_seconds``). Nothing is
applied twice and no call comes after its Complete-By (``Stack.assert_remote_clean``).
A cancel racing a step's response and a supervisor reset, on the whole stack, is
tests/e2e/test_cancel_races.py's; the many interleavings one write at a time (a postponed
line, a line after a retry too) are tests/unit/test_cancel.py's, over the memtable."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import requests
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from adapters.wiring import services
from core import names
from core.models import ProcessState, cancel_message_id, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from tests.e2e.conftest import net_zero, wait_until
from tests.e2e.test_compensation import line_states, ordersctl

A, C = Kind.ACTION.value, Kind.COMPENSATION.value
#: How long the fake remote holds a `slow` call: long enough to cancel while it is in flight.
HELD_SECONDS = 3
#: One call's timeout: longer than a held call, so the agent waits for its answer.
CALL_TIMEOUT = "6"
ALL = ("x-api", "x-bus", "x-undo", "x-cli", "x-done")
#: The step timeout: longer than a held call, so the held call answers in time.
STEP_TIMEOUT = "8"


def send_cancel(stack, body: bytes, message_id: str) -> None:
    with ServiceBusClient.from_connection_string(stack.connection_string) as client:
        with client.get_queue_sender(stack.settings[names.CANCELLATIONS_QUEUE_SETTING]) as sender:
            sender.send_messages(ServiceBusMessage(body, message_id=message_id, content_type="application/json"))


def test_cancel_in_flight_while_failing_during_an_undo_after_processed_and_twice(stack, reply_queue, tmp_path):
    stack.remote.set_faults(
        slow_seconds=HELD_SECONDS,
        script={
            "x-api/charge": ["slow"],  # cancelled by the API while its charge is in flight
            "x-bus/reserve": ["slow"],  # cancelled by a Service Bus message while its reserve is in flight
            "x-undo/ship": ["permanent"], "x-undo/refund": ["slow"],  # cancelled by the API during its undo
            # cancelled by ordersctl (a process that takes seconds to start) while its charge keeps failing:
            # the attempt in flight settles by its deadline, then charge (outcome unknown) and reserve are undone
            "x-cli/charge": ["always:transient"],
            # order-parallel: cancelled by the API while both lines of its group are in flight
            "x-group/reserve": ["slow"], "x-group/charge": ["slow"],
        },
    )
    (host,) = stack.start_hosts(API_AUTH="none", STEP_TIMEOUT_SECONDS=STEP_TIMEOUT,
                                REMOTE_CALL_TIMEOUT_SECONDS=CALL_TIMEOUT)
    api = f"{host.http_url}/api"
    submitted = utcnow()
    stack.send([(o, order_json(o)) for o in ALL], reply_to=reply_queue)
    stack.send([("x-group", order_json("x-group", workflow="order-parallel"))])

    def by_api():  # while charge is in flight: 202 with the order document, still at charge
        stack.capture("x-api", "charge")
        first = requests.post(f"{api}/orders/x-api/cancel", json={"reason": "customer called"}, timeout=10)
        second = requests.post(f"{api}/orders/x-api/cancel", json={"reason": "twice"}, timeout=10)
        return first, second

    def by_message():  # any Service Bus client, while reserve is in flight; its resend is dropped or a no-op
        stack.capture("x-bus", "reserve")
        for _ in range(2):
            send_cancel(stack, b'{"order_id": "x-bus", "reason": "sent by the shop"}', cancel_message_id("x-bus"))
        send_cancel(stack, b'{"order_id": "x-bus", "reason": 7}', "cancel:bad")  # cannot be acted on: kept

    def during_undo():  # while the refund of a refused ship is in flight: the undo goes on
        stack.capture("x-undo", "charge", Kind.COMPENSATION)
        return requests.post(f"{api}/orders/x-undo/cancel", json={"reason": "too late"}, timeout=10)

    def by_ordersctl():
        stack.capture("x-cli", "charge")
        return ordersctl(stack, tmp_path, "cancel", "x-cli", "--reason", "out of stock elsewhere")

    def during_group():  # while reserve and charge, a group, are both in flight
        stack.capture("x-group", "reserve")
        stack.capture("x-group", "charge")
        return requests.post(f"{api}/orders/x-group/cancel", json={"reason": "both at once"}, timeout=10)

    # Side by side: each case waits for its own line to be in flight.
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(f) for f in (by_api, by_message, during_undo, by_ordersctl, during_group)]
        (response, again), _, undo_cancel, shown, group_cancel = (f.result() for f in futures)
    assert group_cancel.status_code == 202, group_cancel.text
    assert [(s["step"], s["state"]) for s in group_cancel.json()["steps"]][:3] == [
        ("reserve", "Running"), ("charge", "Running"), ("ship", "NotStarted"),
    ]
    assert response.status_code == 202, response.text
    document = response.json()
    assert (document["state"], document["step"], document["kind"]) == ("Processing", "charge", "action")
    assert document["cancel"]["reason"] == "customer called"
    assert again.status_code == 202 and again.json()["cancel"] == document["cancel"]  # a no-op
    assert undo_cancel.status_code == 202, undo_cancel.text
    assert shown.returncode == 0, shown.stderr
    assert "cancel recorded" in shown.stdout

    states = stack.wait_closed([*ALL, "x-group"], timeout=120)

    # x-api: the charge settled (applied), then refund and release, newest first; ship never ran.
    api_state = states["x-api"]
    assert api_state.process_state is ProcessState.COMPENSATED
    assert "cancelled by the status API" in api_state.cause and "customer called" in api_state.cause
    assert line_states(stack, "x-api") == {
        ("reserve", A): "Done", ("charge", A): "Done", ("charge", C): "Done", ("reserve", C): "Done",
    }
    assert stack.lines("x-api")[("charge", A)].updated_at > api_state.cancel_requested_at  # settled after the cancel
    assert [(c.kind, c.action) for c in stack.claims("x-api")] == [
        (A, "reserve"), (A, "charge"), (C, "refund"), (C, "release"),
    ]
    assert stack.applied("payments")["x-api"] == ["charge"] and stack.undone("payments")["x-api"] == ["refund"]
    assert "x-api" not in stack.applied("shipping")

    # x-bus: the reserve settled, then released; nothing else ran.
    bus_state = states["x-bus"]
    assert bus_state.process_state is ProcessState.COMPENSATED
    assert "a Service Bus message" in bus_state.cause and "sent by the shop" in bus_state.cause
    assert [(c.kind, c.action) for c in stack.claims("x-bus")] == [(A, "reserve"), (C, "release")]
    (kept,) = [r for r in services().rejections.list(limit=100) if r["Source"] == names.CANCELLATIONS_QUEUE]
    assert kept["MessageId"] == "cancel:bad" and "reason" in kept["Reason"]

    # x-undo: already being undone for its refusal: the same undos, once each, its own cause.
    undo_state = states["x-undo"]
    assert undo_state.process_state is ProcessState.COMPENSATED
    assert undo_state.cause.startswith("step ship refused") and undo_state.cancel_reason == "too late"
    assert [(c.kind, c.action) for c in stack.claims("x-undo")] == [
        (A, "reserve"), (A, "charge"), (A, "ship"), (C, "refund"), (C, "release"),
    ]

    # x-cli: no forward step after the cancel; charge's outcome is unknown (its calls failed): undone too.
    cli_state = states["x-cli"]
    assert cli_state.process_state is ProcessState.COMPENSATED
    assert "cancelled by ordersctl" in cli_state.cause and "out of stock elsewhere" in cli_state.cause
    claims = [(c.kind, c.action) for c in stack.claims("x-cli")]
    assert claims[-2:] == [(C, "refund"), (C, "release")] and (A, "ship") not in claims
    assert "x-cli" not in stack.applied("payments") and stack.undone("inventory")["x-cli"] == ["release"]
    status = ordersctl(stack, tmp_path, "status", "x-cli")  # shows the cancel: when, who, why
    assert status.returncode == 0, status.stderr
    (row,) = [line for line in status.stdout.splitlines() if line.strip().startswith("cancel ")]
    assert "requested" in row and "by ordersctl" in row and "out of stock elsewhere" in row
    assert "Cancelled" in status.stdout  # the charge line the cancel ended

    # x-done: Processed; a cancel is refused (409, exit 1) and changes nothing.
    assert states["x-done"].process_state is ProcessState.PROCESSED
    refused = requests.post(f"{api}/orders/x-done/cancel", timeout=10)
    assert refused.status_code == 409 and "Processed" in refused.json()["reason"]
    cli = ordersctl(stack, tmp_path, "cancel", "x-done")
    assert cli.returncode == 1 and "Processed" in cli.stderr
    assert stack.state("x-done") == states["x-done"]

    # x-group: both lines settled (applied) after the cancel, then both undone, charge first.
    group = states["x-group"]
    assert group.process_state is ProcessState.COMPENSATED and "both at once" in group.cause
    lines = stack.lines("x-group")
    assert {key: line.state.value for key, line in lines.items()} == {
        ("reserve", A): "Done", ("charge", A): "Done", ("charge", C): "Done", ("reserve", C): "Done",
    }
    assert min(lines[(s, A)].updated_at for s in ("reserve", "charge")) > group.cancel_requested_at
    claims = [(c.kind, c.action) for c in stack.claims("x-group")]
    assert sorted(claims[:2]) == [(A, "charge"), (A, "reserve")] and claims[2:] == [(C, "refund"), (C, "release")]
    assert "x-group" not in stack.applied("shipping")

    for order_id in ("x-api", "x-bus", "x-undo", "x-cli", "x-group"):
        assert net_zero(stack.remote.net(order_id)), order_id
        stack.assert_within_bound(order_id, submitted)
    events = stack.events(reply_queue)
    # One `cancelling` per order cancelled (x-api, x-undo, x-cli at charge, x-bus at reserve), none for a no-op.
    assert events.count(("cancelling", "charge")) == 3 and events.count(("cancelling", "reserve")) == 1
    assert sum(1 for status, _ in events if status == "compensated") == 4
    # The cancel joins the order's trace.
    spans = wait_until(
        lambda: (found := [s for s in stack.spans("x-api") if s["name"] == names.SPAN_CANCEL]) and found,
        timeout=15, what="the cancel's span",
    )
    submit = next(s for s in stack.spans("x-api") if s["name"] == names.SPAN_SUBMIT)
    assert {s["trace_id"] for s in spans} == {submit["trace_id"]}
    stack.assert_remote_clean()
