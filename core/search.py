"""The keys of the search indexes, and the grouping of Error orders by cause. Pure: no I/O.

Two indexes sit beside the orders in their table (adapters/search.py writes and reads them):

- **by customer**: partition ``_customer-<customer id>``, RowKey :func:`customer_row_key`
  (an inverted creation time in milliseconds, then the order id), so a customer's orders
  read newest first and a ``since``/``until`` window is one RowKey range
  (:func:`customer_key_range`);
- **Error orders by cause**: partition ``_error-<group>``, RowKey the order id, and one
  row per group in ``_error-groups``; the group (:func:`error_group`) is a short hash of
  the line that ended the order (its step and whether it was the action or the undo, and
  the undos that failed) and of its last error *normalised* (:func:`normalise_error`), so
  orders that failed for the same cause share a group whatever their ids and times.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core import names
from core.models import OrderState
from core.workflow import UnknownWorkflow, workflow

#: Every customer index key has 13 digits of inverted milliseconds: 10**13 ms is the
#: year 2286, so the digits never run out and the keys sort as numbers.
_INVERT_FROM = 10**13
#: The creation times, in milliseconds since 1970, a key can hold in its 13 digits: from
#: 1970-01-01T00:00:00.001Z to 2286-11-20T17:46:40Z (every order's: it is created at the
#: app's clock). A time outside them would take 14 digits or a sign, and sort wrongly.
_FIRST_MS, _LAST_MS = 1, _INVERT_FROM
#: Sorts after every character an order id may hold (core.models.ORDER_ID_PATTERN).
_AFTER = "~"
#: The group id: this many hex digits of a SHA-256 (48 bits; a collision between two
#: causes needs ~16 million distinct causes).
GROUP_DIGITS = 12
GROUP_PATTERN = re.compile(rf"^[0-9a-f]{{{GROUP_DIGITS}}}$")
#: A normalised error is kept at most this long (it is the group's description).
MAX_NORMALISED_CHARS = 300


def customer_partition(customer_id: str) -> str:
    """The index partition of a customer's orders, e.g. ``_customer-c-17``. Customer ids
    match core.models.Code (letters, digits, ``._:@-``), none of the characters a Table key
    may not hold (``/ \\ # ?``, control characters)."""
    return f"{names.CUSTOMER_PREFIX}-{customer_id}"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def millis(when: datetime) -> int:
    """Milliseconds since 1970 UTC, floored, in integer arithmetic (exact by construction)."""
    if when.tzinfo is None:
        raise ValueError("a time in the customer index needs a time zone")
    return (when - _EPOCH) // timedelta(milliseconds=1)


def _inverted(when: datetime) -> str:
    return f"{_INVERT_FROM - millis(when):013d}"


def customer_row_key(created_at: datetime, order_id: str) -> str:
    """``<13 digits: 10**13 - created ms>-<order id>``: newer orders sort first."""
    return f"{_inverted(created_at)}-{order_id}"


def created_millis(row_key: str) -> int:
    """The creation time, in milliseconds since 1970, a customer index RowKey holds."""
    return _INVERT_FROM - int(row_key[:13])


def created_of(row_key: str) -> datetime:
    """The creation time (to the millisecond) a customer index RowKey holds."""
    return _EPOCH + timedelta(milliseconds=created_millis(row_key))


def order_of(row_key: str) -> str:
    """The order id a customer index RowKey holds."""
    return row_key[14:]


@dataclass(frozen=True)
class KeyRange:
    """RowKeys ``lo <= key < hi`` (None: unbounded on that side)."""

    lo: str | None
    hi: str | None


#: No RowKey: every key starts with a digit, so none is at or after ``~``.
_NOTHING = KeyRange(_AFTER, _AFTER)


def customer_key_range(since: datetime | None, until: datetime | None) -> KeyRange:
    """The RowKeys of the orders created at or after ``since`` and at or before ``until``
    (to the millisecond): newer orders have smaller keys, so ``until`` is the low end.

    A bound outside the times a key can hold (before 1970-01-01T00:00:00.001Z, after
    2286-11-20T17:46:40Z) is clamped, as no order was created there: a ``since`` before
    them or an ``until`` after them bounds nothing; an ``until`` before them or a ``since``
    after them leaves no order (:data:`_NOTHING`)."""
    if since is not None and until is not None and since > until:
        raise ValueError(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
    if (until is not None and millis(until) < _FIRST_MS) or (since is not None and millis(since) > _LAST_MS):
        return _NOTHING
    lo = _inverted(until) if until is not None and millis(until) < _LAST_MS else None
    hi = _inverted(since) + _AFTER if since is not None and millis(since) > _FIRST_MS else None
    return KeyRange(lo, hi)


# --- Error orders by cause -------------------------------------------------------------

_GUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_TIMESTAMP = re.compile(
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
)
#: An HTTP status is part of the cause (a 422 is not a 409): kept as is.
_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")
#: A quoted value: a JSON string, or a single-quoted word (Python's repr of an id; no
#: spaces, so an apostrophe in a sentence is not taken for a quote). A string followed by
#: ``:`` is an object's key and a short lower-case code (``"card_declined"``) is a cause:
#: both are kept.
_QUOTED = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^'\s]*'")
_CODE = re.compile(r"^[\"'][a-z][a-z_]{0,39}[\"']$")
#: A token holding a digit (an id such as ``o-123`` or ``c1f9e2``, a count, a duration).
_WITH_DIGIT = re.compile(r"[A-Za-z0-9_.@/+-]*\d[A-Za-z0-9_.@/+-]*")
_HEX_ID = re.compile(r"\b[0-9a-fA-F]{8,}\b")
_MARKS = re.compile(r"#(?:[\s,:]*#)+")
_SPACES = re.compile(r"\s+")


def _unquote(match: re.Match[str]) -> str:
    quoted = match.group(0)
    is_key = match.string[match.end() :].lstrip().startswith(":")
    return quoted if is_key or _CODE.match(quoted) else '"…"'


def _strip_values(text: str) -> str:
    text = _GUID.sub("#", text)
    text = _TIMESTAMP.sub("#", text)
    text = _QUOTED.sub(_unquote, text)
    text = _HEX_ID.sub("#", text)
    return _WITH_DIGIT.sub("#", text)


def normalise_error(text: str | None, *, order_id: str | None = None) -> str:
    """The cause in an error text, with what differs between orders of one cause taken out:
    the order's own id, GUIDs, timestamps, hex ids, quoted values (but JSON keys and short
    lower-case codes), and every token with a digit (ids, counts, attempts, durations); an
    HTTP status stays (a 422 is not a 409). ``#`` marks a number or id, ``"…"`` a value."""
    if not text:
        return ""
    if order_id:
        text = text.replace(order_id, "#")
    # The HTTP statuses are kept: the text between them is normalised, they are not.
    parts = _HTTP_STATUS.split(text)  # [text, status, text, status, ..., text]
    text = "".join(f"HTTP {part}" if i % 2 else _strip_values(part) for i, part in enumerate(parts))
    text = _MARKS.sub("#", text)  # "#, #" (a list of ids) is one mark
    return _SPACES.sub(" ", text).strip()[:MAX_NORMALISED_CHARS]


@dataclass(frozen=True)
class ErrorCause:
    """What puts an Error order in its group."""

    #: The line the order stopped on: its step, and ``action`` or ``compensation``.
    step: str
    kind: str
    #: The steps whose undo failed (empty when the order stopped in its actions).
    failed: tuple[str, ...]
    #: The last error, normalised.
    error: str

    @property
    def group(self) -> str:
        """The group id: 12 hex digits of the SHA-256 of the cause (stable across processes)."""
        text = "\n".join((self.kind, self.step, ",".join(self.failed), self.error))
        return hashlib.sha256(text.encode()).hexdigest()[:GROUP_DIGITS]


def error_cause(
    *, order_id: str, step: str | None, kind: str, failed: tuple[str, ...], last_error: str | None
) -> ErrorCause:
    """The cause of an order that ended in Error, from its state row as read."""
    return ErrorCause(step or "", kind, tuple(failed), normalise_error(last_error, order_id=order_id))


def error_partition(group: str) -> str:
    """The partition of a group's Error orders, e.g. ``_error-3f9c0a1b2c4d``."""
    return f"{names.ERROR_PREFIX}-{group}"


def check_group(value: str | None) -> str:
    """A group id from a caller, checked (12 lower-case hex digits); ValueError otherwise."""
    if not value or not GROUP_PATTERN.match(value):
        raise ValueError(f"{value!r} is not an error group: {GROUP_DIGITS} lower-case hex digits, as GET /api/errors lists")
    return value


def cause_of(state: OrderState) -> ErrorCause:
    """The cause of an order in Error, from its state row: the line it stopped on, the
    undos that failed (by step name, as the alert names them) and its last error."""
    try:
        steps = workflow(state.workflow, state.workflow_version).steps
        failed = tuple(steps[i].name for i in state.failed)
    except (UnknownWorkflow, IndexError):
        failed = tuple(str(i) for i in state.failed)
    return error_cause(
        order_id=state.order_id, step=state.step, kind=state.kind.value, failed=failed, last_error=state.last_error
    )
