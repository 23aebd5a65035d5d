"""The finished index: one row per finished order, by the UTC day it ended and a shard.

=============================  =============================  ===========================
PartitionKey                   RowKey                         properties
=============================  =============================  ===========================
``_finished-2026-11-25-007``   ``HHMMSSffffff-<OrderId>``     ``OrderId``, ``State`` (its end
                                                              state), ``FinishedAt``, and
                                                              ``Batch`` once retention took it
=============================  =============================  ===========================

:func:`record_finished` writes the row when an order ends (Processed, Compensated, Error),
in the order's own account, from adapters/closing.py: *before* the order leaves the active
index. The row cannot share the transaction that ends the order (an entity-group
transaction is one partition, at most 100 entities), so it is kept consistent by that
order instead: a crash between the end and this write leaves the order in the active
index, and the supervisor's sweep closes it again (``supervisor.heal``), writing the row
then. The write is an idempotent upsert (same keys from the state row's end time), so a
repeat is harmless and keeps a ``Batch`` mark retention may have set.

Retention (adapters/retention.py) reads only the day partitions that are due
(core/retention.py ``due_ranges``), marks the rows it archives, and deletes them last.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from adapters.store import StateStore
from core import names, retention
from core.models import OrderState, utcnow

#: An entity-group transaction holds at most 100 operations (learn.microsoft.com/rest/api/
#: storageservices/performing-entity-group-transactions, read 2026-11-25).
TRANSACTION_MOST = 100


class FinishedRow(NamedTuple):
    """One row of the finished index, as read."""

    partition: str
    row_key: str
    order_id: str
    state: str
    finished_at: datetime
    batch: str | None
    etag: str
    #: When it was marked into ``batch`` (None: not marked, or marked before this was kept).
    marked_at: datetime | None = None

    @property
    def day(self) -> str:
        """The day the order ended (from the partition key ``_finished-YYYY-MM-DD-NNN``)."""
        return self.partition[len(names.FINISHED_PREFIX) + 1 :][:10]


def accounts(store) -> tuple[StateStore, ...]:
    """Each account's store: a ShardedStateStore's, or the one store itself."""
    return tuple(getattr(store, "stores", (store,)))


def account(store, order_id: str) -> StateStore:
    """The store of the account an order lives in (its finished row lives there too)."""
    return store.store_for(order_id) if hasattr(store, "store_for") else store


def record_finished(state: OrderState, *, store) -> None:
    """Index a terminal order by the day it ended (one upsert in its account). Called
    before the order leaves the active index; see the module's docstring."""
    if not state.process_state.terminal:
        raise ValueError(f"order {state.order_id} is {state.process_state.value}: only a finished order is indexed")
    s = account(store, state.order_id)
    s._op("finished_upsert")
    s.table.upsert_entity(finished_entity(state, s.shards), mode=UpdateMode.MERGE)  # a repeat keeps a Batch mark


def finished_entity(state: OrderState, shards: int) -> dict:
    """The finished-index row of an order that ended (``state``: its terminal state row)."""
    partition, row_key = retention.finished_row(state.order_id, state.updated_at, shards)
    return {
        "PartitionKey": partition, "RowKey": row_key, "OrderId": state.order_id,
        "State": state.process_state.value, "FinishedAt": state.updated_at,
    }


def due_rows(s: StateStore, now: datetime, days: float, *, limit: int) -> list[FinishedRow]:
    """At most ``limit`` rows of orders that ended ``days`` or more before ``now``, oldest
    days first: one range query per due range (core/retention.py), paged lazily and stopped
    at ``limit``, so the cost follows the rows returned, never the table."""
    found: list[FinishedRow] = []
    for due in retention.due_ranges(now, days):
        if len(found) >= limit:
            break
        query, parameters = "PartitionKey ge @lo and PartitionKey lt @hi", {"lo": due.low, "hi": due.high}
        if due.before is not None:
            query, parameters = f"{query} and RowKey lt @before", {**parameters, "before": due.before}
        s._op("finished_query")
        rows = s.table.query_entities(query, parameters=parameters, results_per_page=min(limit - len(found), 1000))
        for row in rows:
            found.append(
                FinishedRow(row["PartitionKey"], row["RowKey"], row["OrderId"], row["State"], row["FinishedAt"],
                            row.get("Batch") or None, row.metadata["etag"], row.get("MarkedAt"))
            )
            if len(found) >= limit:
                break
    return found


def _by_partition(rows: Iterable[FinishedRow]) -> dict[str, list[FinishedRow]]:
    grouped: dict[str, list[FinishedRow]] = defaultdict(list)
    for row in rows:
        grouped[row.partition].append(row)
    return grouped


def mark(s: StateStore, rows: Iterable[FinishedRow], batch: str, now: datetime | None = None) -> list[FinishedRow]:
    """Mark rows as taken into ``batch`` (the archive's block of that id) at ``now``: one
    transaction per index partition and 100 rows, each row If-Match on the ETag read.
    Returns the rows marked; a partition's rows changed since they were read (another
    runner) are left out."""
    now = now or utcnow()
    marked = []
    for partition, group in _by_partition(rows).items():
        for start in range(0, len(group), TRANSACTION_MOST):
            chunk = group[start : start + TRANSACTION_MOST]
            operations = [
                ("update", {"PartitionKey": partition, "RowKey": row.row_key, "Batch": batch, "MarkedAt": now},
                 {"mode": UpdateMode.MERGE, "etag": row.etag, "match_condition": MatchConditions.IfNotModified})
                for row in chunk
            ]
            s._op("transaction")
            try:
                s.table.submit_transaction(operations)
            except HttpResponseError as error:
                if getattr(error, "status_code", None) not in (404, 412):
                    raise
                continue  # moved or gone since read: the next tick reads them again
            marked += [row._replace(batch=batch, marked_at=now) for row in chunk]
    return marked


def delete(s: StateStore, rows: Iterable[FinishedRow]) -> None:
    """Delete index rows: one transaction per partition and 100 rows; a chunk with a row
    already gone (a crash after part of this) is deleted row by row instead."""
    for partition, group in _by_partition(rows).items():
        for start in range(0, len(group), TRANSACTION_MOST):
            chunk = group[start : start + TRANSACTION_MOST]
            s._op("transaction")
            try:
                s.table.submit_transaction(
                    [("delete", {"PartitionKey": partition, "RowKey": row.row_key}) for row in chunk]
                )
            except (ResourceNotFoundError, HttpResponseError) as error:
                if getattr(error, "status_code", None) != 404:
                    raise
                for row in chunk:
                    s._op("index_delete")
                    s.table.delete_entity(partition, row.row_key)  # succeeds when already gone
