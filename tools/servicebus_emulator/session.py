"""Sessions and links: flow control, transfers in both directions, settlement.

A session counts transfer frames against the peer's incoming window and
replenishes its own; a link counts deliveries against credit. Links come in two
directions:

* :class:`IncomingLink` - the client sends (to a queue, or a request to ``$cbs``
  or ``$management``). Multi-frame transfers are reassembled; every delivery is
  settled with ``accepted`` (or ``rejected`` with an error); credit is topped up
  as it is used.
* :class:`OutgoingLink` - the client receives (from a queue or dead-letter queue,
  or the replies of a request node). It is the queue store's :class:`Consumer`:
  deliveries are sent only while the client has granted credit, ``drain`` is
  honoured, large messages are split into frames, and the client's dispositions
  (complete, abandon, dead-letter, defer, release) are applied and echoed.

A session sees its connection only through :class:`SessionHost` (the connection
module imports this one, never the other way round).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.error import AMQPError
from azure.servicebus._pyamqp.performatives import AttachFrame, DetachFrame

from . import address as addresses
from . import codec
from . import message as messages
from .broker import Broker, LockLost, MessageStore, Queue, StoredMessage
from .errors import ProtocolError
from .faults import DETACH_FORCED, DETACHED, SERVER_BUSY, THROTTLED
from .management import ManagementNode, Request, handle_cbs

log = logging.getLogger(__name__)

#: Our incoming window (transfer frames), refilled when half is used.
SESSION_WINDOW = 1 << 16
#: Credit granted to a client's sender link, topped up when half is used.
SENDER_CREDIT = 1000
#: Largest message accepted (the SDK sizes batches from this, read from our attach).
MAX_MESSAGE_SIZE = 1024 * 1024

NOT_FOUND = "amqp:not-found"
NOT_ALLOWED = "amqp:not-allowed"
DECODE_ERROR = "amqp:decode-error"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_FILTER = b"com.microsoft:session-filter"

ACCEPTED = codec.outcome(codec.ACCEPTED)
RELEASED = codec.outcome(codec.RELEASED)
REJECTED = codec.outcome(codec.REJECTED)
_TRANSFER_OVERHEAD = codec.transfer_overhead()


def rejected(condition: str, description: str) -> bytes:
    return codec.outcome(codec.REJECTED, [codec.error_value(condition, description)])


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class SessionHost(Protocol):
    """What a session needs of its connection."""

    broker: Broker

    @property
    def max_outgoing_frame_size(self) -> int:
        """The largest frame the connection may send."""

    def send(self, data: bytes) -> None:
        """Queue encoded frames for the peer."""

    def drop(self) -> None:
        """Close the socket now, without writing what is queued (an injected fault)."""


class Session:
    """One session of a connection."""

    def __init__(
        self,
        connection: SessionHost,
        channel: int,
        remote_channel: int,
        *,
        next_incoming_id: int,
        remote_incoming_window: int,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.remote_channel = remote_channel
        self.next_transfer_id = 0  # transfer frames sent (our next-outgoing-id)
        self.next_delivery_id = 0
        self.next_incoming_id = next_incoming_id
        self.remote_incoming_window = remote_incoming_window
        self.incoming_window = SESSION_WINDOW
        self.outgoing_window = SESSION_WINDOW
        self.links: dict[int, Link] = {}  # by the client's handle
        self.unsettled: dict[int, tuple[OutgoingLink, bytes]] = {}  # our deliveries by delivery id
        #: Handles of links we detached (a refusal, a fault) whose detach the client answered:
        #: frames it sent on them before reading ours are ignored, until the handle is attached again.
        self._detached: set[int] = set()

    # --- frames from the client --------------------------------------------------------------

    def on_frame(self, code: int, fields: list[Any], body: bytes = b"") -> None:
        """A frame for this session: its decoded fields, and the frame body as received."""
        if code == codec.TRANSFER:
            self._on_transfer(fields)
        elif code == codec.DISPOSITION:
            self._on_disposition(fields, body)
        elif code == codec.FLOW:
            self._on_flow(fields)
        elif code == codec.ATTACH:
            self._on_attach(fields)
        elif code == codec.DETACH:
            self._on_detach(fields)

    def _link(self, handle: int) -> Link | None:
        """The link attached with this handle (None: one we detached, see ``_detached``)."""
        link = self.links.get(handle)
        if link is None:
            if handle in self._detached:
                return None
            raise ProtocolError("amqp:session:unattached-handle", f"no link with handle {handle}")
        return link

    def _on_transfer(self, fields: list[Any]) -> None:
        if fields[1] is not None:
            self.next_incoming_id = fields[1] + 1
        self.incoming_window -= 1
        if self.incoming_window <= SESSION_WINDOW // 2:
            self.incoming_window = SESSION_WINDOW
            self.send_flow()
        link = self._link(fields[0])
        if link is None:
            return
        if isinstance(link, IncomingLink):
            if link.detach_sent:
                return  # the client sent it before it read our detach
            link.called()
            drop = self._drop(link)
            if drop == "link":
                return
            link.on_transfer(fields)
            if drop == "connection":
                self.connection.drop()
        elif isinstance(link, OutgoingLink):
            raise ProtocolError(NOT_ALLOWED, "transfer on a link the client receives on")
        # else: a refused link; the client may send before it reads our detach

    def _on_flow(self, fields: list[Any]) -> None:
        was_blocked = self.remote_incoming_window <= 0
        next_incoming_id = fields[0] if fields[0] is not None else 0
        self.remote_incoming_window = next_incoming_id + fields[1] - self.next_transfer_id
        link = self._link(fields[4]) if fields[4] is not None else None
        if link is not None:
            link.called()
            drop = self._drop(link)
            if drop == "link":
                return
            link.on_flow(fields)
            if drop == "connection":
                self.connection.drop()
                return
        if was_blocked and self.remote_incoming_window > 0:
            for link in self.links.values():
                if isinstance(link, OutgoingLink):
                    link.wake()

    def _on_disposition(self, fields: list[Any], body: bytes) -> None:
        role, first, last, settled, state = fields[0], fields[1], fields[2], fields[3], fields[4]
        if role is not codec.ROLE_RECEIVER:
            return  # the client settling its own sends: we settle those on arrival
        last = first if last is None else last
        if last - first < 64:
            ids = [delivery_id for delivery_id in range(first, last + 1) if delivery_id in self.unsettled]
        else:
            ids = [delivery_id for delivery_id in self.unsettled if first <= delivery_id <= last]
        if not ids and first == last and not settled:
            # Not one of ours (any more): say so now rather than let the client wait for an echo.
            self._echo(first, rejected(LOCK_LOST, "Unknown delivery, or its lock was lost."))
        settling = self.unsettled[ids[0]][0] if ids else None  # the link the settled deliveries came on
        if settling is not None:
            settling.called()
        drop = self._drop(settling) if settling is not None else None
        if drop == "link":
            return
        updates = _property_updates(state, body) if ids else []
        for delivery_id in ids:
            link, token = self.unsettled.pop(delivery_id)
            echo = link.settle(token, state, updates)
            if not settled and echo is not None:
                self._echo(delivery_id, echo)
        if drop == "connection":
            self.connection.drop()

    def _drop(self, link: Link) -> str | None:
        """An injected fault for a frame on a queue's link: ``"link"`` (the link is detached
        now; the frame must not be handled), ``"connection"`` (handle it, then drop the
        connection) or None."""
        if not link.carries_messages or link.detach_sent:
            return None
        drop = self.connection.broker.faults.drop()
        if drop == "link":
            link.detach(error=(DETACH_FORCED, DETACHED))
        return drop

    def detach_idle(self, now: float, timeout: float) -> None:
        """Force-detach each queue link with no call for ``timeout`` seconds, as Azure does (broker.py
        ``LINK_IDLE_TIMEOUT``). A receive waiting for a message (credit the client granted and no
        message to spend it on) is a call in progress, not idleness."""
        for link in list(self.links.values()):
            if not link.carries_messages or link.detach_sent:
                continue
            if isinstance(link, OutgoingLink) and link.available_credit() > 0:
                link.called(now)
            elif now - link.last_call >= timeout:
                self.connection.broker.operations["link.idle-detached"] += 1
                log.info("link %r idle for %.0f s: force-detached", link.name, now - link.last_call)
                link.detach(error=(DETACH_FORCED, idle_detached(link, timeout)))

    def _echo(self, delivery_id: int, state: bytes) -> None:
        self.send(
            codec.disposition_frame(
                self.channel, role=codec.ROLE_SENDER, first=delivery_id, last=None, settled=True, state=state
            )
        )

    def _on_attach(self, fields: list[Any]) -> None:
        name, handle, client_receives = _text(fields[0]) or "", fields[1], fields[2]
        if handle in self.links:
            raise ProtocolError("amqp:session:handle-in-use", f"handle {handle} is already attached")
        source, target = fields[5], fields[6]
        raw_address = (source[0] if source else None) if client_receives else (target[0] if target else None)
        where = addresses.parse(raw_address)
        queue = self.connection.broker.get(where.queue) if where and where.kind is not addresses.Kind.CBS else None
        error = _refusal(where, queue, client_receives, source)
        local_handle = next(number for number in range(len(self.links) + 1) if number not in self._local_handles())
        link: Link
        if error is not None or where is None:
            link = Link(self, name, handle, local_handle, fields)
        elif client_receives:
            store = queue.store(where.dead_letter) if queue and where.kind is addresses.Kind.QUEUE else None
            link = OutgoingLink(self, name, handle, local_handle, fields, where, store)
        else:
            link = IncomingLink(self, name, handle, local_handle, fields, self._target(where, queue))
        self.links[handle] = link
        self._detached.discard(handle)
        # A refused link gets no source/target (the SDK then drops it), then a detach with the reason.
        link.send_attach(raw_address if error is None else None)
        if error is not None:
            log.info("refused link %r to %r: %s", name, _text(raw_address), error[1])
            link.detach(error=error)
        else:
            link.start()

    def _local_handles(self) -> set[int]:
        return {link.handle for link in self.links.values()}

    def _target(self, where: addresses.Address, queue: Queue | None) -> Callable[[bytes, int], bytes]:
        if where.kind is addresses.Kind.QUEUE:
            assert queue is not None
            return QueueTarget(queue)
        if where.kind is addresses.Kind.CBS:
            return NodeTarget(self, where.key, handle_cbs)
        assert queue is not None
        node = ManagementNode(queue, queue.store(where.dead_letter))
        return NodeTarget(self, where.key, node.handle)

    def _on_detach(self, fields: list[Any]) -> None:
        link = self.links.pop(fields[0], None)
        if link is None:
            return
        link.teardown()
        if link.detach_sent:
            self._detached.add(fields[0])
        else:
            self.send(
                codec.encode_performative(self.channel, DetachFrame(handle=link.handle, closed=fields[1], error=None))
            )

    # --- to the client -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.connection.send(data)

    def send_flow(self, **link_fields: Any) -> None:
        self.send(
            codec.flow_frame(
                self.channel,
                next_incoming_id=self.next_incoming_id,
                incoming_window=self.incoming_window,
                next_outgoing_id=self.next_transfer_id,
                outgoing_window=self.outgoing_window,
                **link_fields,
            )
        )

    def send_transfer(
        self, handle: int, payload: bytes, *, delivery_tag: bytes, settled: bool, message_format: int = 0
    ) -> int:
        """Send one delivery (split into frames as needed); return its delivery id."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id = (delivery_id + 1) & 0xFFFFFFFF
        room = self.connection.max_outgoing_frame_size - _TRANSFER_OVERHEAD
        view = memoryview(payload)
        first = True
        while True:
            chunk, view = view[:room], view[room:]
            self.send(
                codec.transfer_frame(
                    self.channel,
                    handle,
                    chunk,
                    delivery_id=delivery_id if first else None,
                    delivery_tag=delivery_tag if first else None,
                    message_format=message_format,
                    settled=settled,
                    more=bool(view),
                )
            )
            self.next_transfer_id = (self.next_transfer_id + 1) & 0xFFFFFFFF
            self.remote_incoming_window -= 1
            first = False
            if not view:
                return delivery_id

    def reply(self, key: tuple[str, str, bool], payload: bytes) -> None:
        """Send a request node's reply on the client's receiver link with the same address."""
        for link in self.links.values():
            if isinstance(link, OutgoingLink) and link.address is not None and link.address.key == key:
                link.send_reply(payload)
                return
        log.info("dropped a reply for %s: the client has no receiver link on that address", key)

    def teardown(self) -> None:
        for link in self.links.values():
            link.teardown()
        self.links.clear()
        self.unsettled.clear()  # messages stay locked until their lock expires, as in Service Bus


