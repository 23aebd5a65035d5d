"""The order lifecycle end to end under faults: every order runs its three steps (reserve
at inventory, charge at payments, ship at shipping) on the whole local stack running the
real function_app.py; final state, step rows, remote effects, alerts and status events.
Compensation has its own file (test_compensation.py)."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter

from adapters.wiring import services
from core.models import Context, Outcome, ProcessState, idempotency_key, utcnow
from core.workflow import Kind
from devtools.fake_remote.ledger import confirmation_for
from devtools.orders import order_json
from tests.e2e.conftest import ACTIONS, processed, wait_until

A = Kind.ACTION.value
STEPS = ("reserve", "charge", "ship")


def assert_processed_once(stack, order_ids) -> None:
    """Each step's action applied exactly once per order at its service; nothing undone."""
    effects = stack.assert_remote_clean()
    for service, action in ACTIONS.items():
        assert stack.applied(service) == {order_id: [action] for order_id in order_ids}, service
        assert effects["services"][service]["undone"] == {}, service
    assert effects["total"] == 3 * len(order_ids)


def test_happy_path_and_transient_faults_are_processed_once(stack, reply_queue):
    # t-2: every service fails its first three calls for t-2 (each service has its own copy of the script).
    stack.remote.set_faults(script={"t-2": ["transient", "drop", "throttle"]}, retry_after_seconds=1)
    stack.start_hosts(STEP_TIMEOUT_SECONDS="4")  # room for the agent's retries, Retry-After included
    stack.send([("t-1", order_json("t-1"))], reply_to=reply_queue)
    stack.send([("t-2", order_json("t-2"))])

    states = stack.wait_closed(["t-1", "t-2"], timeout=40)
    assert processed(states) == 2
    assert_processed_once(stack, ["t-1", "t-2"])
    for order_id in ("t-1", "t-2"):
        lines = stack.lines(order_id)
        assert {key: line.state.value for key, line in lines.items()} == {(step, A): "Done" for step in STEPS}
        assert all(lines[(step, A)].result["confirmation"].startswith("cnf-") for step in STEPS)
    assert stack.remote.effects()["faults"]["transient"] == 3  # each service's first call for t-2
    assert stack.events(reply_queue) == [
        ("received", None), ("processing", "reserve"), ("processing", "charge"), ("processing", "ship"),
        ("processed", None),
    ]
    assert services().store.active_ids() == []


def test_lost_response_is_recovered_by_the_supervisor_with_one_effect(stack):
    # The remote applies the charge but answers after the deadline: the agent gives up and
    # sends nothing; the supervisor resets the row, and the re-run asks the remote first
    # (GET by idempotency key) and is settled with the first result.
    stack.remote.set_faults(script={"l-1/charge": ["slow"]}, slow_seconds=10)
    stack.start_hosts(AGENT_MAX_CALLS="1")  # one call per attempt: no retry hides the lost answer
    submitted = utcnow()
    stack.send([("l-1", order_json("l-1"))])

    state = stack.wait_closed(["l-1"], timeout=40)["l-1"]
    assert state.process_state is ProcessState.PROCESSED
    charge = stack.lines("l-1")[("charge", A)]
    assert (charge.failure_count, charge.attempt) == (1, 3) and state.attempt == 4
    assert [(c.step, c.attempt) for c in stack.claims("l-1")] == [
        ("reserve", 1), ("charge", 2), ("charge", 3), ("ship", 4),
    ]
    assert_processed_once(stack, ["l-1"])
    payments = stack.remote.effects()["services"]["payments"]
    assert payments["lookups"] == 1 and payments["by_key"] == {idempotency_key("l-1", "charge", "charge"): 1}
    # Settled with the first answer, whose confirmation the remote derives from the key.
    assert charge.result["confirmation"] == confirmation_for(idempotency_key("l-1", "charge", "charge"))
    stack.assert_within_bound("l-1", submitted)


