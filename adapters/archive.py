"""The archive: finished orders as JSON lines in block blobs, one blob per UTC day.

Container ``ARCHIVE_CONTAINER`` (``archive``), blob ``orders/YYYY-MM-DD.jsonl``; each line
is one order as ``GET /api/orders/{id}`` shows it (core/progress.py ``status_document``),
plus ``archived_at``. Readable without the app: download it and read it line by line.

**Appending, idempotently.** Retention appends a batch of orders as one block whose id is
the batch's (a fresh id, marked on the batch's finished-index rows before the block is
staged): Put Block stages it, Put Block List commits the blob's committed blocks plus it,
If-Match on the blob's ETag (If-None-Match ``*`` for a new blob), so a concurrent commit
cannot drop a block. A crash after the commit and before the deletes leaves rows marked
with a committed block's id: the next tick finds the id in the committed block list and
only deletes. A crash before the commit leaves the block uncommitted (Azure discards
uncommitted blocks after a week): the next tick takes the rows into a new batch.

**Azure's limits** (learn.microsoft.com/rest/api/storageservices/put-block-list,
put-block, and learn.microsoft.com/azure/storage/blobs/scalability-targets, read
2026-11-25): a block blob holds at most 50,000 committed blocks of at most 4,000 MiB
each (service version 2019-12-12 and later; ~190.7 TiB a blob), and at most 100,000
uncommitted blocks. Retention's blocks are a batch each (``RETENTION_MAX_ORDERS_PER_TICK``
orders, ~2 KB a line: a few MB), so a blob fills by its block count first: a day's blob
with 50,000 blocks rolls over to ``orders/YYYY-MM-DD.1.jsonl`` (then ``.2`` ...). An
append blob was not used: its appends cannot be told apart after a crash (no block ids),
and it holds 50,000 appends of 4 MiB at most.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import BlobBlock, ContentSettings

from core import retention

CONTENT_TYPE = "application/x-ndjson"
#: Bytes read per request when reading a day back (the container's client is built with it:
#: adapters/clients.py ``archive_container``).
READ_CHUNK = 4 * 1024 * 1024


class ArchiveConflict(RuntimeError):
    """The day's blob kept changing under the commit (another runner): try the tick again."""


class BadCursor(ValueError):
    """A (part, offset) to read a day from that is not where one of its lines starts: no
    part of that number, an offset inside a line, or past the part's end (a forged cursor;
    the cursors :class:`Line` gives are all line starts, and a day's blobs only grow)."""


@dataclass
class Part:
    """One blob of a day: its part number, committed block ids in order, and its ETag."""

    number: int
    blocks: list[str] = field(default_factory=list)
    etag: str | None = None


@dataclass
class Day:
    """A day's blobs as read before an append."""

    day: str
    parts: list[Part]

    def committed(self) -> set[str]:
        return {block for part in self.parts for block in part.blocks}


@dataclass(frozen=True)
class Line:
    """One archived order as read back, and where its line is (for the next page)."""

    document: dict
    part: int
    end: int


