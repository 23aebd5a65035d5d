"""The bytes of each message as the broker sent it, for this host's own receivers.

The Python SDK (``azure-servicebus`` with its pure-Python AMQP stack) decodes a
message's sections before handing it over and loses their wire types (strings,
symbols and binaries all become ``bytes``); the Functions host's .NET client keeps
them, and what a function receives depends on them. So, on the receivers this host
creates (never on the app's own clients), a tap on the AMQP receive link keeps each
delivery's payload, keyed by its lock token, until the listener takes it.

The tap also catches a delivery the SDK cannot decode at all (e.g. an AMQP ``char`` or
``decimal32`` that the .NET client reads but the Python SDK does not), which would
otherwise fail the whole receive call, again after every lock expiry: the listener
dead-letters it (:meth:`DeliveryTap.take_undecodable`).

This relies on the SDK's internals (``ServiceBusReceiver._create_handler``, the
receive client's ``_client_ready``, the link's ``_incoming_transfer``), checked
against ``azure-servicebus`` 7.15 (pyamqp transport). When they are not there, the
tap stays off, says so once, and messages are converted from the SDK's decoded values
(see ``servicebus_message.from_sdk_message``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("funchost")

#: Payloads kept at most (deliveries the SDK released unseen are never taken: the oldest go).
MAX_KEPT = 1000

# Transfer performative fields (AMQP 1.0 part 2.7.5), as pyamqp's TransferFrame orders them.
_DELIVERY_ID, _DELIVERY_TAG, _MORE, _ABORTED, _PAYLOAD = 1, 2, 5, 9, 11

#: What each missing hook costs, said once per kind (the tap, the keep-alive).
_CONSEQUENCE = {
    "tap": "message properties are converted from the SDK's decoded values (a binary and a string message id "
           "look alike there)",
    "keep-alive": "the SDK's keep-alive thread stays on, and a Service Bus message may reach its function up to "
                  "its socket timeout late",
}
_warned: set[str] = set()


@dataclass(frozen=True)
class Undecodable:
    """A delivery the Python SDK failed to decode: settle it with ``delivery_id``/``delivery_tag``."""

    delivery_id: int
    delivery_tag: bytes
    payload: bytes
    error: BaseException

    @property
    def lock_token(self) -> str | None:
        return _lock_token(self.delivery_tag)


def _lock_token(tag: Any) -> str | None:
    tag = bytes(tag or b"")
    return str(uuid.UUID(bytes_le=tag)) if len(tag) == 16 else None


class DeliveryTap:
    """Installed on one ``ServiceBusReceiver`` before it opens; see the module docstring."""

    def __init__(self, receiver: Any) -> None:
        self._payloads: OrderedDict[str, bytes] = OrderedDict()
        self._undecodable: list[Undecodable] = []
        self._lock = threading.Lock()  # the SDK's keep-alive thread may read frames too
        self.installed = self._install(receiver)

    # --- what the listener uses -------------------------------------------------------

    def take(self, lock_token: Any) -> bytes | None:
        """The payload of the delivery with this lock token (once), or None."""
        if lock_token is None:
            return None
        with self._lock:
            return self._payloads.pop(str(lock_token), None)

    def take_undecodable(self) -> list[Undecodable]:
        with self._lock:
            found, self._undecodable = self._undecodable, []
        return found

    # --- the hooks ------------------------------------------------------------------

    def _install(self, receiver: Any) -> bool:
        return _on_new_handler(receiver, self._hook_handler, "tap")

    def _hook_handler(self, handler: Any) -> None:
        ready = getattr(handler, "_client_ready", None)
        if ready is None or not hasattr(handler, "_link"):
            _warn_once("the receive client's _client_ready/_link")
            return

        def client_ready(*args: Any, **kwargs: Any) -> Any:
            result = ready(*args, **kwargs)
            link = getattr(handler, "_link", None)
            if link is not None and not getattr(link, "_funchost_tap", False):
                self._hook_link(link)
            return result

        handler._client_ready = client_ready

    def _hook_link(self, link: Any) -> None:
        incoming = getattr(link, "_incoming_transfer", None)
        if incoming is None or not hasattr(link, "_received_payload"):
            _warn_once("the receive link's _incoming_transfer")
            return
        chunks: list[bytes] = []
        current: dict[str, Any] = {"active": False, "id": None, "tag": None}  # the delivery being received

        def incoming_transfer(frame: Any) -> Any:
            if not current["active"]:
                current.update(active=True, id=frame[_DELIVERY_ID], tag=frame[_DELIVERY_TAG])
                chunks.clear()
            if len(frame) > _PAYLOAD and frame[_PAYLOAD] is not None:
                chunks.append(bytes(frame[_PAYLOAD]))
            if len(frame) > _ABORTED and frame[_ABORTED]:
                current["active"] = False
                chunks.clear()
                return incoming(frame)
            if frame[_MORE]:
                return incoming(frame)
            current["active"] = False
            payload = b"".join(chunks)
            chunks.clear()
            token = _lock_token(current["tag"])
            if token is not None:
                with self._lock:
                    self._payloads[token] = payload
                    while len(self._payloads) > MAX_KEPT:
                        self._payloads.popitem(last=False)
            try:
                return incoming(frame)
            except Exception as error:  # the SDK could not decode it: settle it, or every receive fails on it
                link._received_payload = bytearray()
                if current["id"] is None or current["tag"] is None:
                    raise
                with self._lock:
                    if token is not None:
                        self._payloads.pop(token, None)
                    self._undecodable.append(Undecodable(current["id"], bytes(current["tag"]), payload, error))
                return None

        link._incoming_transfer = incoming_transfer
        link._funchost_tap = True


def _on_new_handler(receiver: Any, hook: Any, kind: str) -> bool:
    """Call ``hook(handler)`` on each receive client ``receiver`` makes, before it opens (its
    first open and the SDK's own reopens go through ``_create_handler``); False, said once
    for ``kind``, when this SDK version has no such method."""
    create = getattr(receiver, "_create_handler", None)
    if create is None or not callable(create):
        _warn_once("ServiceBusReceiver._create_handler", kind)
        return False

    def create_handler(*args: Any, **kwargs: Any) -> Any:
        result = create(*args, **kwargs)
        hook(getattr(receiver, "_handler", None))
        return result

    receiver._create_handler = create_handler
    return True


def _warn_once(what: str, kind: str = "tap") -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.warning("this azure-servicebus version has no %s: %s", what, _CONSEQUENCE[kind])


def dead_letter_undecodable(receiver: Any, item: Undecodable, reason: str, description: str) -> None:
    """Dead-letter a delivery the SDK could not decode, on the link it came on (as the SDK dead-letters)."""
    from azure.servicebus._common.constants import (  # noqa: PLC0415 - internals, only needed here
        DEADLETTERNAME,
        RECEIVER_LINK_DEAD_LETTER_ERROR_DESCRIPTION,
        RECEIVER_LINK_DEAD_LETTER_REASON,
    )
    from azure.servicebus._pyamqp.error import AMQPError  # noqa: PLC0415

    receiver._handler.settle_messages(
        item.delivery_id,
        item.delivery_tag,
        "rejected",
        error=AMQPError(
            condition=DEADLETTERNAME,
            description=description,
            info={RECEIVER_LINK_DEAD_LETTER_REASON: reason, RECEIVER_LINK_DEAD_LETTER_ERROR_DESCRIPTION: description},
        ),
    )


#: How long the pump may leave its connection unread before it listens on it itself (the
#: interval of the SDK's own keep-alive for a receiver without prefetch).
KEEP_ALIVE_SECONDS = 5.0


class PumpKeepAlive:
    """Installed on one ``ServiceBusReceiver`` before it opens: the SDK's keep-alive thread off,
    its listening done by the pump's own thread instead.

    For a peek-lock receiver without prefetch, azure-servicebus (7.15, pyamqp) starts a
    thread that every 5 s listens on the connection for up to its socket timeout (0.2 s),
    holding the transport's socket lock all that time (``AMQPClient._keep_alive``,
    ``_AbstractTransport.read``). The pump's settlement, or the flow of its next receive,
    waits behind it: the message after it reached its function ~200 ms late, a few times a
    minute per trigger (measured: the light-load p95 send → done, BENCHMARKS.md "Where the
    CPU goes, and what was cut"). The Functions host's .NET client has no such thread. The
    pump reads the connection on every receive call (at most ``RECEIVE_WAIT_SECONDS``
    apart); when it has not (every message slot busy, or draining on stop) for
    :data:`KEEP_ALIVE_SECONDS`, :meth:`listen` does what the SDK's thread did, on the pump's
    thread: the connection is read (heartbeats, the broker's frames) as often as before,
    and nothing holds its lock while the pump needs it.
    """

    def __init__(self, receiver: Any) -> None:
        #: Whether the receive client made last had its keep-alive thread turned off.
        self.installed = False
        _on_new_handler(receiver, self._turn_off_thread, "keep-alive")

    def _turn_off_thread(self, handler: Any) -> None:
        self.installed = handler is not None and hasattr(handler, "_keep_alive_interval")
        if self.installed:
            handler._keep_alive_interval = 0  # read by open(): no thread is started
        else:
            _warn_once("the receive client's _keep_alive_interval", "keep-alive")

    def listen(self, receiver: Any) -> None:
        """What the SDK's keep-alive thread does on each of its turns, here on the caller's thread,
        failures included: logged at debug and left to the next receive, settlement or renewal,
        whose retries reopen the connection, as the thread left them."""
        handler = getattr(receiver, "_handler", None)
        connection, link = getattr(handler, "_connection", None), getattr(handler, "_link", None)
        if connection is None or link is None:
            return
        try:
            connection.listen(wait=handler._socket_timeout, batch=link.current_link_credit)
        except Exception as error:  # noqa: BLE001 - as AMQPClient._keep_alive catches it
            log.debug("keep-alive listen on the receiver's connection failed: %r", error)

