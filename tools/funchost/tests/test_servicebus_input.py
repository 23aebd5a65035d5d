"""Any Service Bus client, any input: a function gets what the real Functions host and Python
worker would hand it, and a message that cannot be handed over is dead-lettered at once.

Messages are sent with the real ``azure-servicebus`` SDK over real sockets to the project's
emulator; where that SDK cannot produce an AMQP type other clients send (a ``long`` message
id, a ``symbol`` reply-to, a ``char`` property), the test rewrites the encoded message on its
way out, byte for byte (:func:`rewritten_on_the_wire`). The expected values follow the real
host's conversion code (README.md, "What a Service Bus function receives").
"""

from __future__ import annotations

import base64
import decimal
import math
import random
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.functions.servicebus import ServiceBusMessageInConverter
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageProperties

from tools.funchost.servicebus_message import BindingFailed, function_message
from tools.funchost.servicebus_wire import DeliveryTap

from .support import APP_DIR, as_the_worker_decodes, eventually, host_env, receive, records, rewritten_on_the_wire

UUID_ID = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
LONG_ID = 0x0102030405060708  # sent as an AMQP ulong, rewritten to a long
SYMBOL_REPLY_TO = "funchost-symbol-reply"  # sent as a string, rewritten to a symbol
CHAR_KEY = b"\xa1\x04char"  # an application property "char" = uint 0x20AC, rewritten to the char '€'
DECIMAL32_KEY = b"\xa1\x05dec32"  # an application property "dec32" = uint, rewritten to a decimal32


def _typed(kind: str, value):
    """An AMQP value of a given type, as the Python SDK's encoder takes it."""
    return {"TYPE": kind, "VALUE": value}


def _described(descriptor: bytes, value):
    return _typed("DESCRIBED", (_typed("SYMBOL", descriptor), value))


def _send(connection_string: str, queue: str, *messages, rewrite: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    with rewritten_on_the_wire(*rewrite):
        with ServiceBusClient.from_connection_string(connection_string) as client:
            with client.get_queue_sender(queue) as sender:
                for message in messages:
                    sender.send_messages(message)


def _message(tag: str, **properties) -> AmqpAnnotatedMessage:
    """A message whose body is ``tag`` (not JSON: its fields would join the binding data)."""
    annotations = properties.pop("annotations", None)
    application_properties = properties.pop("application_properties", None)
    return AmqpAnnotatedMessage(
        data_body=tag.encode(),
        properties=AmqpMessageProperties(**properties),
        annotations=annotations,
        application_properties=application_properties,
    )


def _seen(record_dir, tags: list[str]) -> dict[str, dict]:
    def by_tag():
        found = {r["body"]: r for r in records(record_dir, "sb_record", "start") if r["body"] in tags}
        return found if len(found) == len(tags) else None

    return eventually(by_tag, what=f"invocations for {tags}")


@pytest.fixture
def sb(funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path):
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path,
        lock_duration=timedelta(seconds=30), max_delivery_count=5, enabled=("sb_record",),
    )
    (host,) = funchost.start(APP_DIR, env=env)
    return host, names["FH_SB_QUEUE"], tmp_path


def test_message_ids_and_addresses_of_any_amqp_type_reach_the_function_as_strings(sb, servicebus_emulator):
    host, queue, record_dir = sb
    _send(
        servicebus_emulator.connection_string,
        queue,
        _message("uuid-id", message_id=UUID_ID, correlation_id=uuid.UUID(int=1)),
        _message("ulong-id", message_id=2**64 - 1, correlation_id=7),
        _message("binary-id", message_id=b"\x00\x01\xfe\xff", correlation_id=b"abc"),
        _message("long-strings", message_id="i" * 300, subject="s" * 300, to="t" * 300),
        _message("binary-reply-to", message_id="m-rt", reply_to=b"\xffreply", content_type=b"text/\xe9"),
        _message("sessions", message_id="m-s", group_id="g-1", reply_to_group_id="rg-1"),
    )

    seen = _seen(record_dir, ["uuid-id", "ulong-id", "binary-id", "long-strings", "binary-reply-to", "sessions"])
    # Microsoft.Azure.Amqp MessageId.ToString(): a uuid's canonical text, a ulong's decimal, a binary's hex.
    assert seen["uuid-id"]["message_id"] == "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert seen["uuid-id"]["correlation_id"] == "00000000-0000-0000-0000-000000000001"
    assert seen["ulong-id"]["message_id"] == "18446744073709551615"
    assert seen["ulong-id"]["correlation_id"] == "7"
    assert seen["binary-id"]["message_id"] == "0001FEFF"
    assert seen["binary-id"]["correlation_id"] == "616263"  # a binary, even when its bytes are UTF-8
    assert seen["long-strings"]["message_id"] == "i" * 300
    assert seen["long-strings"]["subject"] == seen["long-strings"]["label"] == "s" * 300
    assert seen["long-strings"]["to"] == "t" * 300
    # A string field with bytes that are not UTF-8: replacement characters; a symbol is read as ASCII.
    assert seen["binary-reply-to"]["reply_to"] == "\ufffdreply"
    assert seen["binary-reply-to"]["content_type"] == "text/?"
    assert seen["sessions"]["session_id"] == "g-1"
    assert seen["sessions"]["reply_to_session_id"] == "rg-1"
    for tag, item in seen.items():
        assert isinstance(item["message_id"], str), tag
        assert item["metadata"]["MessageId"] == item["message_id"], tag
    assert all(i.succeeded for i in host.invocations("sb_record"))


