"""The order lifecycle end to end under faults: final state, remote effects, alerts and
status events, on the whole local stack running the real function_app.py."""

from __future__ import annotations

import json
import re

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from core.models import STEP, AgentResponse, Outcome, ProcessState
from adapters.wiring import services
from devtools.orders import order_json
from tests.e2e.conftest import processed, wait_until


def test_happy_path_and_transient_faults_are_processed_once(stack):
    stack.remote.set_faults(script={"t-2": ["transient", "drop", "throttle"]}, retry_after_seconds=1)
    stack.emulator.declare_queue("replies-t1")
    stack.start_hosts()
    stack.send([("t-1", order_json("t-1"))], reply_to="replies-t1")
    stack.send([("t-2", order_json("t-2"))])
    states = stack.wait_terminal(["t-1", "t-2"], timeout=30)
    assert processed(states) == 2
    assert stack.remote.effects()["by_order"] == {"t-1": 1, "t-2": 1}
    assert [e["status"] for e in stack.statuses("replies-t1", 3)] == ["received", "processing", "processed"]
    assert services().store.active_ids() == []


def test_permanent_fault_is_error_with_an_alert_and_a_failed_event(stack):
    stack.remote.set_faults(script={"p-1": ["always:permanent"]})
    stack.emulator.declare_queue("replies-p1")
    stack.start_hosts()
    stack.send([("p-1", order_json("p-1"))], reply_to="replies-p1")
    states = stack.wait_terminal(["p-1"], timeout=30)
    assert states["p-1"].process_state is ProcessState.ERROR and "422" in states["p-1"].last_error
    assert [a["order_id"] for a in stack.alerts(1)] == ["p-1"]
    assert stack.statuses("replies-p1", 3)[-1]["status"] == "failed"
    assert stack.remote.effects()["total"] == 0


def test_lost_response_is_recovered_by_the_supervisor_with_one_effect(stack):
    # The remote applies the step but answers after the deadline: the agent gives up
    # and sends nothing; the supervisor resets the row and the re-run gets the first result.
    stack.remote.set_faults(script={"l-1": ["slow"]}, slow_seconds=10)
    stack.start_hosts(AGENT_MAX_CALLS="1")  # one call per attempt: no retry hides the lost answer
    stack.send([("l-1", order_json("l-1"))])
    state = stack.wait_terminal(["l-1"], timeout=40)["l-1"]
    assert state.process_state is ProcessState.PROCESSED
    assert state.failure_count == 1 and state.attempt == 2
    assert stack.remote.effects()["by_order"] == {"l-1": 1}


def test_agent_killed_mid_call_is_recovered_on_another_host(stack):
    stack.remote.set_faults(script={"k-1": ["slow"]}, slow_seconds=30)
    (first,) = stack.start_hosts(STEP_TIMEOUT_SECONDS="5", REMOTE_CALL_TIMEOUT_SECONDS="10")
    stack.send([("k-1", order_json("k-1"))])
    wait_until(lambda: stack.remote.effects()["in_flight"] >= 1, timeout=20, what="the agent's call to be in flight")
    first.kill()
    stack.start_hosts()
    state = stack.wait_terminal(["k-1"], timeout=40)["k-1"]
    assert state.process_state is ProcessState.PROCESSED and state.attempt >= 2
    assert stack.remote.effects()["by_order"] == {"k-1": 1}


def test_faults_beyond_the_threshold_end_in_error_and_are_not_retried(stack):
    stack.remote.set_faults(script={"h-1": ["always:hang"]}, slow_seconds=30)
    stack.start_hosts(MAX_FAILURES="2")
    stack.send([("h-1", order_json("h-1"))])
    state = stack.wait_terminal(["h-1"], timeout=40)["h-1"]
    assert state.process_state is ProcessState.ERROR and state.failure_count == 2
    assert [a["order_id"] for a in stack.alerts(1)] == ["h-1"]
    calls = stack.remote.effects()["calls"]
    sweeps = len(stack.hosts[0].invocations("supervise"))
    # Two more supervisor periods: nothing moves any more.
    wait_until(lambda: len(stack.hosts[0].invocations("supervise")) >= sweeps + 2, timeout=10, what="two more sweeps")
    assert stack.state("h-1") == state and stack.remote.effects()["calls"] == calls


