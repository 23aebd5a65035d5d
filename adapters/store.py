"""The state store: Azure Table Storage, every transition conditional on the ETag.

Layout of the orders table:

=================  =====================  ==========================================
PartitionKey       RowKey                 what
=================  =====================  ==========================================
``<OrderId>``      ``order``              the order document (canonical JSON)
``<OrderId>``      ``state``              the process state (:class:`OrderState`):
                                          the current line of the workflow
``<OrderId>``      ``step-01-reserve``    how step 1's action ended (:class:`LineRecord`)
``<OrderId>``      ``undo-01-reserve``    how step 1's compensation ended
``<OrderId>``      ``first-claim-<hex>``  the first-claim seal (core.models.first_claim_key): only
                                          while no write has moved the order since its submission
``_active-007``    ``<OrderId>``          the active index: one row per in-flight order,
                                          in the shard a hash of its id picks
=================  =====================  ==========================================

The order and state rows are written by one entity-group transaction, so they exist
together or not at all. A line's row is written in the same transaction as the state
row's If-Match update that ends the line (and starts the next one), so the state row's
ETag guards the whole partition: no step row is ever written without it.

The seal row is created in the order's transaction and deleted by the first write over
its state row, whoever writes it (the first claim, a claim after a read, a cancel, a
supervisor's verdict, a resubmit), in that write's transaction: while the partition holds
it, the state row is exactly as the submission wrote it, which is what an order's first
claim proves instead of reading (scheduler/dispatch.py). A write over the order as read
deletes the seal the read saw (:meth:`StateStore.write_over`, :attr:`OrderRecord.seal`);
one decided on the state row alone reads the partition first
(:meth:`StateStore.transition`).

The active index row is written *before* the order's transaction and removed once the
order is terminal, so the supervisor's sweep reads the in-flight orders only, however
many finished orders the table holds. The index heals itself: an index row whose order is
terminal, or whose order never got written, is dropped by the supervisor
(:meth:`StateStore.sweep`).

The index is spread over ``ACTIVE_INDEX_SHARDS`` partitions (``_active-000`` ...), the
shard picked by a stable hash of the order id (:func:`core.names.active_shard`), so no
single partition carries every order's index writes. Readers read every index partition,
also those outside the current count (rows written under another count, or in the single
``_active`` partition of before the sharding), and the sweep moves such a row to its shard
under the current count: changing the count with orders in flight loses none
(docs/scale.md, "The active index, sharded").
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    IncompleteReadError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceResponseError,
)
from azure.data.tables import TableClient, UpdateMode
from pydantic import TypeAdapter

from adapters import telemetry
from adapters.ids import random_uuid
from core import lifecycle, names, retention
from core.models import (
    FIRST_CLAIM_PREFIX,
    GroupLine,
    LineRecord,
    LineState,
    OrderRequest,
    OrderState,
    ProcessState,
    first_claim_key,
)
from core.workflow import Kind, Workflow

log = logging.getLogger(__name__)

ORDER_ROW = "order"
STATE_ROW = "state"
#: The active index's single partition before it was sharded: still read (and drained into
#: the shards by the sweep), so an upgrade with orders in flight loses none.
UNSHARDED_ACTIVE_PARTITION = names.ACTIVE_PREFIX
#: Threads that read the index's partitions, and the in-flight orders' state rows, at once.
INDEX_READERS = 16
#: A property of the state row: a new random id on every write of it (creation, each
#: transition). When Azure applies a write but reports it failed (a 500 OperationTimedOut,
#: a dropped connection) and the SDK's retry then meets the write itself (412, 409), the
#: store reads the row back: its own WriteId there means the write is done (docs/scale.md).
WRITE_ID = "WriteId"
#: Tries of one transition whose answer was lost (no answer, or a 5xx after the SDK's
#: retries) and which the row shows was not applied: the azure-core retry policy does not
#: send a PATCH or a POST again after a dropped connection (only the methods it deems
#: idempotent), so the store does, once it has read that the write is not there.
WRITE_ATTEMPTS = 3
#: The agents' circuit breakers as they were published: one row per (remote service, host
#: instance), written only when that breaker changes state (``ordersctl breakers``).
BREAKERS_PARTITION = "_breakers"
#: An index row whose order rows are still missing after this long belongs to a
#: submission that crashed between the two writes; the orders message is retried by
#: Service Bus (which rewrites the index row), so the orphan can go.
ORPHAN_GRACE = timedelta(minutes=10)
#: Sorts after every character an order id may hold: ``[prefix, prefix + this)`` is a key range.
_AFTER_PREFIX = "~"


class StoreError(Exception):
    """Base class of the store's errors."""


class OrderNotFound(StoreError, LookupError):
    """No order with that id."""


class OrderConflict(StoreError):
    """An order with this id exists with different content; nothing was changed."""

    def __init__(self, order_id: str, existing: str, submitted: str) -> None:
        super().__init__(f"order {order_id!r} already exists with different content")
        self.order_id = order_id
        self.existing = existing
        self.submitted = submitted


