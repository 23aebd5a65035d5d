"""Compensation end to end on the whole local stack (the real function_app.py on local
hosts, the fake remote services): a refused or exhausted step undoes the steps before it,
newest first, each undo once; an undo that cannot be done ends in Error with one alert
and an operator's resubmit finishes it; crashes and stale responses during compensation
change nothing. In every test nothing is applied twice and no remote call is made after
its complete-by (``Stack.assert_remote_clean``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

from core.models import Outcome, ProcessState, idempotency_key, utcnow
from core.workflow import Kind
from devtools.orders import order_json
from tests import ROOT
from tests.e2e.conftest import FAST, net_zero, wait_until

A, C = Kind.ACTION.value, Kind.COMPENSATION.value


def ordersctl(stack, tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``ordersctl`` as an operator runs it: a process whose only way to the stack is a
    settings file (``--settings``), none of the stack's settings in its environment."""
    settings = tmp_path / "stack.settings.json"
    if not settings.exists():
        settings.write_text(json.dumps({"IsEncrypted": False, "Values": {**FAST, **stack.settings}}))
    env = {key: value for key, value in os.environ.items() if key not in stack.settings}
    return subprocess.run(
        [sys.executable, "-m", "ordersctl", *args, "--settings", str(settings)],
        cwd=ROOT, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60,
    )


def line_states(stack, order_id: str) -> dict[tuple[str, str], str]:
    return {key: line.state.value for key, line in stack.lines(order_id).items()}


def test_refusal_at_charge_releases_the_reservation_once_and_ends_compensated(stack, reply_queue):
    # a-1 runs the steps in sequence; p-2 runs reserve and charge at once (order-parallel):
    # its reserve is refused while its charge is still in flight (held for 0.6 s).
    stack.remote.set_faults(script={"a-1/charge": ["permanent"], "p-2/reserve": ["permanent"], "p-2/charge": ["slow"]},
                            slow_seconds=0.6)
    stack.start_hosts()
    submitted = utcnow()
    stack.send([("a-1", order_json("a-1"))], reply_to=reply_queue)
    stack.send([("p-2", order_json("p-2", workflow="order-parallel"))])

    states = stack.wait_closed(["a-1", "p-2"], timeout=30)
    state = states["a-1"]
    assert state.process_state is ProcessState.COMPENSATED
    assert "step charge refused" in state.last_error and "422" in state.last_error
    assert line_states(stack, "a-1") == {("reserve", A): "Done", ("charge", A): "Refused", ("reserve", C): "Done"}
    assert [(c.kind, c.step, c.action) for c in stack.claims("a-1")] == [
        (A, "reserve", "reserve"), (A, "charge", "charge"), (C, "reserve", "release"),
    ]
    assert stack.applied("inventory") == {"a-1": ["reserve"]} and stack.undone("inventory") == {"a-1": ["release"]}
    # The refused charge applied nothing, so it is never undone; ship never ran.
    assert "a-1" not in stack.applied("payments") and "a-1" not in stack.undone("payments")
    assert not [key for key in stack.remote.effects()["services"]["payments"]["by_key"] if "a-1" in key]
    assert stack.applied("shipping") == {}

    # p-2: both lines claimed in one write; the refusal came first, the charge settled after it
    # (applied), and only then was it undone; the refused reserve is not undone.
    group = states["p-2"]
    assert group.process_state is ProcessState.COMPENSATED and group.cause.startswith("step reserve refused")
    lines = stack.lines("p-2")
    assert {key: line.state.value for key, line in lines.items()} == {
        ("reserve", A): "Refused", ("charge", A): "Done", ("charge", C): "Done",
    }
    assert lines[("reserve", A)].updated_at < lines[("charge", A)].updated_at < lines[("charge", C)].updated_at
    claims = [(c.kind, c.action, c.attempt) for c in stack.claims("p-2")]
    assert sorted(claims[:2]) == [(A, "charge", 2), (A, "reserve", 1)] and claims[2:] == [(C, "refund", 3)]
    assert stack.applied("payments") == {"p-2": ["charge"]} and stack.undone("payments") == {"p-2": ["refund"]}
    assert "p-2" not in stack.applied("inventory") and net_zero(stack.remote.net("p-2"))
    stack.assert_within_bound("p-2", submitted)
    assert net_zero(stack.remote.net("a-1"))
    stack.assert_within_bound("a-1", submitted)
    assert stack.all_alerts() == []  # Compensated is a clean end: no operator needed
    assert stack.events(reply_queue) == [
        ("received", None), ("processing", "reserve"), ("processing", "charge"),
        ("compensating", "reserve"), ("compensated", None),
    ]
    stack.assert_remote_clean()