def test_duplicate_order_messages(stack):
    stack.start_hosts()
    # The same MessageId twice: the orders queue's duplicate detection drops the repeat.
    stack.send([("d-1", order_json("d-1")), ("d-1", order_json("d-1"))])
    # A resend under a new MessageId (e.g. after the detection window) reaches the app: a no-op.
    stack.send([("d-1-resend", order_json("d-1"))])
    # The same order id with other content is rejected and kept; the original stays.
    stack.send([("d-1-other", order_json("d-1", customer_id="mallory"))])
    states = stack.wait_terminal(["d-1"], timeout=30)
    assert processed(states) == 1
    rejected = wait_until(lambda: services().rejections.list(), timeout=10, what="the conflicting order to be kept")
    assert [(r["MessageId"], "different content" in r["Reason"]) for r in rejected] == [("d-1-other", True)]
    document, _ = services().store.read("d-1")
    assert json.loads(document)["customer_id"] == "c-42"
    def handled() -> list[str]:
        return sorted(i.details.split("message_id=")[1].split()[0] for i in stack.hosts[0].invocations("submit_order"))

    wait_until(lambda: len(handled()) >= 3, timeout=10, what="three submissions to be logged")
    assert handled() == ["d-1", "d-1-other", "d-1-resend"]
    assert stack.remote.effects()["by_order"] == {"d-1": 1}


def test_duplicate_and_stale_agent_responses_change_nothing(stack):
    stack.start_hosts()
    stack.send([("r-1", order_json("r-1"))])
    before = stack.wait_terminal(["r-1"], timeout=30)["r-1"]
    responses = [
        AgentResponse(order_id="r-1", step=STEP, attempt=before.attempt, outcome=Outcome.FAILED_PERMANENT, error="dup"),
        AgentResponse(order_id="r-1", step=STEP, attempt=before.attempt - 1, outcome=Outcome.SUCCEEDED),
        AgentResponse(order_id="r-1", step=STEP, attempt=before.attempt + 5, outcome=Outcome.SUCCEEDED),
    ]
    with ServiceBusClient.from_connection_string(stack.connection_string) as client:
        with client.get_queue_sender(stack.settings["AGENT_RESPONSES_QUEUE"]) as sender:
            sender.send_messages([ServiceBusMessage(r.model_dump_json(), content_type="application/json") for r in responses])
    wait_until(
        lambda: stack.emulator.message_counts(stack.settings["AGENT_RESPONSES_QUEUE"]) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
        and len([i for i in stack.hosts[0].invocations("complete_step") if i.succeeded]) >= 4,
        timeout=20, what="the three extra responses to be handled",
    )
    assert stack.state("r-1") == before


def test_two_hosts_compete_on_300_orders_with_transient_faults(stack, report_figure):
    stack.remote.set_faults(rates={"transient": 0.1}, seed=7)
    hosts = stack.start_hosts(2, STEP_TIMEOUT_SECONDS="15", PENDING_TIMEOUT_SECONDS="15")
    ids = [f"c-{i:03d}" for i in range(300)]
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    states = stack.wait_terminal(ids, timeout=240)
    claims = _claims(stack)
    double = sum(1 for holders in claims.values() if len(holders) > 1)
    effects = stack.remote.effects()
    shares = [len(h.invocations("schedule_order")) for h in hosts]
    report_figure(
        f"two hosts, 300 orders, 10% transient: {processed(states)} Processed, {effects['total']} effects, "
        f"{double} double claims, claims per host {shares}"
    )
    assert processed(states) == 300
    assert effects["total"] == 300 and set(effects["by_order"].values()) == {1}
    assert double == 0 and len(claims) >= 300
    assert all(share > 0 for share in shares)


def test_two_supervisors_handle_each_expired_row_once(stack):
    ids = [f"s-{i:02d}" for i in range(20)]
    stack.remote.set_faults(script={order_id: ["hang"] for order_id in ids}, slow_seconds=30)
    stack.start_hosts(2, AGENT_MAX_CALLS="1")  # the first attempt of each order times out
    stack.send([(order_id, order_json(order_id)) for order_id in ids])
    states = stack.wait_terminal(ids, timeout=60)
    assert processed(states) == 20
    assert {s.failure_count for s in states.values()} == {1}
    resets = re.findall(r"order (s-\d\d) reset for retry", stack.host_logs())
    assert sorted(resets) == sorted(ids)  # each expiry acted on once, by one of the two supervisors
    assert stack.remote.effects()["total"] == 20


def _claims(stack) -> dict[tuple[str, int], set[str]]:
    found: dict[tuple[str, int], set[str]] = {}
    for host in stack.hosts:
        for order_id, attempt, instance in re.findall(r"order (\S+) attempt (\d+) claimed by (\S+)", host.log_text()):
            found.setdefault((order_id, int(attempt)), set()).add(instance)
    return found
