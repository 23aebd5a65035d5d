"""What the Azure Functions host sends the Python worker for one Service Bus message.

In Azure the message goes through four hands before the function sees it, and each
one shapes it (sources in README.md, "What a Service Bus function receives"); this
module does the host's three, and the worker process the fourth:

1. the Functions host's .NET client (``Azure.Messaging.ServiceBus`` on
   ``Microsoft.Azure.Amqp``) reads the AMQP message, strictly by type: a message id
   may be a string, uuid, ulong or binary (``ToString()``: the text, the canonical
   GUID, the decimal, the bytes in upper-case hex); ``to``/``reply-to``/``subject``/
   session ids must be strings and ``content-type`` a symbol (ASCII; other bytes read
   as ``?``); an application property or annotation that is a list, map or array, or
   a property of another type, and the client cannot read the message at all;
2. the Service Bus extension builds the trigger's binding data from that message
   (``ServiceBusTriggerBindingStrategy``), skipping any property whose getter throws
   (a partition key that is not a string, ...), and converts the body to the
   function's data type: a string unless the binding says ``dataType: binary``
   (strict UTF-8, else UTF-8 with replacement characters; an AMQP value body must be a
   string, a sequence body cannot be bound);
3. the Functions host adds the top-level fields of a JSON object body to the binding
   data (``Utility.ApplyBindingData``; case-insensitive, so a body's ``"ReplyTo"``
   replaces the message's) and sends each value over gRPC as the worker's
   ``TypedData``: strings as strings, everything else as JSON (Newtonsoft.Json:
   dates without an offset, byte arrays as base64, ...);
4. the Python worker decodes them: Microsoft's ``azure-functions-runtime`` with
   ``azure.functions`` (``ServiceBusMessageInConverter.decode``), in the worker process.

:func:`function_message` does the first three, from the bytes the broker sent (exact) or,
failing those, from the SDK's decoded message (approximate: see
:func:`from_sdk_message`), and returns the ``TypedData`` of the trigger and of each binding
data entry as the host sends them over FunctionRpc. A message that cannot get through the
host raises a :class:`ConversionError` whose ``reason`` and ``description`` the listener
dead-letters it with; one the worker cannot decode fails its invocation there, as in Azure.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import re
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import amqp
from .amqp import NULL, Value
from .rpc import protos

#: One value as the host sends it over FunctionRpc (``TypedData``: a string, JSON text or bytes).
Datum = Any


def _datum(value: Any, kind: str) -> Any:
    return protos.TypedData(**{kind: value})


# --- failures -------------------------------------------------------------------------

_AZURE_RETRIES = (
    "In Azure the function is not called either; the message comes back after each "
    "lock expiry or failed attempt until the queue's max delivery count dead-letters it "
    "(MaxDeliveryCountExceeded)."
)


class ConversionError(Exception):
    """The message cannot be handed to the function; dead-letter it with ``reason`` and ``description``."""

    reason = "MessageConversionFailed"

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause

    @property
    def description(self) -> str:
        return _clip(f"{self.stage}: {self.cause}. {_AZURE_RETRIES}")

    stage = "the local Functions host could not convert the message"


class Unreadable(ConversionError):
    """The Functions host's .NET Service Bus client cannot read the message."""

    reason = "FunctionsHostCannotReadMessage"
    stage = "the Functions host's Service Bus client (Azure.Messaging.ServiceBus) cannot read this message"


class BindingFailed(ConversionError):
    """The host cannot bind the message to the parameter, or the worker cannot decode what it gets."""

    reason = "FunctionInputBindingFailed"
    stage = "the Functions host cannot hand this message to the function"


class LocalConversionFailed(ConversionError):
    """This host cannot convert a message that Azure could (a limit or a bug of this host)."""

    reason = "LocalHostConversionFailed"
    stage = "the local Functions host cannot convert this message (a limit of this host, not of Azure)"

    @property
    def description(self) -> str:
        return _clip(f"{self.stage}: {self.cause}")


def _clip(text: str, limit: int = 1024) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- .NET values ----------------------------------------------------------------------

_EPOCH_TICKS = 621355968000000000  # DateTime(1970, 1, 1).Ticks
_MAX_TICKS = 3155378975999999999  # DateTime.MaxValue.Ticks
_MAX_MILLISECONDS = 253402300800000  # (long)(DateTime.MaxValue - epoch).TotalMilliseconds, as a double rounds it
_TICKS_PER_SECOND = 10_000_000