class Archive:
    """The archive container (adapters/clients.py ``archive_container``). Thread-safe."""

    def __init__(self, container, *, exists: bool = False) -> None:
        self.container = container
        #: The container is known to exist (created by this process before): no create on first use.
        self._ready = exists
        self._lock = threading.Lock()
        #: Blob requests by kind, for benchmarks and tests.
        self.ops: dict[str, int] = {}

    def _op(self, kind: str) -> None:
        self.ops[kind] = self.ops.get(kind, 0) + 1

    def ensure(self) -> None:
        """Create the container on first use (locally; in Azure the Bicep provisions it and
        the identity may not create it: a refusal is taken as 'it is there')."""
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                try:
                    self._op("create_container")
                    self.container.create_container()
                except (ResourceExistsError, HttpResponseError):
                    pass
                self._ready = True

    # -- writing ------------------------------------------------------------------------

    def _parts(self, day: str) -> list[int]:
        self._op("list")
        try:
            blobs = list(self.container.list_blobs(name_starts_with=f"{retention.BLOB_PREFIX}{day}."))
        except ResourceNotFoundError:  # no container yet: nothing archived
            return []
        numbers = (retention.part_of(blob.name, day) for blob in blobs)
        return sorted(n for n in numbers if n is not None)

    def _read_part(self, day: str, number: int) -> Part:
        headers: dict = {}

        def keep(response) -> None:
            headers.update((key.lower(), value) for key, value in response.http_response.headers.items())

        self._op("get_block_list")
        committed, _ = self.container.get_blob_client(retention.blob_name(day, number)).get_block_list(
            "committed", raw_response_hook=keep
        )
        return Part(number, [block.id for block in committed], headers.get("etag"))

    def day(self, day: str) -> Day:
        """The day's parts with their committed blocks: one list and one Get Block List per part."""
        self.ensure()
        return Day(day, [self._read_part(day, n) for n in self._parts(day)])

    def append(self, day: Day, block_id: str, data: bytes) -> str:
        """Stage ``data`` as block ``block_id`` and commit it at the end of the day's last
        part (a new part when that one is full), If-Match on its ETag. Done already
        (the id committed in any part): nothing. Returns the blob's name."""
        for _ in range(5):
            if block_id in day.committed():
                return next(retention.blob_name(day.day, p.number) for p in day.parts if block_id in p.blocks)
            last = day.parts[-1] if day.parts else Part(0)
            if len(last.blocks) >= retention.MAX_BLOCKS_PER_BLOB:
                last = Part(last.number + 1)
            name = retention.blob_name(day.day, last.number)
            blob = self.container.get_blob_client(name)
            self._op("put_block")
            blob.stage_block(block_id, data)
            guard = (
                {"etag": last.etag, "match_condition": MatchConditions.IfNotModified}
                if last.etag else {"match_condition": MatchConditions.IfMissing}
            )
            try:
                self._op("put_block_list")
                blob.commit_block_list(
                    [BlobBlock(block) for block in [*last.blocks, block_id]],
                    content_settings=ContentSettings(content_type=CONTENT_TYPE), **guard,
                )
                return name
            except (ResourceModifiedError, ResourceExistsError, HttpResponseError) as error:
                if getattr(error, "status_code", None) not in (409, 412):
                    raise
                day = self.day(day.day)  # someone else committed: read again, then decide again
        raise ArchiveConflict(f"the archive of {day.day} kept changing; the next tick tries again")

    # -- reading --------------------------------------------------------------------------

    def lines(self, day: str, *, part: int = 0, offset: int = 0) -> Iterator[Line]:
        """The day's archived orders in the order archived, from byte ``offset`` of part
        ``part`` on (a cursor of :attr:`Line`). Streams each blob in chunks of 4 MiB.

        A cursor must be where a line starts (the byte before it a newline; the part's end
        is one too): it is read from the byte before it, checked; otherwise
        :class:`BadCursor` (raised at the first ``next``), never a partial line parsed."""
        parts = self._parts(day)
        if (part, offset) != (0, 0) and part not in parts:
            raise BadCursor(f"the archive of {day} has no part {part}")
        for number in parts:
            if number < part:
                continue
            start = offset if number == part else 0
            blob = self.container.get_blob_client(retention.blob_name(day, number))
            try:
                self._op("get")
                stream = blob.download_blob(offset=start - 1) if start else blob.download_blob()
            except ResourceNotFoundError:
                continue
            except HttpResponseError as error:
                if start and getattr(error, "status_code", None) == 416:
                    raise BadCursor(f"offset {start} is past the end of part {number} of {day}") from None
                raise
            position, pending, check = start, b"", bool(start)
            for chunk in stream.chunks():
                pending += chunk
                if check and pending:
                    if pending[:1] != b"\n":
                        raise BadCursor(f"offset {start} of part {number} of {day} is not where a line starts")
                    pending, check = pending[1:], False
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    position += len(raw) + 1
                    if raw.strip():
                        yield Line(json.loads(raw), number, position)
            if check:  # not one byte from the one before the offset: past the end (Azurite's answer, not a 416)
                raise BadCursor(f"offset {start} is past the end of part {number} of {day}")

    def has_day(self, day: str) -> bool:
        return bool(self._parts(day))

    def find(self, day: str, order_id: str) -> dict | None:
        """An archived order of a day (the last line archived for it); None if not there.
        Reads the day's blobs up to the end (an operator's read, O(the day's archive))."""
        found = None
        for line in self.lines(day):
            if line.document.get("order_id") == order_id:
                found = line.document
        return found
