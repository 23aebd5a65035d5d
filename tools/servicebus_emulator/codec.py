"""AMQP 1.0 encoding for the emulator: frames, performatives and message sections.

The heavy lifting (decoding any AMQP value, encoding the performatives that carry
nested types such as ``attach`` with its source and target) is done by the
official SDK's own codec, ``azure.servicebus._pyamqp``. That module is private, so
the emulator works with one SDK version, :data:`SUPPORTED_SDK_VERSION` (pin it in
your requirements), checked by :func:`check_sdk_version` (and by a test).

What is written here by hand is small and on the hot path: the few primitive
encodings used for every delivered message (``long``, ``timestamp``, ``symbol``,
maps built from pre-encoded pairs), the ``transfer``/``disposition``/``flow``
performatives, and splitting a message into its sections without decoding the
body, so a message is stored as the bytes the client sent and only the broker's
parts (header, annotations) are re-encoded on delivery.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import azure.servicebus
from azure.servicebus._pyamqp import _decode, _encode, performatives  # noqa: F401  (performatives re-exported)
from azure.servicebus._pyamqp.message import Header, Message, Properties  # noqa: F401

#: The azure-servicebus version this emulator was built and tested against.
SUPPORTED_SDK_VERSION = "7.15.0"

# --- protocol constants ----------------------------------------------------------------

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"

FRAME_AMQP = 0
FRAME_SASL = 1

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)

#: Message sections (descriptor codes).
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

#: Delivery outcomes (descriptor codes), and the keys the SDK decoder gives them.
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = range(0x23, 0x28)

#: Message format of a batch: one data section per inner message.
BATCH_MESSAGE_FORMAT = 0x80013700

ROLE_SENDER = False
ROLE_RECEIVER = True
SND_SETTLED = 1
RCV_SECOND = 1


class SdkVersionError(RuntimeError):
    """The installed azure-servicebus is not the version the emulator was built against."""


class CodecError(ValueError):
    """Bytes that are not valid AMQP (the connection is closed with ``amqp:decode-error``)."""


def check_sdk_version() -> None:
    """Raise if the installed azure-servicebus is not the version this emulator was built against.

    The emulator reuses the SDK's private ``_pyamqp`` codec, whose shape may change in
    any release; a mismatch should fail loudly rather than as an obscure decode error.
    """
    installed = azure.servicebus.__version__
    if installed != SUPPORTED_SDK_VERSION:
        raise SdkVersionError(
            f"The Service Bus emulator was built against azure-servicebus=={SUPPORTED_SDK_VERSION} "
            f"(it reuses the SDK's private AMQP codec) but {installed} is installed. Install "
            f"azure-servicebus=={SUPPORTED_SDK_VERSION}, or re-verify the emulator against the new SDK and "
            "update SUPPORTED_SDK_VERSION in tools/servicebus_emulator/codec.py."
        )


# --- primitive encodings ---------------------------------------------------------------

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_FRAME_HEADER = struct.Struct(">IBBH")

NULL = b"\x40"
TRUE = b"\x41"
FALSE = b"\x42"


def enc_bool(value: bool) -> bytes:
    return TRUE if value else FALSE


def enc_uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return b"\x52" + _U8.pack(value)
    return b"\x70" + _U32.pack(value & 0xFFFFFFFF)


def enc_ubyte(value: int) -> bytes:
    return b"\x50" + _U8.pack(value)


def enc_int(value: int) -> bytes:
    return b"\x71" + _I32.pack(value)


def enc_long(value: int) -> bytes:
    return b"\x81" + _I64.pack(value)


def enc_timestamp(ms: int) -> bytes:
    return b"\x83" + _I64.pack(ms)


def _variable(small: bytes, large: bytes, data: bytes) -> bytes:
    if len(data) < 256:
        return small + _U8.pack(len(data)) + data
    return large + _U32.pack(len(data)) + data


def enc_binary(data: bytes) -> bytes:
    return _variable(b"\xa0", b"\xb0", data)


def enc_string(value: str | bytes) -> bytes:
    return _variable(b"\xa1", b"\xb1", value.encode() if isinstance(value, str) else value)


def enc_symbol(value: str | bytes) -> bytes:
    return _variable(b"\xa3", b"\xb3", value.encode() if isinstance(value, str) else value)


def enc_list(items: list[bytes]) -> bytes:
    """A list32 of already-encoded items."""
    body = b"".join(items)
    return b"\xd0" + _U32.pack(len(body) + 4) + _U32.pack(len(items)) + body


def enc_map(pairs: bytes, count: int) -> bytes:
    """A map32 of ``count`` already-encoded key/value pairs (``count`` pairs, not elements)."""
    return b"\xd1" + _U32.pack(len(pairs) + 4) + _U32.pack(count * 2) + pairs


def enc_described(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + _U8.pack(code) + value


def encode_value(value: Any) -> bytes:
    """Encode any value the SDK's codec understands (plain values or ``{TYPE:, VALUE:}`` dicts)."""
    output = bytearray()
    _encode.encode_value(output, value)
    return bytes(output)


