"""Peeking a queue whatever its messages hold: what the Azure SDK can decode is shown, what it
cannot is skipped and named.

``ServiceBusReceiver.peek_messages`` (azure-servicebus 7.15, its pure-Python AMQP stack)
decodes every peeked message before it returns any, so one message with a value its
decoder refuses fails the whole call: an AMQP ``decimal128`` (it raises "Invalid AMQP
decimal128 encoding", even for what it encodes itself), a ``char``, a ``decimal32`` or
``decimal64`` (it has no decoder for them). Other clients send such values (the .NET and
Java clients, Qpid Proton), and the dead-letter queue is where an operator looks for them.

So this module sends the same ``peek-message`` request to the queue's ``$management`` node
through the SDK (its link, its retries, its errors) and decodes each message itself: the
whole message with the SDK's decoder; if that fails, section by section, and within the
application properties and annotations entry by entry, leaving out only what the decoder refuses (the
sections and entries are found with the generic AMQP codec of ``tools.servicebus_emulator``). Each
message is then a real ``ServiceBusReceivedMessage`` of what could be decoded, with the
list of what was skipped and why.

The SDK internals it relies on (``_mgmt_request_response_with_retry``, the request's
field names, ``_pyamqp._decode``) were read in azure-servicebus 7.15.0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from tools.servicebus_emulator import codec

#: AMQP 1.0 message sections (part 3, 3.2): descriptor code -> what an operator calls it.
SECTIONS = {
    0x70: "header",
    0x71: "delivery annotations",
    0x72: "message annotations",
    0x73: "properties",
    0x74: "application properties",
    0x75: "body (data)",
    0x76: "body (sequence)",
    0x77: "body (value)",
    0x78: "footer",
}
#: Sections that are maps, decoded entry by entry when whole they cannot be: what one entry is called.
MAP_ENTRIES = {
    0x71: "delivery annotation",
    0x72: "message annotation",
    0x74: "application property",
    0x78: "footer entry",
}
#: Types the SDK's decoder refuses, by format code (AMQP 1.0 part 1, 1.6).
TYPE_NAMES = {0x73: "char", 0x74: "decimal32", 0x84: "decimal64", 0x94: "decimal128"}


@dataclass(frozen=True)
class Skipped:
    """A part of a message left out: ``part`` (a section, or ``application property 'x'``) and why."""

    part: str
    why: str


@dataclass
class Peeked:
    """One peeked message: ``message`` (``ServiceBusReceivedMessage``) of what could be decoded,
    or None when nothing could; ``skipped`` what was left out."""

    message: Any
    skipped: list[Skipped] = field(default_factory=list)


def peek(receiver: Any, most: int) -> list[Peeked]:
    """Peek up to ``most`` messages from the start of ``receiver``'s queue (or sub-queue)."""
    from azure.servicebus._common import mgmt_handlers  # noqa: PLC0415 - internals, see the module docstring
    from azure.servicebus._common.constants import (  # noqa: PLC0415
        MGMT_REQUEST_FROM_SEQUENCE_NUMBER,
        MGMT_REQUEST_MAX_MESSAGE_COUNT,
        REQUEST_RESPONSE_PEEK_OPERATION,
    )

    def payloads(status_code: int, message: Any, description: Any, amqp_transport: Any) -> list[bytes]:
        if status_code == 200:
            return [bytes(entry[b"message"]) for entry in (message.value or {}).get(b"messages", [])]
        # 204: nothing to peek; anything else: the SDK raises its own error for it.
        return mgmt_handlers.peek_op(status_code, message, description, receiver, amqp_transport) or []

    request = {
        MGMT_REQUEST_FROM_SEQUENCE_NUMBER: receiver._amqp_transport.AMQP_LONG_VALUE(1),
        MGMT_REQUEST_MAX_MESSAGE_COUNT: most,
    }
    raw = receiver._mgmt_request_response_with_retry(REQUEST_RESPONSE_PEEK_OPERATION, request, payloads)
    build = functools.partial(_received, receiver=receiver)
    return [decode(payload, build) for payload in raw]


def _received(message: Any, *, receiver: Any) -> Any:
    from azure.servicebus import ServiceBusReceivedMessage  # noqa: PLC0415

    return ServiceBusReceivedMessage(message, receiver=receiver, is_peeked_message=True)


def decode(payload: bytes, build: Any) -> Peeked:
    """``payload`` (one encoded message) as ``build(pyamqp Message)`` of what the SDK decodes."""
    from azure.servicebus._pyamqp._decode import decode_payload  # noqa: PLC0415

    try:
        return Peeked(build(decode_payload(memoryview(payload))))
    except Exception:  # noqa: BLE001 - decode it piece by piece below, naming what fails
        pass
    skipped: list[Skipped] = []
    try:
        kept = [
            _kept_section(section.code, payload[section.start : section.end],
                          payload[section.value_start : section.end], skipped)
            for section in codec.split_sections(payload)
        ]
        return Peeked(build(decode_payload(memoryview(b"".join(part for part in kept if part)))), skipped)
    except Exception as error:  # noqa: BLE001 - shown, never a crash
        return Peeked(None, [*skipped, Skipped("the whole message", f"{type(error).__name__}: {error}")])


def _kept_section(code: int, raw: bytes, value: bytes, skipped: list[Skipped]) -> bytes | None:
    """The section as it can be decoded: whole, with the entries of a map section (application
    properties, annotations) that cannot be decoded left out, or None (each recorded in ``skipped``)."""
    from azure.servicebus._pyamqp._decode import decode_payload  # noqa: PLC0415

    name = SECTIONS.get(code, f"section 0x{code:02x}")
    try:
        decode_payload(memoryview(raw))
        return raw
    except Exception as error:  # noqa: BLE001 - narrowed below
        cause = _why(value, error)
    if code not in MAP_ENTRIES:
        skipped.append(Skipped(name, cause))
        return None
    entries = []
    for key, entry in codec.map_entries(value):
        problem = _undecodable(key) or _undecodable(entry)
        if problem is None:
            entries.append(key + entry)
        else:
            skipped.append(Skipped(f"{MAP_ENTRIES[code]} {_key_text(key)}", problem))
    return raw[: len(raw) - len(value)] + codec.enc_map(b"".join(entries), len(entries))


def _undecodable(value: bytes) -> str | None:
    """Why the SDK's decoder refuses this encoded value, or None when it reads it."""
    from azure.servicebus._pyamqp._decode import _DECODE_BY_CONSTRUCTOR  # noqa: PLC0415

    try:
        _DECODE_BY_CONSTRUCTOR[value[0]](memoryview(value[1:]))
        return None
    except Exception as error:  # noqa: BLE001 - this is the answer
        return _why(value, error)


def _why(value: bytes, error: Exception) -> str:
    name = TYPE_NAMES.get(value[0]) if value else None
    if name and isinstance(error, TypeError):
        return f"an AMQP {name}, which the Azure SDK for Python cannot decode (it has no decoder for it)"
    if name:
        return f"an AMQP {name}, which the Azure SDK for Python cannot decode ({error})"
    return f"the Azure SDK for Python cannot decode it ({type(error).__name__}: {error})"


def _key_text(key: bytes) -> str:
    """A map key for a message: its text when it is a string or symbol, else its type and bytes."""
    text = codec.text_key(key)
    return repr(text) if text is not None else f"(a key of AMQP format code 0x{key[0]:02x}: {key.hex()})"
