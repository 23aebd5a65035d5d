"""The orders as this process last wrote them, so the scheduler can decide on a response
without reading the order's partition first (scheduler/dispatch.py).

An entry is only ever this process's own write: the record :meth:`StateStore.write_over`
returns (or the creation, :attr:`Created.record`), which is what a read of the partition
returns right after that write. A decision taken on an entry is trusted only when it
writes, because the write is If-Match on the entry's ETag and succeeds only while the state
row is still the one the entry holds; and the rest of the partition cannot have changed
either, since every write to an order's partition writes its state row too:

- the order, state and seal rows are created in one transaction (``create_order``,
  ``import_order``, which creates the line rows in it as well);
- a line's row is written only in the transaction of the state row's If-Match MERGE that
  ends the line (``StateStore.write``: the scheduler, its events, the supervisor's resets,
  cancels, resubmits), and the first-claim seal deleted only in the first such write (so
  the creation's record holds the seal, as a read then shows it, and a written one none);
- retention deletes a finished order's partition with its state row first, If-Match, in the
  same transaction (adapters/retention.py).

Everything else the app writes lives in other partitions (the active and finished indexes,
the search indexes, the breakers' rows). So an ETag names the whole partition, and an entry
gone stale (another instance's write, a reset, a cancel) costs one write answered 412, then
the read the scheduler does without an entry. Its other decisions ("nothing to do": a stale
response, a row not Pending) are not trusted on an entry: the row may have moved on to
where the message counts, so they are taken again on a fresh read.

Bounded: at most :data:`MOST_ORDERS` orders and :data:`MOST_CHARACTERS` characters of their
documents, the least recently used dropped first; an entry older than ``max_age`` (the
pending timeout) is never used. Thread-safe: the host runs functions on several threads; a
put that lands after a later one holds a stale entry, which the next write finds out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from adapters.store import OrderRecord

#: Orders kept. A miss costs one partition query, so the bound is about memory, not hits: a
#: host has this many orders between two of their steps only at thousands of steps per second.
MOST_ORDERS = 4_096
#: Characters of order documents kept (an order may be up to a Service Bus message's size).
MOST_CHARACTERS = 32 * 1024 * 1024


class OrderCache:
    """Order id -> the order as this process last wrote it, and when."""

    def __init__(self, max_age: timedelta, *, most: int = MOST_ORDERS, most_characters: int = MOST_CHARACTERS) -> None:
        self.max_age = max_age
        self.most = most
        self.most_characters = most_characters
        self._entries: OrderedDict[str, tuple[OrderRecord, datetime]] = OrderedDict()
        self._characters = 0
        self._lock = threading.Lock()
        #: Order id -> its decision lock and how many threads hold or wait for it.
        self._deciding: dict[str, list] = {}

    @contextmanager
    def deciding(self, order_id: str) -> Iterator[None]:
        """One decision on ``order_id`` at a time in this process: a second waits for the
        first's write and then decides on the order as that write left it (its entry here),
        instead of on the same entry, whose write would lose the race (412) and be decided
        again on a read. Two answers of one order that land together (the lines of a group
        of steps that run at once) so cost no lost write and no read when one process takes
        both. Other processes still race, and the ETags decide, as ever."""
        with self._lock:
            entry = self._deciding.setdefault(order_id, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if not entry[1]:
                    del self._deciding[order_id]

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, order_id: str, now: datetime) -> OrderRecord | None:
        """The order as this process last wrote it, unless that was more than ``max_age`` ago."""
        with self._lock:
            entry = self._entries.get(order_id)
            if entry is None:
                return None
            record, written_at = entry
            if now - written_at > self.max_age:
                self._pop(order_id)
                return None
            self._entries.move_to_end(order_id)
            return record

    def put(self, record: OrderRecord, now: datetime) -> None:
        """Keep ``record``, just written at ``now``; an order that ended is dropped instead (no
        message for it is acted on any more)."""
        order_id = record.state.order_id
        with self._lock:
            self._pop(order_id)
            if record.state.process_state.terminal or len(record.document) > self.most_characters:
                return
            self._entries[order_id] = (record, now)
            self._characters += len(record.document)
            while len(self._entries) > self.most or self._characters > self.most_characters:
                self._pop(next(iter(self._entries)))

    def drop(self, order_id: str, etag: str | None = None) -> None:
        """Forget ``order_id``; with ``etag``, only while the entry is still of that ETag (a
        thread that found its entry stale must not drop the one another just put)."""
        with self._lock:
            entry = self._entries.get(order_id)
            if entry is not None and (etag is None or entry[0].state.etag == etag):
                self._pop(order_id)

    def _pop(self, order_id: str) -> None:
        entry = self._entries.pop(order_id, None)
        if entry is not None:
            self._characters -= len(entry[0].document)
