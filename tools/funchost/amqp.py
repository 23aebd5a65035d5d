"""A small AMQP 1.0 decoder that keeps every value's wire type.

The Python Service Bus SDK decodes strings, symbols and binaries alike to ``bytes``,
and every integer type to ``int``; the Functions host's .NET client tells them apart
(a binary message id becomes hex, a string one stays as it is, a symbol reply-to is
refused). To hand a function what the real host hands it, this host reads the bytes of
each message as the broker sent them (see ``servicebus_wire``) with this decoder.

Only decoding, and only what a message can hold (AMQP 1.0 part 1, types; part 3,
message format). Anything malformed raises :class:`AmqpDecodeError`.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

#: Containers nested deeper than this are refused (a message is data from anyone).
MAX_DEPTH = 100


class AmqpDecodeError(ValueError):
    """The bytes are not a well-formed AMQP value or message."""


@dataclass(frozen=True, slots=True)
class Value:
    """One decoded value and its AMQP type.

    ``value`` is: ``None`` (null); ``bool``; ``int`` (every integer type,
    ``timestamp`` in milliseconds since the epoch, ``char`` as its UTF-32 code);
    ``float`` (``float``, ``double``); ``bytes`` (the raw encoded bytes of ``binary``,
    ``string`` and ``symbol``, and the raw 4/8/16 bytes of ``decimal32/64/128``);
    ``uuid.UUID``;
    ``list[Value]`` (``list``); ``list[tuple[Value, Value]]`` (``map``, in wire order,
    duplicates kept); ``tuple[str, list[Value]]`` (``array``: element type, elements);
    ``tuple[Value, Value]`` (``described``: descriptor, value).
    """

    type: str
    value: Any

    @property
    def is_null(self) -> bool:
        return self.type == "null"


NULL = Value("null", None)

_FIXED = {
    0x50: ("ubyte", 1, ">B"),
    0x51: ("byte", 1, ">b"),
    0x60: ("ushort", 2, ">H"),
    0x61: ("short", 2, ">h"),
    0x70: ("uint", 4, ">I"),
    0x71: ("int", 4, ">i"),
    0x80: ("ulong", 8, ">Q"),
    0x81: ("long", 8, ">q"),
    0x72: ("float", 4, ">f"),
    0x82: ("double", 8, ">d"),
    0x83: ("timestamp", 8, ">q"),
    0x52: ("uint", 1, ">B"),
    0x53: ("ulong", 1, ">B"),
    0x54: ("int", 1, ">b"),
    0x55: ("long", 1, ">b"),
}
_ZERO_WIDTH = {
    0x40: NULL,
    0x41: Value("bool", True),
    0x42: Value("bool", False),
    0x43: Value("uint", 0),
    0x44: Value("ulong", 0),
}
_VARIABLE = {
    0xA0: ("binary", 1),
    0xB0: ("binary", 4),
    0xA1: ("string", 1),
    0xB1: ("string", 4),
    0xA3: ("symbol", 1),
    0xB3: ("symbol", 4),
}
_DECIMALS = {0x74: ("decimal32", 4), 0x84: ("decimal64", 8), 0x94: ("decimal128", 16)}


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if count < 0 or end > len(self.data):
            raise AmqpDecodeError(f"value runs past the end of the data (offset {self.pos}, {count} bytes)")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack(fmt, self.take(size))[0]


def _read(reader: _Reader, depth: int) -> Value:
    code = reader.unpack(">B", 1)
    if code == 0x00:
        if depth >= MAX_DEPTH:
            raise AmqpDecodeError("values nested too deep")
        descriptor = _read(reader, depth + 1)
        return Value("described", (descriptor, _read(reader, depth + 1)))
    return _read_with(code, reader, depth)


def _read_with(code: int, reader: _Reader, depth: int) -> Value:
    if code in _ZERO_WIDTH:
        return _ZERO_WIDTH[code]
    if code == 0x56:
        flag = reader.unpack(">B", 1)
        if flag > 1:
            raise AmqpDecodeError(f"boolean byte {flag:#x}")
        return Value("bool", flag == 1)
    if code in _FIXED:
        kind, size, fmt = _FIXED[code]
        return Value(kind, reader.unpack(fmt, size))
    if code in _VARIABLE:
        kind, width = _VARIABLE[code]
        size = reader.unpack(">B" if width == 1 else ">I", width)
        return Value(kind, reader.take(size))
    if code in _DECIMALS:
        kind, size = _DECIMALS[code]
        return Value(kind, reader.take(size))
    if code == 0x73:
        return Value("char", reader.unpack(">I", 4))
    if code == 0x98:
        return Value("uuid", uuid.UUID(bytes=reader.take(16)))
    if code in (0x45, 0xC0, 0xD0, 0xC1, 0xD1):
        if depth >= MAX_DEPTH:
            raise AmqpDecodeError("values nested too deep")
        if code == 0x45:
            return Value("list", [])
        width = 1 if code in (0xC0, 0xC1) else 4
        fmt = ">B" if width == 1 else ">I"
        size = reader.unpack(fmt, width)
        end = reader.pos + size
        if end > len(reader.data) or size < width:
            raise AmqpDecodeError("compound value runs past the end of the data")
        count = reader.unpack(fmt, width)
        items = []
        for _ in range(count):
            items.append(_read(reader, depth + 1))
        if reader.pos != end:
            raise AmqpDecodeError("compound value size does not match its items")
        if code in (0xC0, 0xD0):
            return Value("list", items)
        if count % 2:
            raise AmqpDecodeError("map with an odd number of items")
        return Value("map", [(items[i], items[i + 1]) for i in range(0, count, 2)])
    if code in (0xE0, 0xF0):
        if depth >= MAX_DEPTH:
            raise AmqpDecodeError("values nested too deep")
        width = 1 if code == 0xE0 else 4
        fmt = ">B" if width == 1 else ">I"
        size = reader.unpack(fmt, width)
        end = reader.pos + size
        if end > len(reader.data) or size < width:
            raise AmqpDecodeError("array runs past the end of the data")
        count = reader.unpack(fmt, width)
        element = reader.unpack(">B", 1)
        descriptor = None
        if element == 0x00:
            descriptor = _read(reader, depth + 1)
            element = reader.unpack(">B", 1)
        items = [_read_with(element, reader, depth + 1) for _ in range(count)]
        if reader.pos != end:
            raise AmqpDecodeError("array size does not match its items")
        if descriptor is not None:
            items = [Value("described", (descriptor, item)) for item in items]
        kind = items[0].type if items else _element_type(element)
        return Value("array", (kind, items))
    raise AmqpDecodeError(f"unknown AMQP format code {code:#04x}")


def _element_type(code: int) -> str:
    if code in _FIXED:
        return _FIXED[code][0]
    if code in _VARIABLE:
        return _VARIABLE[code][0]
    return {0x56: "bool", 0x98: "uuid", 0x73: "char", 0xC0: "list", 0xD0: "list", 0xC1: "map", 0xD1: "map"}.get(
        code, f"{code:#04x}"
    )


def decode(data: bytes) -> Value:
    """One complete value."""
    reader = _Reader(bytes(data))
    value = _read(reader, 0)
    if reader.pos != len(reader.data):
        raise AmqpDecodeError("bytes left after the value")
    return value


# --- messages ---------------------------------------------------------------------------

_SECTIONS = {
    0x70: "header",
    0x71: "delivery_annotations",
    0x72: "message_annotations",
    0x73: "properties",
    0x74: "application_properties",
    0x75: "data",
    0x76: "sequence",
    0x77: "value",
    0x78: "footer",
}
_SECTION_NAMES = {
    b"amqp:header:list": "header",
    b"amqp:delivery-annotations:map": "delivery_annotations",
    b"amqp:message-annotations:map": "message_annotations",
    b"amqp:properties:list": "properties",
    b"amqp:application-properties:map": "application_properties",
    b"amqp:data:binary": "data",
    b"amqp:amqp-sequence:list": "sequence",
    b"amqp:amqp-value:*": "value",
    b"amqp:footer:map": "footer",
}


@dataclass
class Message:
    """The sections of one message, each as decoded (``None`` when absent)."""

    header: list[Value] | None = None
    delivery_annotations: list[tuple[Value, Value]] | None = None
    message_annotations: list[tuple[Value, Value]] | None = None
    properties: list[Value] | None = None
    application_properties: list[tuple[Value, Value]] | None = None
    data: list[bytes] | None = None
    sequence: list[list[Value]] | None = None
    value: Value | None = None
    footer: list[tuple[Value, Value]] | None = None

    def field(self, index: int) -> Value:
        """Field ``index`` of the properties section (null when absent)."""
        if self.properties is None or index >= len(self.properties):
            return NULL
        return self.properties[index]


def _section_name(descriptor: Value) -> str:
    if descriptor.type == "ulong" and descriptor.value in _SECTIONS:
        return _SECTIONS[descriptor.value]
    if descriptor.type == "symbol" and descriptor.value in _SECTION_NAMES:
        return _SECTION_NAMES[descriptor.value]
    raise AmqpDecodeError(f"unknown message section {descriptor.type} {descriptor.value!r}")


def _expect(value: Value, kind: str, section: str) -> Any:
    if value.type == "null" and kind in ("map", "list"):
        return []
    if value.type != kind:
        raise AmqpDecodeError(f"the {section} section is a {value.type}, not a {kind}")
    return value.value


def decode_message(payload: bytes) -> Message:
    """The sections of an encoded message (a transfer's payload)."""
    reader = _Reader(bytes(payload))
    message = Message()
    while reader.pos < len(reader.data):
        if reader.unpack(">B", 1) != 0x00:
            raise AmqpDecodeError(f"message section at offset {reader.pos - 1} is not a described value")
        name = _section_name(_read(reader, 1))
        value = _read(reader, 1)
        if name == "data":
            message.data = [*(message.data or []), _expect(value, "binary", name)]
        elif name == "sequence":
            message.sequence = [*(message.sequence or []), _expect(value, "list", name)]
        elif name == "value":
            message.value = value
        elif name in ("header", "properties"):
            setattr(message, name, _expect(value, "list", name))
        else:
            setattr(message, name, _expect(value, "map", name))
    return message
