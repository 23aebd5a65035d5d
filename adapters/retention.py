"""One retention tick: archive the finished orders that are due, then delete them.

A tick reads at most ``RETENTION_MAX_ORDERS_PER_TICK`` rows of the finished index
(adapters/finished.py), from the day partitions that are due only (core/retention.py),
and for each day:

1. rows marked with a batch whose block the day's blob has committed were archived by an
   earlier tick that stopped before deleting: they are only deleted (step 4);
2. every other row's order is read (one partition query) and judged
   (core/retention.py ``dispose``): archived, stale (resubmitted since, or gone: only the
   index row goes) or kept (an Error order while ``RETENTION_INCLUDE_ERROR`` is off);
3. the rows to archive are marked with a new batch id (If-Match), then the batch is staged
   and committed as one block of the day's blob (adapters/archive.py);
4. each archived order's partition is deleted in one transaction, If-Match on its state
   row as read, so an order resubmitted meanwhile is kept (its customer-index row, removed
   just before, put back; the archive keeps the copy it wrote); then the index rows go.

A crash anywhere loses nothing (an order's rows go only after its block is committed) and
archives nothing twice (a committed batch is recognised by its id). The cost is O(what it
deletes): the due rows returned, one partition read, one delete and its search-index rows'
deletes (adapters.search.forget) per order, a few
transactions of index rows per 100, and a few blob requests per day; never the table.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError

from adapters import finished, search
from adapters.archive import Archive
from adapters.finished import FinishedRow
from adapters.store import STATE_ROW, OrderNotFound, OrderRecord, StateStore, record_from_rows
from core.models import OrderRequest
from core.progress import status_document
from core.retention import Disposal, dispose

log = logging.getLogger(__name__)

#: Threads reading and deleting the orders of a batch at once.
WORKERS = 16


@dataclass(frozen=True)
class RetentionPolicy:
    """RETENTION_DAYS, RETENTION_INCLUDE_ERROR and RETENTION_MAX_ORDERS_PER_TICK."""

    days: float
    include_error: bool = False
    max_orders: int = 5000

    @classmethod
    def from_settings(cls, settings) -> RetentionPolicy:
        return cls(settings.retention_days, settings.retention_include_error, settings.retention_max_orders)


@dataclass(frozen=True)
class _Order:
    """An order as read for retention: its rows by key, the record, and the state row's ETag."""

    row: FinishedRow
    keys: tuple[str, ...]
    record: OrderRecord | None


def _read(s: StateStore, row: FinishedRow) -> _Order:
    s._op("query")
    rows = {r["RowKey"]: r for r in s.table.query_entities("PartitionKey eq @pk", parameters={"pk": row.order_id})}
    try:
        record = record_from_rows(row.order_id, rows)
    except OrderNotFound:
        record = None
    return _Order(row, tuple(rows), record)


def _line(record: OrderRecord, now: datetime) -> bytes:
    document = {**status_document(record.state, record.document, record.lines), "archived_at": now.isoformat()}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


#: How long a row marked into a batch not yet committed is left to the tick that marked it:
#: longer than any tick can run (host.json functionTimeout, 10 minutes). After that, the tick
#: that marked it died before committing, and a later tick archives the row anew.
MARK_LEASE = timedelta(minutes=15)


def _being_archived(row: FinishedRow, now: datetime) -> bool:
    return row.batch is not None and row.marked_at is not None and now - row.marked_at < MARK_LEASE