def test_application_properties_of_any_type_arrive_as_the_host_serializes_them(sb, servicebus_emulator):
    host, queue, record_dir = sb
    offset_ticks = (datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC) - datetime(1, 1, 1, tzinfo=UTC)) // timedelta(
        microseconds=1
    ) * 10
    properties = {
        "text": "v",
        "int": 5,
        "long": _typed("LONG", -(2**40)),
        "ulong": _typed("ULONG", 2**64 - 1),
        "double": 1.5,
        "nan": math.nan,
        "float": _typed("FLOAT", 0.1),
        "bool": True,
        "null": None,
        "uuid": UUID_ID,
        "binary": _typed("BINARY", b"\xff\x00"),
        "symbol": _typed("SYMBOL", b"sym"),
        "timestamp": _typed("TIMESTAMP", 1700000000123),
        "not-utf8": _typed("STRING", b"\xffx"),
        "timespan": _described(b"com.microsoft:timespan", _typed("LONG", 15_000_000)),
        "uri": _described(b"com.microsoft:uri", "https://example.org/a?b=c"),
        "offset": _described(b"com.microsoft:datetime-offset", _typed("LONG", offset_ticks)),
        "custom": _described(b"x:custom", 1),
    }
    _send(
        servicebus_emulator.connection_string,
        queue,
        _message("props", message_id="p", application_properties=properties),
    )

    (seen,) = _seen(record_dir, ["props"]).values()
    expected = {
        "text": "v",
        "int": 5,
        "long": -(2**40),
        "ulong": 2**64 - 1,
        "double": 1.5,
        "nan": "NaN",  # Newtonsoft.Json writes NaN as a string
        "float": 0.1,  # a Single written with its own shortest digits
        "bool": True,
        "null": None,
        "uuid": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "binary": base64.b64encode(b"\xff\x00").decode(),  # byte[] -> base64
        "symbol": "sym",
        "timestamp": "2023-11-14T22:13:20.123Z",  # a UTC DateTime
        "not-utf8": "\ufffdx",
        "timespan": "00:00:01.5000000",
        "uri": "https://example.org/a?b=c",
        "offset": "2024-01-02T03:04:05+00:00",
        # "custom": a described type the .NET client does not know is left out
    }
    assert seen["application_properties"] == seen["user_properties"] == expected
    assert seen["metadata"]["ApplicationProperties"] == expected
    assert all(i.succeeded for i in host.invocations("sb_record"))


def test_client_set_annotations_never_stop_a_message_and_read_as_the_host_reads_them(sb, servicebus_emulator):
    host, queue, record_dir = sb
    _send(
        servicebus_emulator.connection_string,
        queue,
        _message(
            "odd-annotations",
            message_id="a-1",
            annotations={
                b"x-opt-partition-key": 7,  # not a string: the host's getter throws, the entry is left out
                b"x-opt-via-partition-key": "via-1",
                b"x-opt-deadletter-source": 9,
                b"x-opt-custom": 5,
                b"x-opt-uuid": uuid.uuid4(),
                b"x-opt-enqueued-time": _typed("TIMESTAMP", 0),  # the broker's own value wins
            },
        ),
        _message("string-partition-key", message_id="a-2", annotations={b"x-opt-partition-key": "pk-1"}),
    )

    seen = _seen(record_dir, ["odd-annotations", "string-partition-key"])
    odd = seen["odd-annotations"]
    assert odd["partition_key"] is None and "PartitionKey" not in odd["metadata"]
    assert odd["transaction_partition_key"] == "via-1"
    assert odd["dead_letter_source"] is None
    assert odd["enqueued_time_is_naive"], "the host sends EnqueuedTimeUtc without an offset"
    enqueued = datetime.fromisoformat(odd["enqueued_time_utc"]).replace(tzinfo=UTC)
    assert abs(enqueued - datetime.now(UTC)) < timedelta(minutes=1)
    assert seen["string-partition-key"]["partition_key"] == "pk-1"
    assert all(i.succeeded for i in host.invocations("sb_record"))


