"""Request/response nodes: ``$cbs`` (token put) and ``<entity>/$management``.

Each request is an AMQP message whose application property ``operation`` names
the operation and whose body (an AMQP value) holds the arguments; the reply goes
back on the receiver link attached to the same address in the same session, with
``correlation_id`` set to the request's ``message_id``, of the same AMQP type (a
client matches replies on it: the JavaScript SDK sends strings, the Python SDK
UUIDs; a string read back as binary matches nothing). CBS replies use
``status-code``/``status-description``; management replies ``statusCode``/
``statusDescription`` (and ``errorCondition`` on failure), as Service Bus does.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

from . import codec
from . import message as messages
from .broker import LockLost, MessageNotFound, MessageState, MessageStore, Queue, StoredMessage
from .faults import SERVER_BUSY, THROTTLED

log = logging.getLogger(__name__)

LOCK_LOST = "com.microsoft:message-lock-lost"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
ARGUMENT_ERROR = "com.microsoft:argument-error"
NOT_IMPLEMENTED = "amqp:not-implemented"


class ManagementError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status, self.condition, self.description = status, condition, description


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _array(item_type: str, values: list[Any]) -> dict[str, Any]:
    return {TYPE: AMQPTypes.array, VALUE: [{TYPE: item_type, VALUE: value} for value in values]}


@dataclass(frozen=True)
class Request:
    """A request to a node: the message as sent, and decoded."""

    payload: bytes
    message: codec.Message

    @classmethod
    def parse(cls, payload: bytes) -> Request:
        """Raise ``CodecError`` if the payload is not a valid message."""
        return cls(bytes(payload), codec.decode_payload(payload))

    @property
    def operation(self) -> str:
        return _text((self.message.application_properties or {}).get(b"operation")) or ""

    @cached_property
    def raw_message_id(self) -> bytes | None:
        """The request's message id as encoded: the reply's correlation id, type and all."""
        return codec.message_id(self.payload)

    def body_entry(self, key: str) -> bytes | None:
        """The encoded value of ``key`` in the request's body map (types kept), or None."""
        for section in codec.split_sections(self.payload):
            if section.code == codec.AMQP_VALUE:
                if self.payload[section.value_start] not in (0xC1, 0xD1):
                    return None
                for raw_key, raw_value in codec.map_entries(self.payload, section.value_start):
                    if codec.text_key(raw_key) == key:
                        return raw_value
        return None


def reply(
    request: Request,
    status: int,
    description: str,
    *,
    value: Any = None,
    condition: str | None = None,
    cbs: bool = False,
) -> bytes:
    """Encode the response to ``request``."""
    code_key, description_key = ("status-code", "status-description") if cbs else ("statusCode", "statusDescription")
    properties: dict[str, Any] = {code_key: {TYPE: AMQPTypes.int, VALUE: status}, description_key: description}
    if condition:
        properties["errorCondition"] = {TYPE: AMQPTypes.symbol, VALUE: condition}
    encoded = codec.encode_message(codec.Message(application_properties=properties, value=value))
    correlation_id = request.raw_message_id
    if correlation_id is None:
        return encoded
    # properties (first: the reply has no header or annotations) with correlation-id, the 6th field
    fields = [codec.NULL] * 5 + [correlation_id]
    return codec.enc_described(codec.PROPERTIES, codec.enc_list(fields)) + encoded


def handle_cbs(request: Request) -> bytes:
    """Accept any token: the emulator does not authenticate (see the docs' limits)."""
    operation = request.operation
    if operation != "put-token":
        return reply(request, 400, f"Unsupported CBS operation {operation!r}.", cbs=True)
    return reply(request, 200, "OK", cbs=True)


def _lock_token(value: Any) -> bytes:
    if not isinstance(value, uuid.UUID):
        raise ManagementError(400, ARGUMENT_ERROR, "Lock tokens must be UUIDs.")
    return value.bytes_le  # the delivery tag, as the SDK reads it with uuid.UUID(bytes_le=tag)


def _delivered(stored: StoredMessage, locked_until: float | None, state: int | None = None) -> bytes:
    return messages.encode(
        stored.content,
        sequence_number=stored.sequence_number,
        enqueued_ms=stored.enqueued_ms,
        delivery_count=stored.delivery_count,
        locked_until_ms=int(locked_until * 1000) if locked_until is not None else None,
        state=state,
        dead_letter=stored.dead_letter,
    )