def test_agent_killed_mid_call_is_recovered_on_another_host(stack):
    # Killed while shipping (a step the remote cannot look up): the re-run sends the
    # same key again and the remote replays its first answer.
    stack.remote.set_faults(script={"k-1/ship": ["slow"]}, slow_seconds=30)
    (first,) = stack.start_hosts(STEP_TIMEOUT_SECONDS="5", REMOTE_CALL_TIMEOUT_SECONDS="10")
    stack.send([("k-1", order_json("k-1"))])
    wait_until(lambda: stack.remote.effects()["services"]["shipping"]["in_flight"] >= 1, timeout=20,
               what="the agent's ship call to be in flight")
    first.kill()
    stack.start_hosts()

    state = stack.wait_closed(["k-1"], timeout=40)["k-1"]
    assert state.process_state is ProcessState.PROCESSED
    ships = [c for c in stack.claims("k-1") if c.step == "ship"]
    assert len(ships) == 2 and ships[0].instance == first.instance_id != ships[1].instance
    assert_processed_once(stack, ["k-1"])
    assert stack.remote.effects()["services"]["shipping"]["replays"] >= 1


def test_a_worker_process_killed_mid_call_is_started_again_by_its_host_and_the_order_finishes_once(stack):
    # The worker process dies while its agent's ship call is in flight (the host lives on): the
    # invocation fails, its request message is abandoned and delivered again to the worker the
    # host starts in its place, which sends the same key again; the remote replays its answer.
    stack.remote.set_faults(script={"w-1/ship": ["slow"]}, slow_seconds=6)
    (host,) = stack.start_hosts(STEP_TIMEOUT_SECONDS="20", REMOTE_CALL_TIMEOUT_SECONDS="10")
    stack.send([("w-1", order_json("w-1"))])
    wait_until(lambda: stack.remote.effects()["services"]["shipping"]["in_flight"] >= 1, timeout=20,
               what="the agent's ship call to be in flight")
    (worker,) = host.worker_pids
    os.kill(worker, signal.SIGKILL)

    state = stack.wait_closed(["w-1"], timeout=40)["w-1"]
    assert state.process_state is ProcessState.PROCESSED
    assert len(host.worker_pids) == 2 and host.running  # a new worker, the same host
    ships = [c for c in stack.claims("w-1") if c.step == "ship"]
    assert len(ships) == 1, "the redelivered request ran the same attempt: no new claim"
    assert_processed_once(stack, ["w-1"])
    assert stack.remote.effects()["services"]["shipping"]["replays"] >= 1
    assert "Language Worker Process exited" in host.log_text()


def test_a_step_that_cannot_be_undone_ends_in_error_when_it_gives_up_and_is_not_retried(stack):
    # Ship never answers. Its outcome is unknown and it has no undo: the order stops in
    # Error for an operator, reserve and charge stay applied, and nothing moves any more.
    stack.remote.set_faults(script={"h-1/ship": ["always:hang"]}, slow_seconds=30)
    stack.start_hosts(MAX_FAILURES="2", AGENT_MAX_CALLS="1", REMOTE_CALL_TIMEOUT_SECONDS="2")
    submitted = utcnow()
    stack.send([("h-1", order_json("h-1"))])

    state = stack.wait_closed(["h-1"], timeout=40)["h-1"]
    assert state.process_state is ProcessState.ERROR and "cannot be undone" in state.last_error
    lines = stack.lines("h-1")
    assert {key: line.state.value for key, line in lines.items()} == {
        ("reserve", A): "Done", ("charge", A): "Done", ("ship", A): "Exhausted",
    }
    assert lines[("ship", A)].failure_count == 2
    alerts = stack.all_alerts()
    assert [a["order_id"] for a in alerts] == ["h-1"] and "ship" in alerts[0]["last_error"]
    assert stack.remote.net("h-1") == {"inventory": {"reserve": 1}, "payments": {"charge": 1}}
    assert stack.remote.effects()["undos"] == 0 and not any(c.kind != A for c in stack.claims("h-1"))
    stack.assert_within_bound("h-1", submitted)
    calls, record = stack.remote.effects()["calls"], stack.record("h-1")
    sweeps = len(stack.hosts[0].invocations("supervise"))
    # Two more supervisor periods: nothing moves any more.
    wait_until(lambda: len(stack.hosts[0].invocations("supervise")) >= sweeps + 2, timeout=10, what="two more sweeps")
    assert stack.record("h-1") == record and stack.remote.effects()["calls"] == calls
    stack.assert_remote_clean()