def test_body_json_fields_join_the_binding_data_as_in_the_host(sb, servicebus_emulator):
    host, queue, record_dir = sb
    body = (
        b'{"tag": "json-body", "ReplyTo": "elsewhere", "messageid": 5, '
        b'"when": "2024-01-02T03:04:05Z", "n": {"a": 1}}'
    )
    _send(
        servicebus_emulator.connection_string,
        queue,
        ServiceBusMessage(body, message_id="j-1", reply_to="status"),
        ServiceBusMessage(b"\xff\xfe{}", message_id="not-utf8"),
    )

    def seen():
        found = {r["message_id"]: r for r in records(record_dir, "sb_record", "start")}
        return found if {"5", "not-utf8"} <= set(found) else None

    found = eventually(seen, what="both invocations")
    merged = found["5"]  # the body's "messageid" replaced the MessageId, ignoring case
    assert merged["reply_to"] == "elsewhere"
    assert merged["metadata"]["when"] == "01/02/2024 03:04:05"  # Newtonsoft read it as a date
    assert merged["metadata"]["n"] == {"a": 1}
    assert merged["metadata"]["tag"] == "json-body"
    # The body is bound as a string: bytes that are not UTF-8 arrive as replacement characters.
    assert found["not-utf8"]["body_hex"] == ("\ufffd\ufffd{}".encode()).hex()
    assert all(i.succeeded for i in host.invocations("sb_record"))


@pytest.mark.parametrize("sdk_tracing", [False, True], ids=["sdk-tracing-off", "sdk-tracing-on"])
def test_trace_properties_of_any_text_never_stop_a_message_being_completed(
    sdk_tracing, funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    """The SDK's settlement reads ``traceparent``/``Diagnostic-Id``/``tracestate`` as ASCII for its
    tracing links (``get_span_link_from_message``, called on every settlement), and so does its
    receive when the Azure SDK's tracing is on (an app that exports to Application Insights turns it
    on in its process): a value that is not ASCII must not keep the host from receiving and completing
    the message, or it comes back after every lock expiry."""
    settings = {"AZURE_SDK_TRACING_IMPLEMENTATION": "opentelemetry"} if sdk_tracing else {}
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path,
        lock_duration=timedelta(seconds=30), max_delivery_count=5, enabled=("sb_record",), **settings,
    )
    (host,) = funchost.start(APP_DIR, env=env)
    queue, record_dir = names["FH_SB_QUEUE"], tmp_path
    cases = {
        "tracestate-non-ascii": {"tracestate": "vendor=ünïcödé"},
        "diagnostic-id-non-ascii": {"Diagnostic-Id": "Ωmega|not-w3c"},
        "traceparent-binary": {"traceparent": _typed("BINARY", b"\xff\xfe\x00\x80")},
        "diagnostic-id-not-w3c": {"Diagnostic-Id": "|5e4b3a2c.1.", "tracestate": _typed("BINARY", b"\xc3\xa9")},
    }
    _send(
        servicebus_emulator.connection_string,
        queue,
        *(_message(tag, message_id=tag, application_properties=properties) for tag, properties in cases.items()),
    )

    _seen(record_dir, list(cases))
    # Completed on the first delivery (the queue's lock is 30 s: a failed settlement would leave them locked).
    eventually(
        lambda: servicebus_emulator.message_counts(queue)
        == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0},
        what="every message to be completed",
    )
    assert sorted(r["body"] for r in records(record_dir, "sb_record", "start")) == sorted(cases)
    assert all(i.succeeded for i in host.invocations("sb_record"))
    assert "could not complete" not in host.log_text()