def _property_updates(state: Any, body: bytes) -> messages.PropertyUpdates:
    """The properties to modify that a settlement carries, with their AMQP types (read from the
    frame as received, since decoding loses the difference between a string and binary):
    the ``message-annotations`` of ``modified`` (abandon, defer) or the ``info`` of a
    ``rejected`` outcome's error (dead-letter: other than the reason and description)."""
    kind = next(iter(state)) if isinstance(state, dict) and state else None
    if kind not in ("modified", "rejected") or not body:
        return []
    try:
        _, start = codec.described(body)
        fields = codec.list_items(body, start)
        if len(fields) < 5 or fields[4] == codec.NULL:
            return []
        _, outcome_start = codec.described(fields[4])
        outcome = codec.list_items(fields[4], outcome_start)
        if kind == "modified":
            return messages.property_updates(outcome[2]) if len(outcome) > 2 else []
        if not outcome or outcome[0] == codec.NULL:
            return []
        _, error_start = codec.described(outcome[0])
        error = codec.list_items(outcome[0], error_start)
        return messages.property_updates(error[2], skip=_DEAD_LETTER_KEYS) if len(error) > 2 else []
    except codec.CodecError as error:
        log.info("ignored the properties to modify of a %s outcome: %s", kind, error)
        return []


_DEAD_LETTER_KEYS = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})