class _NotApplied(Exception):
    """A write that got no answer and is not on the row: safe to send again."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ConcurrencyConflict(StoreError):
    """The row changed since it was read (HTTP 412): re-read and decide again."""


# --- entity mapping ----------------------------------------------------------------

_STATE_FIELDS = {
    "order_id": "OrderId",
    "process_state": "ProcessState",
    "complete_by": "CompleteBy",
    "locked_by": "LockedBy",
    "failure_count": "FailureCount",
    "attempt": "Attempt",
    "last_error": "LastError",
    "reply_to": "ReplyTo",
    "created_at": "CreatedAt",
    "updated_at": "UpdatedAt",
    "workflow": "Workflow",
    "workflow_version": "WorkflowVersion",
    "step_index": "StepIndex",
    "kind": "Kind",
    "step": "Step",
    "plan": "Plan",
    "failed": "Failed",
    "cause": "Cause",
    "gave_up": "GaveUp",
    "max_failures": "MaxFailures",
    "postponements": "Postponements",
    "note": "Note",
    "trace_parent": "TraceParent",
    "cancel_requested_at": "CancelRequestedAt",
    "cancel_reason": "CancelReason",
    "cancelled_by": "CancelledBy",
    "group": "Group",
}
#: Optional values are written as "" (or 0) rather than left out: a MERGE that leaves
#: a property out keeps its old value, so clearing LockedBy must write something.
_OPTIONAL_TEXT = {"LockedBy", "LastError", "ReplyTo", "Step", "Cause", "Note", "TraceParent", "CancelReason", "CancelledBy"}
_OPTIONAL_NUMBER = {"MaxFailures"}
_INDEX_LISTS = {"Plan", "Failed"}
#: The lines of a group in flight, as JSON text ("" when none): core.models.GroupLine.
_GROUP = "Group"
_GROUP_LINES = TypeAdapter(tuple[GroupLine, ...])


def _to_property(prop: str, value: Any) -> Any:
    if prop == _GROUP:
        return _GROUP_LINES.dump_json(value).decode() if value else ""
    if isinstance(value, Enum):
        return value.value
    if prop in _INDEX_LISTS:
        return ",".join(str(i) for i in value)
    if value is None and prop in _OPTIONAL_TEXT:
        return ""
    if value is None and prop in _OPTIONAL_NUMBER:
        return 0
    return value


def _from_property(prop: str, value: Any) -> Any:
    if prop == _GROUP:
        return _GROUP_LINES.validate_json(value) if value else ()
    if prop in _INDEX_LISTS:
        return tuple(int(i) for i in value.split(",")) if value else ()
    if prop in _OPTIONAL_TEXT and value == "":
        return None
    if prop in _OPTIONAL_NUMBER and not value:
        return None
    return value


def state_to_entity(state: OrderState) -> dict[str, Any]:
    """Datetimes stay ``datetime`` objects so they are stored as ``Edm.DateTime``
    (a string would compare as text in Azure and silently miss rows)."""
    entity: dict[str, Any] = {"PartitionKey": state.order_id, "RowKey": STATE_ROW}
    for name, prop in _STATE_FIELDS.items():
        entity[prop] = _to_property(prop, getattr(state, name))
    return entity


def state_from_entity(entity: dict[str, Any]) -> OrderState:
    return _state(entity, entity.metadata.get("etag"))


def _state(entity: dict[str, Any], etag: str | None) -> OrderState:
    values = {name: _from_property(prop, entity.get(prop)) for name, prop in _STATE_FIELDS.items()}
    # Properties an older row does not have yet take the model's defaults.
    present = {name: value for name, value in values.items() if value is not None or name in _NULLABLE}
    return OrderState(**present, etag=etag)


_NULLABLE = {
    "locked_by", "last_error", "reply_to", "step", "cause", "max_failures", "note", "trace_parent",
    "cancel_requested_at", "cancel_reason", "cancelled_by",
}

_LINE_PREFIX = {Kind.ACTION: "step", Kind.COMPENSATION: "undo"}
_LINE_PREFIXES = tuple(f"{prefix}-" for prefix in _LINE_PREFIX.values())


def line_key(step_index: int, step: str, kind: Kind) -> str:
    """``step-01-reserve`` (the action of step 1) or ``undo-01-reserve`` (its compensation)."""
    return f"{_LINE_PREFIX[kind]}-{step_index + 1:02d}-{step}"


def line_to_entity(line: LineRecord) -> dict[str, Any]:
    return {
        "PartitionKey": line.order_id,
        "RowKey": line_key(line.step_index, line.step, line.kind),
        "StepIndex": line.step_index,
        "Step": line.step,
        "Kind": line.kind.value,
        "Action": line.action or "",
        "LineState": line.state.value,
        "Attempt": line.attempt,
        "FailureCount": line.failure_count,
        "LastError": line.last_error or "",
        # A Table string holds 32K characters; results are small confirmations.
        "Result": "" if line.result is None else json.dumps(line.result, separators=(",", ":")),
        "UpdatedAt": line.updated_at,
    }


def line_from_entity(entity: dict[str, Any]) -> LineRecord:
    return LineRecord(
        order_id=entity["PartitionKey"],
        step_index=entity["StepIndex"],
        step=entity["Step"],
        kind=Kind(entity["Kind"]),
        action=entity.get("Action") or None,
        state=LineState(entity["LineState"]),
        attempt=entity["Attempt"],
        failure_count=entity.get("FailureCount", 0),
        last_error=entity.get("LastError") or None,
        result=json.loads(entity["Result"]) if entity.get("Result") else None,
        updated_at=entity["UpdatedAt"],
    )


@dataclass(frozen=True)
class OrderRecord:
    """Everything the partition holds about one order."""

    document: str
    state: OrderState
    lines: tuple[LineRecord, ...]
    #: The state row's :data:`WRITE_ID`: which write last wrote it.
    write_id: str | None = None
    #: The RowKey of the order's first-claim seal while the partition holds it (no write has
    #: moved the order since its submission); a write over this record deletes it.
    seal: str | None = None

    def results(self) -> dict[str, dict[str, Any]]:
        """Results of the steps whose action is done, by step name."""
        return {
            line.step: line.result or {}
            for line in self.lines
            if line.kind is Kind.ACTION and line.state is LineState.DONE
        }

    def after(self, state: OrderState, lines: Iterable[LineRecord] = (), write_id: str | None = None) -> OrderRecord:
        """This order as :meth:`StateStore.read` returns it right after a write over it of
        ``state`` (with the ETag the write got), the rows of ``lines`` and the state row's
        ``write_id``: both as the table gives them back (an empty text reads as None), each
        line in place of the row of the same line, the other lines kept, in the order of
        :func:`record_from_rows`; no seal, which that write deleted. The document never
        changes once written."""
        by_key = {_line_key(line): line for line in self.lines}
        by_key.update({_line_key(line): line_from_entity(line_to_entity(line)) for line in lines})
        return OrderRecord(self.document, stored(state), _in_order(by_key.values()), write_id)


def stored(state: OrderState) -> OrderState:
    """``state`` as the table gives it back once written, with the same ETag."""
    return _state(state_to_entity(state), state.etag)


def _line_key(line: LineRecord) -> str:
    return line_key(line.step_index, line.step, line.kind)


def _in_order(lines: Iterable[LineRecord]) -> tuple[LineRecord, ...]:
    """Lines in the order they ended, those that ended at once (one transition) by RowKey, as a
    partition query returns its rows."""
    return tuple(sorted(lines, key=lambda line: (line.updated_at, _line_key(line))))


def record_from_rows(order_id: str, rows: dict[str, Any]) -> OrderRecord:
    """The order from its partition's rows (by RowKey); :class:`OrderNotFound` without its
    order and state rows."""
    if STATE_ROW not in rows or ORDER_ROW not in rows:
        raise OrderNotFound(f"no order {order_id!r}")
    lines = _in_order(line_from_entity(row) for key, row in rows.items() if key.startswith(_LINE_PREFIXES))
    seal = min((key for key in rows if key.startswith(FIRST_CLAIM_PREFIX)), default=None)
    return OrderRecord(
        rows[ORDER_ROW]["Document"], state_from_entity(rows[STATE_ROW]), lines, rows[STATE_ROW].get(WRITE_ID), seal
    )


# --- the store ----------------------------------------------------------------------


@dataclass(frozen=True)
class Created:
    state: OrderState
    #: False when the same order had been submitted before (a duplicate: nothing written).
    created: bool
    #: The order as its partition holds it right after this creation (None for a duplicate).
    record: OrderRecord | None = None


@dataclass(frozen=True)
class BreakerRow:
    """One agent's circuit breaker for one remote service, as last published."""

    service: str
    instance: str
    state: str
    changed_at: datetime


