"""An in-memory table that behaves like Azure Table Storage where the store relies on it:
ETags change on every write (unique, in Table Storage's own form, so the app's checks
of an ETag's form accept them), If-Match fails with 412 (``ResourceModifiedError``), a
missing entity is a 404, ``create`` of an existing one a 409, and an entity-group
transaction is all or nothing (``TableTransactionError``, nothing applied).

It lets the workflow's decisions, dispatch and supervision run through the real
``StateStore`` without Azurite. Filters: the ``Prop op @param`` clauses joined by
``and`` that the store writes (eq, ne, lt, le, gt, ge); anything else raises.
"""

from __future__ import annotations

import copy
import itertools
import re
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceResponseError,
)
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

_CLAUSE = re.compile(r"^\s*(\w+)\s+(eq|ne|lt|le|gt|ge)\s+@(\w+)\s*$")
_OPS = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Status(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status


class MemoryTable:
    """The subset of ``azure.data.tables.TableClient`` the app's store uses. Thread-safe."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}
        self._etags = itertools.count(1)
        self._base_ticks = int((datetime.now(UTC) - _EPOCH).total_seconds()) * 10_000_000
        self._lock = threading.RLock()
        #: Operations by kind, as Table Storage would bill them.
        self.ops: Counter[str] = Counter()

    # -- helpers --------------------------------------------------------------------

    def _etag(self) -> str:
        """Table Storage's form, ``W/"datetime'<Timestamp, URL-encoded>'"``: a Timestamp
        100 ns after the previous one (called under the lock, so unique and increasing)."""
        ticks = self._base_ticks + next(self._etags)
        seconds, fraction = divmod(ticks, 10_000_000)
        stamp = _EPOCH + timedelta(seconds=seconds)
        return f'W/"datetime\'{stamp:%Y-%m-%dT%H}%3A{stamp:%M}%3A{stamp:%S}.{fraction:07d}Z\'"'

    def _entity(self, key: tuple[str, str]) -> TableEntity:
        properties, etag = self._rows[key]
        entity = TableEntity(copy.deepcopy(properties))
        entity._metadata = {"etag": etag}  # noqa: SLF001 - the SDK's own field for it
        return entity

    @staticmethod
    def _key(entity: dict[str, Any]) -> tuple[str, str]:
        return entity["PartitionKey"], entity["RowKey"]

    def _check(self, key, etag: str | None, match_condition) -> None:
        if key not in self._rows:
            raise _Status(404, f"entity {key} not found")
        if match_condition is MatchConditions.IfNotModified and etag != self._rows[key][1]:
            raise _Status(412, f"entity {key} was modified (If-Match failed)")

    def _put(self, key, properties: dict[str, Any], mode) -> str:
        if mode == UpdateMode.MERGE and key in self._rows:
            properties = {**self._rows[key][0], **properties}
        etag = self._etag()
        self._rows[key] = (copy.deepcopy(dict(properties)), etag)
        return etag

    def _apply(self, kind: str, entity: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
        key = self._key(entity)
        if kind == "create":
            if key in self._rows:
                raise _Status(409, f"entity {key} already exists")
            return {"etag": self._put(key, entity, UpdateMode.REPLACE)}
        if kind == "update":
            self._check(key, options.get("etag"), options.get("match_condition"))
            return {"etag": self._put(key, entity, options.get("mode", UpdateMode.MERGE))}
        if kind == "upsert":
            return {"etag": self._put(key, entity, options.get("mode", UpdateMode.MERGE))}
        if kind == "delete":
            self._check(key, options.get("etag"), options.get("match_condition"))
            del self._rows[key]
            return {}
        raise ValueError(f"unsupported operation {kind!r}")

    @staticmethod
    def _raise(error: _Status):
        if error.status_code == 404:
            raise ResourceNotFoundError(str(error)) from None
        if error.status_code == 412:
            raise ResourceModifiedError(str(error)) from None
        raise ResourceExistsError(str(error)) from None

    # -- the TableClient API ------------------------------------------------------------

    def get_entity(self, partition_key: str, row_key: str, **_) -> TableEntity:
        with self._lock:
            self.ops["read"] += 1
            if (partition_key, row_key) not in self._rows:
                raise ResourceNotFoundError(f"entity {(partition_key, row_key)} not found")
            return self._entity((partition_key, row_key))

    def query_entities(self, query_filter: str, *, parameters: dict[str, Any] | None = None, select=None, **_):
        clauses = []
        for text in re.split(r"\s+and\s+", query_filter):
            match = _CLAUSE.match(text)
            if not match:
                raise ValueError(f"filter clause not supported by the in-memory table: {text!r}")
            prop, op, name = match.groups()
            clauses.append((prop, _OPS[op], (parameters or {})[name]))
        with self._lock:
            self.ops["query"] += 1
            found = []
            for key in sorted(self._rows):
                properties = self._rows[key][0]
                if all(prop in properties and test(properties[prop], value) for prop, test, value in clauses):
                    found.append(self._entity(key))
        return iter(found)

    def list_entities(self, **_):
        with self._lock:
            self.ops["query"] += 1
            return iter([self._entity(key) for key in sorted(self._rows)])

    def create_entity(self, entity: dict[str, Any], **_) -> dict[str, Any]:
        return self._single("create", entity, {})

    def update_entity(self, entity, mode=UpdateMode.MERGE, *, etag=None, match_condition=None, **_):
        return self._single("update", entity, {"mode": mode, "etag": etag, "match_condition": match_condition})

    def upsert_entity(self, entity, mode=UpdateMode.MERGE, **_):
        return self._single("upsert", entity, {"mode": mode})

    def delete_entity(self, partition_key: str, row_key: str, *, etag=None, match_condition=None, **_) -> None:
        entity = {"PartitionKey": partition_key, "RowKey": row_key}
        try:
            self._single("delete", entity, {"etag": etag, "match_condition": match_condition})
        except ResourceNotFoundError:
            pass  # Table Storage's client: deleting what is gone succeeds

    def _single(self, kind: str, entity, options) -> dict[str, Any]:
        with self._lock:
            self.ops[kind] += 1
            try:
                result = self._apply(kind, entity, options)
                return self._answer_lost(kind, lambda: self._apply(kind, entity, options), result)
            except _Status as error:
                self._raise(error)

    def submit_transaction(self, operations) -> list[dict[str, Any]]:
        operations = [(op[0], op[1], op[2] if len(op) > 2 else {}) for op in operations]
        partitions = {entity["PartitionKey"] for _, entity, _ in operations}
        if len(partitions) != 1 or len(operations) > 100:
            raise ValueError("a transaction holds 1-100 operations on one partition")
        with self._lock:
            self.ops["transaction"] += 1
            saved = dict(self._rows)

            def apply_all() -> list[dict[str, Any]]:
                return [self._apply(kind, entity, options) for kind, entity, options in operations]

            try:
                result = apply_all()
                saved = dict(self._rows)  # applied: a retry that fails rolls back to here
                return self._answer_lost("transaction", apply_all, result)
            except _Status as error:
                self._rows = saved  # all or nothing
                failure = TableTransactionError(message=str(error))
                failure.status_code = error.status_code
                raise failure from None

    # -- Azure's ambiguous answers: applied, reported failed ----------------------------

    #: (operation kind, retried by the SDK) of the answers still to lose, in order.
    _lost_answers: list[tuple[str, bool]] = []

    def lose_answers(self, kind: str, *, times: int = 1, retried: bool = True, error: Exception | None = None) -> None:
        """The next ``times`` operations of ``kind`` (``create``, ``update``, ``upsert``,
        ``delete``, ``transaction``) are applied and their answer lost, as when Azure
        answers 500 OperationTimedOut, or drops the connection, after applying a write.

        ``retried``: the SDK sends the same request again (it does after a 500, and after
        a dropped GET, PUT or DELETE) and the caller gets the second answer: 412 for an
        If-Match write, 409 for a create, 404 for a delete, success for an upsert.
        Otherwise the caller gets the ``ServiceResponseError`` of a dropped connection,
        which the SDK does not retry for a POST (create, transaction) or a PATCH (merge), or
        ``error`` (e.g. the ``IncompleteReadError`` of an answer cut short).
        """
        self._lost_answers = [*self._lost_answers, *[(kind, retried, error)] * times]

    def _answer_lost(self, kind: str, again, result):
        for i, (lost_kind, retried, error) in enumerate(self._lost_answers):
            if lost_kind == kind:
                del self._lost_answers[i]
                self.ops[f"{kind} answer lost"] += 1
                if error is not None:
                    raise error
                if not retried:
                    raise ServiceResponseError("Connection aborted: the remote end closed the connection without a response")
                self.ops[kind] += 1
                return again()
        return result

    def rows(self, partition_key: str) -> dict[str, dict[str, Any]]:
        """Test helper: the partition's rows by RowKey."""
        with self._lock:
            return {rk: copy.deepcopy(props) for (pk, rk), (props, _) in self._rows.items() if pk == partition_key}
