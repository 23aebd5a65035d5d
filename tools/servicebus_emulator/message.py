"""A message as the broker keeps it: the client's bytes, plus the few fields it reads.

A message is split into its sections once, on arrival. The broker reads what it
needs (header TTL, message id, session id, scheduled enqueue time) and keeps the
bare message (properties, application properties, body, footer) as the bytes the
client sent, so every property round-trips exactly. On delivery only the header
(delivery count) and the message annotations (sequence number, enqueued time,
lock expiry) are re-encoded, and a dead-lettered message gets its reason spliced
into the application properties.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

from . import codec

_DEAD_LETTER_REASON = codec.enc_string("DeadLetterReason")
_DEAD_LETTER_DESCRIPTION = codec.enc_string("DeadLetterErrorDescription")

X_OPT_SEQUENCE_NUMBER = codec.enc_symbol("x-opt-sequence-number")
X_OPT_ENQUEUED_TIME = codec.enc_symbol("x-opt-enqueued-time")
X_OPT_LOCKED_UNTIL = codec.enc_symbol("x-opt-locked-until")
X_OPT_MESSAGE_STATE = codec.enc_symbol("x-opt-message-state")
X_OPT_SCHEDULED_ENQUEUE_TIME = b"x-opt-scheduled-enqueue-time"
#: The annotations the broker writes on every delivery. A client's own values for them are
#: dropped on enqueue (Service Bus sets them, and a map's keys must be distinct).
BROKER_ANNOTATIONS = frozenset(
    {"x-opt-sequence-number", "x-opt-enqueued-time", "x-opt-locked-until", "x-opt-message-state"}
)
_BROKER_ANNOTATION_KEYS = frozenset(name.encode() for name in BROKER_ANNOTATIONS)
_DEAD_LETTER_KEYS = ("DeadLetterReason", "DeadLetterErrorDescription")


@dataclass(slots=True)
class MessageContent:
    """The parts of one client message the broker keeps (immutable once parsed)."""

    header: list[Any]
    """Decoded header fields: durable, priority, ttl (ms), first-acquirer, delivery-count."""
    annotation_pairs: bytes
    annotation_count: int
    scheduled_enqueue_ms: int | None
    properties: bytes
    """The whole properties section as sent (empty if none)."""
    message_id: Any
    session_id: bytes | None
    application_pairs: bytes
    application_count: int
    body: bytes
    """Body sections and footer, as sent."""
    size: int

    @property
    def ttl_ms(self) -> int | None:
        ttl = self.header[2] if len(self.header) > 2 else None
        return ttl or None


def parse(payload: bytes | memoryview) -> MessageContent:
    """Split an encoded message into what the broker keeps; raise ``CodecError`` if malformed."""
    payload = bytes(payload)
    header: list[Any] = []
    annotation_pairs, annotation_count, scheduled = b"", 0, None
    properties, message_id, session_id = b"", None, None
    application_pairs, application_count = b"", 0
    body: list[bytes] = []
    for section in codec.split_sections(payload):
        value = payload[section.value_start : section.end]
        if section.code == codec.HEADER:
            header = list(codec.decode_value(value) or [])
        elif section.code == codec.MESSAGE_ANNOTATIONS:
            annotation_pairs, annotation_count = codec.map_pairs(value)
            annotations = codec.decode_value(value) or {}
            if not isinstance(annotations, dict):
                raise codec.CodecError("message annotations are not a map")
            if not _BROKER_ANNOTATION_KEYS.isdisjoint(annotations):
                annotation_pairs, annotation_count = _without_keys(
                    annotation_pairs, annotation_count, BROKER_ANNOTATIONS
                )
            scheduled = annotations.get(X_OPT_SCHEDULED_ENQUEUE_TIME)
            if scheduled is not None and not isinstance(scheduled, int):
                raise codec.CodecError("x-opt-scheduled-enqueue-time is not a timestamp")
        elif section.code == codec.PROPERTIES:
            properties = payload[section.start : section.end]
            fields = codec.decode_value(value) or []
            message_id = fields[0] if fields else None
            session_id = fields[10] if len(fields) > 10 else None
        elif section.code == codec.APPLICATION_PROPERTIES:
            application_pairs, application_count = codec.map_pairs(value)
        elif section.code == codec.DELIVERY_ANNOTATIONS:
            continue  # hop-by-hop: not forwarded, as in Service Bus
        else:
            body.append(payload[section.start : section.end])
    return MessageContent(
        header=header,
        annotation_pairs=annotation_pairs,
        annotation_count=annotation_count,
        scheduled_enqueue_ms=scheduled,
        properties=properties,
        message_id=message_id,
        session_id=session_id,
        application_pairs=application_pairs,
        application_count=application_count,
        body=b"".join(body),
        size=len(payload),
    )


#: Application properties to set on a message: (name, encoded value), in order.
PropertyUpdates = list[tuple[str, bytes]]


def property_updates(encoded_map: bytes | memoryview, *, skip: frozenset[str] = frozenset()) -> PropertyUpdates:
    """The entries of an encoded map as application properties to set (a settlement's
    "properties to modify"): keys are strings or symbols (others are ignored), values keep
    their AMQP type. Raise ``CodecError`` if it is not a map."""
    updates = []
    for raw_key, raw_value in codec.map_entries(encoded_map):
        key = codec.text_key(raw_key)
        if key is not None and key not in skip:
            updates.append((key, raw_value))
    return updates


def with_properties(content: MessageContent, updates: PropertyUpdates) -> MessageContent:
    """The message with these application properties set (replaced or added), as Service Bus
    applies the properties to modify of an abandon, defer or dead-letter. The rest of the
    message is unchanged."""
    if not updates:
        return content
    entries = codec.pairs_entries(content.application_pairs, content.application_count)
    names = [codec.text_key(raw_key) for raw_key, _ in entries]
    for key, raw_value in updates:
        if key in names:
            index = names.index(key)
            entries[index] = (entries[index][0], raw_value)
        else:
            entries.append((codec.enc_string(key), raw_value))
            names.append(key)
    pairs = b"".join(raw_key + raw_value for raw_key, raw_value in entries)
    return dataclasses.replace(content, application_pairs=pairs, application_count=len(entries))


def with_message_id(content: MessageContent) -> MessageContent:
    """The message, given a message id if it has none, as Service Bus does on enqueue (a GUID
    in 32 hex digits, as a string): clients rely on it (the JavaScript SDK's settlement looks
    up its lock renewal by message id)."""
    if content.message_id is not None:
        return content
    text = uuid.uuid4().hex
    items = []
    if content.properties:
        _, start = codec.described(content.properties)
        items = codec.list_items(content.properties, start)
    items = [codec.enc_string(text), *items[1:]]
    properties = codec.enc_described(codec.PROPERTIES, codec.enc_list(items))
    return dataclasses.replace(content, properties=properties, message_id=text.encode())


def _without_keys(pairs: bytes, count: int, names: set[str] | frozenset[str]) -> tuple[bytes, int]:
    """The encoded pairs of a map without the entries whose (string or symbol) key is in ``names``."""
    kept = [(key, value) for key, value in codec.pairs_entries(pairs, count) if codec.text_key(key) not in names]
    return b"".join(key + value for key, value in kept), len(kept)


def split_batch(payload: bytes | memoryview) -> list[bytes]:
    """The inner messages of a batch (format ``0x80013700``): one data section each."""
    payload = bytes(payload)
    inner = []
    for section in codec.split_sections(payload):
        if section.code != codec.DATA:
            continue
        data = codec.decode_value(payload[section.value_start : section.end])
        if not isinstance(data, bytes):
            raise codec.CodecError("batch data section is not binary")
        inner.append(data)
    return inner


def _header(content: MessageContent, delivery_count: int) -> bytes:
    fields = (content.header + [None] * 5)[:4]
    durable, priority, ttl, first_acquirer = fields
    items = [
        codec.NULL if durable is None else codec.enc_bool(durable),
        codec.NULL if priority is None else codec.enc_ubyte(priority),
        codec.NULL if not ttl else codec.enc_uint(ttl),
        codec.NULL if first_acquirer is None else codec.enc_bool(first_acquirer),
        codec.enc_uint(delivery_count),
    ]
    return codec.enc_described(codec.HEADER, codec.enc_list(items))


def encode(
    content: MessageContent,
    *,
    sequence_number: int,
    enqueued_ms: int,
    delivery_count: int,
    locked_until_ms: int | None = None,
    state: int | None = None,
    dead_letter: tuple[str | None, str | None] | None = None,
) -> bytes:
    """The message as delivered: the client's bare message with the broker's header and annotations."""
    broker = (
        X_OPT_SEQUENCE_NUMBER + codec.enc_long(sequence_number) + X_OPT_ENQUEUED_TIME + codec.enc_timestamp(enqueued_ms)
    )
    count = 2
    if locked_until_ms is not None:
        broker += X_OPT_LOCKED_UNTIL + codec.enc_timestamp(locked_until_ms)
        count += 1
    if state:
        broker += X_OPT_MESSAGE_STATE + codec.enc_int(state)
        count += 1
    parts = [
        _header(content, delivery_count),
        codec.enc_described(
            codec.MESSAGE_ANNOTATIONS,
            codec.enc_map(content.annotation_pairs + broker, content.annotation_count + count),
        ),
        content.properties,
    ]
    application_pairs, application_count = content.application_pairs, content.application_count
    if dead_letter is not None:
        reason, description = dead_letter
        replaced = {key for key, value in zip(_DEAD_LETTER_KEYS, (reason, description)) if value is not None}
        if application_count and replaced:
            # A message dead-lettered again (sent on from a dead-letter queue) gets the new values, not second keys.
            application_pairs, application_count = _without_keys(application_pairs, application_count, replaced)
        if reason is not None:
            application_pairs += _DEAD_LETTER_REASON + codec.enc_string(reason)
            application_count += 1
        if description is not None:
            application_pairs += _DEAD_LETTER_DESCRIPTION + codec.enc_string(description)
            application_count += 1
    if application_count:
        parts.append(
            codec.enc_described(codec.APPLICATION_PROPERTIES, codec.enc_map(application_pairs, application_count))
        )
    parts.append(content.body)
    return b"".join(parts)
