"""The order state over several storage accounts: :class:`ShardedStateStore`.

One account serves ~20,000 requests/s (docs/scale.md); an order costs ~12 table requests
(12.2 measured), so one account holds ~1,300 orders/s at 80%. ``STATE_STORAGE_ACCOUNTS``
lists A accounts, and each order lives, whole, in the account a slice of its id's hash picks
(:func:`core.names.state_account`): its order, state and line rows, and its row of the
active index (the index shards of each account, picked by another slice of the hash, so
each account's shards fill evenly). Every transition therefore stays one If-Match write
or one entity-group transaction in the order's partition, in one account.

The store below has :class:`adapters.store.StateStore`'s interface and delegates every
per-order call to the order's account; the lists, sweeps and counts read every account
(concurrently) and merge. The list is fixed for the deployment's life: an order is looked
for where its id and the list's length say, so adding, removing or reordering an account
would hide the orders already written (docs/scale.md, "The order state over several
accounts"). :func:`check_layout` refuses such a change: each account's table keeps a row
with its place in the list and the list's length, written on first use and compared on
every start.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TypeVar

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError, ServiceResponseError

from adapters.store import BreakerRow, Created, OrderRecord, StateStore
from core import names
from core.models import LineRecord, OrderRequest, OrderState, ProcessState

T = TypeVar("T")

#: Where each account's table records its place among the state's accounts. The partition
#: starts with ``_``, as no order id does, and sorts before the active index's partitions.
LAYOUT_PARTITION = "_accounts"
LAYOUT_ROW = "layout"


class AccountLayoutChanged(RuntimeError):
    """STATE_STORAGE_ACCOUNTS no longer lists the accounts as the orders were written:
    reads and writes would look for orders in the wrong account, so nothing runs."""


def check_layout(tables: Sequence) -> None:
    """Record, or check, each account's place in the list (``tables``: the orders table in
    each account, in the setting's order). The first start writes a row in each; every
    later start compares: a reordered list, or a changed count, raises
    :class:`AccountLayoutChanged` naming the account and what it was. One read per account
    per process, and on the first start a create.

    The read comes first because azure-core sends a read again after a dropped connection
    or a 5xx, but never a POST: a create with no answer (or a 5xx), applied or not, is
    followed by another read rather than failing the process (ordersctl failed on it in a
    push-back soak), as is a create refused because another process wrote the row first."""
    for position, table in enumerate(tables):
        _check_place(table, position, len(tables))


#: Reads of a layout row whose create keeps failing unanswered, before the error is raised.
LAYOUT_ATTEMPTS = 3


def _check_place(table, position: int, count: int) -> None:
    for attempt in range(1, LAYOUT_ATTEMPTS + 1):
        try:
            row = table.get_entity(LAYOUT_PARTITION, LAYOUT_ROW)
        except ResourceNotFoundError:
            try:
                table.create_entity(
                    {"PartitionKey": LAYOUT_PARTITION, "RowKey": LAYOUT_ROW, "Position": position, "Accounts": count}
                )
                return
            except ResourceExistsError:  # another process wrote it first
                row = table.get_entity(LAYOUT_PARTITION, LAYOUT_ROW)
            except (ServiceResponseError, HttpResponseError) as error:
                unanswered = isinstance(error, ServiceResponseError) or (error.status_code or 500) >= 500
                if not unanswered or attempt == LAYOUT_ATTEMPTS:
                    raise
                continue  # applied or not: read again
        if (row["Position"], row["Accounts"]) != (position, count):
            raise AccountLayoutChanged(
                f"{names.STATE_STORAGE_ACCOUNTS_SETTING}: the account at place {position} of {count} "
                f"({getattr(table, 'account_name', '?')}) was written as place {row['Position']} of "
                f"{row['Accounts']}. The accounts of the order state are fixed for the deployment's life "
                "(orders live where they were created): restore the list as it was (docs/scale.md)"
            )
        return


class ShardedStateStore:
    """A :class:`StateStore` per account, each order in the one its id picks. Thread-safe."""

    def __init__(self, stores: Sequence[StateStore]) -> None:
        names.state_account("", len(stores))  # a clear error for a count out of range
        if len({store.shards for store in stores}) != 1:
            raise ValueError("every account's store must have the same ACTIVE_INDEX_SHARDS")
        self.stores = tuple(stores)
        self.shards = stores[0].shards

    @property
    def ops(self) -> Counter[str]:
        """Table operations by kind, every account's together."""
        return sum((store.ops for store in self.stores), Counter())

    @property
    def recognised(self) -> Counter[str]:
        """Writes reported failed but found applied, by kind, every account's together."""
        return sum((store.recognised for store in self.stores), Counter())

    def store_for(self, order_id: str) -> StateStore:
        """The store of the account ``order_id`` lives in."""
        return self.stores[names.state_account(order_id, len(self.stores))]

    def _each(self, fn: Callable[[StateStore], T]) -> list[T]:
        """``fn`` on every account's store at once, results in account order."""
        with ThreadPoolExecutor(max_workers=len(self.stores), thread_name_prefix="accounts") as pool:
            return list(pool.map(fn, self.stores))

    # -- per order: the order's account ----------------------------------------------------

    def create_order(self, order: OrderRequest, **kwargs) -> Created:
        return self.store_for(order.order_id).create_order(order, **kwargs)

    def import_order(self, order: OrderRequest, state: OrderState, lines: Sequence[LineRecord] = ()) -> None:
        self.store_for(order.order_id).import_order(order, state, lines)

    def read(self, order_id: str) -> OrderRecord:
        return self.store_for(order_id).read(order_id)

    def get(self, order_id: str) -> OrderState:
        return self.store_for(order_id).get(order_id)

    def get_order(self, order_id: str) -> OrderRequest:
        return self.store_for(order_id).get_order(order_id)

    def write(
        self, current: OrderState, new: OrderState, lines: Sequence[LineRecord] = (), *, consume: str | None = None
    ) -> OrderState:
        return self.store_for(new.order_id).write(current, new, lines, consume=consume)

    def write_over(self, record: OrderRecord, new: OrderState, lines: Sequence[LineRecord] = ()) -> OrderRecord:
        return self.store_for(new.order_id).write_over(record, new, lines)

    def transition(
        self, current: OrderState, new: OrderState | None, lines: Sequence[LineRecord] = ()
    ) -> OrderState | None:
        return self.store_for(current.order_id).transition(current, new, lines)

    def index_partition(self, order_id: str) -> str:
        return self.store_for(order_id).index_partition(order_id)

    def reindex(self, order_id: str, now: datetime) -> None:
        self.store_for(order_id).reindex(order_id, now)

    def unindex(self, order_id: str, etag: str | None = None, *, partition: str | None = None) -> None:
        self.store_for(order_id).unindex(order_id, etag, partition=partition)

    def index_etag(self, order_id: str) -> str | None:
        return self.store_for(order_id).index_etag(order_id)

    # -- not per order: the first account ----------------------------------------------------

    def publish_breaker(self, service: str, instance: str, state: str, at: datetime) -> None:
        self.stores[0].publish_breaker(service, instance, state, at)

    def breakers(self) -> list[BreakerRow]:
        return self.stores[0].breakers()

    # -- every account, merged ----------------------------------------------------------------

    def sweep(self, now: datetime, *, younger_than_cannot_expire: timedelta) -> Iterator[OrderState]:
        """Every account's sweep (each reads its index shards), read at once, one after the other yielded."""
        found = self._each(lambda s: list(s.sweep(now, younger_than_cannot_expire=younger_than_cannot_expire)))
        return itertools.chain.from_iterable(found)

    def list_expired(self, now: datetime, *, younger_than_cannot_expire: timedelta = timedelta(0)) -> list[OrderState]:
        return [state for states in self._each(
            lambda s: s.list_expired(now, younger_than_cannot_expire=younger_than_cannot_expire)) for state in states]

    def active_ids(
        self, *, indexed_before: datetime | None = None, id_prefix: str | None = None
    ) -> list[tuple[str, datetime, str]]:
        """Every account's in-flight orders, by order id."""
        found = self._each(lambda s: s.active_ids(indexed_before=indexed_before, id_prefix=id_prefix))
        return list(heapq.merge(*found))

    def in_flight(self, *, limit: int) -> tuple[list[OrderState], bool]:
        found = self._each(lambda s: s.in_flight(limit=limit))
        states = sorted((state for states, _ in found for state in states), key=lambda s: s.order_id)
        return states[:limit], len(states) > limit or any(more for _, more in found)

    def list_states(self, *, id_prefix: str | None = None) -> list[OrderState]:
        return [state for states in self._each(lambda s: s.list_states(id_prefix=id_prefix)) for state in states]

    def states_updated_since(
        self, since: datetime, *, limit: int
    ) -> tuple[list[tuple[str, ProcessState, datetime]], bool]:
        found = self._each(lambda s: s.states_updated_since(since, limit=limit))
        # By order id, as one account's query returns them: a cut past ``limit`` thins every
        # hour alike, where by time it dropped the newest hours whole.
        rows = sorted((row for rows, _ in found for row in rows), key=lambda row: row[0])
        return rows[:limit], len(rows) > limit or any(more for _, more in found)

    def list_by_state(self, state: ProcessState, *, limit: int = 50) -> list[OrderState]:
        found = [s for states in self._each(lambda s: s.list_by_state(state, limit=limit)) for s in states]
        return sorted(found, key=lambda s: s.updated_at, reverse=True)[:limit]

    def page_by_state(
        self, state: ProcessState, *, limit: int, after: str | None = None
    ) -> tuple[list[OrderState], str | None]:
        """One page in order-id order across the accounts: each account's first ``limit``
        after the cursor, merged, the first ``limit`` kept (the cursor is an order id, so
        the next page starts right after the last one shown, in every account)."""
        pages = self._each(lambda s: s.page_by_state(state, limit=limit, after=after))
        merged = list(heapq.merge(*(page for page, _ in pages), key=lambda s: s.order_id))
        page = merged[:limit]
        more = len(merged) > limit or any(cursor is not None for _, cursor in pages)
        return page, (page[-1].order_id if more and page else None)


def state_store(stores: Sequence[StateStore]) -> StateStore | ShardedStateStore:
    """The store over the order state's accounts: one account's store itself, else the router."""
    return stores[0] if len(stores) == 1 else ShardedStateStore(stores)


__all__ = ["ShardedStateStore", "state_store"]