@dataclass(frozen=True)
class NetDateTime:
    """A .NET ``DateTime`` (ticks and whether its Kind is Utc) or, with ``offset``, a ``DateTimeOffset`` at +00:00."""

    ticks: int
    utc: bool = True
    offset: bool = False

    @classmethod
    def from_amqp_ms(cls, ms: int) -> NetDateTime:
        """``TimeStampEncoding.ToDateTime``: negative clamps to the epoch, beyond year 9999 to DateTime.MaxValue."""
        ms = max(ms, 0)
        if ms >= _MAX_MILLISECONDS:
            return cls(_MAX_TICKS, utc=False)
        return cls(_EPOCH_TICKS + ms * 10_000)

    def as_offset(self) -> NetDateTime:
        return NetDateTime(self.ticks, utc=True, offset=True)

    def as_unspecified(self) -> NetDateTime:
        """``DateTimeOffset.DateTime``: the same clock time, Kind Unspecified."""
        return NetDateTime(self.ticks, utc=False)

    def json(self) -> str:
        """As Newtonsoft.Json writes it (``yyyy-MM-ddTHH:mm:ss.FFFFFFFK``)."""
        seconds, fraction = divmod(self.ticks, _TICKS_PER_SECOND)
        moment = datetime.datetime(1, 1, 1) + datetime.timedelta(seconds=seconds)
        text = moment.strftime("%Y-%m-%dT%H:%M:%S")
        digits = f"{fraction:07d}".rstrip("0")
        if digits:
            text += "." + digits
        if self.offset:
            text += "+00:00"
        elif self.utc:
            text += "Z"
        return text


def _utf8(raw: bytes) -> str:
    """``Encoding.UTF8.GetString``: invalid bytes become U+FFFD."""
    return raw.decode("utf-8", errors="replace")


#: Latin-1 text of bytes above 0x7F, each to ``?``.
_NOT_ASCII = {code: "?" for code in range(0x80, 0x100)}


def _ascii(raw: bytes) -> str:
    """``Encoding.ASCII.GetString`` (how .NET reads a symbol): bytes above 0x7F become ``?``."""
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return raw.decode("latin-1").translate(_NOT_ASCII)