def _delete_order(s: StateStore, order: _Order) -> bool:
    """Delete the order's partition in one transaction (100 rows each; an order has far
    fewer), the state row first and If-Match on its ETag as read. False when the order
    moved since (resubmitted): it is kept."""
    assert order.record is not None
    # Its rows in the search indexes first (a customer's orders, the Error causes): they live
    # in other partitions, so a crash after the delete must not leave them pointing at nothing.
    request = OrderRequest.model_validate_json(order.record.document)
    search.forget(s, request, order.record.state)
    keys = [STATE_ROW, *(key for key in order.keys if key != STATE_ROW)]
    for start in range(0, len(keys), finished.TRANSACTION_MOST):
        operations: list[Any] = []
        for key in keys[start : start + finished.TRANSACTION_MOST]:
            entity = {"PartitionKey": order.row.order_id, "RowKey": key}
            if key == STATE_ROW:
                guard = {"etag": order.record.state.etag, "match_condition": MatchConditions.IfNotModified}
                operations.append(("delete", entity, guard))
            else:
                operations.append(("delete", entity))
        s._op("transaction")
        try:
            s.table.submit_transaction(operations)
        except HttpResponseError as error:
            status = getattr(error, "status_code", None)
            if status == 412:
                # Moved since it was read (resubmitted): kept, with its customer's index row put
                # back (its Error row is the resubmit's to remove, and a new Error's to write).
                search.index_customer(s, request, order.record.state.created_at)
                return False
            if status != 404 or start == 0:
                raise
    return True


@dataclass
class TickReport:
    """What one tick did, by outcome; ``blobs``: the blobs it appended to."""

    counts: Counter
    blobs: set

    def __getitem__(self, key: str) -> int:
        return self.counts[key]


def tick(
    *, store, archive: Archive, policy: RetentionPolicy, now: datetime,
    after_archive: Callable[[], None] | None = None,
) -> TickReport:
    """One retention tick over every account of the order state (``store``: a StateStore or
    a ShardedStateStore). ``after_archive`` runs after each batch's block is committed and
    before anything is deleted (the local stack's crash test: RETENTION_FAULT)."""
    report = TickReport(Counter(), set())
    budget = policy.max_orders
    for s in finished.accounts(store):
        if budget <= 0:
            break
        rows = finished.due_rows(s, now, policy.days, limit=budget)
        budget -= len(rows)
        by_day: dict[str, list[FinishedRow]] = defaultdict(list)
        for row in rows:
            by_day[row.day].append(row)
        for day, day_rows in sorted(by_day.items()):
            _day(s, day, day_rows, archive=archive, policy=policy, now=now, report=report, after_archive=after_archive)
    if report.counts:
        log.info("retention tick: %s", dict(report.counts))
    return report


def _day(
    s: StateStore, day: str, rows: list[FinishedRow], *, archive: Archive, policy: RetentionPolicy, now: datetime,
    report: TickReport, after_archive: Callable[[], None] | None,
) -> None:
    blobs = archive.day(day)
    committed = blobs.committed()
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="retention") as pool:
        orders = list(pool.map(lambda row: _read(s, row), rows))
        done: list[_Order] = []  # archived (now or by an earlier tick): their rows go
        drop: list[FinishedRow] = []  # only the index row goes
        todo: list[_Order] = []
        for order in orders:
            state = order.record.state if order.record else None
            verdict = dispose(state, order.row.finished_at, include_error=policy.include_error)
            if order.row.batch and order.row.batch in committed:
                # Archived by a tick that stopped before deleting: delete it, if still as archived.
                report.counts["already_archived"] += 1
                if verdict is Disposal.STALE:
                    drop.append(order.row)
                else:
                    done.append(order)
            elif verdict is Disposal.ARCHIVE and _being_archived(order.row, now):
                # Marked by a tick that may still be running (another host's: each runs its
                # timers): its block may be on its way. Taken over once it cannot be running.
                report.counts["being_archived"] += 1
            elif verdict is Disposal.ARCHIVE:
                todo.append(order)
            else:
                drop.append(order.row)
                report.counts[verdict.value] += 1
        if todo:
            batch = uuid.uuid4().hex
            marked = {row.row_key for row in finished.mark(s, [o.row for o in todo], batch, now)}
            todo = [o for o in todo if o.row.row_key in marked]
        if todo:
            data = b"".join(_line(o.record, now) for o in todo)
            report.blobs.add(archive.append(blobs, batch, data))
            report.counts["archived"] += len(todo)
            if after_archive is not None:
                after_archive()
            done += todo
        deleted = list(pool.map(lambda order: _delete_order(s, order), done))
    report.counts["deleted"] += sum(deleted)
    report.counts["moved"] += len(deleted) - sum(deleted)
    finished.delete(s, [o.row for o in done] + drop)