def test_duplicate_order_messages(stack):
    stack.start_hosts()
    # The same MessageId twice: the orders queue's duplicate detection drops the repeat.
    stack.send([("d-1", order_json("d-1")), ("d-1", order_json("d-1"))])
    # A resend under a new MessageId (e.g. after the detection window) reaches the app: a no-op.
    stack.send([("d-1-resend", order_json("d-1"))])
    # The same order id with other content is rejected and kept; the original stays.
    stack.send([("d-1-other", order_json("d-1", customer_id="mallory"))])
    states = stack.wait_closed(["d-1"], timeout=30)
    assert processed(states) == 1
    rejected = wait_until(lambda: services().rejections.list(), timeout=10, what="the conflicting order to be kept")
    assert [(r["MessageId"], "different content" in r["Reason"]) for r in rejected] == [("d-1-other", True)]
    assert '"customer_id":"c-42"' in stack.record("d-1").document

    def handled() -> list[str]:
        return sorted(i.details.split("message_id=")[1].split()[0] for i in stack.hosts[0].invocations("submit_order"))

    wait_until(lambda: len(handled()) >= 3, timeout=10, what="three submissions to be logged")
    assert handled() == ["d-1", "d-1-other", "d-1-resend"]
    assert len(stack.claims("d-1")) == 3
    assert_processed_once(stack, ["d-1"])


def test_duplicate_and_stale_agent_responses_change_nothing(stack):
    # Read each line's claim (the fence its request carries) while it runs: the charge
    # and the ship are throttled once (Retry-After 2 s) to leave the time to read it.
    # r-p runs reserve and charge at once (order-parallel): its group is read while both run.
    stack.remote.set_faults(script={"r-1/charge": ["throttle"], "r-1/ship": ["throttle"], "r-p/charge": ["throttle"]},
                            retry_after_seconds=2)
    stack.start_hosts(STEP_TIMEOUT_SECONDS="4")
    stack.send([("r-1", order_json("r-1")), ("r-p", order_json("r-p", workflow="order-parallel"))])
    group = stack.capture("r-p", "charge")
    charge = stack.capture("r-1", "charge")
    ship = stack.capture("r-1", "ship")
    stack.wait_closed(["r-1", "r-p"], timeout=30)
    before, calls = stack.record("r-1"), stack.remote.effects()["calls"]
    grouped = stack.record("r-p")
    assert before.state.process_state is ProcessState.PROCESSED
    assert grouped.state.process_state is ProcessState.PROCESSED
    results = {line.step: line.result for line in before.lines}
    line = next(line for line in group.state.group if line.step == "charge")
    forged = group.state.model_copy(update={"group": tuple(
        other.model_copy(update={"attempt": other.attempt + 7}) if other.step == "charge" else other
        for other in group.state.group
    )})

    responses = [
        stack.response(charge, Outcome.SUCCEEDED, result=results["charge"]),  # the charge's answer again
        stack.response(charge, Outcome.FAILED_PERMANENT, error="HTTP 422: late refusal"),  # stale
        stack.response(ship, Outcome.SUCCEEDED, result=results["ship"]),  # the last answer again
        stack.response(ship, Outcome.FAILED_PERMANENT, error="HTTP 422: late refusal"),
        stack.response(ship, Outcome.POSTPONED, error="shipping unavailable", retry_after_seconds=1.0),
        stack.response(ship, Outcome.FAILED_PERMANENT, attempt=ship.state.attempt + 5),  # a future attempt
    ]
    in_group = [
        # a line of the group already done, answered again; then refused late
        stack.response(group, Outcome.SUCCEEDED, step="charge", attempt=line.attempt,
                       result=next(r.result for r in grouped.lines if r.step == "charge")),
        stack.response(group, Outcome.FAILED_PERMANENT, step="charge", attempt=line.attempt, error="HTTP 422: late"),
        # a line that is not in flight in the fence it carries (ship is not of the group)
        stack.response(group, Outcome.FAILED_PERMANENT, step="ship", attempt=line.attempt, error="HTTP 422"),
        # a forged fence for one line of the group: an attempt the order never gave
        stack.response(group, Outcome.FAILED_PERMANENT, step="charge", attempt=line.attempt + 7, error="HTTP 422",
                       context=Context(fence=forged, order=json.loads(group.document), results={})),
    ]
    stack.send_responses([*responses, *in_group])
    wait_until(lambda: stack.ignored("r-p") >= len(in_group), timeout=15, what="the group's extra responses ignored")
    assert stack.record("r-p") == grouped
    wait_until(lambda: stack.ignored("r-1") >= len(responses), timeout=15, what="the extra responses to be ignored")
    wait_until(lambda: stack.waiting(stack.settings["AGENT_RESPONSES_QUEUE"]) == 0, timeout=10,
               what="the responses queue to be empty")
    assert stack.record("r-1") == before  # the state row (its ETag too) and the step rows
    assert stack.remote.effects()["calls"] == calls
    assert_processed_once(stack, ["r-1", "r-p"])


