"""One client connection: protocol headers, SASL, open/close, and its sessions.

The server side of the AMQP 1.0 transport, as the azure-servicebus SDK uses it.
Frames are read from a buffer as they arrive; frames to send are queued and
written together once the current batch of input is handled, so a burst of
deliveries or settlements costs one ``send`` (and the socket has Nagle's algorithm
off, so nothing waits for an ACK).

Anything that is not AMQP (a TLS handshake, garbage, a frame that does not
decode) gets a clean close: an AMQP ``close`` carrying the error when the
connection is open, otherwise our protocol header, and the socket is closed. The
server keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from typing import Any

from azure.servicebus._pyamqp.error import AMQPError
from azure.servicebus._pyamqp.performatives import (
    BeginFrame,
    CloseFrame,
    EndFrame,
    OpenFrame,
    SASLMechanism,
    SASLOutcome,
)

from . import codec
from .broker import Broker
from .errors import ProtocolError
from .session import Session

log = logging.getLogger(__name__)

#: Largest frame we accept, and the largest we send (also when the client allows more,
#: so a big message is split into several frames in both directions).
MAX_FRAME_SIZE = 64 * 1024
CONTAINER_ID = "servicebus-emulator"
SASL_MECHANISMS = [b"ANONYMOUS", b"PLAIN", b"MSSBCBS"]

DECODE_ERROR = "amqp:decode-error"
FRAMING_ERROR = "amqp:connection:framing-error"
ILLEGAL_STATE = "amqp:illegal-state"
NOT_ALLOWED = "amqp:not-allowed"
INTERNAL_ERROR = "amqp:internal-error"

_HEADER = struct.Struct(">IBBH")
_NAMES = {
    codec.OPEN: "open",
    codec.BEGIN: "begin",
    codec.ATTACH: "attach",
    codec.FLOW: "flow",
    codec.TRANSFER: "transfer",
    codec.DISPOSITION: "disposition",
    codec.DETACH: "detach",
    codec.END: "end",
    codec.CLOSE: "close",
}
#: The operation counter of each kind of frame a client sends (the SASL init frame too).
_FRAME_COUNTERS = {code: f"frame.{name}" for code, name in {**_NAMES, codec.SASL_INIT: "sasl_init"}.items()}


def _frame_counter(code: int) -> str:
    return _FRAME_COUNTERS.get(code) or f"frame.{code:#x}"


class Connection(asyncio.Protocol):
    """The server end of one AMQP connection.

    ``registry`` is the server's set of open connections: the connection adds itself
    when its socket is accepted and removes itself when it is closed.
    """

    def __init__(self, broker: Broker, registry: set[Connection]) -> None:
        self.registry = registry
        self.broker = broker
        self.operations = broker.operations
        self.loop = broker.loop
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.remote_max_frame_size = 512
        self.sessions: dict[int, Session] = {}  # by the client's channel
        self._ended: set[int] = set()  # channels whose session ended (the SDK still detaches on them)
        self._input = bytearray()
        self._expect_header = True
        self._sasl = False
        self._opened = False
        self._closing = False
        self._output: list[bytes] = []
        self._flush_scheduled = False
        self._reading = False  # inside data_received: its output is written when it returns
        self._heartbeat: asyncio.TimerHandle | None = None
        self._sent_since_heartbeat = False
        self._idle_check: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.registry.add(self)
        self.operations["connections"] += 1
        log.debug("connection from %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.discard(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._idle_check is not None:
            self._idle_check.cancel()
        for session in list(self.sessions.values()):
            session.teardown()
        self.sessions.clear()
        self._closing = True
        log.debug("connection from %s closed%s", self.peer, f": {exc}" if exc else "")

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._input += data
        self._reading = True
        try:
            self._process_input()
        except ProtocolError as error:
            self.fail(error.condition, error.description)
        except codec.CodecError as error:
            self.fail(DECODE_ERROR, str(error))
        except Exception as error:  # a bug here must not take the server down
            log.exception("internal error on connection from %s", self.peer)
            self.fail(INTERNAL_ERROR, f"emulator error: {error!r}")
        finally:
            self._reading = False
        if self._output and not self._flush_scheduled:
            self._flush()

    # --- output ---------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue bytes for the peer; they are written together once the current input (or loop pass) is handled."""
        if self._closing and not self._output and not self._flush_scheduled:
            return
        self._output.append(data)
        if not self._flush_scheduled and not self._reading:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._output and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._output))
            self._sent_since_heartbeat = True
        self._output.clear()
        if self._closing and self.transport is not None:
            self.transport.close()

    def close_transport(self) -> None:
        """Close the socket once what is queued has been written."""
        self._closing = True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def drop(self) -> None:
        """Close the socket at once, without writing what is queued: an injected fault (faults.py)."""
        if self._closing:
            return
        log.info("dropping the connection from %s (injected fault)", self.peer)
        self._output.clear()
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    def fail(self, condition: str, description: str) -> None:
        """Close the connection because of a protocol error."""
        if self._closing:
            return
        log.warning("closing connection from %s: %s (%s)", self.peer, description, condition)
        if self._opened:
            self.send(codec.encode_performative(0, CloseFrame(error=AMQPError(condition, description))))
        self.close_transport()

    @property
    def max_outgoing_frame_size(self) -> int:
        return min(self.remote_max_frame_size, MAX_FRAME_SIZE)

    # --- input ------------------------------------------------------------------------------------

    def _process_input(self) -> None:
        buffer = self._input
        position = 0
        try:
            while not self._closing:
                if self._expect_header:
                    if len(buffer) - position < 8:
                        break
                    header = bytes(buffer[position : position + 8])
                    position += 8
                    self._on_protocol_header(header)
                    continue
                if len(buffer) - position < 8:
                    break
                size, offset, frame_type, channel = _HEADER.unpack_from(buffer, position)
                if size < 8 or offset < 2 or offset * 4 > size:
                    raise ProtocolError(FRAMING_ERROR, f"malformed frame header (size {size}, offset {offset})")
                if size > MAX_FRAME_SIZE:
                    raise ProtocolError(FRAMING_ERROR, f"frame of {size} bytes exceeds max-frame-size {MAX_FRAME_SIZE}")
                if len(buffer) - position < size:
                    break
                body = bytes(buffer[position + offset * 4 : position + size])
                position += size
                self._on_frame(frame_type, channel, body)
        finally:
            del buffer[:position]

    def _on_protocol_header(self, header: bytes) -> None:
        if header == codec.SASL_HEADER and not self._sasl:
            self._sasl = True
            self._expect_header = False
            self.send(codec.SASL_HEADER)
            mechanisms = SASLMechanism(sasl_server_mechanisms=SASL_MECHANISMS)
            self.send(codec.encode_performative(0, mechanisms, codec.FRAME_SASL))
        elif header == codec.AMQP_HEADER:
            self._expect_header = False
            self.send(codec.AMQP_HEADER)
        else:
            kind = "a TLS handshake" if header[:1] == b"\x16" else f"protocol header {header!r}"
            log.warning(
                "closing connection from %s: it sent %s; the emulator speaks plain AMQP 1.0 (no TLS: "
                "use UseDevelopmentEmulator=true in the connection string)",
                self.peer,
                kind,
            )
            self.send(codec.AMQP_HEADER)  # what we speak, as the spec asks, then close
            self.close_transport()

    def _on_frame(self, frame_type: int, channel: int, body: bytes) -> None:
        if self._sasl and not self._opened and frame_type == codec.FRAME_SASL:
            self._on_sasl_frame(body)
            return
        if frame_type != codec.FRAME_AMQP:
            raise ProtocolError(FRAMING_ERROR, f"unexpected frame type {frame_type}")
        if not body:
            return  # empty frame: a heartbeat
        code, fields = codec.decode_performative(memoryview(body))
        self.operations[_frame_counter(code)] += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "<- %s ch%d %s", _NAMES.get(code, hex(code)), channel, fields[:-1] if code == codec.TRANSFER else fields
            )
        if code == codec.OPEN:
            self._on_open(fields)
        elif not self._opened:
            raise ProtocolError(ILLEGAL_STATE, f"frame 0x{code:x} before open")
        elif code == codec.CLOSE:
            self._on_close()
        elif code == codec.BEGIN:
            self._on_begin(channel, fields)
        elif code == codec.END:
            session = self._session(channel)
            session.teardown()
            del self.sessions[channel]
            self._ended.add(channel)
            self.send(codec.encode_performative(session.channel, EndFrame(error=None)))
        elif code in (codec.ATTACH, codec.FLOW, codec.TRANSFER, codec.DISPOSITION, codec.DETACH):
            if channel in self._ended and channel not in self.sessions:
                log.debug("ignored a frame on channel %d after its session ended", channel)
                return
            self._session(channel).on_frame(code, fields, body)
        else:
            raise ProtocolError(NOT_ALLOWED, f"unexpected frame 0x{code:x}")

    def _session(self, channel: int) -> Session:
        session = self.sessions.get(channel)
        if session is None:
            raise ProtocolError(ILLEGAL_STATE, f"no session on channel {channel}")
        return session

    def _on_sasl_frame(self, body: bytes) -> None:
        code, fields = codec.decode_performative(memoryview(body))
        self.operations[_frame_counter(code)] += 1
        if code != codec.SASL_INIT:
            raise ProtocolError(ILLEGAL_STATE, f"unexpected SASL frame 0x{code:x}")
        log.debug("SASL %s from %s (accepted: the emulator does not authenticate)", fields[0], self.peer)
        self.send(codec.encode_performative(0, SASLOutcome(code=0, additional_data=None), codec.FRAME_SASL))
        self._expect_header = True  # next comes the AMQP protocol header

    def _on_open(self, fields: list[Any]) -> None:
        if self._opened:
            raise ProtocolError(ILLEGAL_STATE, "second open")
        self._opened = True
        max_frame_size = fields[2] if fields[2] is not None else 0xFFFFFFFF
        if max_frame_size < 512:
            raise ProtocolError("amqp:invalid-field", "max-frame-size below 512")
        self.remote_max_frame_size = max_frame_size
        self.send(
            codec.encode_performative(
                0,
                OpenFrame(
                    container_id=CONTAINER_ID,
                    hostname=None,
                    max_frame_size=MAX_FRAME_SIZE,
                    channel_max=65535,
                    idle_timeout=None,
                    outgoing_locales=None,
                    incoming_locales=None,
                    offered_capabilities=None,
                    desired_capabilities=None,
                    properties=None,
                ),
            )
        )
        idle_timeout_ms = fields[4]
        if idle_timeout_ms:
            self._schedule_heartbeat(idle_timeout_ms / 2000.0)
        self._schedule_idle_check()

    def _schedule_idle_check(self) -> None:
        """Every few seconds (a quarter of the timeout, at most 30 s), force-detach the links idle
        past the broker's ``link_idle_timeout``, as Azure does (session.py ``detach_idle``)."""
        timeout = self.broker.link_idle_timeout
        interval = 1.0 if not timeout else min(30.0, max(0.05, timeout / 4))

        def check() -> None:
            if self._closing:
                return
            if self.broker.link_idle_timeout:
                now = time.monotonic()
                for session in list(self.sessions.values()):
                    session.detach_idle(now, self.broker.link_idle_timeout)
            self._schedule_idle_check()

        self._idle_check = self.loop.call_later(interval, check)

    def restart_idle_check(self) -> None:
        """The broker's ``link_idle_timeout`` changed: check at the new pace from now on."""
        if self._idle_check is not None and not self._closing:
            self._idle_check.cancel()
            self._schedule_idle_check()

    def _schedule_heartbeat(self, interval: float) -> None:
        def beat() -> None:
            if self._closing:
                return
            if not self._sent_since_heartbeat:
                self.send(codec.EMPTY_FRAME)
            self._sent_since_heartbeat = False
            self._heartbeat = self.loop.call_later(interval, beat)

        self._heartbeat = self.loop.call_later(interval, beat)

    def _on_close(self) -> None:
        for session in list(self.sessions.values()):
            session.teardown()
        self.sessions.clear()
        self.send(codec.encode_performative(0, CloseFrame(error=None)))
        self.close_transport()

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        if fields[0] is not None:
            raise ProtocolError(ILLEGAL_STATE, "begin answering a session the emulator never started")
        if channel in self.sessions:
            raise ProtocolError(ILLEGAL_STATE, f"channel {channel} already has a session")
        used = {session.channel for session in self.sessions.values()}
        local = next(number for number in range(len(used) + 1) if number not in used)
        session = Session(self, local, channel, next_incoming_id=fields[1], remote_incoming_window=fields[2])
        self.sessions[channel] = session
        self._ended.discard(channel)
        self.send(
            codec.encode_performative(
                local,
                BeginFrame(
                    remote_channel=channel,
                    next_outgoing_id=session.next_transfer_id,
                    incoming_window=session.incoming_window,
                    outgoing_window=session.outgoing_window,
                    handle_max=0xFFFFFFFF,
                    offered_capabilities=None,
                    desired_capabilities=None,
                    properties=None,
                ),
            )
        )
