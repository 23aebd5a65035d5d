"""A minimal AMQP 1.0 client over a plain socket, for the emulator's own tests.

It sends what other clients (the JavaScript or .NET SDKs, any AMQP library) put on the
wire, byte for byte where it matters (the type of a message id, the fields of an
outcome), which the Python SDK never sends: no SASL, one session, links by address.
Values are written with the emulator's own encoders (``codec.enc_*``); frames come back
decoded by the SDK's decoder, a transfer's payload last in its fields.
"""

from __future__ import annotations

import socket
import struct
import uuid
from typing import Any

from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.performatives import AttachFrame, BeginFrame, CloseFrame, OpenFrame

from tools.servicebus_emulator import codec

WINDOW = 1 << 16


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {size} bytes")
        data += chunk
    return data


# --- encoding values and messages ----------------------------------------------------------


def enc_uuid(value: uuid.UUID) -> bytes:
    return b"\x98" + value.bytes


def enc_ulong(value: int) -> bytes:
    return b"\x80" + struct.pack(">Q", value)


def enc_uuid_array(values: list[uuid.UUID]) -> bytes:
    """An array32 of uuids (how clients send ``lock-tokens``)."""
    body = struct.pack(">I", len(values)) + b"\x98" + b"".join(value.bytes for value in values)
    return b"\xf0" + struct.pack(">I", len(body)) + body