def net_double(value: float) -> str:
    """``double.ToString(CultureInfo.InvariantCulture)`` on .NET Core 3.0+: the shortest round-trip digits,
    in exponent form from 1E+15 and from 1E-05 down."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    power = len(text) - 1 + exponent  # value = d.ddd x 10**power
    prefix = "-" if sign else ""
    if power >= 15 or power <= -5:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}E{'+' if power >= 0 else '-'}{abs(power):02d}"
    if power >= len(text) - 1:
        return prefix + text + "0" * (power - len(text) + 1)
    if power >= 0:
        return prefix + text[: power + 1] + "." + text[power + 1 :]
    return prefix + "0." + "0" * (-power - 1) + text


def _float32(value: float) -> float:
    """A Single as Newtonsoft writes it (``ToString("R")``, the shortest float32 digits), read back by JSON."""
    if math.isnan(value) or math.isinf(value):
        return value
    packed = struct.pack(">f", value)
    for precision in range(1, 10):
        text = f"{value:.{precision}g}"
        if struct.pack(">f", float(text)) == packed:
            return float(text)
    return value


def _json_number(value: float) -> Any:
    """Newtonsoft writes NaN and infinities as the strings "NaN", "Infinity", "-Infinity"."""
    if math.isnan(value) or math.isinf(value):
        return net_double(value)
    return value


_DECIMAL_MAX = 2**96 - 1  # System.Decimal's largest significand


def _net_decimal128(raw: bytes, where: str) -> decimal.Decimal:
    """A decimal128 as ``Microsoft.Azure.Amqp``'s ``DecimalEncoding.DecodeDecimal128`` reads it: the low 96
    bits of the significand, a 14-bit exponent, ``new decimal(lo, mid, hi, negative, (byte)-exponent)``
    (a scale above 28 throws) or, for a positive exponent, multiplied by ten (an overflow throws)."""
    negative = bool(raw[0] & 0x80)
    if raw[0] & 0x60 != 0x60:
        exponent = ((raw[0] & 0x7F) << 7) | ((raw[1] & 0xFE) >> 1)
    elif raw[0] & 0x78 != 0:
        exponent = 0  # NaN and infinities: the exponent is left at 0
    else:
        return decimal.Decimal(0)
    significand = int.from_bytes(raw[4:16], "big")
    exponent -= 6176
    if exponent <= 0:
        scale = -exponent & 0xFF
        if scale > 28:
            raise Unreadable(f"{where} is an AMQP decimal128 that System.Decimal cannot hold (scale {scale})")
        value = decimal.Decimal(significand).scaleb(-scale)
    else:
        if significand * 10**exponent > _DECIMAL_MAX:
            raise Unreadable(f"{where} is an AMQP decimal128 too large for System.Decimal")
        value = decimal.Decimal(significand * 10**exponent)
    return -value if negative else value


def _timespan(ticks: int) -> str:
    """``TimeSpan.ToString()`` ("c"): ``[-][d.]hh:mm:ss[.fffffff]``, as Newtonsoft writes a TimeSpan."""
    sign = "-" if ticks < 0 else ""
    ticks = abs(ticks)
    seconds, fraction = divmod(ticks, _TICKS_PER_SECOND)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    text = f"{sign}{f'{days}.' if days else ''}{hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{fraction:07d}" if fraction else "")


_NET_TYPE_NAMES = {
    "bool": "System.Boolean",
    "ubyte": "System.Byte",
    "byte": "System.SByte",
    "ushort": "System.UInt16",
    "short": "System.Int16",
    "uint": "System.UInt32",
    "int": "System.Int32",
    "ulong": "System.UInt64",
    "long": "System.Int64",
    "float": "System.Single",
    "double": "System.Double",
    "decimal128": "System.Decimal",
    "char": "System.Char",
    "timestamp": "System.DateTime",
    "uuid": "System.Guid",
    "binary": "System.Byte[]",
    "string": "System.String",
    "symbol": "Microsoft.Azure.Amqp.Encoding.AmqpSymbol",
    "list": "System.Collections.Generic.List`1[System.Object]",
    "map": "Microsoft.Azure.Amqp.Encoding.AmqpMap",
    "array": "System.Array",
    "described": "Microsoft.Azure.Amqp.Encoding.DescribedType",
}


def _what(value: Value) -> str:
    return f"an AMQP {value.type}"


_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:|^/")
_URI_DESCRIPTOR = b"com.microsoft:uri"
_TIMESPAN_DESCRIPTOR = b"com.microsoft:timespan"
_DATETIME_OFFSET_DESCRIPTOR = b"com.microsoft:datetime-offset"
#: Descriptors Microsoft.Azure.Amqp decodes into its own framing types (not a DescribedType).
_KNOWN_DESCRIPTOR_CODES = frozenset(
    [*range(0x10, 0x19), 0x1D, *range(0x23, 0x2A), *range(0x30, 0x34), *range(0x40, 0x45), *range(0x70, 0x79)]
)

_DROP = object()  # TryGetNetObjectFromAmqpObject returned false: the entry is left out


def _net_object(value: Value, where: str, *, body: bool = False) -> Any:
    """``AmqpMessageConverter.TryGetNetObjectFromAmqpObject`` followed by Newtonsoft.Json: the value as the
    function reads it once its JSON is parsed, or ``_DROP``. Raises Unreadable where the client throws."""
    kind, raw = value.type, value.value
    if kind == "null":
        return None
    if kind in ("bool", "ubyte", "byte", "ushort", "short", "uint", "int", "ulong", "long"):
        return raw
    if kind == "double":
        return _json_number(raw)
    if kind == "float":
        return _json_number(_float32(raw))
    if kind == "decimal128":
        return float(_net_decimal128(raw, where))  # Newtonsoft writes the decimal's digits: JSON reads a float
    if kind in ("decimal32", "decimal64"):
        raise Unreadable(f"{where} is {_what(value)}, a type Microsoft.Azure.Amqp does not decode")
    if kind == "char":
        if 0x10000 <= raw <= 0x10FFFF:
            raise Unreadable(f"{where} is an AMQP char outside the BMP (U+{raw:X}), which a .NET char cannot hold")
        return "\ufffd" if raw > 0x10FFFF or 0xD800 <= raw <= 0xDFFF else chr(raw)
    if kind == "timestamp":
        return NetDateTime.from_amqp_ms(raw).json()
    if kind == "uuid":
        return str(raw)
    if kind == "binary":
        return base64.b64encode(raw).decode("ascii")
    if kind == "string":
        return _utf8(raw)
    if kind == "symbol":
        return _ascii(raw)
    if kind == "described":
        descriptor, inner = raw
        if descriptor.type == "symbol":
            name = descriptor.value
            if name == _URI_DESCRIPTOR:
                if inner.type != "string":
                    raise Unreadable(f"{where} is a com.microsoft:uri whose value is {_what(inner)}, not a string")
                text = _utf8(inner.value)
                if not _URI_SCHEME.match(text):
                    raise Unreadable(f"{where} is a com.microsoft:uri that is not an absolute URI ({text!r})")
                return text
            if name in (_TIMESPAN_DESCRIPTOR, _DATETIME_OFFSET_DESCRIPTOR):
                if inner.type != "long":
                    raise Unreadable(f"{where} is a {name.decode()} whose value is {_what(inner)}, not a long")
                if name == _TIMESPAN_DESCRIPTOR:
                    return _timespan(inner.value)
                if not 0 <= inner.value <= _MAX_TICKS:
                    raise Unreadable(f"{where} is a com.microsoft:datetime-offset out of range ({inner.value} ticks)")
                return NetDateTime(inner.value).as_offset().json()
        if body:
            raise Unreadable(f"{where} is an AMQP described value the client cannot map")
        if descriptor.type == "ulong" and descriptor.value in _KNOWN_DESCRIPTOR_CODES:
            raise Unreadable(f"{where} is an AMQP described value of a framing type (descriptor {descriptor.value:#x})")
        return _DROP
    if body:  # MappingType.MessageBody: lists, maps and arrays are kept
        if kind == "list":
            return [_net_object(item, where, body=True) for item in raw]
        if kind == "array":
            return [_net_object(item, where, body=True) for item in raw[1]]
        if kind == "map":
            return {_net_key(k, where): _net_object(v, where, body=True) for k, v in raw}
    raise Unreadable(
        f"{where} is {_what(value)}; the client throws SerializationException "
        f"(\"Serialization operation failed due to unsupported type {_NET_TYPE_NAMES.get(kind, kind)}\")"
    )


def _net_key(key: Value, where: str) -> str:
    """``MapKey.ToString()``: what a map key becomes as a dictionary key."""
    kind, raw = key.type, key.value
    if kind == "string":
        return _utf8(raw)
    if kind == "symbol":
        return _ascii(raw)
    if kind in ("ubyte", "byte", "ushort", "short", "uint", "int", "ulong", "long"):
        return str(raw)
    if kind == "bool":
        return "True" if raw else "False"
    if kind == "uuid":
        return str(raw)
    if kind in ("float", "double"):
        return net_double(raw)
    if kind == "null":
        raise Unreadable(f"{where} have a null key")
    return _NET_TYPE_NAMES.get(kind, kind)


# --- 1. the message as the Functions host's .NET client reads it -----------------------


@dataclass
class NetMessage:
    """The parts of ``ServiceBusReceivedMessage`` the binding data and the body come from."""

    lock_token: str
    message_id: str | None = None
    correlation_id: str | None = None
    content_type: str | None = None
    subject: str | None = None
    to: str | None = None
    reply_to: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    absolute_expiry: NetDateTime | None = None
    ttl_ms: int | None = None
    delivery_count: int | None = None
    annotations: dict[str, Value] = field(default_factory=dict)
    application_properties: dict[str, Any] = field(default_factory=dict)
    body_kind: str = "data"  # "data" | "value" | "sequence"
    body: bytes = b""
    body_value: Value | None = None


def _message_id(value: Value, name: str) -> str | None:
    """``MessageId.Decode`` + ``ToString()`` (Microsoft.Azure.Amqp)."""
    if value.type == "null":
        return None
    if value.type == "string":
        return _utf8(value.value)
    if value.type == "uuid":
        return str(value.value)
    if value.type == "ulong":
        return str(value.value)
    if value.type == "binary":
        return value.value.hex().upper()
    raise Unreadable(f"its {name} is {_what(value)}; a message id must be a string, uuid, ulong or binary")


def _map(pairs: list[tuple[Value, Value]] | None) -> list[tuple[Value, Value]]:
    """A decoded map as ``MapEncoding.ReadMapValue`` builds it: a repeated key keeps its first place and
    its last value (a string and a symbol of the same text are different keys)."""
    entries: dict[tuple[str, Any], tuple[Value, Value]] = {}
    for key, value in pairs or []:
        identity = (key.type, _hashable(key.value))
        entries[identity] = (entries[identity][0] if identity in entries else key, value)
    return list(entries.values())


def _hashable(raw: Any) -> Any:
    try:
        hash(raw)
    except TypeError:
        return repr(raw)
    return raw


def _typed(value: Value, name: str, kind: str) -> Any:
    if value.type == "null":
        return None
    if value.type != kind:
        raise Unreadable(f"its {name} is {_what(value)}, not an AMQP {kind}")
    return value.value


def read_message(message: amqp.Message, lock_token: str) -> NetMessage:
    """The message as ``AmqpMessageConverter.AmqpMessageToSBReceivedMessage`` leaves it; raise Unreadable
    where the .NET client throws."""
    net = NetMessage(lock_token=lock_token)
    if message.properties is not None:
        net.message_id = _message_id(message.field(0), "message-id")
        _typed(message.field(1), "user-id", "binary")
        for index, name, attribute in ((2, "to", "to"), (4, "reply-to", "reply_to")):
            raw = _typed(message.field(index), name, "string")  # Address.Decode: strings only
            setattr(net, attribute, None if raw is None else _utf8(raw))
        subject = _typed(message.field(3), "subject", "string")
        net.subject = None if subject is None else _utf8(subject)
        net.correlation_id = _message_id(message.field(5), "correlation-id")
        content_type = _typed(message.field(6), "content-type", "symbol")
        net.content_type = None if content_type is None else _ascii(content_type)
        _typed(message.field(7), "content-encoding", "symbol")
        expiry = _typed(message.field(8), "absolute-expiry-time", "timestamp")
        if expiry is not None:
            net.absolute_expiry = NetDateTime.from_amqp_ms(expiry)
        _typed(message.field(9), "creation-time", "timestamp")
        group = _typed(message.field(10), "group-id", "string")
        net.session_id = None if group is None else _utf8(group)
        _typed(message.field(11), "group-sequence", "uint")
        reply_group = _typed(message.field(12), "reply-to-group-id", "string")
        net.reply_to_session_id = None if reply_group is None else _utf8(reply_group)

    for key, value in _map(message.application_properties):
        name = _net_key(key, "the application properties")
        converted = _net_object(value, f"application property {name!r}")
        if converted is not _DROP:
            net.application_properties[name] = converted

    for key, value in _map(message.message_annotations):
        name = _net_key(key, "the message annotations")
        if name == "x-opt-locked-until" and value.type != "timestamp":  # (DateTime)pair.Value in the converter
            raise Unreadable(f"its x-opt-locked-until annotation is {_what(value)}, not a timestamp")
        if name == "x-opt-message-state" and value.type != "int":  # (int)pair.Value in the converter
            raise Unreadable(f"its x-opt-message-state annotation is {_what(value)}, not an int")
        if name in _RAW_ANNOTATIONS:
            net.annotations[name] = value
        elif _net_object(value, f"message annotation {name!r}") is not _DROP:
            net.annotations[name] = value
    for section, entries in (("delivery annotation", message.delivery_annotations), ("footer", message.footer)):
        for key, value in _map(entries):
            name = _net_key(key, f"the {section}s")
            _net_object(value, f"{section} {name!r}")

    if message.header is not None:
        header = message.header + [NULL] * (5 - len(message.header))
        for index, name, kind in ((0, "durable", "bool"), (1, "priority", "ubyte"), (3, "first-acquirer", "bool")):
            _typed(header[index], f"header {name}", kind)
        net.ttl_ms = _typed(header[2], "header ttl", "uint")
        count = _typed(header[4], "header delivery-count", "uint")
        net.delivery_count = None if count is None else count + 1

    if message.data is not None:
        net.body = b"".join(message.data)
    elif message.value is not None and not message.value.is_null:
        net.body_kind, net.body_value = "value", message.value
        _net_object(message.value, "the message's AMQP value body", body=True)
    elif message.sequence is not None:
        net.body_kind = "sequence"
    return net


_RAW_ANNOTATIONS = frozenset(
    {
        "x-opt-enqueued-time",
        "x-opt-scheduled-enqueue-time",
        "x-opt-sequence-number",
        "x-opt-enqueue-sequence-number",
        "x-opt-locked-until",
        "x-opt-partition-key",
        "x-opt-partition-id",
        "x-opt-via-partition-key",
        "x-opt-deadletter-source",
        "x-opt-message-state",
    }
)


# --- 2. the binding data, as the worker receives it ---------------------------------------


class _Throws(Exception):
    """A ServiceBusReceivedMessage getter throws (SafeAddValue leaves the entry out)."""


def _annotation(net: NetMessage, name: str, kind: str) -> Any:
    """``(T)MessageAnnotations[name]``: the value, None when absent, _Throws when of another type."""
    value = net.annotations.get(name)
    if value is None or value.is_null:
        if value is not None and kind in ("long", "timestamp"):
            raise _Throws  # unboxing null to a value type
        return None
    if value.type != kind:
        raise _Throws
    return value.value


def _enqueued_time(net: NetMessage) -> NetDateTime:
    ms = _annotation(net, "x-opt-enqueued-time", "timestamp")
    return NetDateTime(0).as_offset() if ms is None else NetDateTime.from_amqp_ms(ms).as_offset()


def _expires_at(net: NetMessage) -> NetDateTime:
    """``ServiceBusReceivedMessage.ExpiresAt``."""
    if net.absolute_expiry is not None:
        return NetDateTime(net.absolute_expiry.ticks).as_offset()
    enqueued = _enqueued_time(net)
    if net.ttl_ms is None or net.ttl_ms * 10_000 >= _MAX_TICKS - enqueued.ticks:
        return NetDateTime(_MAX_TICKS).as_offset()
    return NetDateTime(enqueued.ticks + net.ttl_ms * 10_000).as_offset()


def binding_data(net: NetMessage) -> dict[str, Datum]:
    """``ServiceBusTriggerBindingStrategy.GetBindingData`` for one message, each value as the host's
    ``ToRpc`` sends it (null values are not sent). The MessageActions/Client objects are not reproduced."""
    entries: list[tuple[str, Any]] = []

    def add(name: str, getter: Any) -> None:
        try:
            entries.append((name, getter()))
        except _Throws:
            pass

    add("DeliveryCount", lambda: _json_int(net.delivery_count))
    add("DeadLetterSource", lambda: _string(_annotation(net, "x-opt-deadletter-source", "string")))
    add("LockToken", lambda: _string_text(net.lock_token))
    add("ExpiresAtUtc", lambda: _json_date(_expires_at(net).as_unspecified()))
    add("ExpiresAt", lambda: _json_date(_expires_at(net)))
    add("EnqueuedTimeUtc", lambda: _json_date(_enqueued_time(net).as_unspecified()))
    add("EnqueuedTime", lambda: _json_date(_enqueued_time(net)))
    add("MessageId", lambda: _string_text(net.message_id))
    add("ContentType", lambda: _string_text(net.content_type))
    add("ReplyTo", lambda: _string_text(net.reply_to))
    add("SequenceNumber", lambda: _json_int(_annotation(net, "x-opt-sequence-number", "long") or 0))
    add("To", lambda: _string_text(net.to))
    add("Subject", lambda: _string_text(net.subject))
    add("Label", lambda: _string_text(net.subject))
    add("CorrelationId", lambda: _string_text(net.correlation_id))
    properties = _datum(json.dumps(net.application_properties, ensure_ascii=False, allow_nan=False), "json")
    add("ApplicationProperties", lambda: properties)
    add("UserProperties", lambda: properties)
    add("SessionId", lambda: _string_text(net.session_id))
    add("ReplyToSessionId", lambda: _string_text(net.reply_to_session_id))
    add("PartitionKey", lambda: _string(_annotation(net, "x-opt-partition-key", "string")))
    add("TransactionPartitionKey", lambda: _string(_annotation(net, "x-opt-via-partition-key", "string")))
    return {name: datum for name, datum in entries if datum is not None}


def _string(raw: bytes | None) -> Datum | None:
    return None if raw is None else _datum(_utf8(raw), "string")


def _string_text(text: str | None) -> Datum | None:
    return None if text is None else _datum(text, "string")


def _json_int(value: int | None) -> Datum | None:
    if value is None:
        raise _Throws  # (int)null
    return _datum(str(value), "json")


def _json_date(value: NetDateTime) -> Datum:
    return _datum(json.dumps(value.json()), "json")


# --- 3. the trigger value -----------------------------------------------------------------


def trigger_value(net: NetMessage, data_type: str | None, parameter: str) -> str | bytes:
    """The body as the extension converts it: ``byte[]`` for ``dataType: binary``, else a string
    (``MessageToStringConverter``)."""
    binary = str(data_type or "").lower() in ("binary", "stream")
    if net.body_kind == "data":
        if binary:
            return net.body
        try:
            return net.body.decode("utf-8")
        except UnicodeDecodeError:
            return _utf8(net.body)  # (a DataContract-serialized string is not recognised here)
    if binary:
        raise BindingFailed(
            f"Exception binding parameter '{parameter}': {net.body_kind.capitalize()} cannot be retrieved using "
            "the Body property (the message has an AMQP " + ("value" if net.body_kind == "value" else "sequence")
            + " body)"
        )
    if net.body_kind == "value":
        value = net.body_value
        assert value is not None
        if value.type in ("string", "symbol"):
            return _utf8(value.value) if value.type == "string" else _ascii(value.value)
        raise BindingFailed(
            f"Exception binding parameter '{parameter}': A message with a value type of "
            f"{_NET_TYPE_NAMES.get(value.type, value.type)} cannot be bound to a string"
        )
    raise BindingFailed(
        f"Exception binding parameter '{parameter}': A sequence body message cannot be bound to a string"
    )


# --- 4. the body's JSON fields (Utility.ApplyBindingData) -----------------------------------

_MAX_JSON_DEPTH = 64  # Newtonsoft.Json's JsonReader.MaxDepth default
_ISO_DATE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?(Z|[+-]\d{2}(?::?\d{2})?)?$"
)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest


def _newtonsoft_date(text: str) -> str | None:
    """A string Newtonsoft reads as a DateTime (DateParseHandling.DateTime), as ``(string)JValue`` then writes
    it: ``Convert.ToString(DateTime, InvariantCulture)`` = ``MM/dd/yyyy HH:mm:ss`` (UTC clock: Azure's)."""
    match = _ISO_DATE.match(text)
    if not match:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    try:
        moment = datetime.datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None
    zone = match.group(8)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        offset = datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
        try:
            moment -= sign * offset
        except OverflowError:
            return None
    return moment.strftime("%m/%d/%Y %H:%M:%S")


def _field_datum(value: Any) -> Datum | None:
    """``ConvertPropertyValue`` then ``ToRpc``: an object stays JSON, anything else becomes ``(string)JValue``."""
    if value is None:
        return None
    if isinstance(value, dict):
        return _datum(json.dumps(value, ensure_ascii=False, separators=(",", ":")), "json")
    if isinstance(value, bool):
        return _datum("True" if value else "False", "string")
    if isinstance(value, int):
        return _datum(str(value), "string")
    if isinstance(value, float):
        return _datum(net_double(value), "string")
    text = str(value)
    return _datum(_newtonsoft_date(text) or text, "string")


def merge_body_fields(metadata: dict[str, Datum], text: str) -> None:
    """Add (or replace, ignoring case) a binding data entry per top-level field of a JSON object body."""
    trimmed = text.strip()
    if not ((trimmed.startswith("{") and trimmed.endswith("}")) or (trimmed.startswith("[") and trimmed.endswith("]"))):
        return
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return  # JObject.Parse failed: the host ignores it
    if not isinstance(parsed, dict) or _depth(parsed) > _MAX_JSON_DEPTH:
        return
    by_lower = {key.lower(): key for key in metadata}
    for name, value in parsed.items():
        if isinstance(value, list):
            continue
        datum = _field_datum(value)
        if datum is None:
            continue
        key = by_lower.setdefault(name.lower(), name)
        metadata[key] = datum


# --- what goes to the worker ----------------------------------------------------------------


@dataclass
class Converted:
    """The trigger's ``TypedData`` and the binding data (``trigger_metadata``), as the host sends them."""

    data: Datum
    metadata: dict[str, Datum]
    message_id: str | None
    delivery_count: int | None


def convert(net: NetMessage, *, data_type: str | None = None, parameter: str = "msg") -> Converted:
    """Steps 2 and 3 for a message the .NET client could read."""
    metadata = binding_data(net)
    value = trigger_value(net, data_type, parameter)
    if isinstance(value, str):
        merge_body_fields(metadata, value)
        data = _datum(value, "string")
    else:
        data = _datum(value, "bytes")
    count = net.delivery_count
    return Converted(data, metadata, net.message_id, count)


def function_message(
    payload: bytes | None,
    sdk_message: Any,
    *,
    lock_token: str | None = None,
    data_type: str | None = None,
    parameter: str = "msg",
) -> Converted:
    """What the Functions host sends the worker for the message: its data and binding data.

    ``payload`` is the message's bytes as the broker sent them (exact); without them the
    SDK's decoded message is used (approximate, see :func:`from_sdk_message`).
    """
    if lock_token is None:
        token = getattr(sdk_message, "lock_token", None)
        lock_token = str(token) if token else str(uuid.UUID(int=0))
    if payload is not None:
        try:
            sections = amqp.decode_message(payload)
        except amqp.AmqpDecodeError as error:
            raise Unreadable(f"it is not a well-formed AMQP message ({error})") from error
    else:
        sections = from_sdk_message(sdk_message)
    return convert(read_message(sections, lock_token), data_type=data_type, parameter=parameter)


def message_id_of(payload: bytes) -> str:
    """The message id of an encoded message for a log line, as well as it can be read (else ``?``)."""
    try:
        return _message_id(amqp.decode_message(payload).field(0), "message-id") or "(none)"
    except Exception:  # noqa: BLE001 - only for a log line
        return "?"


# --- without the wire bytes --------------------------------------------------------------


def _guess(value: Any, *, text_type: str = "string") -> Value:
    """An AMQP value for what the Python SDK decoded (it has lost the wire type: bytes that are UTF-8 are
    taken as strings, other bytes as binary; ints as longs; datetimes as timestamps)."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return Value("bool", value)
    if isinstance(value, int):
        return Value("long" if -(2**63) <= value < 2**63 else "ulong", int(value))
    if isinstance(value, float):
        return Value("double", float(value))
    if isinstance(value, uuid.UUID):
        return Value("uuid", value)
    if isinstance(value, str):
        return Value(text_type, value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return Value("binary", raw)
        return Value(text_type, raw)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return Value("timestamp", int(value.timestamp() * 1000))
    if isinstance(value, decimal.Decimal):
        return Value("double", float(value))
    if isinstance(value, dict):
        return Value("map", [(_guess(k, text_type="symbol"), _guess(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return Value("list", [_guess(v) for v in value])
    return Value("string", str(value).encode("utf-8"))


def _message_id_guess(value: Any) -> Value:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return Value("ulong", value)
    return _guess(value)


def _pairs(mapping: Any, key_type: str = "string") -> list[tuple[Value, Value]]:
    return [(_guess(k, text_type=key_type), _guess(v)) for k, v in (mapping or {}).items()]


def from_sdk_message(message: Any) -> amqp.Message:
    """The sections of a message rebuilt from the Python SDK's decoded ``ServiceBusReceivedMessage``."""
    raw = message.raw_amqp_message
    props = raw.properties
    sections = amqp.Message()
    if props is not None:
        sections.properties = [
            _message_id_guess(props.message_id),
            _guess(props.user_id, text_type="binary"),
            _guess(props.to),
            _guess(props.subject),
            _guess(props.reply_to),
            _message_id_guess(props.correlation_id),
            _guess(props.content_type, text_type="symbol"),
            _guess(props.content_encoding, text_type="symbol"),
            _timestamp_guess(props.absolute_expiry_time),
            _timestamp_guess(props.creation_time),
            _guess(props.group_id),
            _guess(props.group_sequence) if props.group_sequence is None else Value("uint", props.group_sequence),
            _guess(props.reply_to_group_id),
        ]
        for index, value in enumerate(sections.properties):
            if value.type == "binary" and index not in (0, 1, 5):  # non-UTF-8 bytes in a string or symbol field
                sections.properties[index] = Value("symbol" if index in (6, 7) else "string", value.value)
    sections.application_properties = _pairs(message.application_properties)
    annotations = []
    for key, value in (raw.annotations or {}).items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        if name in ("x-opt-enqueued-time", "x-opt-locked-until", "x-opt-scheduled-enqueue-time"):
            typed = _timestamp_guess(value)
        elif name in ("x-opt-partition-key", "x-opt-via-partition-key", "x-opt-deadletter-source"):
            typed = _guess(value)
        elif name == "x-opt-message-state":
            typed = Value("int", int(value)) if isinstance(value, int) else _guess(value)
        else:
            typed = _guess(value)
        annotations.append((Value("symbol", name.encode("utf-8")), typed))
    sections.message_annotations = annotations
    header = raw.header
    if header is not None:
        sections.header = [
            _guess(header.durable),
            NULL if header.priority is None else Value("ubyte", header.priority),
            NULL if header.time_to_live is None else Value("uint", int(header.time_to_live)),
            _guess(header.first_acquirer),
            NULL if header.delivery_count is None else Value("uint", header.delivery_count),
        ]
    body_type = str(getattr(message.body_type, "value", message.body_type)).lower()
    if "value" in body_type:
        sections.value = _guess(message.body)
    elif "sequence" in body_type:
        sections.sequence = [[_guess(v) for v in section] for section in message.body]
    else:
        body = message.body
        sections.data = [body] if isinstance(body, bytes) else [bytes(b) for b in _iterable(body)]
    return sections


def _timestamp_guess(value: Any) -> Value:
    if value is None:
        return NULL
    if isinstance(value, datetime.datetime):
        return _guess(value)
    if isinstance(value, (int, float)):
        return Value("timestamp", int(value))
    return _guess(value)


def _iterable(body: Any) -> Iterable[Any]:
    return body if body is not None else []
