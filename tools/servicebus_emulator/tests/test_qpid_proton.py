"""Conformance with a second, independent AMQP 1.0 client: Apache Qpid Proton (``python-qpid-proton``).

Proton shares no code with the Azure SDKs (the Python SDK has its own ``pyamqp``, the
JavaScript SDK is built on ``rhea``): its C core frames, encodes and negotiates everything
itself. These tests use it as any AMQP 1.0 application would use Service Bus, over a real
socket: SASL PLAIN with the SAS key name and key (or ANONYMOUS), links by queue address,
every AMQP type through its own encoder, and the four outcomes settled by hand: accepted
(complete), released (handed back, not counted), modified (abandon: counted, dead-lettered at
the max delivery count; with annotations, properties to modify), rejected (dead-letter, the
reason in the error's info as the SDKs send it). A session receiver is refused at once.

The library is pinned in the project's dev requirements; a missing or different version fails
these tests (never skips them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from importlib import metadata
from urllib.parse import quote

import pytest

from .conftest import wait_until

VERIFIED_VERSION = "0.40.0"
INSTALL_HINT = "install the project's dev requirements (pip install -r requirements-dev.txt)"

try:
    from proton import (
        SASL,
        Condition,
        Delivery,
        Message,
        Timeout,
        byte,
        char,
        decimal32,
        decimal64,
        decimal128,
        float32,
        int32,
        short,
        symbol,
        timestamp,
        ubyte,
        uint,
        ulong,
        ushort,
    )
    from proton.reactor import AtMostOnce, Filter
    from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached
except ImportError as error:  # fail every test with the reason, never skip
    _MISSING: str | None = f"Qpid Proton (python-qpid-proton) is not installed ({error}): {INSTALL_HINT}"
else:
    _MISSING = None

SESSION_FILTER = "com.microsoft:session-filter"
EMPTY = {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


@pytest.fixture(autouse=True)
def _proton_installed() -> None:
    if _MISSING:
        pytest.fail(_MISSING, pytrace=False)
    installed = metadata.version("python-qpid-proton")
    assert installed == VERIFIED_VERSION, (
        f"python-qpid-proton {installed} is installed; these tests verify {VERIFIED_VERSION}: {INSTALL_HINT}"
    )


def _credentials(connection_string: str) -> tuple[str, str]:
    parts = dict(part.split("=", 1) for part in connection_string.split(";") if "=" in part)
    return parts["SharedAccessKeyName"], parts["SharedAccessKey"]


@pytest.fixture
def connect(servicebus_emulator) -> Iterator[Callable[..., BlockingConnection]]:
    """Open a Proton connection to the emulator: SASL PLAIN with the connection string's key name
    and key (Service Bus accepts PLAIN as a SAS key login; without TLS Proton must be told PLAIN may
    go in the clear), or ``anonymous=True``. Closed after the test."""
    opened: list[BlockingConnection] = []

    def open_connection(*, anonymous: bool = False, **options) -> BlockingConnection:
        url = f"amqp://127.0.0.1:{servicebus_emulator.port}"
        if anonymous:
            options.setdefault("allowed_mechs", "ANONYMOUS")
        else:
            name, key = _credentials(servicebus_emulator.connection_string)
            url = f"amqp://{quote(name, safe='')}:{quote(key, safe='')}@127.0.0.1:{servicebus_emulator.port}"
            options.update(allowed_mechs="PLAIN", allow_insecure_mechs=True)
        connection = BlockingConnection(url, timeout=10, **options)
        opened.append(connection)
        return connection

    yield open_connection
    for connection in reversed(opened):
        connection.close()


@pytest.fixture
def conn(connect) -> BlockingConnection:
    return connect()


def _receiver(conn: BlockingConnection, address: str, **options) -> BlockingReceiver:
    # Proton names a link after its container and address; two links on one address need their own names.
    return conn.create_receiver(address, name=f"receiver-{uuid.uuid4().hex[:8]}", credit=0, **options)


def _sender(conn: BlockingConnection, address: str):
    return conn.create_sender(address, name=f"sender-{uuid.uuid4().hex[:8]}")


def _pending(receiver: BlockingReceiver) -> Delivery:
    """The delivery of the message last received and not yet settled (the next one ``settle`` settles)."""
    return receiver.fetcher.unsettled[0]


def _until(conn: BlockingConnection, check: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Run Proton's I/O (a settlement is only written while it runs) until ``check`` holds; fail
    naming ``what`` after ``timeout`` seconds. (``conn.wait`` alone would block until the next
    frame arrives, and a settled disposition gets no answer.)"""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        try:
            conn.wait(lambda: bool(check()), timeout=0.05)
        except Timeout:
            pass


