"""Liveness end to end (issue 24): every order ends within the bound of core/liveness.py
(docs/workflows.md, "How long an order can take"), computed from the hosts' settings.

- A few orders whose own calls fail, among many that succeed: each bad order is judged
  by its own policy (a refund that always fails ends in Error with an alert, a charge
  never answered is undone, a refund that fails twice then works is undone cleanly, a
  charge answered late is settled by the lookup); payments' circuit breaker never
  opens, so none of the good orders is postponed or undone because of the bad ones.
- A real outage of payments (every call 503 for some seconds, then back): the breaker
  opens, the lines that could not call are postponed, nothing is undone, and every
  order ends within the bound for an outage of that length.
"""

from __future__ import annotations

import time
from datetime import timedelta

from core.models import ProcessState, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from tests.e2e.conftest import wait_until

A, C = Kind.ACTION.value, Kind.COMPENSATION.value
#: The issue's settings, scaled: a step attempt may take 4 s, two failures give up.
SETTINGS = {"STEP_TIMEOUT_SECONDS": "4", "MAX_FAILURES": "2"}


def states_of(stack, order_id: str) -> dict[tuple[str, str], str]:
    return {key: line.state.value for key, line in stack.lines(order_id).items()}


def test_a_few_orders_whose_own_calls_fail_end_by_their_own_policy_and_hold_up_no_one(stack, report_figure):
    good = [f"g-{i:02d}" for i in range(30)]
    refund_fails = [f"x-{i}" for i in range(3)]  # ship refused, then the refund answers 503 for ever
    charge_hangs = [f"h-{i}" for i in range(3)]  # the charge is never answered in time, never applied
    refund_twice = [f"r-{i}" for i in range(3)]  # ship refused, the refund answers 503 twice, then works
    charge_late = [f"l-{i}" for i in range(4)]  # the charge is applied but answered after the call's timeout
    script = {
        **{f"{o}/ship": ["permanent"] for o in refund_fails + refund_twice},
        **{f"{o}/refund": ["always:transient"] for o in refund_fails},
        **{f"{o}/refund": ["transient", "transient"] for o in refund_twice},
        **{f"{o}/charge": ["always:hang"] for o in charge_hangs},
        **{f"{o}/charge": ["slow"] for o in charge_late},
    }
    stack.remote.set_faults(script=script, slow_seconds=6)
    stack.start_hosts(**SETTINGS)
    bad = refund_fails + charge_hangs + refund_twice + charge_late
    ids = good + bad
    submitted = utcnow()
    # The bad orders among the good ones, as they would come.
    stack.send([(order_id, order_json(order_id)) for order_id in sorted(ids, key=lambda o: o[-1] + o)])

    states = stack.wait_closed(ids, timeout=120)
    took = {order_id: stack.assert_within_bound(order_id, submitted) for order_id in ids}
    ended = {order_id: s.process_state for order_id, s in states.items()}

    assert {ended[o] for o in good + charge_late} == {ProcessState.PROCESSED}
    for order_id in good:  # not undone, and never held back for payments
        assert all(kind == A for _, kind in states_of(stack, order_id)), order_id
    for order_id in charge_late:  # settled by the lookup: applied once, never sent twice
        assert stack.applied("payments")[order_id] == ["charge"]
    assert stack.remote.effects()["services"]["payments"]["lookups"] >= len(charge_late)

    for order_id in refund_fails:  # the undo cannot be done: Error, with an alert
        assert ended[order_id] is ProcessState.ERROR and states[order_id].failed == (1,)
        assert states_of(stack, order_id) == {
            ("reserve", A): "Done", ("charge", A): "Done", ("ship", A): "Refused",
            ("charge", C): "Failed", ("reserve", C): "Done",
        }
        assert "gave up after 2 failed attempts" in stack.lines(order_id)[("charge", C)].last_error
    for order_id in charge_hangs:  # outcome unknown when it gave up: refunded (nothing to undo), released
        assert ended[order_id] is ProcessState.COMPENSATED
        assert states_of(stack, order_id) == {
            ("reserve", A): "Done", ("charge", A): "Exhausted", ("charge", C): "Done", ("reserve", C): "Done",
        }
        assert stack.lines(order_id)[("charge", A)].failure_count == 2
    for order_id in refund_twice:  # the refund's own retries got through: undone cleanly
        assert ended[order_id] is ProcessState.COMPENSATED
        assert states_of(stack, order_id)[("charge", C)] == "Done"
        assert stack.remote.net(order_id) == {"inventory": {"reserve": 0}, "payments": {"charge": 0}}
    alerts = stack.all_alerts()
    assert sorted(a["order_id"] for a in alerts) == sorted(refund_fails)

    # Payments' breaker saw a few failing requests among many that succeeded: it never
    # opened, so no line anywhere was postponed.
    logs = stack.host_logs()
    assert "circuit breaker for payments" not in logs
    assert " postponed for " not in logs and "postponed:" not in logs
    stack.assert_remote_clean()
    slowest = max(took, key=took.get)
    report_figure(
        f"liveness, {len(good)} good + {len(bad)} bad orders (STEP_TIMEOUT_SECONDS=4, MAX_FAILURES=2): "
        f"slowest {slowest} {took[slowest].total_seconds():.1f} s; breaker openings 0; postponed lines 0"
    )


