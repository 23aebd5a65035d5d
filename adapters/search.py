"""The search indexes beside the orders: a customer's orders, and the Error orders by cause.

Rows (keys from core/search.py), in the orders table of the order's own storage account:

========================  =========================  ==========================================
PartitionKey              RowKey                     what
========================  =========================  ==========================================
``_customer-<customer>``  ``<inverted ms>-<order>``  one row per order, written at submission
``_error-<group>``        ``<OrderId>``              one row per order in Error, by cause
``_error-groups``         ``<group>``                each cause: its step, normalised error, a sample
========================  =========================  ==========================================

An entity-group transaction covers one partition of one table ("Entity group
transactions", https://learn.microsoft.com/en-us/rest/api/storageservices/performing-entity-group-transactions,
read 2026-11-25: same table, same PartitionKey, at most 100 entities), and an index
partition is not the order's: no index row can share the order's transaction. So, as the
active index: an index row is written *before* the order's own write, and a reader keeps
only the index rows whose order exists as they say (a customer row whose order was never
written, or was written at another time by an earlier delivery, is skipped and removed; an
Error row whose order is no longer in Error at that attempt is skipped and removed).

A customer row is written by :func:`index_customer` just before the order's creating
transaction; an Error row by :func:`index_error` when the order is closed in Error
(adapters/closing.py), before its active index row goes, so a crash between leaves the
active row and the supervisor's sweep closes the order again, which writes the row again.
A resubmit removes it (:func:`unindex_error`). :func:`forget` removes an order's rows of
both indexes (for retention, which deletes a finished order's rows).

With several state accounts (adapters/accounts.py) each order's index rows live in its
own account, and the readers read every account and merge.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from adapters.store import ORPHAN_GRACE, OrderNotFound
from core import names
from core.models import OrderRequest, OrderState, ProcessState, utcnow
from core.search import (
    ErrorCause,
    KeyRange,
    cause_of,
    created_millis,
    created_of,
    customer_partition,
    customer_row_key,
    error_partition,
    millis,
    order_of,
)

log = logging.getLogger(__name__)

#: A group's orders are counted up to this many (``count_capped`` past it): a count costs
#: one query per 1,000 rows.
MAX_COUNT = 10_000
#: A sample error is kept this long in the group's row.
SAMPLE_CHARS = 500

T = TypeVar("T")
R = TypeVar("R")


def _accounts(store) -> tuple[Any, ...]:
    """Every account's store (one account: the store itself)."""
    return tuple(getattr(store, "stores", (store,)))


def _home(store, order_id: str):
    """The store of the account ``order_id`` lives in."""
    return store.store_for(order_id) if hasattr(store, "store_for") else store