def test_refusal_at_ship_refunds_then_releases_and_ordersctl_status_shows_every_line(stack, reply_queue, tmp_path):
    stack.remote.set_faults(script={"b-1/ship": ["permanent"]})
    stack.start_hosts()
    submitted = utcnow()
    stack.send([("b-1", order_json("b-1"))], reply_to=reply_queue)

    state = stack.wait_closed(["b-1"], timeout=30)["b-1"]
    assert state.process_state is ProcessState.COMPENSATED and "step ship refused" in state.last_error
    lines = stack.lines("b-1")
    assert {key: line.state.value for key, line in lines.items()} == {
        ("reserve", A): "Done", ("charge", A): "Done", ("ship", A): "Refused",
        ("charge", C): "Done", ("reserve", C): "Done",
    }
    # Newest first: the refund was claimed, and applied at the remote, before the release.
    assert [(c.kind, c.action) for c in stack.claims("b-1")] == [
        (A, "reserve"), (A, "charge"), (A, "ship"), (C, "refund"), (C, "release"),
    ]
    refund, release = lines[("charge", C)].result, lines[("reserve", C)].result
    assert (refund["undid"], release["undid"]) == ("charge", "reserve")
    assert datetime.fromisoformat(refund["applied_at"]) < datetime.fromisoformat(release["applied_at"])  # fake's clock
    assert stack.undone("payments") == {"b-1": ["refund"]} and stack.undone("inventory") == {"b-1": ["release"]}
    assert stack.applied("shipping") == {}
    assert net_zero(stack.remote.net("b-1"))
    stack.assert_within_bound("b-1", submitted)
    assert stack.all_alerts() == []
    assert stack.events(reply_queue)[-3:] == [
        ("compensating", "charge"), ("compensating", "reserve"), ("compensated", None),
    ]
    stack.assert_remote_clean()

    shown = ordersctl(stack, tmp_path, "status", "b-1", "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert (document["order_id"], document["state"]) == ("b-1", "Compensated")
    assert [(s["step"], s["kind"], s["action"], s["state"]) for s in document["steps"]] == [
        ("reserve", A, "reserve", "Done"), ("charge", A, "charge", "Done"), ("ship", A, "ship", "Refused"),
        ("charge", C, "refund", "Done"), ("reserve", C, "release", "Done"),
    ]
    by_line = {(s["step"], s["kind"]): s for s in document["steps"]}
    assert "422" in by_line[("ship", A)]["last_error"]
    assert by_line[("charge", C)]["result"]["outcome"] == "undone"
    assert all(set(s) >= {"attempt", "failure_count", "last_error", "result"} for s in document["steps"])
    unknown = ordersctl(stack, tmp_path, "status", "no-such-order", "--json")
    assert unknown.returncode == 1 and "no-such-order" in unknown.stderr


def test_exhausted_charge_is_refunded_although_its_outcome_is_unknown_then_released(stack, reply_queue):
    # One call per attempt, two attempts. c-1: the first charge call hangs (nothing
    # applied), the second is applied but never answered in time (slow), after the
    # lookup had found nothing. c-2: every call hangs (never applied). Either way the
    # outcome is unknown when the charge gives up: the scheduler refunds, then releases.
    # c-p runs reserve and charge at once (order-parallel): its charge times out every time
    # while its reserve is done; once the charge gives up, both are undone.
    stack.remote.set_faults(
        script={"c-1/charge": ["hang", "always:slow"], "c-2/charge": ["always:hang"], "c-p/charge": ["always:hang"]},
        slow_seconds=30,
    )
    # Timeouts are transient failures for the agents' circuit breaker, but the six failing
    # requests are kept below its minimum throughput: it stays closed, each line is judged
    # by its own policy.
    stack.start_hosts(MAX_FAILURES="2", AGENT_MAX_CALLS="1", BREAKER_MINIMUM_THROUGHPUT="10")
    submitted = utcnow()
    stack.send([("c-1", order_json("c-1"))], reply_to=reply_queue)
    stack.send([("c-2", order_json("c-2")), ("c-p", order_json("c-p", workflow="order-parallel"))])

    states = stack.wait_closed(["c-1", "c-2", "c-p"], timeout=40)
    for order_id in ("c-1", "c-2"):
        assert states[order_id].process_state is ProcessState.COMPENSATED
        assert "step charge gave up" in states[order_id].last_error
        lines = stack.lines(order_id)
        assert {key: line.state.value for key, line in lines.items()} == {
            ("reserve", A): "Done", ("charge", A): "Exhausted", ("charge", C): "Done", ("reserve", C): "Done",
        }
        assert lines[("charge", A)].failure_count == 2
        assert [(c.kind, c.action) for c in stack.claims(order_id)] == [
            (A, "reserve"), (A, "charge"), (A, "charge"), (C, "refund"), (C, "release"),
        ]
        assert net_zero(stack.remote.net(order_id))
        assert stack.applied("shipping").get(order_id) is None
        stack.assert_within_bound(order_id, submitted)
    assert stack.lines("c-1")[("charge", C)].result["outcome"] == "undone"  # it had been applied
    assert stack.lines("c-2")[("charge", C)].result["outcome"] == "nothing_to_undo"  # it never was
    assert stack.applied("payments") == {"c-1": ["charge"]} and stack.undone("payments") == {"c-1": ["refund"]}
    assert stack.undone("inventory") == {"c-1": ["release"], "c-2": ["release"], "c-p": ["release"]}
    # c-p: the charge timed out twice (each retry claimed alone, reserve done meanwhile), then
    # gave up; the group is undone, the highest step first.
    group = states["c-p"]
    assert group.process_state is ProcessState.COMPENSATED and "step charge gave up" in group.cause
    assert line_states(stack, "c-p") == {
        ("reserve", A): "Done", ("charge", A): "Exhausted", ("charge", C): "Done", ("reserve", C): "Done",
    }
    assert stack.lines("c-p")[("charge", A)].failure_count == 2
    claims = [(c.kind, c.action) for c in stack.claims("c-p")]
    assert sorted(claims[:2]) == [(A, "charge"), (A, "reserve")]
    assert claims[2:] == [(A, "charge"), (C, "refund"), (C, "release")]
    assert net_zero(stack.remote.net("c-p"))
    stack.assert_within_bound("c-p", submitted)
    assert stack.remote.effects()["services"]["payments"]["lookups"] >= 2  # the second attempts asked first
    assert stack.all_alerts() == []
    events = stack.events(reply_queue)
    assert events.count(("retrying", "charge")) == 1
    assert events[-3:] == [("compensating", "charge"), ("compensating", "reserve"), ("compensated", None)]
    stack.assert_remote_clean()


def test_an_undo_the_service_fails_every_time_fails_by_its_own_policy_within_the_bound(stack):
    # The refund answers 503 to this one order, every time. One request, however often it
    # retries, never opens payments' circuit breaker: each attempt runs out of calls (no
    # response), the supervisor counts it, and after MAX_FAILURES the refund fails; the
    # release still runs, and the order stops in Error with one alert. Nothing is
    # postponed: the line's own calls failed, so its own policy judges it.
    stack.remote.set_faults(script={"p-1/ship": ["permanent"], "p-1/refund": ["always:transient"]})
    stack.start_hosts(MAX_FAILURES="2")
    submitted = utcnow()
    stack.send([("p-1", order_json("p-1"))])

    state = stack.wait_closed(["p-1"], timeout=60)["p-1"]
    assert state.process_state is ProcessState.ERROR and state.failed == (1,)
    assert line_states(stack, "p-1") == {
        ("reserve", A): "Done", ("charge", A): "Done", ("ship", A): "Refused",
        ("charge", C): "Failed", ("reserve", C): "Done",
    }
    refund = stack.lines("p-1")[("charge", C)]
    assert "gave up after 2 failed attempts" in refund.last_error and refund.failure_count == 2
    assert [(a["order_id"], a["failed_compensations"]) for a in stack.all_alerts()] == [("p-1", ["charge"])]
    assert [c.action for c in stack.claims("p-1")].count("refund") == 2  # one claim per counted attempt
    logs = stack.host_logs()
    assert "circuit breaker for payments" not in logs and "postponed" not in logs
    assert stack.remote.net("p-1") == {"inventory": {"reserve": 0}, "payments": {"charge": 1}}
    stack.assert_within_bound("p-1", submitted)
    stack.assert_remote_clean()


def test_a_failing_compensation_ends_in_error_with_one_alert_and_resubmit_finishes_it(stack, tmp_path):
    # The release never answers: each attempt (one call) times out.
    stack.remote.set_faults(script={"d-1/ship": ["permanent"], "d-1/release": ["always:hang"]}, slow_seconds=30)
    stack.start_hosts(MAX_FAILURES="2", AGENT_MAX_CALLS="1", REMOTE_CALL_TIMEOUT_SECONDS="2")
    submitted = utcnow()
    stack.send([("d-1", order_json("d-1"))])

    state = stack.wait_closed(["d-1"], timeout=40)["d-1"]
    assert state.process_state is ProcessState.ERROR and state.failed == (0,)
    assert "could not undo step(s) reserve" in state.last_error
    assert line_states(stack, "d-1") == {
        ("reserve", A): "Done", ("charge", A): "Done", ("ship", A): "Refused",
        ("charge", C): "Done", ("reserve", C): "Failed",
    }
    alerts = stack.all_alerts()
    assert [(a["order_id"], a["failed_compensations"]) for a in alerts] == [("d-1", ["reserve"])]
    assert stack.undone("payments") == {"d-1": ["refund"]}
    assert stack.undone("inventory") == {}  # no release call was ever answered: nothing undone
    assert stack.remote.net("d-1") == {"inventory": {"reserve": 1}, "payments": {"charge": 0}}
    stack.assert_within_bound("d-1", submitted)
    payments_calls = stack.remote.effects()["services"]["payments"]["calls"]

    # The operator fixes the cause, then resubmits: only the failed undo runs again.
    stack.remote.set_faults(service="inventory", script=None)
    resubmitted = ordersctl(stack, tmp_path, "resubmit", "d-1")
    assert resubmitted.returncode == 0, resubmitted.stderr
    state = stack.wait_closed(["d-1"], timeout=30)["d-1"]
    assert state.process_state is ProcessState.COMPENSATED and state.failed == ()
    assert line_states(stack, "d-1")[("reserve", C)] == "Done"
    assert [c.action for c in stack.claims("d-1")].count("refund") == 1  # the refund is not redone
    assert stack.remote.effects()["services"]["payments"]["calls"] == payments_calls
    assert stack.undone("payments") == {"d-1": ["refund"]} and stack.undone("inventory") == {"d-1": ["release"]}
    release_key = idempotency_key("d-1", "reserve", "release")
    assert stack.remote.effects()["services"]["inventory"]["by_key"][release_key] == 1
    assert net_zero(stack.remote.net("d-1"))
    assert stack.all_alerts() == []  # no second alert
    stack.assert_remote_clean()


def test_a_host_killed_mid_compensation_is_recovered_on_another_host(stack):
    # The release is applied, then its answer is held: kill the host while it waits.
    stack.remote.set_faults(script={"e-1/charge": ["permanent"], "e-1/release": ["slow"]}, slow_seconds=30)
    (first,) = stack.start_hosts(STEP_TIMEOUT_SECONDS="5", REMOTE_CALL_TIMEOUT_SECONDS="10")
    stack.send([("e-1", order_json("e-1"))])
    wait_until(
        lambda: stack.undone("inventory").get("e-1") == ["release"]
        and stack.remote.effects()["services"]["inventory"]["in_flight"] >= 1,
        timeout=20, what="the release to be applied with its answer in flight",
    )
    first.kill()
    stack.start_hosts()

    state = stack.wait_closed(["e-1"], timeout=40)["e-1"]
    assert state.process_state is ProcessState.COMPENSATED
    releases = [c for c in stack.claims("e-1") if c.action == "release"]
    assert len(releases) == 2 and releases[0].instance == first.instance_id != releases[1].instance
    undo = stack.lines("e-1")[("reserve", C)]
    assert undo.state.value == "Done" and undo.failure_count == 1 and undo.result["outcome"] == "undone"
    assert stack.undone("inventory") == {"e-1": ["release"]}
    # The re-run asked the remote first (its outcome was unknown) and was settled without a second release.
    inventory = stack.remote.effects()["services"]["inventory"]
    assert inventory["lookups"] >= 1 and inventory["by_key"][idempotency_key("e-1", "reserve", "release")] == 1
    assert net_zero(stack.remote.net("e-1"))
    stack.assert_remote_clean()


def test_duplicate_and_stale_responses_during_compensation_change_nothing(stack, reply_queue):
    # Windows to read each line's claim while it runs: ship and refund are throttled once
    # (Retry-After 2 s), and the release answers after 5 s (within its deadline): the
    # stale responses arrive while the release is in flight.
    stack.remote.set_faults(script={"f-1/ship": ["throttle", "permanent"], "f-1/refund": ["throttle"]},
                            retry_after_seconds=2)
    stack.remote.set_faults(service="inventory", script={"f-1/release": ["slow"]}, slow_seconds=5)
    stack.start_hosts(STEP_TIMEOUT_SECONDS="8", REMOTE_CALL_TIMEOUT_SECONDS="8")
    submitted = utcnow()
    stack.send([("f-1", order_json("f-1"))], reply_to=reply_queue)
    ship = stack.capture("f-1", "ship")
    refund = stack.capture("f-1", "charge", Kind.COMPENSATION)
    release = stack.capture("f-1", "reserve", Kind.COMPENSATION)
    refunded = stack.lines("f-1")[("charge", C)].result

    stale = [
        stack.response(ship, Outcome.FAILED_PERMANENT, error="HTTP 422: permanent"),  # the refusal again
        stack.response(ship, Outcome.SUCCEEDED, result={"late": True}),  # a late success of the refused step
        stack.response(refund, Outcome.SUCCEEDED, result=refunded),  # the refund's answer again
        stack.response(refund, Outcome.FAILED_PERMANENT, error="HTTP 409: late refusal"),
        stack.response(refund, Outcome.POSTPONED, error="payments unavailable", retry_after_seconds=1.0),
        stack.response(release, Outcome.FAILED_PERMANENT, kind=Kind.ACTION),  # the current attempt, another line
        stack.response(release, Outcome.FAILED_PERMANENT, attempt=release.state.attempt + 5),  # a future attempt
    ]
    stack.send_responses(stale)
    wait_until(lambda: stack.ignored("f-1") >= len(stale), timeout=4, what="the stale responses to be ignored")
    during = stack.record("f-1")
    assert during.state == release.state and during.lines == release.lines  # not even the ETag moved

    state = stack.wait_closed(["f-1"], timeout=30)["f-1"]
    assert state.process_state is ProcessState.COMPENSATED and state.failed == ()
    assert line_states(stack, "f-1") == {
        ("reserve", A): "Done", ("charge", A): "Done", ("ship", A): "Refused",
        ("charge", C): "Done", ("reserve", C): "Done",
    }
    assert [(c.kind, c.action) for c in stack.claims("f-1")] == [
        (A, "reserve"), (A, "charge"), (A, "ship"), (C, "refund"), (C, "release"),
    ]
    assert stack.undone("payments") == {"f-1": ["refund"]} and stack.undone("inventory") == {"f-1": ["release"]}
    stack.assert_within_bound("f-1", submitted)

    # The same responses and the release's own answer again, once the order is Compensated.
    final, calls, ignored = stack.record("f-1"), stack.remote.effects()["calls"], stack.ignored("f-1")
    released = stack.lines("f-1")[("reserve", C)].result
    stack.send_responses([*stale, stack.response(release, Outcome.SUCCEEDED, result=released)])
    wait_until(lambda: stack.ignored("f-1") >= ignored + len(stale) + 1, timeout=10,
               what="the replayed responses to be ignored")
    assert stack.record("f-1") == final
    assert stack.remote.effects()["calls"] == calls
    assert stack.all_alerts() == []
    assert stack.events(reply_queue) == [
        ("received", None), ("processing", "reserve"), ("processing", "charge"), ("processing", "ship"),
        ("compensating", "charge"), ("compensating", "reserve"), ("compensated", None),
    ]
    assert net_zero(stack.remote.net("f-1"))
    stack.assert_remote_clean()
