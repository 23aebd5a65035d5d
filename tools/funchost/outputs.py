"""Output bindings: send what a function set on its ``func.Out`` (or returned for ``$return``).

- Storage queue (``queue``): ``str``, ``bytes``, ``func.QueueMessage`` or a list of
  them (one message each), encoded as host.json ``messageEncoding`` says. The queue is
  created when missing, as the Functions host does.
- Service Bus queue (``serviceBus``): ``str`` or ``bytes``, one message, as the Python
  worker accepts.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import azure.functions as func
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusMessage, ServiceBusSender

from .app import QUEUE_OUTPUT, SERVICE_BUS_OUTPUT, Binding
from .config import QueueOptions
from .connections import Clients
from .queue_rest import LeanQueue, lean_queue

log = logging.getLogger("funchost")

#: Connections kept per queue an output sends to (invocations in flight share them).
OUTPUT_POOL_SIZE = 16


def encode_queue_text(value: str | bytes, encoding: str) -> str:
    """The text stored in a storage queue for one message body."""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    return data.decode("utf-8")


def decode_queue_text(text: str, encoding: str) -> bytes:
    """A storage queue message's body as the function sees it; ValueError if it is not valid for the encoding."""
    if encoding == "base64":
        return base64.b64decode(text.encode("ascii"), validate=True)
    return text.encode("utf-8")


def ensure_queue(clients: Clients, setting: str, queue_name: str) -> None:
    """Create a storage queue unless it exists."""
    try:
        clients.queue(setting, queue_name).create_queue()
    except ResourceExistsError:
        pass


def _queue_items(value: Any) -> list[str | bytes]:
    if isinstance(value, (str, bytes, bytearray)):
        return [value]
    if isinstance(value, func.QueueMessage):
        return [value.get_body()]
    if isinstance(value, Iterable) and not isinstance(value, dict):
        items: list[str | bytes] = []
        for item in value:
            if isinstance(item, (str, bytes, bytearray)):
                items.append(item)
            elif isinstance(item, func.QueueMessage):
                items.append(item.get_body())
            else:
                raise TypeError(f"invalid data type in output queue message list: {type(item).__name__}")
        return items
    raise TypeError(f"a queue output takes str, bytes, QueueMessage or a list of them, not {type(value).__name__}")


class OutputSender:
    """Sends output binding values; thread-safe. ``on_queue_message(name)`` is told of every storage send."""

    def __init__(
        self, clients: Clients, queue_options: QueueOptions, on_queue_message: Callable[[str], None] | None = None
    ) -> None:
        self._clients = clients
        self._encoding = queue_options.message_encoding
        self._on_queue_message = on_queue_message or (lambda name: None)
        self._senders: dict[tuple[str, str], tuple[threading.Lock, ServiceBusSender]] = {}
        self._lean: dict[tuple[str, str], LeanQueue | None] = {}
        self._lock = threading.Lock()

    def prepare(self, binding: Binding) -> None:
        """Before listening: create the storage queue an output sends to."""
        if binding.type == QUEUE_OUTPUT:
            ensure_queue(self._clients, binding.connection, binding.queue_name)

    def send(self, binding: Binding, value: Any) -> None:
        if binding.type == QUEUE_OUTPUT:
            self._send_queue(binding, value)
        elif binding.type == SERVICE_BUS_OUTPUT:
            self._send_servicebus(binding, value)
        else:  # build_spec only admits the two kinds above
            raise TypeError(f"unsupported output binding {binding.type}")

    def _send_queue(self, binding: Binding, value: Any) -> None:
        client = self._clients.queue(binding.connection, binding.queue_name)
        key = (binding.connection, binding.queue_name)
        with self._lock:
            if key not in self._lean:  # Put Message without the SDK's pipeline where the connection allows
                self._lean[key] = lean_queue(client, pool_size=OUTPUT_POOL_SIZE)
            lean = self._lean[key]
        send = lean.send if lean is not None else client.send_message
        for item in _queue_items(value):
            text = encode_queue_text(item, self._encoding)
            try:
                send(text)
            except ResourceNotFoundError:
                ensure_queue(self._clients, binding.connection, binding.queue_name)
                send(text)
        self._on_queue_message(binding.queue_name)

    def _send_servicebus(self, binding: Binding, value: Any) -> None:
        if isinstance(value, bytearray):
            value = bytes(value)
        if not isinstance(value, (str, bytes)):
            raise TypeError(f"a Service Bus output takes str or bytes, not {type(value).__name__}")
        key = (binding.connection, binding.queue_name)
        with self._lock:
            if key not in self._senders:
                client = self._clients.servicebus_client(binding.connection)
                self._senders[key] = (threading.Lock(), client.get_queue_sender(binding.queue_name))
            lock, sender = self._senders[key]
        with lock:
            try:
                sender.send_messages(ServiceBusMessage(value))
            except Exception:
                # A broken link is not retried by the SDK once closed: drop this sender so the
                # next send opens a fresh one, and let the invocation fail (its trigger retries).
                with self._lock:
                    if self._senders.get(key, (None, None))[1] is sender:
                        del self._senders[key]
                try:
                    sender.close()
                except Exception:
                    pass
                raise

    def close(self) -> None:
        with self._lock:
            senders = list(self._senders.values())
            self._senders.clear()
            lean = [queue for queue in self._lean.values() if queue is not None]
            self._lean.clear()
        for queue in lean:
            queue.close()
        for lock, sender in senders:
            with lock:
                try:
                    sender.close()
                except Exception:  # shutting down: a failed close changes nothing
                    pass