class IndexRow(NamedTuple):
    """One row of the active index, and the partition it was read from."""

    order_id: str
    indexed_at: datetime
    etag: str
    partition: str


T = TypeVar("T")
R = TypeVar("R")


def _concurrently(fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    """``map(fn, items)`` on up to :data:`INDEX_READERS` threads (inline for a few items)."""
    if len(items) <= 4:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=min(len(items), INDEX_READERS), thread_name_prefix="index") as pool:
        yield from pool.map(fn, items)


class StateStore:
    """Orders and their process state in one table. Thread-safe (the SDK client is)."""

    def __init__(self, table: TableClient, *, shards: int = names.DEFAULT_ACTIVE_INDEX_SHARDS) -> None:
        names.active_shard("", shards)  # a clear error for a count out of range
        self.table = table
        #: Partitions of the active index that new index rows go to (ACTIVE_INDEX_SHARDS).
        self.shards = shards
        #: Table operations by kind, for benchmarks and tests (operations per order).
        self.ops: Counter[str] = Counter()
        #: Writes reported failed but found applied (their write id on the row), by kind.
        self.recognised: Counter[str] = Counter()

    def _op(self, kind: str) -> None:
        self.ops[kind] += 1
        telemetry.table_operation(kind)

    # -- submission -----------------------------------------------------------------

    def create_order(
        self, order: OrderRequest, *, workflow: Workflow, reply_to: str | None, now: datetime, pending_timeout: timedelta,
        note: str | None = None, trace_parent: str | None = None,
    ) -> Created:
        """Write the order row and its Pending state row (at the workflow's first step)
        in one transaction.

        The same order again is a no-op (``created=False``); different content under
        the same id raises :class:`OrderConflict` and changes nothing.
        """
        document = order.document()
        state = lifecycle.new_order(
            order.order_id, workflow, now, pending_timeout, reply_to, note=note, trace_parent=trace_parent
        )
        # Index first: a crash after this line leaves an index row the supervisor
        # can heal; the other order would leave an order nobody supervises.
        index_etag = self._index(order.order_id, now)
        seal = first_claim_key(state.workflow, state.workflow_version, state.reply_to, document)
        write_id = _new_write_id()
        operations = [
            ("create", {"PartitionKey": order.order_id, "RowKey": ORDER_ROW, "Document": document}),
            ("create", {**state_to_entity(state), WRITE_ID: write_id}),
            ("create", {"PartitionKey": order.order_id, "RowKey": seal}),  # the first claim's seal (dispatch.py)
        ]
        try:
            self._op("transaction")
            results = self.table.submit_transaction(operations)
        except (ServiceResponseError, HttpResponseError) as error:
            if _is_conflict(error):
                return self._existing(order.order_id, document, write_id, index_etag)
            if not _ambiguous(error):
                raise
            # Sent, but no answer (a dropped connection: the SDK does not retry a POST) or a
            # 5xx left after the SDK's retries: applied or not, the partition says which.
            try:
                return self._existing(order.order_id, document, write_id, index_etag)
            except OrderNotFound:
                raise error from None
        created = state.model_copy(update={"etag": results[1].get("etag")})
        return Created(created, created=True, record=OrderRecord(document, stored(created), (), write_id, seal))

    def _existing(self, order_id: str, document: str, write_id: str, index_etag: str | None) -> Created:
        """The order already there: this very submission's write, whose success was lost on
        the way back (created), the same order submitted before (a duplicate), or another
        order under the same id (:class:`OrderConflict`). ``index_etag``: the ETag of the
        index row this submission wrote."""
        record = self.read(order_id)
        if record.write_id == write_id:
            self._recognised("create", order_id, "409 entity exists, or no answer")
            return Created(record.state, created=True, record=record)
        if record.document != document:
            raise OrderConflict(order_id, record.document, document)
        if record.state.process_state.terminal and self._closed(record.state):
            # The duplicate's index write re-added it: that row goes, If-Match, so a row an
            # operator's resubmit wrote since (the order in flight again) stays.
            self.unindex(order_id, index_etag)
        # Terminal but not closed yet (a crash between its end and its close): its active row
        # stays, and the sweep closes it (status event, alert, finished index) as it would have.
        return Created(record.state, created=False)

    def _closed(self, state: OrderState) -> bool:
        """Whether a terminal order was closed: its finished-index row, written by the close
        before the active row goes (adapters/finished.py), is there. One point read."""
        partition, row_key = retention.finished_row(state.order_id, state.updated_at, self.shards)
        self._op("read")
        try:
            self.table.get_entity(partition, row_key, select=["RowKey"])
        except ResourceNotFoundError:
            return False
        return True

    # -- reads ----------------------------------------------------------------------

    def read(self, order_id: str) -> OrderRecord:
        """The order document, its state and its ended lines, in one query of the partition."""
        self._op("query")
        rows = {
            row["RowKey"]: row
            for row in self.table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
        }
        return record_from_rows(order_id, rows)

    def get(self, order_id: str) -> OrderState:
        """The state of an order; raises :class:`OrderNotFound`."""
        self._op("read")
        try:
            return state_from_entity(self.table.get_entity(order_id, STATE_ROW))
        except ResourceNotFoundError as error:
            raise OrderNotFound(f"no order {order_id!r}") from error

    def get_order(self, order_id: str) -> OrderRequest:
        self._op("read")
        try:
            entity = self.table.get_entity(order_id, ORDER_ROW)
        except ResourceNotFoundError as error:
            raise OrderNotFound(f"no order {order_id!r}") from error
        return OrderRequest.model_validate_json(entity["Document"])

    # -- transitions ----------------------------------------------------------------

    def write(
        self, current: OrderState, new: OrderState, lines: Sequence[LineRecord] = (), *, consume: str | None = None
    ) -> OrderState:
        """Write ``new`` over ``current`` if the row is unchanged since ``current`` was read,
        together with the rows of the lines that end with it, and deleting the row
        ``consume`` of the partition, which must exist (else :class:`ConcurrencyConflict`).

        The caller must know whether the partition holds the order's first-claim seal: a
        write over the order must delete it (``consume``). The first claim, decided without
        a read, names the seal it proves; a writer holding the order as read uses
        :meth:`write_over`, and one holding its state row alone :meth:`transition`.

        The state row gets only the properties that differ (a MERGE), with If-Match on
        ``current.etag``; with lines, all of it is one entity-group transaction, which
        fails whole if the state row moved. Raises :class:`ConcurrencyConflict` if
        someone else moved the row. A write Azure applied but reported failed (its retry
        answered 412, or no answer at all) is recognised by its :data:`WRITE_ID` on the
        row and returned as written; one with no answer that the row shows was not applied
        is sent again, up to :data:`WRITE_ATTEMPTS` tries in all.
        """
        return self._write(current, new, lines, consume)[0]

    def write_over(self, record: OrderRecord, new: OrderState, lines: Sequence[LineRecord] = ()) -> OrderRecord:
        """:meth:`write` of ``new`` and ``lines`` over ``record`` (the order as read, or as
        this process last wrote it), deleting its seal (:attr:`OrderRecord.seal`) in the same
        transaction, and returning the order as :meth:`read` would return it right after the
        write (:meth:`OrderRecord.after`): the If-Match on ``record``'s ETag passed, so the
        partition held ``record`` and now holds this."""
        state, write_id = self._write(record.state, new, lines, record.seal)
        return record.after(state, lines, write_id)

    def _write(
        self, current: OrderState, new: OrderState, lines: Sequence[LineRecord], consume: str | None
    ) -> tuple[OrderState, str]:
        """:meth:`write`, and the write id the state row now holds."""
        if current.etag is None:
            raise ValueError("a transition needs the ETag the state was read with")
        # One write id for every try: a try that got no answer and looked unapplied may still
        # be applied after the look (a late request), and the next try's 412 must know it.
        write_id = _new_write_id()
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                return self._write_once(current, new, lines, consume, write_id)
            except _NotApplied as unapplied:
                if attempt == WRITE_ATTEMPTS:
                    raise unapplied.error from None
                log.info("order %s: a write with no answer was not applied (the row is unchanged): sent again (%s)",
                         new.order_id, type(unapplied.error).__name__)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _write_once(
        self, current: OrderState, new: OrderState, lines: Sequence[LineRecord], consume: str | None, write_id: str
    ) -> tuple[OrderState, str]:
        """One try of :meth:`write` under ``write_id`` (the same for every try of one write;
        returned with the state); raises :class:`_NotApplied` when it got no answer (or a
        5xx) and the row shows it was not applied."""
        before, after = state_to_entity(current), state_to_entity(new)
        changes = {key: value for key, value in after.items() if before.get(key) != value}
        changes.update(PartitionKey=new.order_id, RowKey=STATE_ROW, **{WRITE_ID: write_id})
        guard = {"etag": current.etag, "match_condition": MatchConditions.IfNotModified}
        try:
            if not lines and consume is None:
                self._op("update")
                metadata = self.table.update_entity(changes, mode=UpdateMode.MERGE, **guard)
            else:
                self._op("transaction")
                operations = [("update", changes, {"mode": UpdateMode.MERGE, **guard})]
                operations += [("upsert", line_to_entity(line), {"mode": UpdateMode.REPLACE}) for line in lines]
                if consume is not None:  # If-Match *: a 404 when it is gone fails the whole transaction
                    operations.append(
                        ("delete", {"PartitionKey": new.order_id, "RowKey": consume},
                         {"match_condition": MatchConditions.Unconditionally})
                    )
                metadata = self.table.submit_transaction(operations)[0]
        except (ServiceResponseError, HttpResponseError) as error:
            status = getattr(error, "status_code", None)
            if isinstance(error, ResourceNotFoundError) or status == 404:
                if consume is not None:
                    # The row to consume is gone (written over since: the seal goes with the first
                    # write), or the state row is: this write was not applied, decide again on a read.
                    raise ConcurrencyConflict(f"order {new.order_id!r}: no row {consume!r} to consume") from error
                raise OrderNotFound(f"no order {new.order_id!r}") from error
            moved = isinstance(error, ResourceModifiedError) or status == 412 or "UpdateConditionNotSatisfied" in str(error)
            # A 412 is someone else's write, or ours: applied, reported failed (a 500
            # OperationTimedOut), then retried by the SDK. A dropped connection (the SDK does
            # not retry a PATCH or a POST) or a 5xx left after its retries: applied or not.
            if moved or _ambiguous(error):
                etag, holder = self._row_version(new.order_id)
                if holder == write_id:
                    self._recognised("write", new.order_id, type(error).__name__)
                    return new.model_copy(update={"etag": etag}), write_id
                # Not ours: if the row moved on, this If-Match write can never apply.
                moved = moved or (etag is not None and etag != current.etag)
                if not moved and etag is not None:
                    # The row is as it was read and holds no write of ours: this one was not
                    # applied, and sending it again (If-Match still guards it) is safe.
                    raise _NotApplied(error) from error
            if moved:
                raise ConcurrencyConflict(f"order {new.order_id!r} changed since it was read") from error
            raise
        return new.model_copy(update={"etag": metadata["etag"]}), write_id

    def _row_version(self, order_id: str) -> tuple[str | None, str | None]:
        """The state row's ETag and :data:`WRITE_ID` (which write last wrote it); Nones if it is gone."""
        self._op("read")
        try:
            entity = self.table.get_entity(order_id, STATE_ROW)
        except ResourceNotFoundError:
            return None, None
        return entity.metadata["etag"], entity.get(WRITE_ID)

    def _recognised(self, what: str, order_id: str, answer: str) -> None:
        self.recognised[what] += 1
        log.info("order %s: the %s answered %s had been applied: recognised by its write id", order_id, what, answer)

    def transition(
        self, current: OrderState, new: OrderState | None, lines: Sequence[LineRecord] = ()
    ) -> OrderState | None:
        """Write a lifecycle decision taken on a state row read alone (the supervisor's sweep);
        None when there is nothing to write or the row moved. The partition is read first (one
        query): the state row does not tell whether the order's first-claim seal is still
        there, and a write over the order must delete it (:meth:`write_over`)."""
        if new is None:
            return None
        record = self.read(current.order_id)
        if record.state.etag != current.etag:
            return None  # moved since ``current`` was read: the decision was taken on another row
        try:
            return self.write_over(record, new, lines).state
        except ConcurrencyConflict:
            return None

    # -- the active index -------------------------------------------------------------

    def index_partition(self, order_id: str) -> str:
        """The index partition an order's row is written to under the current shard count."""
        return names.active_partition(names.active_shard(order_id, self.shards))

    def _index(self, order_id: str, now: datetime) -> str | None:
        """Write the order's index row; its ETag."""
        self._op("index_upsert")
        written = self.table.upsert_entity(
            {"PartitionKey": self.index_partition(order_id), "RowKey": order_id, "IndexedAt": now},
            mode=UpdateMode.REPLACE,
        )
        return (written or {}).get("etag")

    def index_etag(self, order_id: str) -> str | None:
        """The ETag of the order's row in its index shard; None when it has none. One point read."""
        self._op("read")
        try:
            row = self.table.get_entity(self.index_partition(order_id), order_id, select=["RowKey"])
        except ResourceNotFoundError:
            return None
        return row.metadata.get("etag")

    def reindex(self, order_id: str, now: datetime) -> None:
        """Put an order back in the active index (before it leaves a terminal state)."""
        self._index(order_id, now)

    def unindex(self, order_id: str, etag: str | None = None, *, partition: str | None = None) -> None:
        """Drop an order from the active index (from its shard, or from ``partition``);
        succeeds when it is already gone."""
        self._op("index_delete")
        partition = partition or self.index_partition(order_id)
        try:
            if etag:
                self.table.delete_entity(partition, order_id, etag=etag, match_condition=MatchConditions.IfNotModified)
            else:
                self.table.delete_entity(partition, order_id)
        except ResourceModifiedError:
            pass  # re-indexed since we looked: it is in flight again, keep it
        except ResourceNotFoundError:
            pass

    def _index_queries(self) -> list[tuple[str, dict[str, Any]]]:
        """Queries that together read every index row: one per shard of the current count,
        one for the partitions past it (shards of a larger count before), one for the
        partition of before the sharding. The last two cost one empty reply each when
        nothing is left there."""
        return [
            *(("PartitionKey eq @pk", {"pk": names.active_partition(i)}) for i in range(self.shards)),
            (
                "PartitionKey ge @lo and PartitionKey lt @hi",
                {"lo": names.active_partition(self.shards), "hi": f"{names.ACTIVE_PREFIX}-{_AFTER_PREFIX}"},
            ),
            ("PartitionKey eq @pk", {"pk": UNSHARDED_ACTIVE_PARTITION}),
        ]

    def _index_rows(
        self, *, indexed_before: datetime | None = None, id_prefix: str | None = None, after: str | None = None,
        page: int | None = None,
    ) -> list[Iterator[IndexRow]]:
        """One lazy iterator of index rows per index query (see :meth:`_index_queries`),
        each in (partition, order id) order; ``page``: rows per reply."""
        extra, extra_parameters = "", {}
        if indexed_before is not None:
            extra, extra_parameters = " and IndexedAt lt @before", {"before": indexed_before}
        if id_prefix:
            extra += " and RowKey ge @idlo and RowKey lt @idhi"
            extra_parameters.update(idlo=id_prefix, idhi=id_prefix + _AFTER_PREFIX)
        if after:
            extra += " and RowKey gt @after"
            extra_parameters["after"] = after

        def rows(query: str, parameters: dict[str, Any]) -> Iterator[IndexRow]:
            # A generator: the query is sent by whichever thread first asks for a row.
            self._op("index_query")
            found = self.table.query_entities(
                query + extra, parameters={**parameters, **extra_parameters}, results_per_page=page or 1000
            )
            for r in found:
                yield IndexRow(r["RowKey"], r["IndexedAt"], r.metadata["etag"], r["PartitionKey"])

        return [rows(query, parameters) for query, parameters in self._index_queries()]

    def _all_index_rows(self, **filters) -> list[IndexRow]:
        """Every index row (filtered as :meth:`_index_rows`), the partitions read
        concurrently, by order id."""
        iterators = self._index_rows(**filters)
        found = [row for rows in _concurrently(list, iterators) for row in rows]
        return sorted(found, key=lambda row: row.order_id)

    def active_ids(
        self, *, indexed_before: datetime | None = None, id_prefix: str | None = None
    ) -> list[tuple[str, datetime, str]]:
        """(order id, indexed at, index ETag) of the in-flight orders, by order id: one query
        per index partition (read concurrently), optionally of the ids that start with
        ``id_prefix``."""
        rows = self._all_index_rows(indexed_before=indexed_before, id_prefix=id_prefix)
        return [(row.order_id, row.indexed_at, row.etag) for row in rows]

    def _rehome(self, row: IndexRow) -> IndexRow:
        """Move an index row written under another shard count to its shard under this one:
        write it there (same IndexedAt), then delete it where it was (If-Match, so a row
        written there again since is kept)."""
        home = self.index_partition(row.order_id)
        if row.partition == home:
            return row
        self._op("index_upsert")
        metadata = self.table.upsert_entity(
            {"PartitionKey": home, "RowKey": row.order_id, "IndexedAt": row.indexed_at}, mode=UpdateMode.REPLACE
        )
        self.unindex(row.order_id, row.etag, partition=row.partition)
        return IndexRow(row.order_id, row.indexed_at, metadata["etag"], home)

    def publish_breaker(self, service: str, instance: str, state: str, at: datetime) -> None:
        """Record a breaker's new state (one upsert, on a state change only)."""
        self._op("upsert")
        self.table.upsert_entity(
            {
                "PartitionKey": BREAKERS_PARTITION, "RowKey": _safe_key(f"{service}~{instance}"),
                "Service": service, "Instance": instance, "State": state, "ChangedAt": at,
            },
            mode=UpdateMode.REPLACE,
        )

    def breakers(self) -> list[BreakerRow]:
        """Every published breaker, by service then instance (one partition query)."""
        self._op("query")
        rows = self.table.query_entities("PartitionKey eq @pk", parameters={"pk": BREAKERS_PARTITION})
        return sorted(
            (BreakerRow(row["Service"], row["Instance"], row["State"], row["ChangedAt"]) for row in rows),
            key=lambda b: (b.service, b.instance),
        )

    def list_states(self, *, id_prefix: str | None = None) -> list[OrderState]:
        """Every order's state, or those whose id starts with ``id_prefix``: a scan of the
        table (or of a key range), for tools and operators, never for the functions."""
        self._op("query")
        query, parameters = "RowKey eq @rk", {"rk": STATE_ROW}
        if id_prefix:
            query = "PartitionKey ge @lo and PartitionKey lt @hi and RowKey eq @rk"
            parameters = {**parameters, "lo": id_prefix, "hi": id_prefix + _AFTER_PREFIX}
        return [state_from_entity(row) for row in self.table.query_entities(query, parameters=parameters)]

    def states_updated_since(
        self, since: datetime, *, limit: int
    ) -> tuple[list[tuple[str, ProcessState, datetime]], bool]:
        """(order id, state, updated at) of the orders whose state row was last written at or
        after ``since``, at most ``limit`` of them, and whether there were more: for the
        operator page's counts over time. One query of the state rows, three properties
        each (a scan in Azure, as for ``list_states``: for operators, never the functions)."""
        self._op("query")
        rows = self.table.query_entities(
            "RowKey eq @rk and UpdatedAt ge @since", parameters={"rk": STATE_ROW, "since": since},
            select=["PartitionKey", "ProcessState", "UpdatedAt"], results_per_page=1000,
        )
        found = []
        for row in rows:
            if len(found) == limit:
                return found, True
            found.append((row["PartitionKey"], ProcessState(row["ProcessState"]), row["UpdatedAt"]))
        return found, False

    def in_flight(self, *, limit: int) -> tuple[list[OrderState], bool]:
        """The states of the in-flight orders (the active index), at most ``limit`` of them,
        and whether there were more: one query per index partition and a point read per order."""
        indexed = self._all_index_rows()
        states = [s for _, s in self._states(indexed[:limit]) if s is not None and not s.process_state.terminal]
        return states, len(indexed) > limit

    def import_order(self, order: OrderRequest, state: OrderState, lines: Sequence[LineRecord] = ()) -> None:
        """Write an order with a state of its own choosing and the rows of the lines it has
        ended (one transaction; indexed only when in flight): for migrations, and for
        seeding a benchmark's history with orders as the app leaves them (a finished order:
        its order, state and step rows). The lines are written under ``order``'s id."""
        if not state.process_state.terminal:
            self._index(order.order_id, state.updated_at)
        self._op("transaction")
        self.table.submit_transaction(
            [
                ("create", {"PartitionKey": order.order_id, "RowKey": ORDER_ROW, "Document": order.document()}),
                ("create", state_to_entity(state.model_copy(update={"order_id": order.order_id}))),
                *(("create", line_to_entity(line.model_copy(update={"order_id": order.order_id}))) for line in lines),
            ]
        )

    def sweep(self, now: datetime, *, younger_than_cannot_expire: timedelta) -> Iterator[OrderState]:
        """The indexed orders that need the supervisor: those whose deadline has passed,
        and terminal ones still indexed (their finishing step died half-way).

        Costs one query per index partition (read concurrently) plus one point read per
        in-flight order that is old enough to have expired; finished orders are never read
        (they are not in the index). Index rows whose order was never written are dropped
        here, and a row found outside its shard (written under another shard count) is
        moved to its shard first.
        """
        candidates = self._all_index_rows(indexed_before=now - younger_than_cannot_expire)
        misplaced = [row for row in candidates if row.partition != self.index_partition(row.order_id)]
        if misplaced:
            moved = {row.order_id: row for row in _concurrently(self._rehome, misplaced)}
            # One row per order (an order may have had a row on each side of the change).
            candidates = list({row.order_id: moved.get(row.order_id, row) for row in candidates}.values())
        for row, state in self._states(candidates):
            if state is None:
                if now - row.indexed_at > ORPHAN_GRACE:
                    self.unindex(row.order_id, row.etag, partition=row.partition)
                    self._reindex_if_written(row.order_id, now)
                continue
            if state.process_state.terminal or state.complete_by <= now:
                yield state

    def _states(self, candidates: Iterable[IndexRow]) -> Iterator[tuple[IndexRow, OrderState | None]]:
        """Each index row with its order's state (None when the order is not written), read concurrently."""

        def load(row: IndexRow) -> tuple[IndexRow, OrderState | None]:
            try:
                return row, self.get(row.order_id)
            except OrderNotFound:
                return row, None

        yield from _concurrently(load, list(candidates))

    def _reindex_if_written(self, order_id: str, now: datetime) -> None:
        # Closes the race with a submission that committed its rows after we looked.
        try:
            state = self.get(order_id)
        except OrderNotFound:
            return
        if not state.process_state.terminal:
            self._index(order_id, now)

    def list_expired(self, now: datetime, *, younger_than_cannot_expire: timedelta = timedelta(0)) -> list[OrderState]:
        """In-flight orders whose complete-by time has passed."""
        return [
            state
            for state in self.sweep(now, younger_than_cannot_expire=younger_than_cannot_expire)
            if not state.process_state.terminal
        ]

    def list_by_state(self, state: ProcessState, *, limit: int = 50) -> list[OrderState]:
        """Operator view: rows in a given state, newest first. In-flight states are read
        through the active index; terminal states need a table scan (operator use only)."""
        if state.terminal:
            self._op("query")
            rows = self.table.query_entities(
                "RowKey eq @rk and ProcessState eq @state", parameters={"rk": STATE_ROW, "state": state.value}
            )
            states = [state_from_entity(row) for row in rows]
        else:
            states = [
                s for _, s in self._states(self._all_index_rows()) if s is not None and s.process_state is state
            ]
        states.sort(key=lambda s: s.updated_at, reverse=True)
        return states[:limit]

    def page_by_state(
        self, state: ProcessState, *, limit: int, after: str | None = None
    ) -> tuple[list[OrderState], str | None]:
        """One page of the orders in a state, in order-id order, from the first id after
        ``after``; and the id the next page starts after (None on the last page).

        The cursor is a key, not a position, so orders written between two pages neither
        repeat nor shift a page, and a page survives a change of the shard count. Terminal
        states: one query of the state rows (a scan in Azure, for operators); in-flight
        states: the active index, every partition read in pages of ``limit + 1`` ids after
        the cursor and merged by order id, taken in batches of ``limit + 1`` with a point
        read per index row, until ``limit + 1`` orders are in the state (or the index ends):
        about ``limit + 1`` rows and reads when most in-flight orders are in that state, more
        when few are; never the table."""
        found: list[OrderState] = []
        if state.terminal:
            self._op("query")
            query, parameters = "RowKey eq @rk and ProcessState eq @state", {"rk": STATE_ROW, "state": state.value}
            if after:
                query, parameters = f"{query} and PartitionKey gt @after", {**parameters, "after": after}
            # The SDK follows the service's continuation tokens; stop one past the page.
            for row in self.table.query_entities(query, parameters=parameters, results_per_page=min(limit + 1, 1000)):
                found.append(state_from_entity(row))
                if len(found) > limit:
                    break
        else:
            ids = self._merged_index(after=after, page=min(limit + 1, 1000))
            while len(found) <= limit:
                batch = list(itertools.islice(ids, limit + 1))
                found += [s for _, s in self._states(batch) if s is not None and s.process_state is state]
                if len(batch) <= limit:
                    break
        page = found[:limit]
        return page, (page[-1].order_id if len(found) > limit else None)


    def _merged_index(self, *, after: str | None, page: int) -> Iterator[IndexRow]:
        """Every index row after ``after`` in order-id order across the partitions (each
        partition's query pages lazily; the range past the shards, which may span several
        partitions, is read whole and sorted), each order once even while the sweep moves
        its row between partitions."""
        *shards, beyond, unsharded = self._index_rows(after=after, page=page)

        def first_page_read(rows: Iterator[IndexRow]) -> Iterator[IndexRow]:
            first = next(rows, None)
            return iter(()) if first is None else itertools.chain([first], rows)

        # Each partition's first page read at once (a page needs the head of every one).
        heads = list(_concurrently(first_page_read, [*shards, unsharded]))
        merged = heapq.merge(*heads, iter(sorted(beyond, key=lambda r: r.order_id)), key=lambda row: row.order_id)
        last = None
        for row in merged:
            if row.order_id != last:
                yield row
            last = row.order_id