def _as_proton_reads(message: Message) -> Message:
    """The message as Proton reads back its own encoding, without the emulator: what a round trip
    through the emulator must give (Proton reads a ulong message id as int, binary as memoryview)."""
    local = Message()
    local.decode(message.encode())
    return local


def _typed(value: object) -> object:
    """A value with its Python (so AMQP) type, all the way down lists and maps; binary by content."""
    if isinstance(value, dict):
        return {_typed(key): _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return (list, [_typed(item) for item in value])
    return (type(value), bytes(value) if isinstance(value, memoryview) else value)


def _dead_letter_info(reason: str, description: str) -> Condition:
    """The error of a ``rejected`` outcome as the Service Bus SDKs dead-letter a message."""
    return Condition(
        "com.microsoft:dead-letter",
        None,
        {symbol("DeadLetterReason"): reason, symbol("DeadLetterErrorDescription"): description},
    )


# --- connecting -------------------------------------------------------------------------------------


def test_proton_is_installed_at_the_verified_version(report_figure):
    assert metadata.version("python-qpid-proton") == VERIFIED_VERSION
    report_figure(f"Qpid Proton (python-qpid-proton {VERIFIED_VERSION}): the independent AMQP 1.0 client's checks")


def test_connects_with_sasl_plain_using_the_sas_key_name_and_key(servicebus_emulator, connect, queue):
    before = servicebus_emulator.operation_counts().get("frame.sasl_init", 0)
    conn = connect()
    sasl = conn.conn.transport.sasl()
    assert (sasl.mech, sasl.outcome) == ("PLAIN", SASL.OK)
    assert conn.conn.remote_container  # the emulator opened the connection
    assert servicebus_emulator.operation_counts()["frame.sasl_init"] > before
    sender = _sender(conn, queue)
    assert sender.send(Message(body="over PLAIN")).remote_state == Delivery.ACCEPTED


def test_connects_with_sasl_anonymous(connect, queue):
    conn = connect(anonymous=True)
    sasl = conn.conn.transport.sasl()
    assert (sasl.mech, sasl.outcome) == ("ANONYMOUS", SASL.OK)
    assert _sender(conn, queue).send(Message(body="anonymous")).remote_state == Delivery.ACCEPTED


def test_the_emulator_keeps_an_idle_connection_alive_with_heartbeats(connect, queue):
    # Proton asks for an idle timeout of 0.5 s and closes the connection if nothing arrives in time.
    conn = connect(heartbeat=0.5)
    quiet_until = time.monotonic() + 1.6
    _until(conn, lambda: time.monotonic() > quiet_until, "an idle period")  # Proton's I/O runs all along
    assert _sender(conn, queue).send(Message(body="still connected")).remote_state == Delivery.ACCEPTED


def test_a_link_to_an_unknown_queue_is_refused_with_not_found(conn, unique_name):
    with pytest.raises(LinkDetached) as refused:
        _receiver(conn, unique_name("missing"))
    assert refused.value.condition == "amqp:not-found"


# --- send, receive, settle --------------------------------------------------------------------------


def test_send_receive_and_accept_completes_in_order(servicebus_emulator, conn, queue):
    sender = _sender(conn, queue)
    for i in range(3):
        assert sender.send(Message(body=f"m{i}", id=f"id-{i}")).remote_state == Delivery.ACCEPTED
    assert servicebus_emulator.message_counts(queue)["active"] == 3
    receiver = _receiver(conn, queue)
    received = []
    for _ in range(3):
        message = receiver.receive(timeout=10)
        # Peek-lock: unsettled. (Its tag is the 16-byte lock token, as from Service Bus; Proton's Python
        # binding reads tags as UTF-8 text, so it cannot show it.)
        assert not _pending(receiver).settled
        annotations = message.annotations
        assert annotations[symbol("x-opt-locked-until")] > annotations[symbol("x-opt-enqueued-time")]
        sequence_number = annotations[symbol("x-opt-sequence-number")]
        received.append((message.body, message.id, message.delivery_count, sequence_number))
        receiver.accept()
    assert [r[:3] for r in received] == [(f"m{i}", f"id-{i}", 0) for i in range(3)]
    assert [r[3] for r in received] == sorted(r[3] for r in received)
    _until(conn, lambda: servicebus_emulator.message_counts(queue) == EMPTY, "the completions")


def test_released_is_redelivered_without_counting_a_delivery(servicebus_emulator, conn, queue):
    _sender(conn, queue).send(Message(body="handed back"))
    receiver = _receiver(conn, queue)
    for _ in range(3):
        message = receiver.receive(timeout=10)
        assert (message.body, message.delivery_count) == ("handed back", 0)  # Service Bus does not count a release
        receiver.release(delivered=False)  # released
    receiver.receive(timeout=10)
    receiver.accept()
    _until(conn, lambda: servicebus_emulator.message_counts(queue) == EMPTY, "the completion")


def test_modified_with_delivery_failed_counts_a_delivery_up_to_dead_lettering(servicebus_emulator, conn, make_queue):
    queue = make_queue(max_delivery_count=3)
    _sender(conn, queue).send(Message(body="unlucky", id="unlucky"))
    receiver = _receiver(conn, queue)
    counts = []
    for _ in range(3):
        message = receiver.receive(timeout=10)
        counts.append(message.delivery_count)
        _pending(receiver).local.failed = True
        receiver.settle(Delivery.MODIFIED)
    assert counts == [0, 1, 2]
    _until(conn, lambda: servicebus_emulator.message_counts(queue)["dead_letter"] == 1, "the dead-lettering")
    assert servicebus_emulator.message_counts(queue) == {**EMPTY, "dead_letter": 1}
    dead_letters = _receiver(conn, f"{queue}/$DeadLetterQueue")
    dead = dead_letters.receive(timeout=10)
    assert (dead.body, dead.id, dead.delivery_count) == ("unlucky", "unlucky", 3)
    assert dead.properties["DeadLetterReason"] == "MaxDeliveryCountExceeded"
    assert dead.properties["DeadLetterErrorDescription"]
    dead_letters.accept()
    _until(conn, lambda: servicebus_emulator.message_counts(queue) == EMPTY, "the dead letter's completion")


def test_modified_with_annotations_sets_them_as_application_properties(conn, queue):
    # Service Bus reads the annotations of modified as properties to modify (typed, replacing or adding).
    _sender(conn, queue).send(Message(body="retry", properties={"kept": "yes", "attempt": int32(0)}))
    receiver = _receiver(conn, queue)
    receiver.receive(timeout=10)
    delivery = _pending(receiver)
    delivery.local.failed = True
    delivery.local.annotations = {symbol("attempt"): int32(1), symbol("note"): "try later"}
    receiver.settle(Delivery.MODIFIED)
    again = receiver.receive(timeout=10)
    assert again.delivery_count == 1
    assert again.properties == {"kept": "yes", "attempt": int32(1), "note": "try later"}
    assert type(again.properties["attempt"]) is int32
    receiver.accept()


def test_rejected_dead_letters_with_the_reason_and_description(servicebus_emulator, conn, queue):
    _sender(conn, queue).send(Message(body="poison", id=ulong(7), properties={"kept": "yes"}))
    receiver = _receiver(conn, queue)
    receiver.receive(timeout=10)
    _pending(receiver).local.condition = _dead_letter_info("BadOrder", "amount is negative")
    receiver.reject()
    _until(conn, lambda: servicebus_emulator.message_counts(queue)["dead_letter"] == 1, "the dead-lettering")
    assert servicebus_emulator.message_counts(queue) == {**EMPTY, "dead_letter": 1}
    dead_letters = _receiver(conn, f"{queue}/$DeadLetterQueue")
    dead = dead_letters.receive(timeout=10)
    assert (dead.body, dead.id) == ("poison", 7)
    assert dead.properties == {
        "kept": "yes",
        "DeadLetterReason": "BadOrder",
        "DeadLetterErrorDescription": "amount is negative",
    }
    dead_letters.accept()


def test_rejected_without_an_error_dead_letters_without_a_reason(servicebus_emulator, conn, queue):
    _sender(conn, queue).send(Message(body="plain reject"))
    receiver = _receiver(conn, queue)
    receiver.receive(timeout=10)
    receiver.reject()
    _until(conn, lambda: servicebus_emulator.message_counts(queue)["dead_letter"] == 1, "the dead-lettering")
    dead = _receiver(conn, f"{queue}/$DeadLetterQueue").receive(timeout=10)
    assert dead.body == "plain reject"
    assert "DeadLetterReason" not in (dead.properties or {})


def test_receive_and_delete_gets_settled_deliveries(servicebus_emulator, conn, queue):
    sender = _sender(conn, queue)
    for body in ("a", "b"):
        sender.send(Message(body=body))
    receiver = _receiver(conn, queue, options=AtMostOnce())  # snd-settle-mode settled
    bodies = []
    for _ in range(2):
        bodies.append(receiver.receive(timeout=10).body)
        assert not receiver.fetcher.unsettled  # nothing to settle
    assert bodies == ["a", "b"]
    assert servicebus_emulator.message_counts(queue) == EMPTY


def test_prefetched_messages_are_delivered_within_the_granted_credit(servicebus_emulator, conn, queue):
    sender = _sender(conn, queue)
    for i in range(5):
        sender.send(Message(body=i))
    receiver = conn.create_receiver(queue, name="prefetch", credit=3)
    _until(conn, lambda: receiver.fetcher.has_message == 3, "three prefetched messages")
    wait_until(lambda: servicebus_emulator.message_counts(queue)["locked"] == 3, what="three locks")
    assert servicebus_emulator.message_counts(queue)["active"] == 2
    bodies = []
    for _ in range(5):
        bodies.append(receiver.receive(timeout=10).body)
        receiver.accept()
    assert bodies == [0, 1, 2, 3, 4]
    _until(conn, lambda: servicebus_emulator.message_counts(queue) == EMPTY, "the completions")


# --- every AMQP type round-trips ------------------------------------------------------------------------


def _application_properties() -> dict:
    """One application property of every AMQP primitive type (the only types they may have)."""
    return {
        "string": "text",
        "symbol": symbol("a-symbol"),
        "true": True,
        "false": False,
        "ubyte": ubyte(255),
        "byte": byte(-128),
        "ushort": ushort(65535),
        "short": short(-32768),
        "uint": uint(4294967295),
        "int": int32(-2147483648),
        "ulong": ulong(18446744073709551615),
        "long": -9223372036854775808,
        "float": float32(0.5),
        "double": 1.25,
        "char": char("é"),
        "timestamp": timestamp(1700000000123),
        "uuid": uuid.UUID("d3b07384-d9a0-4c9b-8f7e-5c1a2b3c4d5e"),
        "binary": b"\x00\x01\xff",
        "decimal32": decimal32(1),
        "decimal64": decimal64(2),
        "decimal128": decimal128(b"\x01" * 16),
        "null": None,
    }


def _message_annotations() -> dict:
    """Message annotations: symbol and ulong keys, any value (lists and maps too)."""
    return {
        symbol("x-opt-partition-key"): "pk",
        symbol("x-app-count"): int32(3),
        symbol("x-app-list"): [ubyte(1), "two", symbol("three")],
        symbol("x-app-map"): {"k": ulong(1), symbol("s"): [short(-1)]},
        ulong(42): "a ulong key",
    }


def test_application_properties_and_message_annotations_round_trip_with_their_types(conn, queue):
    sent = Message(body="typed", properties=_application_properties(), annotations=_message_annotations())
    _sender(conn, queue).send(sent)
    receiver = _receiver(conn, queue)
    got = receiver.receive(timeout=10)
    receiver.accept()
    local = _as_proton_reads(sent)
    assert _typed(got.properties) == _typed(local.properties)
    # Every value keeps its AMQP type (Proton reads binary back as a memoryview).
    sent_types = {key: memoryview if type(value) is bytes else type(value) for key, value in sent.properties.items()}
    assert {key: type(value) for key, value in got.properties.items()} == sent_types
    broker = {symbol("x-opt-sequence-number"), symbol("x-opt-enqueued-time"), symbol("x-opt-locked-until")}
    assert broker <= set(got.annotations)
    annotations = {key: value for key, value in got.annotations.items() if key not in broker}
    assert _typed(annotations) == _typed(dict(local.annotations))
    assert list(annotations) == list(sent.annotations)  # in the order sent


def _message_id(kind: str) -> object:
    return {
        "uuid": uuid.UUID("d3b07384-d9a0-4c9b-8f7e-5c1a2b3c4d5e"),
        "ulong": ulong(42),
        "binary": b"\x00binary-id",
        "string": "string-id",
    }[kind]


@pytest.mark.parametrize("id_type", ["uuid", "ulong", "binary", "string"])
def test_message_properties_and_header_round_trip(conn, queue, id_type):
    sent = Message(
        body=b"\x00data section",
        id=_message_id(id_type),
        correlation_id=uuid.UUID(int=7),
        user_id=b"k",
        address="to-someone",
        subject="the subject",
        reply_to="replies",
        content_type="application/octet-stream",
        content_encoding="identity",
        creation_time=1700000000.5,
        group_id="group",
        group_sequence=3,
        reply_to_group_id="reply-group",
        durable=True,
        priority=7,
        ttl=300,
        first_acquirer=False,
    )
    _sender(conn, queue).send(sent)
    receiver = _receiver(conn, queue)
    got = receiver.receive(timeout=10)
    receiver.accept()
    fields = [
        "correlation_id", "user_id", "address", "subject", "reply_to", "content_type", "content_encoding",
        "creation_time", "group_id", "group_sequence", "reply_to_group_id", "durable", "priority", "ttl",
        "first_acquirer",
    ]  # fmt: skip
    assert {f: getattr(got, f) for f in fields} == {f: getattr(sent, f) for f in fields}
    local = _as_proton_reads(sent)
    assert _typed({"id": got.id, "body": got.body}) == _typed({"id": local.id, "body": local.body})
    assert got.delivery_count == 0


def _body(kind: str) -> tuple[object, bool]:
    """A body of each kind of section, and Proton's ``inferred`` flag that selects it."""
    return {
        "value-string": ("an amqp-value string", False),
        "value-map": ({"map": [1, 2.5, None], "nested": {"k": symbol("v"), "n": int32(-1)}}, False),
        "sequence": ([1, "two", 3.0], True),  # an amqp-sequence section
        "data": (b"a data section", True),
    }[kind]


@pytest.mark.parametrize("kind", ["value-string", "value-map", "sequence", "data"])
def test_every_body_section_round_trips(conn, queue, kind):
    body, inferred = _body(kind)
    sent = Message(body=body, inferred=inferred)
    _sender(conn, queue).send(sent)
    receiver = _receiver(conn, queue)
    got = receiver.receive(timeout=10)
    receiver.accept()
    assert _typed(got.body) == _typed(_as_proton_reads(sent).body)
    assert got.inferred == inferred


def test_a_large_message_travels_in_many_frames_both_ways(conn, queue):
    body = bytes(range(256)) * 1200  # 300 KiB: several frames each way (the emulator's are 64 KiB at most)
    _sender(conn, queue).send(Message(body=body))
    receiver = _receiver(conn, queue)
    got = receiver.receive(timeout=10)
    receiver.accept()
    assert bytes(got.body) == body


# --- request/response nodes --------------------------------------------------------------------------


def test_a_cbs_put_token_is_answered_and_correlated_by_message_id(conn, servicebus_emulator, queue):
    # The other way to authenticate with Service Bus: a token put to the $cbs node.
    requests = _sender(conn, "$cbs")
    replies = _receiver(conn, "$cbs")
    token = "SharedAccessSignature sr=x&sig=y&se=1&skn=k"
    requests.send(
        Message(
            body=token,
            id=ulong(42),
            reply_to="cbs-replies",
            properties={
                "operation": "put-token",
                "type": "servicebus.windows.net:sastoken",
                "name": f"amqp://127.0.0.1:{servicebus_emulator.port}/{queue}",
            },
        )
    )
    reply = replies.receive(timeout=10)  # request/response replies arrive settled
    request_id = _as_proton_reads(Message(id=ulong(42))).id
    assert (type(reply.correlation_id), reply.correlation_id) == (type(request_id), request_id)
    assert (reply.properties["status-code"], type(reply.properties["status-code"])) == (200, int32)


# --- sessions are refused ------------------------------------------------------------------------------


@pytest.mark.parametrize("session", ["s1", None], ids=["session-id", "next-available"])
def test_a_session_receiver_is_refused_at_once_with_a_clear_error(servicebus_emulator, conn, queue, session):
    sender = _sender(conn, queue)
    sender.send(Message(body="in a session", group_id="s1"))  # group-id is Service Bus's session id
    started = time.monotonic()
    with pytest.raises(LinkDetached) as refused:
        _receiver(conn, queue, options=Filter({symbol(SESSION_FILTER): session}))
    elapsed = time.monotonic() - started
    assert refused.value.condition == "amqp:not-allowed"
    description = refused.value.link.remote_condition.description
    assert "A sessionful message receiver cannot be created" in description
    assert f"queue '{queue}' is not session-enabled" in description
    assert elapsed < 2, f"the refusal took {elapsed:.1f} s"
    # The connection is still good, and the message still there for a plain receiver.
    assert servicebus_emulator.message_counts(queue) == {**EMPTY, "active": 1}
    receiver = _receiver(conn, queue)
    got = receiver.receive(timeout=10)
    assert (got.body, got.group_id) == ("in a session", "s1")
    receiver.accept()
    _until(conn, lambda: servicebus_emulator.message_counts(queue) == EMPTY, "the completion")