def idle_detached(link: Link, timeout: float) -> str:
    """Azure's description of a link it force-detached for idleness (broker.py ``LINK_IDLE_TIMEOUT``)."""
    role = ("consumer", "Consumer") if link.client_receives else ("publisher", "Publisher")
    minutes, seconds = divmod(int(timeout), 60)
    return (f"The link '{link.name}' is force detached by the broker due to errors occurred in {role[0]}. "
            f"Detach origin: AmqpMessage{role[1]}.IdleTimerExpired: Idle timeout: "
            f"{minutes // 60:02d}:{minutes % 60:02d}:{seconds:02d}.")


def session_refusal(queue: str) -> str:
    """Why a session receiver is refused (with ``amqp:not-allowed``, as Azure refuses one on a queue
    without sessions): Azure's words, then the emulator's reason."""
    return (
        f"A sessionful message receiver cannot be created on an entity that does not require sessions: "
        f"queue '{queue}' is not session-enabled (the emulator does not support sessions)."
    )


def _refusal(
    where: addresses.Address | None, queue: Queue | None, client_receives: bool, source: list[Any] | None
) -> tuple[str, str] | None:
    """Why a link cannot be attached (AMQP condition, description), or None."""
    if where is None:
        return NOT_FOUND, "The link has no address."
    if where.kind is not addresses.Kind.CBS and queue is None:
        return NOT_FOUND, f"The messaging entity '{where.queue}' could not be found (the emulator has no such queue)."
    if where.kind is addresses.Kind.QUEUE and client_receives:
        filters = source[7] if source and len(source) > 7 else None
        if isinstance(filters, dict) and SESSION_FILTER in filters:
            return NOT_ALLOWED, session_refusal(where.queue)
    if where.kind is addresses.Kind.QUEUE and not client_receives and where.dead_letter:
        return NOT_ALLOWED, "Cannot send to a dead-letter queue."
    return None