def test_a_real_outage_of_payments_undoes_nothing_and_every_order_ends_within_the_bound(stack, report_figure):
    open_seconds, outage_seconds = 2.0, 6.0
    stack.start_hosts(2, BREAKER_OPEN_SECONDS=str(open_seconds))
    stack.remote.set_faults(service="payments", rates={"transient": 1.0})  # every call 503
    down, submitted = time.monotonic(), utcnow()
    ids = [f"o-{i:02d}" for i in range(20)]
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    # The outage lasts its length, and long enough for the breakers to open.
    wait_until(
        lambda: time.monotonic() - down >= outage_seconds and "circuit breaker for payments: closed -> open"
        in stack.host_logs(), timeout=30, what=f"payments down for {outage_seconds:g} s with a breaker open",
    )
    stack.remote.set_faults(service="payments")  # back
    outage = time.monotonic() - down

    states = stack.wait_closed(ids, timeout=90)
    assert {s.process_state for s in states.values()} == {ProcessState.PROCESSED}
    took = {
        order_id: stack.assert_within_bound(order_id, submitted, outage=timedelta(seconds=outage), outage_remote="payments")
        for order_id in ids
    }
    lines = [line for order_id in ids for line in stack.lines(order_id).values()]
    assert all(line.kind is Kind.ACTION for line in lines)  # nothing undone
    assert stack.undone("payments") == {} and stack.undone("inventory") == {}
    assert stack.all_alerts() == []
    logs = stack.host_logs()
    assert logs.count("postponed for") >= 1  # lines that could not call waited
    assert "circuit breaker for payments: half_open -> closed" in logs
    stack.assert_remote_clean()
    failures = sum(line.failure_count for line in lines)
    slowest = max(took, key=took.get)
    report_figure(
        f"liveness, payments down {outage:.1f} s for 20 orders on 2 hosts (BREAKER_OPEN_SECONDS=2): 0 undone, "
        f"{failures} failed attempts counted (own calls failed), {logs.count('postponed for')} postponements, "
        f"slowest {slowest} {took[slowest].total_seconds():.1f} s"
    )


def test_an_outage_that_does_not_end_ends_each_order_in_the_failure_path(stack):
    # Payments never comes back. A line that cannot call is postponed, but every
    # MAX_POSTPONEMENTS-th postponement in a row counts one failed attempt: the charge
    # gives up (its outcome unknown: it is to be undone too), the refund, at payments as
    # well, fails the same way, the release still runs, and each order stops in Error
    # with one alert instead of waiting for ever.
    stack.start_hosts(BREAKER_OPEN_SECONDS="1", MAX_POSTPONEMENTS="2", MAX_FAILURES="2")
    stack.remote.set_faults(service="payments", rates={"transient": 1.0})
    ids = [f"e-{i}" for i in range(6)]
    stack.send([(order_id, order_json(order_id)) for order_id in ids])

    states = stack.wait_closed(ids, timeout=90)
    assert {s.process_state for s in states.values()} == {ProcessState.ERROR}
    assert {s.failed for s in states.values()} == {(1,)}  # the refund could not be done
    for order_id in ids:
        assert states_of(stack, order_id) == {
            ("reserve", A): "Done", ("charge", A): "Exhausted", ("charge", C): "Failed", ("reserve", C): "Done",
        }
        assert "gave up after 2 failed attempts" in stack.lines(order_id)[("charge", C)].last_error
        assert stack.remote.net(order_id) == {"inventory": {"reserve": 0}}
    # Each failure was an attempt whose own call failed (a burst before the breaker
    # opened, a half-open trial) or MAX_POSTPONEMENTS postponements in a row: the cap is
    # what ended the waits of the lines that never got to call.
    assert "postponed 2 times in a row, counted as a failed attempt" in stack.host_logs()
    assert sorted(a["order_id"] for a in stack.all_alerts()) == ids
    assert stack.applied("payments") == {}
    stack.assert_remote_clean()
