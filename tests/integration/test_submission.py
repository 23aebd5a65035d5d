"""The submission function, called directly with a fully populated Service Bus message,
against Azurite and the Service Bus emulator."""

from __future__ import annotations

import json
import time

from azure.servicebus import ServiceBusClient

from core.models import Nudge, ProcessState
from adapters.wiring import services
from devtools.orders import order_json
from scheduler.blueprint import submit_order
from tests.factories import Captured, servicebus_message
from tests.fixtures.app import as_host, take_nudges

handler = as_host(submit_order)  # its nudge goes through a queue output binding


def submit(body: bytes, **properties) -> Captured:
    """Submit, and capture the nudge the submission put on its order's scheduler queue (if any)."""
    handler(servicebus_message(body, **properties))
    nudge = Captured()
    taken = take_nudges(services().nudger)
    assert len(taken) <= 1, taken
    if taken:
        nudge.set(taken[0].model_dump_json(exclude_none=True))
    return nudge


def test_valid_order_is_written_pending_and_nudged(app_settings):
    nudge = submit(order_json("o-1"))
    state = services().store.get("o-1")
    assert state.process_state is ProcessState.PENDING and state.attempt == 0
    hint = Nudge.model_validate_json(nudge.value)
    assert hint.order_id == "o-1" and hint.state.etag == state.etag  # lets the claim skip a read
    assert services().rejections.list() == []


def test_malformed_and_invalid_messages_are_kept_whole_with_the_reason(app_settings):
    cases = {
        b"{not json": "invalid order",
        order_json("o-2", total=1.5): "not a JSON number",
        order_json("o/3"): "order_id",
        b"\xff\xfe": "order",
    }
    for i, (body, reason) in enumerate(cases.items()):
        nudge = submit(body, message_id=f"bad-{i}")
        assert nudge.value is None
    kept = {row["MessageId"]: row for row in services().rejections.list()}
    for i, (body, reason) in enumerate(cases.items()):
        assert kept[f"bad-{i}"]["Body"] == body
        assert reason in kept[f"bad-{i}"]["Reason"]
    assert services().store.active_ids() == []


def test_an_order_whose_reason_would_overflow_a_table_string_is_rejected_with_the_reason_clipped(app_settings):
    """A key of 17,000 emoji (68 KB, under Service Bus Standard's 256 KB) is named in the
    validation error: the reason is kept to what a Table string property holds (32,768
    UTF-16 units; an emoji takes two), so the rejection is written, not retried until the
    message is dead-lettered."""
    body = json.loads(order_json("o-emoji"))
    body["\U0001F600" * 17_000] = 1
    submit(json.dumps(body, ensure_ascii=False).encode(), message_id="emoji")
    (row,) = services().rejections.list()
    assert row["MessageId"] == "emoji" and "invalid order" in row["Reason"]
    assert len(row["Reason"].encode("utf-16-le")) <= 2 * 32_768
    assert json.loads(row["Body"]) == body


def test_non_json_content_type_is_rejected(app_settings):
    submit(order_json("o-4"), content_type="text/plain", message_id="txt")
    (row,) = services().rejections.list()
    assert "content type" in row["Reason"] and row["ContentType"] == "text/plain"


def test_duplicate_message_is_a_no_op_but_nudges_a_pending_order_again(app_settings):
    first = submit(order_json("o-5"))
    before = services().store.get("o-5")
    again = submit(order_json("o-5"), delivery_count=2)
    assert services().store.get("o-5") == before
    assert Nudge.model_validate_json(again.value).state == Nudge.model_validate_json(first.value).state


def test_same_id_with_different_content_is_rejected_and_the_original_kept(app_settings):
    submit(order_json("o-6"))
    before = services().store.read("o-6")
    submit(order_json("o-6", customer_id="mallory"), message_id="second")
    assert services().store.read("o-6") == before
    (row,) = services().rejections.list()
    assert row["OrderId"] == "o-6" and "different content" in row["Reason"]
    assert json.loads(row["Body"])["customer_id"] == "mallory"


def test_reply_to_receives_a_received_event_and_a_missing_queue_does_not_block(app_settings, servicebus_emulator):
    replies = "replies-o7"
    servicebus_emulator.declare_queue(replies)
    submit(order_json("o-7"), reply_to=replies)
    started = time.monotonic()
    submit(order_json("o-8"), reply_to="no-such-queue")
    assert time.monotonic() - started < 5, "a broken reply queue held the order up"
    assert services().store.get("o-8").process_state is ProcessState.PENDING
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_receiver(replies, max_wait_time=5) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            event = json.loads(str(message))
            receiver.complete_message(message)
    assert event["order_id"] == "o-7" and event["status"] == "received"
    assert message.correlation_id == "o-7"


def test_an_order_too_large_for_the_nudge_travels_without_its_document(app_settings, monkeypatch):
    from scheduler import dispatch, submission
    from scheduler.blueprint import scheduler

    monkeypatch.setattr(submission, "MAX_NUDGE_DOCUMENT_BYTES", 10)
    nudge = Nudge.model_validate_json(submit(order_json("o-9")).value)
    assert nudge.document is None and nudge.state is not None
    request = dispatch.schedule(nudge, scheduler=scheduler(services()), now=nudge.state.created_at)
    assert request.order["order_id"] == "o-9"  # read from the order row


