"""Retention's decisions, pure: where an order's finished-index row goes, which of those
rows are due, what to do with each order found there, and where the archive keeps it.

The I/O is adapters/finished.py (the index), adapters/archive.py (the blobs) and
adapters/retention.py (one tick). docs/retention.md says what an operator sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import Enum

from core import names
from core.models import OrderState, ProcessState

#: A day of the archive, as routes and commands take it.
DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: The archive's blobs: ``orders/2026-11-25.jsonl``, then ``orders/2026-11-25.1.jsonl``...
BLOB_PREFIX = "orders/"
#: Azure: a block blob holds at most 50,000 committed blocks (Put Block List; read
#: 2026-11-25, learn.microsoft.com/rest/api/storageservices/put-block-list and
#: learn.microsoft.com/azure/storage/blobs/scalability-targets). Retention commits one block
#: per batch; a day's blob that has this many rolls over to its next part.
MAX_BLOCKS_PER_BLOB = 50_000


class BadDay(ValueError):
    """Not a UTC day written YYYY-MM-DD."""


def day_of(moment: datetime) -> str:
    """The UTC day of a moment, ``YYYY-MM-DD``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def parse_day(text: str | None) -> str:
    """A day as given by an operator, checked: ``YYYY-MM-DD``, a real date."""
    if not text or not DAY.match(text):
        raise BadDay(f"{text!r} is not a day: YYYY-MM-DD (UTC), e.g. 2026-11-25")
    try:
        date.fromisoformat(text)
    except ValueError:
        raise BadDay(f"{text!r} is not a date") from None
    return text


def _time_key(moment: datetime) -> str:
    """The time of day, sortable as text: ``HHMMSSffffff``."""
    return moment.astimezone(UTC).strftime("%H%M%S%f")


def finished_row(order_id: str, finished_at: datetime, shards: int) -> tuple[str, str]:
    """(PartitionKey, RowKey) of an order's finished-index row: the day it ended and the
    shard the active index's hash picks; the row key starts with the time it ended, so the
    rows of a day that are due are a key range."""
    partition = names.finished_partition(day_of(finished_at), names.active_shard(order_id, shards))
    return partition, f"{_time_key(finished_at)}-{order_id}"


@dataclass(frozen=True)
class DueRange:
    """A key range of the finished index whose rows are all due: ``PartitionKey`` from
    ``low`` (inclusive) to ``high`` (exclusive), and, when set, ``RowKey`` below ``before``."""

    low: str
    high: str
    before: str | None = None


def due_ranges(now: datetime, days: float) -> tuple[DueRange, DueRange]:
    """The finished index's rows of orders that ended ``days`` or more before ``now``: every
    partition of the days before the cutoff's day (a range of partition keys), and in the
    cutoff's day the rows whose time is before it (a range of row keys in each of its
    partitions). Nothing else is read: the days not due cost nothing."""
    cutoff = now - timedelta(days=days)
    day = day_of(cutoff)
    prefix = names.FINISHED_PREFIX
    return (
        DueRange(f"{prefix}-", f"{prefix}-{day}-"),
        DueRange(f"{prefix}-{day}-", f"{prefix}-{day}-~", before=_time_key(cutoff)),
    )


class Disposal(str, Enum):
    """What retention does with an order its index names."""

    #: Archive it, then delete its rows and the index row.
    ARCHIVE = "archive"
    #: The index row is stale (the order was resubmitted since, is in flight or ended again
    #: later, or is gone): drop the index row only, touch the order not.
    STALE = "stale"
    #: An Error order while RETENTION_INCLUDE_ERROR is off: it stays for an operator; its
    #: index row is dropped (a resubmit that ends it again writes a new one).
    KEEP = "keep"


def dispose(state: OrderState | None, finished_at: datetime, *, include_error: bool) -> Disposal:
    """Retention's decision on one finished-index row, from the order's state as read now."""
    if state is None or not state.process_state.terminal or state.updated_at != finished_at:
        return Disposal.STALE
    if state.process_state is ProcessState.ERROR and not include_error:
        return Disposal.KEEP
    return Disposal.ARCHIVE


def blob_name(day: str, part: int = 0) -> str:
    """The archive's blob for a day: part 0 ``orders/YYYY-MM-DD.jsonl``, then
    ``orders/YYYY-MM-DD.1.jsonl`` once part 0 holds :data:`MAX_BLOCKS_PER_BLOB` blocks."""
    return f"{BLOB_PREFIX}{day}.jsonl" if part == 0 else f"{BLOB_PREFIX}{day}.{part}.jsonl"


def part_of(name: str, day: str) -> int | None:
    """The part number of one of a day's blob names; None for another blob."""
    if name == blob_name(day):
        return 0
    match = re.fullmatch(re.escape(f"{BLOB_PREFIX}{day}.") + r"(\d+)\.jsonl", name)
    return int(match.group(1)) if match else None