def _each(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` on every item, concurrently when there are several (the accounts, the reads of a page)."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), 16), thread_name_prefix="search") as pool:
        return list(pool.map(fn, items))


def _delete(account, partition: str, row_key: str, etag: str | None = None) -> None:
    """Delete an index row (If-Match ``etag`` when given); gone already, or written again since: fine."""
    account._op("index_delete")
    try:
        if etag:
            account.table.delete_entity(partition, row_key, etag=etag, match_condition=MatchConditions.IfNotModified)
        else:
            account.table.delete_entity(partition, row_key)
    except (ResourceNotFoundError, ResourceModifiedError):
        pass


def _state_or_none(store, order_id: str) -> OrderState | None:
    try:
        return store.get(order_id)
    except OrderNotFound:
        return None


# --- by customer ---------------------------------------------------------------------------


def index_customer(store, order: OrderRequest, now: datetime) -> None:
    """The order's row in its customer's index: one upsert, before the order is created at ``now``."""
    account = _home(store, order.order_id)
    account._op("index_upsert")
    account.table.upsert_entity(
        {"PartitionKey": customer_partition(order.customer_id), "RowKey": customer_row_key(now, order.order_id),
         "OrderId": order.order_id},
        mode=UpdateMode.REPLACE,
    )


@dataclass(frozen=True)
class CustomerPage:
    orders: list[OrderState]
    #: The RowKey the next page starts after; None on the last page.
    next_key: str | None


def by_customer(
    store, customer_id: str, *, key_range: KeyRange, limit: int, after: str | None = None
) -> CustomerPage:
    """One page of a customer's orders, newest first: per account, one query of the
    customer's index partition (the RowKeys after ``after`` within ``key_range``, at most
    ``limit + 1``), merged; then a point read of each order's state row (concurrently).

    An index row whose order is missing is skipped, and removed once it is older than the
    store's ORPHAN_GRACE (a submission that died between the two writes is retried by
    Service Bus, which writes both again); a row whose time is not its order's creation
    time (an earlier delivery's, or a duplicate's) is skipped and removed."""
    partition = customer_partition(customer_id)
    query, parameters = "PartitionKey eq @pk", {"pk": partition}
    for op, name, value in (("ge", "lo", key_range.lo), ("lt", "hi", key_range.hi), ("gt", "after", after)):
        if value is not None:
            query, parameters = f"{query} and RowKey {op} @{name}", {**parameters, name: value}

    def rows(account) -> list[tuple[str, Any]]:
        account._op("index_query")
        found = account.table.query_entities(
            query, parameters=parameters, select=["RowKey"], results_per_page=min(limit + 1, 1000)
        )
        return [(row["RowKey"], account) for row in itertools.islice(found, limit + 1)]

    merged = list(itertools.islice(heapq.merge(*_each(rows, _accounts(store)), key=lambda r: r[0]), limit + 1))
    page = merged[:limit]

    def load(item: tuple[str, Any]) -> OrderState | None:
        row_key, account = item
        state = _state_or_none(account, order_of(row_key))
        if state is not None and created_millis(row_key) == millis(state.created_at):
            return state
        if state is not None or _older_than_grace(row_key):
            _delete(account, partition, row_key)
        return None

    states = [state for state in _each(load, page) if state is not None]
    return CustomerPage(states, page[-1][0] if len(merged) > limit else None)


def _older_than_grace(row_key: str) -> bool:
    """Older than the active index's grace for the same race (a submission between its writes)."""
    return utcnow() - created_of(row_key) > ORPHAN_GRACE


# --- Error orders by cause ------------------------------------------------------------------


def index_error(store, state: OrderState) -> None:
    """An order closed in Error: its own row in its cause's group (an upsert keyed by order
    id, with the attempt it failed at), then the cause's row (an upsert: the latest sample).
    In that order: a listing drops a cause's row only when the cause has no order left and
    the row is unchanged since it looked (:func:`groups`), so a new order's row is never
    left without its cause's row."""
    if state.process_state is not ProcessState.ERROR:
        return
    account, cause = _home(store, state.order_id), cause_of(state)
    account._op("index_upsert")
    account.table.upsert_entity(
        {"PartitionKey": error_partition(cause.group), "RowKey": state.order_id, "Attempt": state.attempt,
         "ErrorAt": state.updated_at},
        mode=UpdateMode.REPLACE,
    )
    account._op("index_upsert")
    account.table.upsert_entity(
        {
            "PartitionKey": names.ERROR_GROUPS_PARTITION, "RowKey": cause.group, "Step": cause.step,
            "Kind": cause.kind, "Failed": ",".join(cause.failed), "Error": cause.error,
            "Sample": (state.last_error or "")[:SAMPLE_CHARS], "SampleOrder": state.order_id, "LastSeen": state.updated_at,
        },
        mode=UpdateMode.REPLACE,
    )


def unindex_error(store, state: OrderState) -> None:
    """The order, as it was in Error (``state``), leaves its group: its row is deleted if it
    is still that Error's (same attempt and the same time it ended; If-Match on the row as
    read), so a later Error of the same order keeps its row, at a later attempt or at the
    same one (a resubmitted undo of a step that has none fails again at once, unclaimed).
    Two requests (a read, a delete)."""
    if state.process_state is not ProcessState.ERROR:
        return
    account, partition = _home(store, state.order_id), error_partition(cause_of(state).group)
    account._op("read")
    try:
        row = account.table.get_entity(partition, state.order_id)
    except ResourceNotFoundError:
        return
    if row.get("Attempt") == state.attempt and _same_time(row.get("ErrorAt"), state.updated_at):
        _delete(account, partition, state.order_id, row.metadata["etag"])


def _same_time(stored, when: datetime) -> bool:
    """A time read back from a row (Table storage keeps 7 decimals) against one in hand."""
    return stored is not None and abs(stored - when) < timedelta(milliseconds=1)


@dataclass(frozen=True)
class Member:
    """One row of a group: an order that ended in Error with that cause, at ``attempt``."""

    order_id: str
    attempt: int
    error_at: datetime | None
    etag: str
    partition: str
    account: Any

    def remove(self) -> None:
        """Delete this row as read (If-Match): a row written again since is kept."""
        _delete(self.account, self.partition, self.order_id, self.etag)


def members(store, group: str, *, limit: int, after: str | None = None) -> tuple[list[Member], bool]:
    """The group's rows in order-id order after ``after``, at most ``limit`` (and whether
    there are more): per account one query of the group's partition, merged."""
    partition = error_partition(group)
    query, parameters = "PartitionKey eq @pk", {"pk": partition}
    if after:
        query, parameters = f"{query} and RowKey gt @after", {**parameters, "after": after}

    def rows(account) -> list[Member]:
        account._op("index_query")
        found = account.table.query_entities(query, parameters=parameters, results_per_page=min(limit + 1, 1000))
        return [
            Member(r["RowKey"], r.get("Attempt", 0), r.get("ErrorAt"), r.metadata["etag"], partition, account)
            for r in itertools.islice(found, limit + 1)
        ]

    merged = list(itertools.islice(heapq.merge(*_each(rows, _accounts(store)), key=lambda m: m.order_id), limit + 1))
    return merged[:limit], len(merged) > limit


@dataclass(frozen=True)
class Group:
    """A cause of Error, with how many orders its index holds."""

    group: str
    cause: ErrorCause
    sample: str
    sample_order: str
    last_seen: datetime
    count: int
    capped: bool

    def document(self) -> dict[str, Any]:
        return {
            "group": self.group, "step": self.cause.step, "kind": self.cause.kind,
            "failed_compensations": list(self.cause.failed), "error": self.cause.error, "sample_error": self.sample,
            "sample_order": self.sample_order, "last_seen": self.last_seen.isoformat(), "count": self.count,
            "count_capped": self.capped,
        }


def _count(account, group: str) -> int:
    """The group's rows in one account, up to MAX_COUNT (keys only, 1,000 per reply)."""
    account._op("index_query")
    found = account.table.query_entities(
        "PartitionKey eq @pk", parameters={"pk": error_partition(group)}, select=["RowKey"], results_per_page=1000
    )
    return sum(1 for _ in itertools.islice(found, MAX_COUNT + 1))


def groups(store, *, limit: int, after: str | None = None) -> tuple[list[Group], str | None]:
    """One page of the causes, by group id after ``after``, at most ``limit``, with their
    counts; and the group id the next page starts after (None on the last). Per account:
    one query of ``_error-groups`` and one count query per group (per 1,000 orders); a
    cause whose orders have all left Error is not listed."""
    query, parameters = "PartitionKey eq @pk", {"pk": names.ERROR_GROUPS_PARTITION}
    if after:
        query, parameters = f"{query} and RowKey gt @after", {**parameters, "after": after}

    def rows(account) -> list[tuple[str, Any, Any]]:
        account._op("index_query")
        found = account.table.query_entities(query, parameters=parameters, results_per_page=min(limit + 1, 1000))
        return [(row["RowKey"], row, account) for row in itertools.islice(found, limit + 1)]

    accounts = _accounts(store)
    merged = list(heapq.merge(*_each(rows, accounts), key=lambda r: r[0]))
    by_group: dict[str, list[tuple[Any, Any]]] = {}
    for group, row, account in merged:
        by_group.setdefault(group, []).append((row, account))
    ids = sorted(by_group)[: limit + 1]
    page_ids = ids[:limit]

    found = [g for g in _each(lambda g: _build(g, by_group[g], accounts), page_ids) if g.count]
    return found, (page_ids[-1] if len(ids) > limit else None)


def _build(group_id: str, found: list[tuple[Any, Any]], accounts: Sequence[Any]) -> Group:
    """A group from its rows (one per account that has seen it) and its count in every
    account. An account's row of a cause with no order left there is deleted (If-Match on
    the row as read: a new order of that cause rewrote it since, so it stays)."""
    row = max((row for row, _ in found), key=lambda r: r["LastSeen"])  # the newest sample
    counts = dict(zip((id(a) for a in accounts), _each(lambda account: _count(account, group_id), accounts)))
    for account_row, account in found:
        if counts[id(account)] == 0:
            _delete(account, names.ERROR_GROUPS_PARTITION, group_id, account_row.metadata["etag"])
    total = sum(counts.values())
    cause = ErrorCause(row["Step"], row["Kind"], tuple(f for f in row["Failed"].split(",") if f), row["Error"])
    return Group(group_id, cause, row["Sample"], row["SampleOrder"], row["LastSeen"], min(total, MAX_COUNT),
                 total > MAX_COUNT)


def group(store, group_id: str) -> Group | None:
    """One cause with its count (None when no account knows it): a point read of its row and
    its count, per account."""
    accounts = _accounts(store)
    found = [(row, account) for row, account in zip(_each(lambda a: _group_row(a, group_id), accounts), accounts)
             if row is not None]
    return _build(group_id, found, accounts) if found else None


def _group_row(account, group_id: str):
    account._op("read")
    try:
        return account.table.get_entity(names.ERROR_GROUPS_PARTITION, group_id)
    except ResourceNotFoundError:
        return None


def backfill_customers(store) -> int:
    """Write the customer row of every order written before the customer index existed (or
    whose row went missing): a one-off scan of the order rows (``RowKey eq 'order'``) of
    every account, and per order a point read of its state (for its creation time) and an
    upsert. Idempotent (the row's key is the order's creation time and id). Returns how many
    orders it indexed. For an operator, once, never for the functions: it reads every order."""

    def one_account(account) -> int:
        account._op("query")
        done = 0
        rows = account.table.query_entities("RowKey eq @rk", parameters={"rk": "order"},
                                            select=["PartitionKey", "Document"], results_per_page=1000)
        for row in rows:
            state = _state_or_none(account, row["PartitionKey"])
            if state is None:
                continue
            index_customer(account, OrderRequest.model_validate_json(row["Document"]), state.created_at)
            done += 1
        return done

    return sum(_each(one_account, _accounts(store)))


# --- retention ------------------------------------------------------------------------------------


def forget(store, order: OrderRequest, state: OrderState) -> None:
    """Remove an order's rows from both indexes (retention, before it deletes the order's
    own rows): its customer row, and its Error row if it ended in Error. Succeeds when
    they are gone already. Two deletes (one for an order not in Error)."""
    account = _home(store, order.order_id)
    _delete(account, customer_partition(order.customer_id), customer_row_key(state.created_at, order.order_id))
    if state.process_state is ProcessState.ERROR:
        _delete(account, error_partition(cause_of(state).group), order.order_id)