class ManagementNode:
    """The ``$management`` node of one queue or dead-letter queue."""

    def __init__(self, queue: Queue, store: MessageStore) -> None:
        self.queue = queue
        self.store = store

    def handle(self, request: Request) -> bytes:
        operation = request.operation
        name = operation.removeprefix("com.microsoft:")
        self.queue.operations[f"management.{name or '?'} {self.queue.settings.name}"] += 1
        body = request.message.value if isinstance(request.message.value, dict) else {}
        handler = getattr(self, "_" + name.replace("-", "_"), None)
        if handler is None:
            return reply(request, 501, f"The emulator does not support {operation!r}.", condition=NOT_IMPLEMENTED)
        try:
            status, value = handler(body, request)
        except ManagementError as error:
            return reply(request, error.status, error.description, condition=error.condition)
        except (KeyError, TypeError, ValueError) as error:
            log.info("bad %s request: %r", operation, error)
            return reply(request, 400, f"Bad request: {error!r}", condition=ARGUMENT_ERROR)
        return reply(request, status, "OK" if status == 200 else "No Content", value=value)

    def _charge(self, messages: int) -> None:
        """Messages sent, received or peeked cost a credit each (faults.py): 503 when throttled."""
        if messages and not self.queue.faults.charge(messages):
            raise ManagementError(503, SERVER_BUSY, THROTTLED)

    # --- operations --------------------------------------------------------------------------

    def _renew_lock(self, body: dict[bytes, Any], request: Request) -> tuple[int, Any]:
        expirations = []
        for value in body[b"lock-tokens"]:
            try:
                expirations.append(int(self.store.renew(_lock_token(value)) * 1000))
            except LockLost:
                raise ManagementError(410, LOCK_LOST, "The lock on the message has expired or was lost.") from None
        return 200, {"expirations": _array(AMQPTypes.timestamp, expirations)}

    def _schedule_message(self, body: dict[bytes, Any], request: Request) -> tuple[int, Any]:
        numbers = []
        self._charge(len(body[b"messages"]))
        for entry in body[b"messages"]:
            try:
                content = messages.parse(entry[b"message"])
            except codec.CodecError as error:
                raise ManagementError(400, ARGUMENT_ERROR, f"Malformed message: {error}") from error
            when = content.scheduled_enqueue_ms
            at = when / 1000.0 if when is not None else time.time()
            numbers.append(self.queue.schedule(content, at))
        return 200, {"sequence-numbers": _array(AMQPTypes.long, numbers)}

    def _cancel_scheduled_message(self, body: dict[bytes, Any], request: Request) -> tuple[int, Any]:
        for number in body[b"sequence-numbers"]:
            try:
                self.queue.cancel_scheduled(int(number))
            except MessageNotFound:
                pass  # already enqueued or cancelled: Service Bus does not fail either
        return 200, None

    def _peek_message(self, body: dict[bytes, Any], request: Request) -> tuple[int, Any]:
        start = int(body.get(b"from-sequence-number") or 1)
        count = int(body.get(b"message-count") or 1)
        found = self.store.peek(start, count)
        if not found:
            return 204, None
        self._charge(len(found))
        encoded = [{"message": _delivered(m, None, int(m.state) or None)} for m in found]
        return 200, {"messages": encoded}

    def _receive_by_sequence_number(self, body: dict[bytes, Any], request: Request) -> tuple[int, Any]:
        receive_and_delete = int(body.get(b"receiver-settle-mode", 1)) == 0
        results = []
        self._charge(len(body[b"sequence-numbers"]))
        for number in body[b"sequence-numbers"]:
            try:
                stored, token = self.store.take_deferred(int(number), receive_and_delete)
            except MessageNotFound:
                raise ManagementError(
                    404, MESSAGE_NOT_FOUND, f"No deferred message with sequence number {number}."
                ) from None
            entry: dict[str, Any] = {
                "message": _delivered(stored, stored.locked_until if token else None, int(MessageState.DEFERRED))
            }
            if token is not None:
                entry["lock-token"] = uuid.UUID(bytes_le=token)
            results.append(entry)
        return 200, {"messages": results}

    def _update_disposition(self, body: dict[bytes, Any], request: Request) -> tuple[int, Any]:
        status = _text(body[b"disposition-status"])
        raw_updates = request.body_entry("properties-to-modify")
        try:
            updates = messages.property_updates(raw_updates) if raw_updates is not None else []
        except codec.CodecError as error:
            raise ManagementError(400, ARGUMENT_ERROR, f"Bad properties-to-modify: {error}") from error
        for value in body[b"lock-tokens"]:
            token = _lock_token(value)
            try:
                if status == "completed":
                    self.store.complete(token)
                elif status == "abandoned":
                    self.store.abandon(token, updates)
                elif status == "defered":
                    self.store.defer(token, updates)
                elif status == "suspended":
                    self.store.dead_letter(
                        token,
                        _text(body.get(b"deadletter-reason")),
                        _text(body.get(b"deadletter-description")),
                        updates,
                    )
                else:
                    raise ManagementError(400, ARGUMENT_ERROR, f"Unknown disposition status {status!r}.")
            except LockLost:
                raise ManagementError(410, LOCK_LOST, "The lock on the message has expired or was lost.") from None
        return 200, None
