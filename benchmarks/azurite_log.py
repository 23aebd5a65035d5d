"""Counting storage operations at the server, from Azurite's debug log.

Azurite (started with ``--debug <file>``) logs every request with its id: one
``DispatchMiddleware: Operation=<name>`` line and one ``EndMiddleware: End response.
... StatusCode=<n>`` line. An entity-group transaction is one request
(``Table_Batch``), as it is one billed transaction in Azure.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

_OPERATION = re.compile(r"^\S+ (\S+) info: DispatchMiddleware: Operation=(\w+)")
_END = re.compile(r"^\S+ (\S+) info: EndMiddleware: End response\. TotalTimeInMS=(\d+) StatusCode=(\d+)")

#: Azurite's operation names, in the app's words.
FRIENDLY = {
    "Table_Batch": "table transaction",
    "Table_MergeEntity": "table If-Match MERGE",
    "Table_UpdateEntity": "table upsert/replace (PUT)",
    "Table_InsertEntity": "table insert",
    "Table_DeleteEntity": "table delete",
    "Table_QueryEntitiesWithPartitionAndRowKey": "table point read",
    "Table_QueryEntities": "table query",
    "Table_Create": "table create",
    "Table_Query": "table list",
    "Messages_Enqueue": "queue send",
    "Messages_Dequeue": "queue receive",
    "MessageId_Delete": "queue delete",
    "MessageId_Update": "queue update (visibility)",
    "Queue_Create": "queue create",
    "Queue_GetProperties": "queue properties",
}


def service_of(operation: str) -> str:
    if operation.startswith("Table_"):
        return "table"
    if operation.startswith(("Messages_", "MessageId_", "Queue_", "Service_")):
        return "queue"
    return "blob"


class AzuriteLog:
    """Reads the debug log incrementally: :meth:`mark` notes a position, :meth:`since`
    counts the operations logged after it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self, settle: float = 0.5) -> int:
        """The end of the log once Azurite has written what it was writing (it logs asynchronously)."""
        size = -1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(settle)
            now = self.path.stat().st_size if self.path.exists() else 0
            if now == size:
                break
            size = now
        return max(size, 0)

    def since(self, start: int, end: int | None = None) -> Operations:
        operations: dict[str, str] = {}
        statuses: dict[str, int] = {}
        with open(self.path, "rb") as handle:
            handle.seek(start)
            data = handle.read(None if end is None else end - start)
        for raw in data.split(b"\n"):
            if b"DispatchMiddleware: Operation=" in raw:
                match = _OPERATION.match(raw.decode("utf-8", "replace"))
                if match:
                    operations[match[1]] = match[2]
            elif b"EndMiddleware: End response" in raw:
                match = _END.match(raw.decode("utf-8", "replace"))
                if match:
                    statuses[match[1]] = int(match[3])
        return Operations(
            Counter(operations.values()),
            Counter(f"{op} {statuses.get(rid, '?')}" for rid, op in operations.items()),
        )


class Operations:
    def __init__(self, by_operation: Counter[str], by_status: Counter[str]) -> None:
        self.by_operation = by_operation
        #: ``"<operation> <status>"`` -> count (a 412 or 404 is an operation that did nothing).
        self.by_status = by_status

    def service_total(self, service: str) -> int:
        return sum(n for op, n in self.by_operation.items() if service_of(op) == service)

    def failed(self) -> Counter[str]:
        """Operations answered 4xx/5xx, by ``"<operation> <status>"``."""
        return Counter({k: n for k, n in self.by_status.items() if not k.endswith("?") and int(k.rsplit(" ", 1)[1]) >= 400})
