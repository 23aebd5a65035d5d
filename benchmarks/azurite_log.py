"""Counting storage operations at the server, from Azurite's debug log.

Azurite (started with ``--debug <file>``) logs every request with its id: one
``DispatchMiddleware: Operation=<name>`` line and one ``EndMiddleware: End response.
... StatusCode=<n>`` line. An entity-group transaction is one request
(``Table_Batch``), as it is one billed transaction in Azure.

Table requests are also given a *role* in the app's layout (:func:`role_of`), from the
request URL Azurite logs and, for a transaction, the raw batch it logs (each
sub-request's method and RowKey): a transaction that writes a step's row is a step's;
one that inserts an ``order`` row is a submission; a MERGE of a ``state`` row outside a
transaction is a claim (or the supervisor's write); writes and deletes in the
``_active`` partition are the index. So a step's cost and an order's fixed cost are
counted apart, at the server.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableServiceClient

_OPERATION = re.compile(r"^\S+ (\S+) info: DispatchMiddleware: Operation=(\w+)")
_END = re.compile(r"^\S+ (\S+) info: EndMiddleware: End response\. TotalTimeInMS=(\d+) StatusCode=(\d+)")
_URL = re.compile(r"^\S+ (\S+) info: TableStorageContextMiddleware: RequestMethod=(\w+) RequestURL=(\S+)")
_BATCH = re.compile(r"^\S+ (\S+) debug: TableHandler:batch\(\) Raw request string is ")
#: One sub-request of a logged batch: its method, then its RowKey (in the URL, or in the body of an insert).
_SUB_METHOD = re.compile(r"(POST|PUT|PATCH|MERGE|DELETE) \S+ HTTP/1\.1")
_SUB_ROW = re.compile(r"RowKey='([^']*)'|RowKey\\?\": \\?\"([^\"\\]*)")
_KEYS = re.compile(r"\(PartitionKey='([^']*)',\s*RowKey='([^']*)'\)")
#: The active index's partitions (``_active-000`` … and the unsharded ``_active`` of before).
_INDEX_PARTITION = "_active"
_LINE_PREFIXES = ("step-", "undo-")

#: Roles of table requests in the app's layout (see :func:`role_of`), in report order.
STEP_TRANSACTION = "step transaction (state row If-Match + the step's row)"
SUBMISSION = "submission transaction (order + state rows)"
STATE_MERGE = "state row If-Match MERGE (a claim, or the supervisor)"
FIRST_CLAIM = "first claim transaction (state row If-Match + the first-claim seal's deletion)"
INDEX_UPSERT = "index upsert"
INDEX_DELETE = "index delete"
INDEX_QUERY = "index query (the supervisor's sweep)"
POINT_READ = "point read"
QUERY = "query (a partition or a scan)"
ROLES = (STEP_TRANSACTION, SUBMISSION, FIRST_CLAIM, STATE_MERGE, INDEX_UPSERT, INDEX_DELETE, INDEX_QUERY, POINT_READ, QUERY)
#: The roles that read.
READS = (INDEX_QUERY, POINT_READ, QUERY)

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


def role_of(operation: str, url: str, rows: list[tuple[str, str]]) -> str | None:
    """The role of one table request in the app's layout; None for a request that is not
    a table request. ``rows`` are a batch's sub-requests: (method, RowKey)."""
    if not operation.startswith("Table_"):
        return None
    path = unquote(url)
    keys = _KEYS.search(path)
    partition, row = (keys[1], keys[2]) if keys else (None, None)
    if operation == "Table_Batch":
        if any(key.startswith(_LINE_PREFIXES) for _, key in rows):
            return STEP_TRANSACTION
        if any(key == "order" for _, key in rows):
            return SUBMISSION
        if any(key.startswith("first-claim-") for _, key in rows):
            return FIRST_CLAIM
        return "other transaction"
    if operation == "Table_MergeEntity" and row == "state":
        return STATE_MERGE
    index = partition is not None and partition.startswith(_INDEX_PARTITION)
    if index and operation in ("Table_UpdateEntity", "Table_InsertEntity", "Table_InsertOrMergeEntity"):
        return INDEX_UPSERT
    if operation == "Table_DeleteEntity" and index:
        return INDEX_DELETE
    if operation == "Table_QueryEntitiesWithPartitionAndRowKey":
        return POINT_READ
    if operation == "Table_QueryEntities":
        return INDEX_QUERY if f"'{_INDEX_PARTITION}" in path else QUERY
    return FRIENDLY.get(operation, operation)


def batch_rows(raw: str) -> list[tuple[str, str]]:
    """The sub-requests of a logged batch body: (method, RowKey) each."""
    rows = []
    for part in raw.split("Content-ID: ")[1:]:
        method, row = _SUB_METHOD.search(part), _SUB_ROW.search(part)
        if method:
            rows.append((method[1], (row[1] or row[2]) if row else ""))
    return rows