def test_two_hosts_compete_on_300_orders_with_transient_faults(stack, report_figure):
    stack.remote.set_faults(rates={"transient": 0.1}, seed=7)
    hosts = stack.start_hosts(2, STEP_TIMEOUT_SECONDS="15", PENDING_TIMEOUT_SECONDS="15")
    ids = [f"c-{i:03d}" for i in range(300)]
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    states = stack.wait_closed(ids, timeout=300)
    claims = _claims(stack)
    double = sum(1 for holders in claims.values() if len(holders) > 1)
    effects = stack.remote.effects()
    by_instance = Counter(claim.instance for claim in stack.claims())
    shares = [by_instance[host.instance_id] for host in hosts]
    report_figure(
        f"two hosts, 300 three-step orders, 10% transient: {processed(states)} Processed, {effects['total']} effects "
        f"({effects['faults']['transient']} transient faults), {double} double claims, {len(claims)} claims, "
        f"claims per host {shares}"
    )
    assert processed(states) == 300
    assert_processed_once(stack, ids)
    assert double == 0 and len(claims) >= 900
    assert all(share > 0 for share in shares)


def test_two_supervisors_handle_each_expired_row_once(stack):
    ids = [f"s-{i:02d}" for i in range(20)]
    # The first reserve call of each order hangs: its first attempt times out.
    stack.remote.set_faults(script={f"{order_id}/reserve": ["hang"] for order_id in ids}, slow_seconds=30)
    # 20 requests whose first attempts all time out are, to a breaker, a service that is
    # down: keep it closed (this test is about the supervisors).
    stack.start_hosts(2, AGENT_MAX_CALLS="1", BREAKER_MINIMUM_THROUGHPUT="50")
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    states = stack.wait_closed(ids, timeout=60)
    assert processed(states) == 20
    for order_id in ids:
        reserve = stack.lines(order_id)[("reserve", A)]
        assert (reserve.failure_count, reserve.attempt) == (1, 2), order_id
    resets = re.findall(r"order (s-\d\d) reset for retry", stack.host_logs())
    assert sorted(resets) == sorted(ids)  # each expiry acted on once, by one of the two supervisors
    assert_processed_once(stack, ids)


def _claims(stack) -> dict[tuple[str, int], set[str]]:
    """Who claimed each (order, attempt): more than one instance would be a double claim."""
    found: dict[tuple[str, int], set[str]] = {}
    for claim in stack.claims():
        found.setdefault((claim.order_id, claim.attempt), set()).add(claim.instance)
    return found
