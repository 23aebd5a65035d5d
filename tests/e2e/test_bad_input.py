"""The bad-input corpus through the real orders queue, mixed with valid orders."""

from __future__ import annotations

from collections import Counter

from adapters.wiring import services
from devtools.orders import bad_order_body, load_bad_orders, order_json
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
