"""Hostile internal messages through the real host (devtools/corpus/hostile_messages.json):
someone with send rights on one internal queue forges or mangles the app's own messages
about an order that is already Processed. Every one is handled once (no redelivery, no
dead letter, no poison message), the drops are counted by reason, and the order, its
steps and the remote services are exactly as they were."""

from __future__ import annotations

from collections import Counter

from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from adapters import clients
from adapters.wiring import services
from core import names
from core.models import ProcessState, utcnow
from devtools.corpus.hostile import (
    INVENTORY_REQUESTS,
    NUDGES,
    RESPONSES,
    base_messages,
    hostile_body,
    load_hostile_messages,
)
from devtools.orders import order_json
from tests.e2e.conftest import wait_until

#: The function each queue triggers.
FUNCTIONS = {RESPONSES: "complete_step", NUDGES: "schedule_order", INVENTORY_REQUESTS: "run_inventory_agent"}
OPERATIONS = {RESPONSES: "agent_response", NUDGES: "nudge", INVENTORY_REQUESTS: "agent_request"}


def test_hostile_internal_messages_are_dropped_once_counted_and_change_nothing(stack):
    cases = load_hostile_messages()
    (host,) = stack.start_hosts()
    stack.send([("h-1", order_json("h-1")), ("h-2", order_json("h-2"))])
    stack.wait_closed(["h-1", "h-2"], timeout=60)
    before = stack.record("h-1")
    assert before.state.process_state is ProcessState.PROCESSED
    applied = {service: stack.applied(service).get("h-1") for service in ("inventory", "payments", "shipping")}
    baseline = {queue: len(host.invocations(function)) for queue, function in FUNCTIONS.items()}

    queues = {
        RESPONSES: stack.settings["AGENT_RESPONSES_QUEUE"],
        INVENTORY_REQUESTS: stack.settings[names.requests_queue_setting("inventory")],
    }
    bases = base_messages(before.state, before.document, utcnow())
    bodies = [
        (case, hostile_body(case, bases, current_etag=before.state.etag, other_order="h-2")) for case in cases
    ]
    with ServiceBusClient.from_connection_string(stack.connection_string) as client:
        for queue in (RESPONSES, INVENTORY_REQUESTS):
            with client.get_queue_sender(queues[queue]) as sender:
                for n, (case, body) in enumerate(bodies):
                    if case["queue"] == queue:
                        sender.send_messages(ServiceBusMessage(body, message_id=f"hostile-{n}", content_type="application/json"))
    nudges = clients.queue_client(services().settings, stack.settings[names.SCHEDULER_QUEUE_SETTING])
    for case, body in bodies:
        if case["queue"] == NUDGES:
            nudges.send_message(body)

    # Each handled once, and each invocation returned normally (nothing raised, so nothing redelivered).
    sent = Counter(case["queue"] for case in cases)
    for queue, function in FUNCTIONS.items():
        wait_until(lambda q=queue, f=function: len(host.invocations(f)) - baseline[q] >= sent[q], timeout=45,
                   what=f"{sent[queue]} hostile messages on {queue} to be handled")
    dropped = Counter((OPERATIONS[case["queue"]], case["expect"]["dropped"]) for case in cases if "dropped" in case["expect"])
    for (operation, reason), count in dropped.items():
        wait_until(
            lambda o=operation, r=reason, c=count: stack.metric(
                names.METRIC_MESSAGES_DROPPED, {names.ATTR_OPERATION: o, names.ATTR_DROP_REASON: r}) == c,
            timeout=20, what=f"{count} {operation} messages counted as dropped ({reason})",
        )
    for queue, function in FUNCTIONS.items():
        handled = host.invocations(function)[baseline[queue]:]
        assert len(handled) == sent[queue] and all(i.succeeded for i in handled), [i.details for i in handled]
    for queue in queues.values():
        counts = stack.emulator.message_counts(queue)
        assert counts["dead_letter"] == 0 and counts["active"] + counts["locked"] == 0, (queue, counts)
    poison = clients.queue_client(services().settings, stack.settings[names.SCHEDULER_QUEUE_SETTING] + "-poison")
    try:
        poisoned = list(poison.peek_messages(max_messages=32))
    except ResourceNotFoundError:  # never created: nothing was ever poisoned
        poisoned = []
    assert poisoned == []
    logs = stack.host_logs()
    assert logs.count("dropped as forged") == sum(1 for c in cases if c["expect"].get("dropped") == "forged")

    # The order, its steps and the remote services: exactly as before.
    after = stack.record("h-1")
    assert after.state == before.state and after.lines == before.lines
    assert {service: stack.applied(service).get("h-1") for service in applied} == applied
    assert not stack.undone("inventory").get("h-1") and not stack.undone("payments").get("h-1")
    assert stack.record("h-2").state.process_state is ProcessState.PROCESSED
    stack.assert_remote_clean()
