"""A remote service down, and outcomes unknown, end to end on the local stack.

- An outage behind the agents' circuit breaker: steps for the service that is down
  that could not call are postponed, not failed (a line whose own call failed counts
  that attempt, by its own policy); a half-open trial that fails opens the breaker
  again; when the service is back every order finishes, with no undo and no alert,
  within the liveness bound for an outage of that length.
- An attempt whose answer came too late was applied: at a service that offers the
  lookup, the next attempt asks and is done without a second POST; at a service
  without it, the next attempt sends the action again with the same idempotency key
  and the service replays its first answer.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

from adapters.wiring import services
from core.models import ProcessState, idempotency_key, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from tests.e2e.conftest import wait_until

_BREAKER = re.compile(r"circuit breaker for (\S+): (\S+) -> (\S+)")


def breaker_changes(stack, service: str) -> list[tuple[str, str]]:
    """Every state change of ``service``'s breakers, on every host, as (from, to)."""
    return [(m[2], m[3]) for m in _BREAKER.finditer(stack.host_logs()) if m[1] == service]


def test_an_outage_postpones_steps_that_could_not_call_and_every_order_finishes_after_it_within_the_bound(stack, reply_queue):
    open_seconds = 2.0
    stack.start_hosts(2, BREAKER_OPEN_SECONDS=str(open_seconds))
    stack.remote.set_faults(service="payments", rates={"transient": 1.0})  # payments answers 503 to everything
    down, submitted = time.monotonic(), utcnow()
    ids = [f"u-{i}" for i in range(20)]
    # Every fourth runs reserve and charge at once (order-parallel): its charge waits out the
    # outage while its reserve is done, and ship starts only once both are.
    grouped = ids[::4]
    stack.send([(o, order_json(o, **({"workflow": "order-parallel"} if o in grouped else {}))) for o in ids],
               reply_to=reply_queue)

    # The breakers open, and at least one half-open trial fails and opens again.
    wait_until(lambda: ("half_open", "open") in breaker_changes(stack, "payments"), timeout=30,
               what="a failed half-open trial reopening payments' breaker")
    # Each host published its breaker's state for operators (ordersctl breakers).
    published = wait_until(
        lambda: [b for b in services().store.breakers() if b.service == "payments" and b.state != "closed"] or None,
        timeout=10, what="payments' breaker published as not closed",
    )
    assert {b.instance for b in published} <= {host.instance_id for host in stack.hosts}
    calls_down = stack.remote.effects()["services"]["payments"]["calls"]
    stack.remote.set_faults(service="payments")  # back
    outage = time.monotonic() - down

    states = stack.wait_closed(ids, timeout=60)
    assert {s.process_state for s in states.values()} == {ProcessState.PROCESSED}
    lines = [line for order_id in ids for line in stack.lines(order_id).values()]
    assert all(line.kind is Kind.ACTION for line in lines)  # nothing undone
    for order_id in grouped:
        assert states[order_id].workflow == "order-parallel", order_id
        steps = {line.step: line for line in stack.lines(order_id).values()}
        assert steps["ship"].updated_at > max(steps["reserve"].updated_at, steps["charge"].updated_at), order_id
    # A failure is counted only for an attempt whose own call failed (one per call at most),
    # never for one the breaker kept from calling; inventory and shipping saw no failure.
    failures = sum(line.failure_count for line in lines)
    assert failures <= calls_down, (failures, calls_down)
    assert all(line.failure_count == 0 for line in lines if line.step != "charge")
    assert stack.all_alerts() == []
    for order_id in ids:
        stack.assert_within_bound(order_id, submitted, outage=timedelta(seconds=outage), outage_remote="payments")
    changes = breaker_changes(stack, "payments")
    assert ("half_open", "closed") in changes
    # What each host published is the last state its log shows it entered (a breaker
    # that saw no call since it opened stays "open" until its next call).
    last_entered = {
        host.instance_id: [m[3] for m in _BREAKER.finditer(host.log_text()) if m[1] == "payments"][-1]
        for host in stack.hosts
        if "circuit breaker for payments" in host.log_text()
    }
    wait_until(
        lambda: {b.instance: b.state for b in services().store.breakers() if b.service == "payments"} == last_entered,
        timeout=10, what=f"the published breakers to match the hosts' logs {last_entered}",
    )
    assert "closed" in last_entered.values()
    # Every charge ran into the outage: it waited (postponed: the breaker kept it from
    # calling), or its own call failed and that attempt counted (judged by its own policy).
    logs = stack.host_logs()
    charges = {order_id: stack.lines(order_id)[("charge", "action")] for order_id in ids}
    untouched = [
        order_id for order_id, line in charges.items()
        if f"order {order_id}: action charge postponed for" not in logs and line.failure_count == 0
    ]
    assert untouched == [], untouched
    assert logs.count("postponed for") >= 1
    # While open, a host makes one trial call per open period: calls during the outage
    # stay within what was in flight when the breakers opened plus one per period.
    in_flight_at_opening = 2 * 16  # hosts x the bulkhead
    assert calls_down <= in_flight_at_opening + 2 * (outage / open_seconds + 1), (calls_down, outage)
    stack.assert_remote_clean()


def test_an_applied_step_answered_too_late_is_settled_by_lookup_without_a_second_post(stack):
    # The first reserve is applied, but its answer comes after the call's timeout.
    stack.remote.set_faults(script={"s-1/reserve": ["slow"]}, slow_seconds=3)
    stack.start_hosts(AGENT_MAX_CALLS="1")
    submitted = utcnow()
    stack.send([("s-1", order_json("s-1"))])

    state = stack.wait_closed(["s-1"], timeout=40)["s-1"]
    assert state.process_state is ProcessState.PROCESSED
    inventory = stack.remote.effects()["services"]["inventory"]
    key = idempotency_key("s-1", "reserve", "reserve")
    assert inventory["by_key"][key] == 1 and inventory["lookups"] == 1
    assert inventory["calls"] == 1 and inventory["replays"] == 0  # one POST: the retry asked instead
    reserve = stack.lines("s-1")[("reserve", "action")]
    assert reserve.failure_count == 1 and reserve.result["confirmation"]
    stack.assert_within_bound("s-1", submitted)
    stack.assert_remote_clean()


def test_without_a_lookup_the_step_is_sent_again_with_the_same_key_and_applied_once(stack):
    stack.remote.set_faults(script={"s-2/ship": ["slow"]}, slow_seconds=3)
    stack.start_hosts(AGENT_MAX_CALLS="1")
    submitted = utcnow()
    stack.send([("s-2", order_json("s-2"))])

    state = stack.wait_closed(["s-2"], timeout=40)["s-2"]
    assert state.process_state is ProcessState.PROCESSED
    shipping = stack.remote.effects()["services"]["shipping"]
    key = idempotency_key("s-2", "ship", "ship")
    assert shipping["lookups"] == 0
    assert shipping["by_key"] == {key: 1}  # applied once...
    assert shipping["calls"] == 2 and shipping["replays"] == 1  # ...though sent twice, with the same key
    assert stack.lines("s-2")[("ship", "action")].failure_count == 1
    stack.assert_within_bound("s-2", submitted)
    stack.assert_remote_clean()