# --- skipping and splitting ------------------------------------------------------------

# Width of the size (variable/compound types) or of the value (fixed types) by the
# constructor's high nibble: 0x4_ .. 0x9_ are fixed, 0xa_ .. 0xf_ carry a size.
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_SIZE_WIDTH = {0xA: 1, 0xB: 4, 0xC: 1, 0xD: 4, 0xE: 1, 0xF: 4}


def skip_value(buf: bytes | memoryview, pos: int) -> int:
    """Return the offset just past the AMQP value starting at ``pos`` (without decoding it)."""
    try:
        constructor = buf[pos]
        if constructor == 0x00:  # described: descriptor, then value
            return skip_value(buf, skip_value(buf, pos + 1))
        nibble = constructor >> 4
        if nibble in _FIXED_WIDTH:
            end = pos + 1 + _FIXED_WIDTH[nibble]
        elif nibble in _SIZE_WIDTH:
            width = _SIZE_WIDTH[nibble]
            size = buf[pos + 1] if width == 1 else _U32.unpack_from(buf, pos + 1)[0]
            end = pos + 1 + width + size
        else:
            raise CodecError(f"invalid AMQP constructor 0x{constructor:02x}")
    except (IndexError, struct.error) as error:
        raise CodecError("truncated AMQP value") from error
    if end > len(buf):
        raise CodecError("truncated AMQP value")
    return end


class Section(NamedTuple):
    """One message section: its descriptor code, and where its bytes and its value start."""

    code: int
    start: int
    value_start: int
    end: int


def split_sections(payload: bytes | memoryview) -> Iterator[Section]:
    """Yield the sections of an encoded message in order, decoding nothing but descriptors."""
    pos = 0
    length = len(payload)
    while pos < length:
        if payload[pos] != 0x00:
            raise CodecError("message section is not a described type")
        descriptor = payload[pos + 1] if pos + 1 < length else None
        if descriptor == 0x53:  # smallulong
            code, value_start = payload[pos + 2], pos + 3
        elif descriptor == 0x80:  # ulong
            code, value_start = int.from_bytes(payload[pos + 2 : pos + 10], "big"), pos + 10
        else:
            raise CodecError("message section descriptor is not a numeric code")
        if not HEADER <= code <= FOOTER:
            raise CodecError(f"unknown message section 0x{code:x}")
        end = skip_value(payload, value_start)
        yield Section(code, pos, value_start, end)
        pos = end


def map_pairs(encoded_map: bytes | memoryview) -> tuple[bytes, int]:
    """The raw key/value bytes of an encoded map (or null) and its number of pairs."""
    if not encoded_map or encoded_map[0] == 0x40:
        return b"", 0
    constructor = encoded_map[0]
    if constructor == 0xC1:
        return bytes(encoded_map[3:]), encoded_map[2] // 2
    if constructor == 0xD1:
        return bytes(encoded_map[9:]), _U32.unpack_from(encoded_map, 5)[0] // 2
    raise CodecError("expected an AMQP map")