def enc_map(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A map of already-encoded (key, value) pairs."""
    return codec.enc_map(b"".join(key + value for key, value in entries), len(entries))


def message(
    *,
    message_id: bytes | None = None,
    application_properties: list[tuple[str, bytes]] | None = None,
    value: bytes = codec.enc_string("body"),
    with_properties: bool = True,
    annotations: list[tuple[str, bytes]] | None = None,
) -> bytes:
    """An encoded message: message annotations (symbol, encoded value), properties (message id
    as given, already encoded), application properties (name, encoded value), and an AMQP value body."""
    sections = []
    if annotations:
        entries = [(codec.enc_symbol(name), raw) for name, raw in annotations]
        sections.append(codec.enc_described(codec.MESSAGE_ANNOTATIONS, enc_map(entries)))
    if with_properties:
        sections.append(codec.enc_described(codec.PROPERTIES, codec.enc_list([message_id or codec.NULL])))
    if application_properties:
        entries = [(codec.enc_string(name), raw) for name, raw in application_properties]
        sections.append(codec.enc_described(codec.APPLICATION_PROPERTIES, enc_map(entries)))
    sections.append(codec.enc_described(codec.AMQP_VALUE, value))
    return b"".join(sections)


def section(payload: bytes, code: int) -> bytes | None:
    """The encoded value of a message's section, or None."""
    for found in codec.split_sections(payload):
        if found.code == code:
            return payload[found.value_start : found.end]
    return None


def application_properties(payload: bytes) -> dict[str, bytes]:
    """A message's application properties: name -> encoded value (types kept)."""
    raw = section(payload, codec.APPLICATION_PROPERTIES)
    if raw is None:
        return {}
    return {codec.text_key(key) or "": value for key, value in codec.map_entries(raw)}


def header_delivery_count(payload: bytes) -> int:
    items = codec.list_items(section(payload, codec.HEADER) or codec.NULL)
    return codec.decode_value(items[4]) if len(items) > 4 and items[4] != codec.NULL else 0


_TYPES = {0xA1: "string", 0xB1: "string", 0xA0: "binary", 0xB0: "binary", 0x98: "uuid"}
_TYPES.update({0x80: "ulong", 0x53: "ulong", 0x44: "ulong"})


def typed(encoded: bytes) -> tuple[str, Any]:
    """An encoded message id's AMQP type and value (``ulong`` however it is encoded)."""
    return _TYPES.get(encoded[0], f"0x{encoded[0]:02x}"), codec.decode_value(encoded)


def correlation_id(payload: bytes) -> bytes | None:
    """A reply's correlation id as encoded."""
    raw = section(payload, codec.PROPERTIES)
    items = codec.list_items(raw) if raw is not None else []
    return items[5] if len(items) > 5 and items[5] != codec.NULL else None


# --- outcomes --------------------------------------------------------------------------------


def modified(fields: list[bytes]) -> bytes:
    """A ``modified`` outcome with these encoded fields (delivery-failed, undeliverable-here, message-annotations)."""
    return codec.outcome(codec.MODIFIED, fields)


RELEASED = codec.outcome(codec.RELEASED)


def rejected(info: list[tuple[str, bytes]]) -> bytes:
    """A ``rejected`` outcome whose error (``com.microsoft:dead-letter``) carries this info map."""
    entries = [(codec.enc_symbol(name), raw) for name, raw in info]
    error = codec.enc_described(
        0x1D, codec.enc_list([codec.enc_symbol("com.microsoft:dead-letter"), codec.NULL, enc_map(entries)])
    )
    return codec.outcome(codec.REJECTED, [error])


# --- the client -----------------------------------------------------------------------------


class Delivery:
    def __init__(self, delivery_id: int, tag: bytes, payload: bytes) -> None:
        self.delivery_id, self.tag, self.payload = delivery_id, tag, payload

    @property
    def lock_token(self) -> uuid.UUID:
        """The lock token as clients show it and send it to ``$management``."""
        return uuid.UUID(bytes_le=self.tag)


class RawClient:
    """One connection, one session (channel 0). Not thread-safe; every call waits for its answer."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.next_outgoing_id = 0  # transfer frames we sent
        self.next_incoming_id = 0  # transfer frames we received
        self.next_delivery_id = 0
        self._handles = 0
        self._server_handles: dict[int, int] = {}  # the server's handle -> ours
        self._received: dict[int, int] = {}  # deliveries received per (our) receiver handle
        self._nodes: dict[str, tuple[int, int]] = {}
        self._message_ids = 0
        self._pending: list[tuple[int, list[Any]]] = []
        self.sock.sendall(codec.AMQP_HEADER)
        assert read_exactly(self.sock, 8) == codec.AMQP_HEADER
        self._send_performative(
            OpenFrame(
                container_id="raw-client",
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
        )
        self.expect(codec.OPEN)
        self._send_performative(
            BeginFrame(
                remote_channel=None,
                next_outgoing_id=0,
                incoming_window=WINDOW,
                outgoing_window=WINDOW,
                handle_max=1024,
                offered_capabilities=None,
                desired_capabilities=None,
                properties=None,
            )
        )
        self.expect(codec.BEGIN)

    def close(self) -> None:
        try:
            self._send_performative(CloseFrame(error=None))
        finally:
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- frames ---------------------------------------------------------------------------------

    def _send_performative(self, performative: Any) -> None:
        self.sock.sendall(codec.encode_performative(0, performative))

    def read_frame(self) -> tuple[int, list[Any]]:
        while True:
            size, offset, _, _ = struct.unpack(">IBBH", read_exactly(self.sock, 8))
            body = read_exactly(self.sock, size - 8)[offset * 4 - 8 :]
            if body:  # else a heartbeat
                code, fields = codec.decode_performative(memoryview(body))
                if code == codec.TRANSFER:
                    self.next_incoming_id += 1
                return code, fields

    def expect(self, code: int) -> list[Any]:
        """The next frame of this kind, read now or kept from before (flows are dropped, others kept
        for a later call: a node's reply can come before the settlement of its request); fail on a
        detach, end or close."""
        for index, (got, fields) in enumerate(self._pending):
            if got == code:
                del self._pending[index]
                return fields
        while True:
            got, fields = self.read_frame()
            if got == code:
                return fields
            if got in (codec.DETACH, codec.END, codec.CLOSE):
                raise AssertionError(f"expected frame 0x{code:x}, got 0x{got:x}: {fields}")
            if got != codec.FLOW:
                self._pending.append((got, fields))

    # --- links ------------------------------------------------------------------------------------

    def attach(self, address: str, *, receiver: bool, settle_first: bool = False) -> int:
        """Attach a link (we receive on it if ``receiver``); return our handle."""
        handle = self._handles
        self._handles += 1
        self._send_performative(
            AttachFrame(
                name=f"link-{handle}",
                handle=handle,
                role=receiver,
                send_settle_mode=codec.SND_SETTLED if settle_first else 0,
                rcv_settle_mode=0,
                source=Source(address=address) if receiver else Source(address="raw-client"),
                target=Target(address="raw-client") if receiver else Target(address=address),
                unsettled=None,
                incomplete_unsettled=False,
                initial_delivery_count=None if receiver else 0,
                max_message_size=None,
                offered_capabilities=None,
                desired_capabilities=None,
                properties=None,
            )
        )
        fields = self.expect(codec.ATTACH)
        self._server_handles[fields[1]] = handle
        if receiver:
            self._received[handle] = 0
        else:
            self.expect(codec.FLOW)  # the server's credit
        return handle

    def flow(self, handle: int, credit: int) -> None:
        self.sock.sendall(
            codec.flow_frame(
                0,
                next_incoming_id=self.next_incoming_id,
                incoming_window=WINDOW,
                next_outgoing_id=self.next_outgoing_id,
                outgoing_window=WINDOW,
                handle=handle,
                delivery_count=self._received[handle],
                link_credit=credit,
            )
        )

    def send(self, handle: int, payload: bytes) -> Any:
        """Send one unsettled delivery; return the outcome the server settles it with (decoded)."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id += 1
        tag = delivery_id.to_bytes(4, "big")
        self.sock.sendall(
            codec.transfer_frame(
                0, handle, payload, delivery_id=delivery_id, delivery_tag=tag, settled=False, more=False
            )
        )
        self.next_outgoing_id += 1
        fields = self.expect(codec.DISPOSITION)
        assert fields[1] == delivery_id, fields
        return fields[4]

    def receive(self, handle: int, *, credit: int = 1) -> Delivery:
        """Grant credit and wait for the next delivery on the link."""
        self.flow(handle, credit)
        fields = self.expect(codec.TRANSFER)
        assert self._server_handles[fields[0]] == handle, fields
        assert not fields[5], "multi-frame deliveries are not handled here"
        self._received[handle] += 1
        return Delivery(fields[1], bytes(fields[2]), bytes(fields[-1]))

    def settle(self, delivery: Delivery, state: bytes) -> Any:
        """Settle a delivery we received with this outcome (unsettled: the server echoes its outcome)."""
        self.sock.sendall(
            codec.disposition_frame(
                0, role=codec.ROLE_RECEIVER, first=delivery.delivery_id, last=None, settled=False, state=state
            )
        )
        return self.expect(codec.DISPOSITION)[4]

    # --- request nodes ----------------------------------------------------------------------------

    def request(
        self,
        node: str,
        operation: str,
        body: bytes,
        *,
        message_id: bytes | None = None,
        properties: tuple[tuple[str, bytes], ...] = (),
    ) -> bytes:
        """Send a request to a node (``$cbs``, ``<queue>/$management``) and return the reply's payload.

        ``message_id`` is the encoded request message id (a string by default, as the JavaScript SDK sends).
        """
        if node not in self._nodes:
            self._nodes[node] = (self.attach(node, receiver=False), self.attach(node, receiver=True))
        sender, receiver = self._nodes[node]
        if message_id is None:
            self._message_ids += 1
            message_id = codec.enc_string(f"request-{self._message_ids}")
        request = message(
            message_id=message_id,
            application_properties=[("operation", codec.enc_string(operation)), *properties],
            value=body,
        )
        self.flow(receiver, 1)
        self.send(sender, request)
        fields = self.expect(codec.TRANSFER)
        assert self._server_handles[fields[0]] == receiver, fields
        self._received[receiver] += 1
        return bytes(fields[-1])


def status_code(reply: bytes) -> int:
    properties = application_properties(reply)
    raw = properties.get("statusCode") or properties.get("status-code")
    assert raw is not None, properties
    return codec.decode_value(raw)