def test_a_message_the_host_cannot_hand_over_is_dead_lettered_at_once_and_the_host_goes_on(
    sb, servicebus_emulator
):
    host, queue, record_dir = sb
    long_ulong = b"\x80" + LONG_ID.to_bytes(8, "big")
    symbol_reply = bytes([0xA1, len(SYMBOL_REPLY_TO)]) + SYMBOL_REPLY_TO.encode()
    _send(
        servicebus_emulator.connection_string,
        queue,
        _message("list-property", message_id="bad-list", application_properties={"list": [1, 2]}),
        _message("map-annotation", message_id="bad-map", annotations={b"x-opt-map": {b"a": 1}}),
        _message("long-id", message_id=LONG_ID),
        _message("symbol-reply-to", message_id="bad-reply", reply_to=SYMBOL_REPLY_TO),
        AmqpAnnotatedMessage(value_body=5, properties=AmqpMessageProperties(message_id="bad-value")),
        AmqpAnnotatedMessage(sequence_body=[[1, 2]], properties=AmqpMessageProperties(message_id="bad-sequence")),
        rewrite=((long_ulong, b"\x81" + long_ulong[1:]), (symbol_reply, b"\xa3" + symbol_reply[1:])),
    )
    _send(servicebus_emulator.connection_string, queue, _message("after", message_id="good"))

    _seen(record_dir, ["after"])
    dead = receive(
        servicebus_emulator.connection_string, queue, 6, timeout=20, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    )
    by_id = {m.message_id: m for m in dead}
    assert set(by_id) == {"bad-list", "bad-map", LONG_ID, "bad-reply", "bad-value", "bad-sequence"}
    expected = {
        "bad-list": ("FunctionsHostCannotReadMessage", "application property 'list' is an AMQP list"),
        "bad-map": ("FunctionsHostCannotReadMessage", "message annotation 'x-opt-map' is an AMQP map"),
        LONG_ID: ("FunctionsHostCannotReadMessage", "message-id is an AMQP long"),
        "bad-reply": ("FunctionsHostCannotReadMessage", "reply-to is an AMQP symbol"),
        "bad-value": ("FunctionInputBindingFailed", "A message with a value type of System.Int"),
        "bad-sequence": ("FunctionInputBindingFailed", "A sequence body message cannot be bound to a string"),
    }
    for message_id, (reason, cause) in expected.items():
        message = by_id[message_id]
        assert message.dead_letter_reason == reason, message_id
        assert cause in message.dead_letter_error_description, (message_id, message.dead_letter_error_description)
    # The function never saw any of them; the host logged each, on its first delivery, and kept going.
    assert [r["body"] for r in records(record_dir, "sb_record", "start")] == ["after"]
    log = host.log_text()
    assert log.count("(delivery 1) cannot be handed to the function; dead-lettering it") == 6
    assert "(delivery 2)" not in log
    assert "Traceback" not in log and "retrying in" not in log
    assert host.running
    assert servicebus_emulator.message_counts(queue)["active"] == 0