def list_items(buf: bytes | memoryview, pos: int = 0) -> list[bytes]:
    """The items of the encoded list (or null) at ``pos``, each as its encoded bytes (types kept)."""
    try:
        constructor = buf[pos]
        if constructor in (0x40, 0x45):  # null, list0
            return []
        if constructor == 0xC0:
            count, start = buf[pos + 2], pos + 3
        elif constructor == 0xD0:
            count, start = _U32.unpack_from(buf, pos + 5)[0], pos + 9
        else:
            raise CodecError(f"expected an AMQP list, found constructor 0x{constructor:02x}")
    except (IndexError, struct.error) as error:
        raise CodecError("truncated AMQP list") from error
    items = []
    for _ in range(count):
        end = skip_value(buf, start)
        items.append(bytes(buf[start:end]))
        start = end
    return items


def map_entries(buf: bytes | memoryview, pos: int = 0) -> list[tuple[bytes, bytes]]:
    """The entries of the encoded map (or null) at ``pos``: (key, value), each as its encoded bytes."""
    try:
        constructor = buf[pos]
        if constructor == 0x40:
            return []
        if constructor == 0xC1:
            count, start = buf[pos + 2], pos + 3
        elif constructor == 0xD1:
            count, start = _U32.unpack_from(buf, pos + 5)[0], pos + 9
        else:
            raise CodecError(f"expected an AMQP map, found constructor 0x{constructor:02x}")
    except (IndexError, struct.error) as error:
        raise CodecError("truncated AMQP map") from error
    if count % 2:
        raise CodecError("AMQP map with an odd number of elements")
    return pairs_entries(buf[start : skip_value(buf, pos)], count // 2)


def pairs_entries(pairs: bytes | memoryview, count: int) -> list[tuple[bytes, bytes]]:
    """Split ``count`` encoded key/value pairs (a map's body, as :func:`map_pairs` gives it)."""
    entries = []
    pos = 0
    for _ in range(count):
        middle = skip_value(pairs, pos)
        end = skip_value(pairs, middle)
        entries.append((bytes(pairs[pos:middle]), bytes(pairs[middle:end])))
        pos = end
    return entries


def described(buf: bytes | memoryview, pos: int = 0) -> tuple[Any, int]:
    """The descriptor of the described value at ``pos`` (a number or symbol) and where its value starts."""
    if pos >= len(buf) or buf[pos] != 0x00:
        raise CodecError("expected a described AMQP value")
    value_start = skip_value(buf, pos + 1)
    return decode_value(buf[pos + 1 : value_start]), value_start


def text_key(encoded: bytes) -> str | None:
    """The text of an encoded string or symbol (a map key); None for any other type."""
    if not encoded or encoded[0] not in (0xA1, 0xB1, 0xA3, 0xB3):
        return None
    value = decode_value(encoded)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def message_id(payload: bytes | memoryview) -> bytes | None:
    """A message's ``message-id`` exactly as encoded (ulong, uuid, binary or string), or None.

    A reply's ``correlation-id`` must be the request's ``message-id`` with the same AMQP
    type: clients match replies on it (the JavaScript SDK sends strings, Python UUIDs).
    """
    for section in split_sections(payload):
        if section.code == PROPERTIES:
            items = list_items(payload, section.value_start)
            if items and items[0] != NULL:
                return items[0]
            return None
    return None


def decode_value(buf: bytes | memoryview) -> Any:
    """Decode one AMQP value with the SDK's decoder (strings and symbols come back as bytes)."""
    view = memoryview(buf)
    try:
        return _decode._DECODE_BY_CONSTRUCTOR[view[0]](view[1:])[1]  # pylint: disable=protected-access
    except (IndexError, KeyError, TypeError, ValueError, struct.error) as error:
        raise CodecError(f"cannot decode AMQP value: {error}") from error


def decode_payload(payload: bytes | memoryview) -> Message:
    """Decode a whole message with the SDK's decoder."""
    try:
        return _decode.decode_payload(memoryview(payload))
    except (IndexError, KeyError, TypeError, ValueError, struct.error) as error:
        raise CodecError(f"cannot decode AMQP message: {error}") from error


def encode_message(message: Message) -> bytes:
    """Encode a whole message with the SDK's encoder (management replies; not the hot path)."""
    return bytes(_encode.encode_payload(bytearray(), message))


# --- frames ------------------------------------------------------------------------------


class Frame(NamedTuple):
    """One received frame: its type, channel, and decoded performative (``code``, ``fields``)."""

    frame_type: int
    channel: int
    code: int | None
    fields: list[Any]


def frame(channel: int, body: bytes, frame_type: int = FRAME_AMQP) -> bytes:
    """Wrap an encoded performative (and payload) in a frame header."""
    return _FRAME_HEADER.pack(len(body) + 8, 2, frame_type, channel) + body


def encode_performative(channel: int, performative: Any, frame_type: int = FRAME_AMQP) -> bytes:
    """Encode any performative namedtuple with the SDK's encoder (``open``, ``attach``, ``close``...)."""
    _, body = _encode.encode_frame(performative)
    return frame(channel, bytes(body), frame_type)


def decode_performative(body: memoryview) -> tuple[int, list[Any]]:
    """Decode a frame body with the SDK's decoder; a transfer's payload comes last in the fields."""
    try:
        return _decode.decode_frame(body)
    except (IndexError, KeyError, TypeError, ValueError, struct.error) as error:
        raise CodecError(f"cannot decode AMQP frame: {error}") from error


EMPTY_FRAME = _FRAME_HEADER.pack(8, 2, FRAME_AMQP, 0)


def transfer_frame(
    channel: int,
    handle: int,
    payload: bytes | memoryview,
    *,
    delivery_id: int | None,
    delivery_tag: bytes | None,
    message_format: int = 0,
    settled: bool,
    more: bool,
) -> bytes:
    """One transfer frame (the first of a delivery carries id and tag; continuations need not)."""
    fields = [enc_uint(handle)]
    if delivery_id is None:
        fields += [NULL, NULL, NULL]
    else:
        fields += [enc_uint(delivery_id), enc_binary(delivery_tag or b""), enc_uint(message_format)]
    fields += [enc_bool(settled), enc_bool(more)]
    return frame(channel, enc_described(TRANSFER, enc_list(fields)) + bytes(payload))


def transfer_overhead() -> int:
    """An upper bound on a transfer frame's size without its payload (16-byte tags, 32-bit ids)."""
    return len(
        transfer_frame(
            0,
            0xFFFFFFFF,
            b"",
            delivery_id=0xFFFFFFFF,
            delivery_tag=bytes(32),
            message_format=0xFFFFFFFF,
            settled=True,
            more=True,
        )
    )


def outcome(code: int, fields: list[bytes] | None = None) -> bytes:
    """An encoded delivery outcome (``accepted``, ``rejected``...)."""
    return enc_described(code, enc_list(fields or []))


def error_value(condition: str, description: str | None = None) -> bytes:
    """An encoded AMQP ``error`` (described list: condition, description, info), all three fields
    written (info null): the Python SDK reads the third one of a refused send's error."""
    return enc_described(
        0x1D, enc_list([enc_symbol(condition), enc_string(description) if description else NULL, NULL])
    )


def disposition_frame(
    channel: int, *, role: bool, first: int, last: int | None, settled: bool, state: bytes | None
) -> bytes:
    fields = [
        enc_bool(role),
        enc_uint(first),
        NULL if last is None else enc_uint(last),
        enc_bool(settled),
        state if state is not None else NULL,
    ]
    return frame(channel, enc_described(DISPOSITION, enc_list(fields)))


def flow_frame(
    channel: int,
    *,
    next_incoming_id: int | None,
    incoming_window: int,
    next_outgoing_id: int,
    outgoing_window: int,
    handle: int | None = None,
    delivery_count: int | None = None,
    link_credit: int | None = None,
    available: int | None = None,
    drain: bool = False,
    echo: bool = False,
) -> bytes:
    def opt(value: int | None) -> bytes:
        return NULL if value is None else enc_uint(value & 0xFFFFFFFF)

    fields = [
        opt(next_incoming_id),
        enc_uint(incoming_window),
        enc_uint(next_outgoing_id & 0xFFFFFFFF),
        enc_uint(outgoing_window),
    ]
    if handle is not None:
        fields += [opt(handle), opt(delivery_count), opt(link_credit), opt(available), enc_bool(drain), enc_bool(echo)]
    return frame(channel, enc_described(FLOW, enc_list(fields)))