def _new_write_id() -> str:
    return random_uuid().hex


def _ambiguous(error: Exception) -> bool:
    """A write that may or may not have been applied: sent with no answer back, or one cut
    short (azure-core's IncompleteReadError: whatever its status, the body did not arrive),
    or a 5xx."""
    if isinstance(error, (ServiceResponseError, IncompleteReadError)):
        return True
    return (getattr(error, "status_code", None) or 0) >= 500


def _is_conflict(error: Exception) -> bool:
    status = getattr(error, "status_code", None)
    code = str(getattr(error, "error_code", "") or "")
    return status == 409 or "EntityAlreadyExists" in code or "AlreadyExists" in str(error)


# --- rejected messages ---------------------------------------------------------------

#: Binary properties hold at most 64 KiB; bodies are kept in chunks of this size.
_CHUNK = 60 * 1024
#: Chunks per row: 720 KiB of body, under the 1 MiB entity limit with room for the other
#: properties (and under what Azurite accepts). A larger body (a Premium namespace takes
#: messages of up to 100 MB) continues in part rows beside the rejection's own row, so
#: every body is kept whole.
_MAX_CHUNKS = 12
#: Message id and content type come from any client and may be long: a Table string
#: property holds 32K characters; keep these far below it.
_MAX_HEADER_CHARS = 1_024