def test_a_message_the_runtime_cannot_convert_fails_each_delivery_until_max_delivery_count_dead_letters_it(
    sb, servicebus_emulator
):
    # The host hands it over (the body's "DeliveryCount" field replaces the binding data's, as the Functions
    # host's ApplyBindingData does); Microsoft's runtime cannot read "many" as the message's delivery count,
    # so every delivery's invocation fails in the worker, and the broker dead-letters it after the fifth.
    host, queue, record_dir = sb
    _send(servicebus_emulator.connection_string, queue, ServiceBusMessage(b'{"DeliveryCount": "many"}',
                                                                          message_id="bad-count"))
    (dead,) = receive(servicebus_emulator.connection_string, queue, 1, timeout=30,
                      sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert (dead.message_id, dead.dead_letter_reason, dead.delivery_count) == ("bad-count", "MaxDeliveryCountExceeded", 5)
    failed = host.invocations("sb_record")
    assert len(failed) == 5 and not any(i.succeeded for i in failed)
    assert "'DeliveryCount' in trigger metadata into int" in host.log_text()
    assert records(record_dir, "sb_record", "start") == []  # the function itself never ran
    assert host.running


def test_a_message_the_python_sdk_cannot_decode_is_dead_lettered_and_the_receiver_goes_on(sb, servicebus_emulator):
    host, queue, record_dir = sb
    char = CHAR_KEY + b"\x70\x00\x00\x20\xac"
    dec32 = DECIMAL32_KEY + b"\x70\x00\x00\x20\xac"
    _send(
        servicebus_emulator.connection_string,
        queue,
        _message("char", message_id="c-1", application_properties={"char": _typed("UINT", 0x20AC)}),
        _message("dec32", message_id="d-1", application_properties={"dec32": _typed("UINT", 0x20AC)}),
        rewrite=(
            (char, CHAR_KEY + b"\x73" + char[len(CHAR_KEY) + 1 :]),
            (dec32, DECIMAL32_KEY + b"\x74" + dec32[len(DECIMAL32_KEY) + 1 :]),
        ),
    )
    # The Python SDK's own encoding of a Decimal property, which its decoder then rejects.
    _send(
        servicebus_emulator.connection_string,
        queue,
        _message("decimal", message_id="m-1", application_properties={"amount": decimal.Decimal("1.25")}),
    )
    _send(servicebus_emulator.connection_string, queue, _message("after-undecodable", message_id="good"))

    _seen(record_dir, ["after-undecodable"])
    # The test's own SDK cannot receive them from the dead-letter queue either: count them, read the log.
    eventually(lambda: servicebus_emulator.message_counts(queue)["dead_letter"] == 3, what="3 dead-lettered")
    log = host.log_text()
    found = dict(
        (m.group(1), (m.group(2), m.group(3)))
        for m in re.finditer(
            r"message (\S+) \(lock token \S+, \d+ bytes\) cannot be decoded by the Python SDK; "
            r"dead-lettering it: (\w+): (.*)",
            log,
        )
    )
    assert set(found) == {"c-1", "d-1", "m-1"}
    # A char and a decimal128 the .NET client reads (the function would get "€", 1.25): this host's limit.
    for message_id in ("c-1", "m-1"):
        reason, description = found[message_id]
        assert reason == "LocalHostConversionFailed", message_id
        assert "the Python azure-servicebus SDK cannot decode it" in description
        assert "the Functions host would hand it to the function" in description
    # A decimal32 the .NET client cannot read either.
    assert found["d-1"][0] == "FunctionsHostCannotReadMessage" and "decimal32" in found["d-1"][1]
    assert [r["body"] for r in records(record_dir, "sb_record", "start")] == ["after-undecodable"]
    assert servicebus_emulator.message_counts(queue)["active"] == 0
    assert "retrying in" not in log and host.running


def test_binary_data_type_gets_the_raw_body_and_without_the_wire_bytes_the_sdk_values_serve(
    servicebus_emulator, unique_name
):
    """``dataType: binary``: the body's bytes as sent, no JSON fields merged; and the conversion from the
    SDK's decoded values (when the tap is off) agrees where those values are unambiguous. Directly,
    through a real receiver."""
    queue = unique_name("bin-")
    servicebus_emulator.declare_queue(queue)
    _send(
        servicebus_emulator.connection_string,
        queue,
        ServiceBusMessage(
            b'\xff{"MessageId": "x"}', message_id="raw", reply_to="r", application_properties={"n": 5, "s": "t"}
        ),
        AmqpAnnotatedMessage(value_body="text", properties=AmqpMessageProperties(message_id=UUID_ID)),
    )
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        receiver = client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK)
        tap = DeliveryTap(receiver)
        with receiver:
            got = []
            eventually(
                lambda: got.extend(receiver.receive_messages(max_message_count=2, max_wait_time=1)) or len(got) == 2,
                what="both messages",
            )
            payloads = {str(m.message_id): (m, tap.take(m.lock_token)) for m in got}
            assert tap.installed and all(p is not None for _, p in payloads.values())
            message, payload = payloads["raw"]
            raw = as_the_worker_decodes(function_message(payload, message, data_type="binary"))
            assert raw.get_body() == b'\xff{"MessageId": "x"}' and raw.message_id == "raw"
            as_string = as_the_worker_decodes(function_message(payload, message))
            assert as_string.get_body() == '\ufffd{"MessageId": "x"}'.encode()
            assert as_string.message_id == "raw"  # the string does not start with "{": no fields merged
            fallback = as_the_worker_decodes(function_message(None, message))
            for name in ("message_id", "reply_to", "application_properties", "delivery_count", "enqueued_time_utc"):
                assert getattr(fallback, name) == getattr(as_string, name), name

            message, payload = payloads[str(UUID_ID)]
            with pytest.raises(BindingFailed, match="cannot be retrieved using the Body property"):
                function_message(payload, message, data_type="binary")
            value = as_the_worker_decodes(function_message(payload, message))
            assert value.get_body() == b"text" and value.message_id == str(UUID_ID)
            assert as_the_worker_decodes(function_message(None, message)).message_id == str(UUID_ID)
            for item in got:
                receiver.complete_message(item)