class Link:
    """A link as attached by the client. Used as is for a link that is refused."""

    def __init__(self, session: Session, name: str, remote_handle: int, handle: int, attach: list[Any]) -> None:
        self.session = session
        self.name = name
        self.remote_handle = remote_handle
        self.handle = handle
        self.client_receives = attach[2]
        self.snd_settle_mode = attach[3]
        self.rcv_settle_mode = attach[4]
        self.detach_sent = False
        #: A link to or from a queue (not a refused link, nor one of a request node).
        self.carries_messages = False
        #: When the client last made a call on it (a send, credit, a settlement), monotonic seconds.
        self.last_call = time.monotonic()

    def called(self, now: float | None = None) -> None:
        """The client made a call on the link: its idle time starts again."""
        self.last_call = time.monotonic() if now is None else now

    def send_attach(self, raw_address: Any) -> None:
        address = _text(raw_address)
        terminus = address is not None
        self.session.send(
            codec.encode_performative(
                self.session.channel,
                AttachFrame(
                    name=self.name,
                    handle=self.handle,
                    role=not self.client_receives,
                    send_settle_mode=self.snd_settle_mode,
                    rcv_settle_mode=self.rcv_settle_mode,
                    source=Source(address=address) if terminus else None,
                    target=Target(address=address) if terminus else None,
                    unsettled=None,
                    incomplete_unsettled=False,
                    initial_delivery_count=0 if self.client_receives else None,
                    max_message_size=MAX_MESSAGE_SIZE,
                    offered_capabilities=None,
                    desired_capabilities=None,
                    properties=None,
                ),
            )
        )

    def start(self) -> None:
        """Called once the attach reply is queued."""

    def detach(self, *, error: tuple[str, str] | None = None) -> None:
        """Detach (closing) from our side, e.g. to refuse the link."""
        self.detach_sent = True
        amqp_error = AMQPError(condition=error[0], description=error[1]) if error else None
        self.session.send(
            codec.encode_performative(
                self.session.channel, DetachFrame(handle=self.handle, closed=True, error=amqp_error)
            )
        )
        self.teardown()

    def on_flow(self, fields: list[Any]) -> None:
        """Credit from the client (receiver links) or its delivery count (sender links)."""

    def teardown(self) -> None:
        """Release what the link holds (consumer registration)."""