def _with_chunks(entity: dict[str, Any], chunks: list[bytes]) -> dict[str, Any]:
    entity["BodyChunks"] = len(chunks)
    for i, chunk in enumerate(chunks):
        entity[f"Body{i}"] = chunk
    return entity


def _chunks(row: dict[str, Any]) -> bytes:
    return b"".join(row.get(f"Body{i}", b"") for i in range(row.get("BodyChunks", 0)))


class RejectionStore:
    """Messages the app refused (invalid, malformed, conflicting), kept whole with the reason.

    PartitionKey is the UTC day (``YYYY-MM-DD``); RowKey sorts newest first. A body too
    large for one row continues in part rows (``<RowKey>~0001``...), written before the
    rejection's row, so a rejection row is only ever seen with its whole body.
    """

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def add(
        self,
        *,
        body: bytes,
        reason: str,
        now: datetime,
        message_id: str | None,
        content_type: str | None = None,
        order_id: str | None = None,
        source: str = "orders",
    ) -> str:
        inverted = 10**13 - int(now.timestamp() * 1000)
        row_key = _safe_key(f"{inverted:013d}-{(message_id or 'no-id')[:100]}")
        day = now.strftime("%Y-%m-%d")
        chunks = [body[i : i + _CHUNK] for i in range(0, len(body), _CHUNK)] or [b""]
        parts = [chunks[i : i + _MAX_CHUNKS] for i in range(0, len(chunks), _MAX_CHUNKS)]
        for n, part in enumerate(parts[1:], start=1):
            part_row = {"PartitionKey": day, "RowKey": _part_key(row_key, n), "PartOf": row_key}
            self.table.upsert_entity(_with_chunks(part_row, part), mode=UpdateMode.REPLACE)
        entity: dict[str, Any] = {
            "PartitionKey": day,
            "RowKey": row_key,
            "Reason": clip_utf16(reason, MAX_REASON_UNITS),
            "MessageId": _clip(message_id or ""),
            "ContentType": _clip(content_type or ""),
            "OrderId": order_id or "",
            "Source": source,
            "RejectedAt": now,
            "BodyBytes": len(body),
            "BodyParts": len(parts),
        }
        self.table.upsert_entity(_with_chunks(entity, parts[0]), mode=UpdateMode.REPLACE)
        return row_key

    def list(self, *, day: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if day:
            rows = self.table.query_entities("PartitionKey eq @day", parameters={"day": day})
        else:
            rows = self.table.list_entities()
        out = []
        for row in rows:
            if row.get("PartOf"):
                continue  # read with its rejection
            body = _chunks(row) + b"".join(
                _chunks(self.table.get_entity(row["PartitionKey"], _part_key(row["RowKey"], n)))
                for n in range(1, row.get("BodyParts", 1))
            )
            out.append({**{k: v for k, v in row.items() if not _BODY_PROPERTY.match(k)}, "Body": body})
        out.sort(key=lambda r: r["RejectedAt"], reverse=True)
        return out[:limit]


#: The properties that hold a body in chunks (read back as one ``Body``).
_BODY_PROPERTY = re.compile(r"^Body(\d+|Chunks|Parts)$")


def _part_key(row_key: str, n: int) -> str:
    return f"{row_key}~{n:04d}"


#: A rejection's reason is kept to this many UTF-16 code units: a Table string property holds
#: 64 KiB of UTF-16, 32,768 units (a character past U+FFFF takes two).
MAX_REASON_UNITS = 30_000


def clip_utf16(text: str, units: int) -> str:
    """``text`` cut to at most ``units`` UTF-16 code units (as Table storage counts a string),
    never between the two halves of a character."""
    if len(text) * 2 <= units:  # the common case: even all astral, it fits
        return text
    encoded = text.encode("utf-16-le", errors="surrogatepass")
    if len(encoded) <= 2 * units:
        return text
    return encoded[: 2 * units].decode("utf-16-le", errors="ignore")


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_HEADER_CHARS else f"{text[:_MAX_HEADER_CHARS]}… ({len(text)} characters)"


def _safe_key(key: str) -> str:
    # Table keys may not hold / \ # ? or control characters; a rejected message's id may.
    return "".join("_" if ch in "/\\#?" or ord(ch) < 32 or 127 <= ord(ch) < 160 else ch for ch in key)