def test_reply_queue_senders_are_bounded(app_settings, servicebus_emulator):
    from adapters.messaging import MAX_OPEN_SENDERS
    from core.models import Status, StatusEvent, utcnow

    publisher = services().publisher
    queues = [f"many-replies-{i}" for i in range(MAX_OPEN_SENDERS + 8)]
    for queue in queues:
        servicebus_emulator.declare_queue(queue)
        assert publisher.send_status(StatusEvent(order_id="o-10", status=Status.RECEIVED, time=utcnow()), queue=queue)
    assert len(publisher._links) <= MAX_OPEN_SENDERS
    assert all(servicebus_emulator.message_counts(q)["active"] == 1 for q in queues)


def test_any_clients_odd_properties_are_kept_as_rejections_never_retried(app_settings):
    import uuid

    cases = [
        dict(message_id=uuid.UUID("6c1f2f55-3c1b-4f7e-9a51-4d9e3b0c2a11"), body=b"{not json"),  # a UUID id
        dict(message_id=12345678901234, body=b"{not json"),  # a ulong id
        dict(message_id="long-ct", body=order_json("o-11"), content_type="x" * 40_000),
        dict(message_id="m" * 40_000, body=b"[]"),
        dict(message_id="bin-ct", body=order_json("o-12"), content_type=b"application/xml"),
        dict(message_id="text-json", body=order_json("o-13"), content_type="text/json"),
    ]
    for case in cases:
        body = case.pop("body")
        assert submit(body, **case).value is None  # returned normally: the message completes
    rows = services().rejections.list()
    assert len(rows) == len(cases)
    assert all(len(row["MessageId"]) <= 1_100 and len(row["ContentType"]) <= 1_100 for row in rows)
    assert {row["MessageId"] for row in rows} >= {"6c1f2f55-3c1b-4f7e-9a51-4d9e3b0c2a11", "12345678901234", "long-ct"}
    assert services().store.active_ids() == []


def test_a_reply_to_naming_one_of_the_apps_own_queues_is_ignored_with_a_note_on_the_order(app_settings):
    submit(order_json("o-14"), reply_to=app_settings["ALERTS_QUEUE"], message_id="o-14")
    state = services().store.get("o-14")
    assert state.process_state is ProcessState.PENDING and state.reply_to is None
    assert f"ReplyTo {app_settings['ALERTS_QUEUE']!r} ignored" in state.note and "app's own queues" in state.note
    submit(order_json("o-16"), reply_to="not a queue?" * 20, message_id="o-16")
    note = services().store.get("o-16").note
    assert "not a valid queue name" in note and len(note) < 300


def test_a_reply_to_with_a_final_newline_or_a_dot_segment_is_no_queue_name_and_is_ignored_with_a_note(app_settings):
    """A regular expression's ``$`` lets a final newline by, and ``a/../alerts`` is made of
    queue-name characters: neither names a queue the broker would resolve as written."""
    for n, reply_to in enumerate(["my-status\n", f"a/../{app_settings['ALERTS_QUEUE']}", "my/./status", "my//status"]):
        order_id = f"o-rt-{n}"
        submit(order_json(order_id), reply_to=reply_to, message_id=order_id)
        state = services().store.get(order_id)
        assert state.reply_to is None, reply_to
        assert "not a valid queue name" in (state.note or ""), (reply_to, state.note)


def test_a_reply_to_naming_an_own_queue_in_another_spelling_is_ignored_and_nothing_lands_there(
    app_settings, servicebus_emulator
):
    """The broker resolves "alerts/", "ALERTS", "/alerts", a namespace's path to alerts or
    its dead-letter subqueue to the alerts queue: each is one of the app's own queues."""
    alerts = app_settings["ALERTS_QUEUE"]
    spellings = [f"{alerts}/", alerts.upper(), f"/{alerts}", f" {alerts} ", f"{alerts}//", f"{alerts}/$DeadLetterQueue",
                 f"ns.servicebus.windows.net/{alerts}", f"sb://ns.servicebus.windows.net/{alerts}",
                 f"{app_settings['AGENT_RESPONSES_QUEUE'].title()}/", f"{app_settings['ORDERS_QUEUE']}/"]
    for n, reply_to in enumerate(spellings):
        order_id = f"o-sp-{n}"
        submit(order_json(order_id), reply_to=reply_to, message_id=order_id)
        state = services().store.get(order_id)
        assert state.reply_to is None, reply_to
        assert "ignored" in (state.note or "") and "no status events are sent" in state.note, (reply_to, state.note)
    counts = servicebus_emulator.message_counts(alerts)
    assert counts["active"] + counts["dead_letter"] == 0, counts  # no status event reached the alerts queue


def test_a_rejected_order_is_told_to_its_reply_to_queue_with_the_reason(app_settings, servicebus_emulator):
    replies = "replies-rejected"
    servicebus_emulator.declare_queue(replies)
    submit(order_json("o-15", total="99.00"), reply_to=replies, message_id="o-15:x")
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_receiver(replies, max_wait_time=5) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            event = json.loads(str(message))
            receiver.complete_message(message)
    assert (event["order_id"], event["status"]) == ("o-15", "rejected")
    assert "total" in event["detail"]
