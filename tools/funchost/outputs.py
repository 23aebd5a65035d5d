"""Output bindings: send what the worker answered for a function's ``func.Out`` (or its ``$return``).

The worker's runtime encodes each value as ``TypedData`` (``azure.functions``' converters:
a queue output's ``str`` as a string, ``bytes`` as bytes, a ``func.QueueMessage`` or a
list as JSON; a Service Bus output's ``str`` or ``bytes``); the host turns it back into
messages as its extensions do:

- Storage queue (``queue``): a string or bytes is one message; a JSON array one message
  per item (a string item as its text, any other item as its JSON); other JSON one
  message of that JSON text. Each is encoded as host.json ``messageEncoding`` says. The
  queue is created when missing, as the Functions host does.
- Service Bus queue (``serviceBus``): one message of the string, bytes or JSON text.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

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


def _text(value: Any) -> str | bytes:
    """One ``TypedData`` as a message body: a string or bytes as it is, anything else as its text."""
    kind = value.WhichOneof("data")
    if kind in ("string", "json"):
        return getattr(value, kind)
    if kind in ("bytes", "stream"):
        return bytes(getattr(value, kind))
    if kind in ("int", "double"):
        return str(getattr(value, kind))
    raise TypeError(f"an output binding cannot send TypedData of kind {kind}")


def _queue_items(value: Any) -> list[str | bytes]:
    """The messages a queue output sends for one ``TypedData``: a JSON array is one message per item."""
    if value.WhichOneof("data") == "json":
        parsed = json.loads(value.json)
        if isinstance(parsed, list):
            return [item if isinstance(item, str) else json.dumps(item, separators=(",", ":")) for item in parsed]
    return [_text(value)]


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
        else:  # build_spec admits only the two kinds above
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
        value = _text(value)
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