class QueueTarget:
    """Messages sent to a queue (one, or a batch of them in one delivery)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def __call__(self, payload: bytes, message_format: int) -> bytes:
        try:
            if message_format == codec.BATCH_MESSAGE_FORMAT:
                contents = [messages.parse(inner) for inner in messages.split_batch(payload)]
            else:
                contents = [messages.parse(payload)]
        except codec.CodecError as error:
            return rejected(DECODE_ERROR, f"Malformed message: {error}")
        if not self.queue.faults.charge(len(contents)):  # a message sent costs a credit
            return rejected(SERVER_BUSY, THROTTLED)
        for content in contents:
            self.queue.send(content)
        return ACCEPTED


class NodeTarget:
    """Requests to ``$cbs`` or ``$management``: the reply goes to the matching receiver link."""

    def __init__(self, session: Session, key: tuple[str, str, bool], handler: Callable[[Request], bytes]) -> None:
        self.session = session
        self.key = key
        self.handler = handler

    def __call__(self, payload: bytes, message_format: int) -> bytes:
        try:
            request = Request.parse(payload)
        except codec.CodecError as error:
            return rejected(DECODE_ERROR, f"Malformed request: {error}")
        self.session.reply(self.key, self.handler(request))
        return ACCEPTED


class IncomingLink(Link):
    """The client sends on this link."""

    def __init__(
        self,
        session: Session,
        name: str,
        remote_handle: int,
        handle: int,
        attach: list[Any],
        target: Callable[[bytes, int], bytes],
    ) -> None:
        super().__init__(session, name, remote_handle, handle, attach)
        self.target = target
        self.carries_messages = isinstance(target, QueueTarget)
        self.delivery_count = attach[9] or 0
        self.credit = 0
        self._delivery: tuple[int, int, bool] | None = None  # id, format, settled
        self._parts: list[bytes] = []
        self._size = 0

    def start(self) -> None:
        self._grant()

    def _grant(self) -> None:
        self.credit = SENDER_CREDIT
        self.session.send_flow(handle=self.handle, delivery_count=self.delivery_count, link_credit=self.credit)

    def on_flow(self, fields: list[Any]) -> None:
        if fields[5] is not None:
            self.delivery_count = fields[5]
        if fields[9] or self.credit < SENDER_CREDIT // 2:  # echo requested, or running low
            self._grant()

    def on_transfer(self, fields: list[Any]) -> None:
        payload = fields[-1]
        if self._delivery is None:
            if fields[1] is None:
                raise ProtocolError("amqp:session:invalid-field", "first transfer of a delivery has no delivery id")
            self._delivery = (fields[1], fields[3] or 0, bool(fields[4]))
            self._parts, self._size = [], 0
        if fields[9]:  # aborted
            self._delivery = None
            return
        self._size += len(payload)
        if self._size <= MAX_MESSAGE_SIZE:
            self._parts.append(bytes(payload))
        if fields[5]:  # more frames to come
            return
        delivery_id, message_format, settled = self._delivery
        self._delivery = None
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        self.credit -= 1
        if self._size > MAX_MESSAGE_SIZE:
            state = rejected(
                MESSAGE_SIZE_EXCEEDED,
                f"The message of {self._size} bytes exceeds the limit of {MAX_MESSAGE_SIZE} bytes.",
            )
        else:
            state = self.target(b"".join(self._parts), message_format)
        self._parts = []
        if not settled:
            self.session.send(
                codec.disposition_frame(
                    self.session.channel,
                    role=codec.ROLE_RECEIVER,
                    first=delivery_id,
                    last=None,
                    settled=True,
                    state=state,
                )
            )
        if self.credit < SENDER_CREDIT // 2:
            self._grant()


class OutgoingLink(Link):
    """The client receives on this link: from a queue's store, or a request node's replies."""

    def __init__(
        self,
        session: Session,
        name: str,
        remote_handle: int,
        handle: int,
        attach: list[Any],
        address: addresses.Address,
        store: MessageStore | None,
    ) -> None:
        super().__init__(session, name, remote_handle, handle, attach)
        self.address = address
        self.store = store
        self.carries_messages = store is not None
        self.operations = session.connection.broker.operations
        self._path = store.path if store is not None else "reply"
        self.receive_and_delete = self.snd_settle_mode == codec.SND_SETTLED
        self.delivery_count = 0
        self.credit = 0
        self.drain = False
        self._replies: list[bytes] = []
        self._attached = True

    def start(self) -> None:
        if self.store is not None:
            self.store.add_consumer(self)

    def teardown(self) -> None:
        self._attached = False
        if self.store is not None:
            self.store.remove_consumer(self)
            # Its deliveries cannot be settled on another link (their messages stay locked
            # until their locks expire, or are settled by lock token over $management).
            for delivery_id in [d for d, (link, _) in self.session.unsettled.items() if link is self]:
                del self.session.unsettled[delivery_id]

    def throttled(self) -> None:
        self.detach(error=(SERVER_BUSY, THROTTLED))

    def wake(self) -> None:
        if self.store is not None:
            self.store.wake()
        else:
            self._send_replies()

    # --- Consumer -------------------------------------------------------------------------------

    def available_credit(self) -> int:
        if not self._attached or self.session.remote_incoming_window <= 0:
            return 0
        return self.credit

    def deliver(self, message: StoredMessage, lock_token: bytes | None) -> None:
        self.operations["deliver " + self._path] += 1
        payload = messages.encode(
            message.content,
            sequence_number=message.sequence_number,
            enqueued_ms=message.enqueued_ms,
            delivery_count=message.delivery_count,
            locked_until_ms=int(message.locked_until * 1000) if lock_token is not None else None,
            dead_letter=message.dead_letter,
        )
        tag = lock_token if lock_token is not None else _receive_and_delete_tag(message)
        delivery_id = self.session.send_transfer(self.handle, payload, delivery_tag=tag, settled=lock_token is None)
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        if lock_token is not None:
            self.session.unsettled[delivery_id] = (self, lock_token)

    # --- flow and settlement -----------------------------------------------------------------

    def on_flow(self, fields: list[Any]) -> None:
        delivery_count = fields[5] if fields[5] is not None else 0
        link_credit = fields[6] or 0
        self.credit = max(0, (delivery_count + link_credit - self.delivery_count) & 0xFFFFFFFF)
        if self.credit > 0x7FFFFFFF:  # the client counted fewer deliveries than we sent: none left
            self.credit = 0
        self.drain = bool(fields[8])
        self.wake()
        if self.drain:
            self._finish_drain()
        elif fields[9]:
            self._send_state()

    def _finish_drain(self) -> None:
        """After delivering what is available: the credit left is used up, and the client told so."""
        self.delivery_count = (self.delivery_count + self.credit) & 0xFFFFFFFF
        self.credit = 0
        self.drain = False
        self._send_state(drain=True)

    def _send_state(self, *, drain: bool = False) -> None:
        self.session.send_flow(
            handle=self.handle, delivery_count=self.delivery_count, link_credit=self.credit, available=0, drain=drain
        )

    def settle(self, token: bytes, state: Any, updates: messages.PropertyUpdates | None = None) -> bytes | None:
        """Apply the client's outcome for a delivery; return the outcome to echo (None: nothing to echo).

        As Service Bus does: ``accepted`` completes; ``modified`` with ``undeliverable-here``
        defers; any other ``modified`` abandons, counting a delivery whether ``delivery-failed``
        is set or not (the Python SDK sets it, the .NET and JavaScript SDKs leave it unset);
        ``rejected`` dead-letters; ``released`` hands the message back without counting a
        delivery. ``updates`` are the outcome's properties to modify (abandon, defer, dead-letter).
        """
        assert self.store is not None
        kind, value = next(iter(state.items())) if isinstance(state, dict) and state else (None, None)
        self.operations[f"settle.{kind or 'none'} {self._path}"] += 1
        try:
            if kind == "accepted":
                self.store.complete(token)
                return ACCEPTED
            if kind == "modified":
                delivery_failed, undeliverable_here = (list(value or []) + [None, None])[:2]
                if undeliverable_here:
                    self.store.defer(token, updates)
                else:
                    self.store.abandon(token, updates)
                return codec.outcome(
                    codec.MODIFIED, [codec.enc_bool(bool(delivery_failed)), codec.enc_bool(bool(undeliverable_here))]
                )
            if kind == "rejected":
                error = value[0] if value else None
                info = error[2] if error and len(error) > 2 and isinstance(error[2], dict) else {}
                self.store.dead_letter(
                    token,
                    _text(info.get(b"DeadLetterReason")),
                    _text(info.get(b"DeadLetterErrorDescription")),
                    updates,
                )
                return REJECTED
            if kind == "received":
                return None  # not an outcome
            self.store.release(token)  # released, or settled without an outcome: nothing is lost
            return RELEASED
        except LockLost:
            return rejected(LOCK_LOST, "The lock on the message has expired or was lost; it is available again.")

    # --- request node replies -------------------------------------------------------------------

    def send_reply(self, payload: bytes) -> None:
        self._replies.append(payload)
        self._send_replies()

    def _send_replies(self) -> None:
        while self._replies and self.available_credit() > 0:
            self.session.send_transfer(self.handle, self._replies.pop(0), delivery_tag=b"\x00" * 4, settled=True)
            self.credit -= 1
            self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF


def _receive_and_delete_tag(message: StoredMessage) -> bytes:
    return message.sequence_number.to_bytes(16, "little")
