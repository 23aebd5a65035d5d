"""The bad-input corpora through the real orders queue: bad order bodies mixed with valid
orders, and messages odd at the AMQP level from any client."""

from __future__ import annotations

from collections import Counter

from adapters.wiring import services
from core.models import ProcessState
from devtools.orders import bad_order_body, load_bad_orders, load_odd_messages, odd_message, order_json
from ordersctl.peek import peek
from tools.funchost.tests.support import rewritten_on_the_wire
from tests.e2e.conftest import processed, wait_until


def test_every_bad_case_is_rejected_with_its_reason_and_valid_orders_flow(stack):
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    cases = load_bad_orders()
    stack.start_hosts()
    valid = [f"ok-{i:03d}" for i in range(len(cases))]
    with ServiceBusClient.from_connection_string(stack.connection_string) as client:
        with client.get_queue_sender(stack.settings["ORDERS_QUEUE"]) as sender:
            for i, case in enumerate(cases):
                sender.send_messages(ServiceBusMessage(order_json(valid[i]), message_id=valid[i], content_type="application/json"))
                sender.send_messages(
                    ServiceBusMessage(bad_order_body(case, f"bad-{i}"), message_id=f"case-{i}",
                                      content_type=case.get("content_type", "application/json"))
                )
    states = stack.wait_terminal(valid, timeout=120)
    assert processed(states) == len(valid)
    kept = wait_until(lambda: (rows := services().rejections.list(limit=1000)) and len(rows) >= len(cases) and rows,
                      timeout=60, what="every bad case to be kept")
    by_message = {row["MessageId"]: row for row in kept}
    for i, case in enumerate(cases):
        row = by_message[f"case-{i}"]
        assert case["reason"] in row["Reason"], (case["name"], row["Reason"])
        assert row["Body"] == bad_order_body(case, f"bad-{i}"), case["name"]  # kept whole, whatever its size
    # Never retried in a loop: each bad message was handled once, and nothing was dead-lettered.
    def deliveries() -> Counter:
        return Counter(
            inv.details.split("message_id=")[1].split()[0]
            for inv in stack.hosts[0].invocations("submit_order") if "message_id=case-" in inv.details
        )

    wait_until(lambda: len(deliveries()) == len(cases), timeout=10, what="every bad case's invocation to be logged")
    assert set(deliveries().values()) == {1}
    assert stack.emulator.message_counts(stack.settings["ORDERS_QUEUE"])["dead_letter"] == 0


def test_odd_messages_from_any_client_each_end_as_expected_and_none_is_retried(stack):
    """Messages odd at the AMQP level (devtools/corpus/odd_messages.json): ids of other
    types, 40,000-character properties, binary properties, client-set annotations, trace
    properties that are not ASCII or not W3C, keys that are not strings, value and sequence
    bodies, a decimal128. Each is rejected with its reason, processed (and completed: the
    queue ends empty), or, where the Functions host itself cannot read it, dead-lettered
    with that reason; none is delivered twice, and the host keeps going."""
    from azure.servicebus import ServiceBusClient, ServiceBusSubQueue

    cases = load_odd_messages()
    (host,) = stack.start_hosts()
    ids = [f"odd-{i}" for i in range(len(cases))]
    with ServiceBusClient.from_connection_string(stack.connection_string) as client:
        with client.get_queue_sender(stack.settings["ORDERS_QUEUE"]) as sender:
            for order_id, case in zip(ids, cases):
                rewrites = [(bytes.fromhex(old), bytes.fromhex(new)) for old, new in case.get("wire_rewrite", [])]
                with rewritten_on_the_wire(*rewrites):
                    sender.send_messages(odd_message(case, order_id))

    processed_ids = [order_id for order_id, case in zip(ids, cases) if "processed" in case["expect"]]
    rejected = [(order_id, case) for order_id, case in zip(ids, cases) if "rejected" in case["expect"]]
    dead = [case for case in cases if "dead_lettered" in case["expect"]]
    states = stack.wait_closed(processed_ids, timeout=60)
    assert {s.process_state for s in states.values()} == {ProcessState.PROCESSED}
    for order_id, case in zip(ids, cases):
        if "note" in case["expect"]:
            assert case["expect"]["note"] in (states[order_id].note or ""), case["name"]
    rows = wait_until(lambda: (r := services().rejections.list(limit=1000)) and len(r) >= len(rejected) and r,
                      timeout=30, what="every rejected case to be kept")
    for order_id, case in rejected:
        expect = case["expect"]
        wanted = expect.get("message_id", order_id).replace("ORDER_ID", order_id)

        def matches(row, expect=expect, wanted=wanted) -> bool:
            if "message_id_starts" in expect:
                return row["MessageId"].startswith(expect["message_id_starts"])
            return row["MessageId"] == wanted

        (row,) = [row for row in rows if matches(row)]
        assert expect["rejected"] in row["Reason"], (case["name"], row["Reason"])
        assert len(row["MessageId"]) <= expect.get("message_id_max", 1100), case["name"]
        assert len(row["ContentType"]) <= expect.get("content_type_max", 1100), case["name"]
    orders_queue = stack.settings["ORDERS_QUEUE"]
    wait_until(lambda: stack.emulator.message_counts(orders_queue)["dead_letter"] == len(dead), timeout=30,
               what="the unreadable messages to be dead-lettered")
    # Peeked as `ordersctl dead-letters` peeks: the SDK's own peek fails on the decimal128 case.
    with ServiceBusClient.from_connection_string(stack.connection_string) as client:
        with client.get_queue_receiver(orders_queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            peeked = peek(receiver, len(dead) + 5)
    letters = [item.message for item in peeked]
    assert sorted(m.dead_letter_reason for m in letters) == sorted(c["expect"]["dead_lettered"] for c in dead)
    assert all(m.dead_letter_error_description and m.delivery_count <= 1 for m in letters)
    assert [s.part for item in peeked for s in item.skipped] == ["application property 'amount'"]
    counts = stack.emulator.message_counts(orders_queue)
    assert counts["active"] + counts["locked"] == 0
    # Each message the app saw was handled once: no invocation failed, none was retried.
    invocations = host.invocations("submit_order")
    assert invocations and all(inv.succeeded for inv in invocations)
    assert len(invocations) == len(cases) - len(dead)
    # The host is alive and takes the next order.
    stack.send([("odd-after", order_json("odd-after"))])
    assert stack.wait_closed(["odd-after"], timeout=30)["odd-after"].process_state is ProcessState.PROCESSED
