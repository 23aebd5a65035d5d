"""Clients that do not speak AMQP properly get a clean close; the server keeps serving everyone else."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp.performatives import OpenFrame

from tools.servicebus_emulator import codec

from .conftest import receive_exactly, sender_for


@pytest.fixture
def raw(servicebus_emulator) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", servicebus_emulator.port), timeout=5)
    yield sock
    sock.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def _read_frame(sock: socket.socket) -> tuple[int, list]:
    size, offset, _, _ = struct.unpack(">IBBH", _read_exactly(sock, 8))
    body = _read_exactly(sock, size - 8)[offset * 4 - 8 :]
    return codec.decode_performative(memoryview(body))


def _assert_closed_by_server(sock: socket.socket) -> None:
    """The server closes its end: reads end with EOF (a reset also counts as closed)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass


def _open(sock: socket.socket) -> None:
    sock.sendall(codec.AMQP_HEADER)
    assert _read_exactly(sock, 8) == codec.AMQP_HEADER
    open_frame = OpenFrame(
        container_id="raw-test",
        hostname=None,
        max_frame_size=65536,
        channel_max=1,
        idle_timeout=None,
        outgoing_locales=None,
        incoming_locales=None,
        offered_capabilities=None,
        desired_capabilities=None,
        properties=None,
    )
    sock.sendall(codec.encode_performative(0, open_frame))
    code, _ = _read_frame(sock)
    assert code == codec.OPEN


def _expect_close_with(sock: socket.socket, condition: bytes) -> None:
    code, fields = _read_frame(sock)
    assert code == codec.CLOSE
    assert fields[0][0] == condition, fields
    _assert_closed_by_server(sock)


def test_a_plain_amqp_client_without_sasl_can_open(raw):
    _open(raw)
    raw.sendall(codec.encode_performative(0, codec.performatives.CloseFrame(error=None)))
    code, fields = _read_frame(raw)
    assert (code, fields[0]) == (codec.CLOSE, None)
    _assert_closed_by_server(raw)


def test_garbage_instead_of_a_protocol_header_gets_our_header_then_a_close(raw):
    raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _read_exactly(raw, 8) == codec.AMQP_HEADER
    _assert_closed_by_server(raw)


def test_a_tls_client_fails_its_handshake_quickly(servicebus_emulator):
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", servicebus_emulator.port), timeout=5) as sock,
        pytest.raises((ssl.SSLError, ConnectionError)),
        context.wrap_socket(sock, server_hostname="127.0.0.1"),
    ):
        pass


def test_an_undecodable_frame_closes_the_connection_with_a_decode_error(raw):
    _open(raw)
    body = b"\x00\x53\x12\xff\xff\xff"  # an attach whose field list has an invalid constructor
    raw.sendall(struct.pack(">IBBH", len(body) + 8, 2, 0, 0) + body)
    _expect_close_with(raw, b"amqp:decode-error")


def test_a_frame_larger_than_max_frame_size_closes_with_a_framing_error(raw):
    _open(raw)
    raw.sendall(struct.pack(">IBBH", 0x7FFFFFFF, 2, 0, 0))
    _expect_close_with(raw, b"amqp:connection:framing-error")


def test_a_frame_on_a_channel_without_a_session_closes_the_connection(raw):
    _open(raw)
    flow = codec.flow_frame(7, next_incoming_id=0, incoming_window=1, next_outgoing_id=0, outgoing_window=1)
    raw.sendall(flow)
    _expect_close_with(raw, b"amqp:illegal-state")


def test_a_truncated_connection_is_simply_dropped(servicebus_emulator):
    with socket.create_connection(("127.0.0.1", servicebus_emulator.port), timeout=5) as sock:
        sock.sendall(codec.AMQP_HEADER + b"\x00\x00\x01\x00")  # header, then half a frame header
    with socket.create_connection(("127.0.0.1", servicebus_emulator.port), timeout=5) as sock:
        _open(sock)  # the server still answers


def test_the_server_keeps_serving_sdk_clients_while_others_misbehave(servicebus_emulator, client, queue):
    port = servicebus_emulator.port
    with sender_for(client, queue) as sender, client.get_queue_receiver(queue) as receiver:
        sender.send_messages(ServiceBusMessage("before"))
        for junk in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"AMQP\x02\x01\x00\x00", b"\xff" * 64):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(junk)
                _assert_closed_by_server(sock)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            _open(sock)
            sock.sendall(struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00\x53\x10\xd0")
            _expect_close_with(sock, b"amqp:decode-error")
        sender.send_messages(ServiceBusMessage("after"))
        messages = receive_exactly(receiver, 2)
        assert [str(m) for m in messages] == ["before", "after"]
        for message in messages:
            receiver.complete_message(message)