#: The tables :meth:`AzuriteLog.mark` reads (they never exist): :func:`parse` counts no request to them.
MARKER = "azuritelogmark"


class AzuriteLog:
    """Reads the debug log incrementally: :meth:`mark` notes a position, :meth:`since`
    counts the operations logged after it. ``connection_string``: the Azurite whose log it is."""

    def __init__(self, path: Path, connection_string: str) -> None:
        self.path = path
        self._tables = TableServiceClient.from_connection_string(connection_string)
        #: Where the next mark is searched from (every mark lies past the one before).
        self._searched = 0

    def mark(self, timeout: float = 10.0) -> int:
        """The position in the log of a request made now: a point read of a table that does
        not exist (``MARKER`` + a random suffix, not counted by :func:`parse`). Azurite logs a
        request's lines as it handles it, so every request answered before this one lies
        before the position. (Waiting for the log to stop growing, as before, never ended
        while a host polled its queues: each mark waited out its 10 s.)"""
        name = f"{MARKER}{uuid.uuid4().hex[:16]}"
        try:
            self._tables.get_table_client(name).get_entity("mark", "mark")
        except ResourceNotFoundError:
            pass  # the table does not exist: the request was logged all the same
        needle = name.encode()
        deadline = time.monotonic() + timeout
        while True:
            with open(self.path, "rb") as handle:
                handle.seek(self._searched)
                data = handle.read()
            at = data.find(needle)
            if at >= 0:
                self._searched += data.rfind(b"\n", 0, at) + 1  # the start of the request's first line
                return self._searched
            if time.monotonic() > deadline:
                raise TimeoutError(f"Azurite did not log the request to {name} within {timeout:g} s ({self.path})")
            time.sleep(0.02)

    def since(self, start: int, end: int | None = None) -> Operations:
        with open(self.path, "rb") as handle:
            handle.seek(start)
            data = handle.read(None if end is None else end - start)
        return parse(data)


def parse(data: bytes) -> Operations:
    """Count the requests of a piece of Azurite's debug log."""
    operations: dict[str, str] = {}
    statuses: dict[str, int] = {}
    urls: dict[str, str] = {}
    batches: dict[str, list[tuple[str, str]]] = {}
    for raw in data.split(b"\n"):
        if b"DispatchMiddleware: Operation=" in raw:
            match = _OPERATION.match(raw.decode("utf-8", "replace"))
            if match:
                operations[match[1]] = match[2]
        elif b"EndMiddleware: End response" in raw:
            match = _END.match(raw.decode("utf-8", "replace"))
            if match:
                statuses[match[1]] = int(match[3])
        elif b"TableStorageContextMiddleware: RequestMethod=" in raw:
            match = _URL.match(raw.decode("utf-8", "replace"))
            if match:
                urls[match[1]] = match[3]
        elif b"TableHandler:batch() Raw request string" in raw:
            text = raw.decode("utf-8", "replace")
            match = _BATCH.match(text)
            if match:
                batches[match[1]] = batch_rows(text[match.end():])
    operations = {rid: op for rid, op in operations.items() if MARKER not in urls.get(rid, "")}  # AzuriteLog.mark's
    by_role: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    for rid, op in operations.items():
        role = role_of(op, urls.get(rid, ""), batches.get(rid, []))
        if role is None:
            continue
        by_role[role] += 1
        if op == "Table_Batch":
            writes[role] += len(batches.get(rid, [])) or 1
        elif role not in READS and op not in ("Table_Create", "Table_Query", "Table_Delete"):
            writes[role] += 1
    return Operations(
        Counter(operations.values()),
        Counter(f"{op} {statuses.get(rid, '?')}" for rid, op in operations.items()),
        by_role,
        writes,
    )


class Operations:
    def __init__(
        self, by_operation: Counter[str], by_status: Counter[str], by_role: Counter[str] | None = None,
        writes_by_role: Counter[str] | None = None,
    ) -> None:
        self.by_operation = by_operation
        #: ``"<operation> <status>"`` -> count (a 412 or 404 is an operation that did nothing).
        self.by_status = by_status
        #: Table requests by their role in the app's layout (:func:`role_of`).
        self.by_role = by_role or Counter()
        #: Entities written by the table requests of each role (a transaction writes several).
        self.writes_by_role = writes_by_role or Counter()

    def service_total(self, service: str) -> int:
        return sum(n for op, n in self.by_operation.items() if service_of(op) == service)

    def failed(self) -> Counter[str]:
        """Operations answered 4xx/5xx, by ``"<operation> <status>"``."""
        return Counter({k: n for k, n in self.by_status.items() if not k.endswith("?") and int(k.rsplit(" ", 1)[1]) >= 400})
