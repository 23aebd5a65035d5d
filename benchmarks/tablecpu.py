"""Client CPU per table transaction: the SDK's own ``$batch`` encoding against adapters/batch.py.

``python -m benchmarks.tablecpu [--transactions 300] [--rounds 6]`` starts an Azurite of its
own and sends the app's two commonest transactions through both clients, in alternating
rounds (SDK, lean, SDK, lean, ...) so that the machine's load falls on both alike:

* the 2-entity transaction (two creates: the shape of a submission's order and state rows);
* a step's transaction (the state row's If-Match MERGE and the upsert of the step's row).

Each side's figure is the process's CPU time (all its threads: the SDK runs its per-part
policies on thread pools) per transaction, over the same storage transport the app uses
(adapters/transport.py). Azurite's own CPU is not counted.
"""

from __future__ import annotations

import argparse
import itertools
import time
import uuid

from azure.core import MatchConditions
from azure.data.tables import TableServiceClient, UpdateMode

from adapters.batch import LeanTableServiceClient
from adapters.clients import transport
from devtools import azurite


def two_creates(table, n: int) -> float:
    """One transaction of two creates; returns its process CPU seconds."""
    start = time.process_time()
    table.submit_transaction([
        ("create", {"PartitionKey": f"p{n}", "RowKey": "order", "Document": '{"orderId": "o", "items": [1, 2]}'}),
        ("create", {"PartitionKey": f"p{n}", "RowKey": "state", "ProcessState": "Pending", "Attempt": 0}),
    ])
    return time.process_time() - start


def step(table, n: int) -> float:
    """A state row written, then one step transaction over it; returns the transaction's process CPU seconds."""
    etag = table.upsert_entity({"PartitionKey": f"s{n}", "RowKey": "state", "ProcessState": "Pending"})["etag"]
    start = time.process_time()
    table.submit_transaction([
        ("update", {"PartitionKey": f"s{n}", "RowKey": "state", "ProcessState": "Processing", "Attempt": 1},
         {"mode": UpdateMode.MERGE, "etag": etag, "match_condition": MatchConditions.IfNotModified}),
        ("upsert", {"PartitionKey": f"s{n}", "RowKey": "line-01", "Step": "reserve", "Outcome": "applied"},
         {"mode": UpdateMode.REPLACE}),
    ])
    return time.process_time() - start  # the transaction alone, not the row's setup


#: Partition numbers, new for every transaction of the run.
_partitions = itertools.count()

SHAPES = {"2-entity transaction (2 creates)": two_creates, "step transaction (If-Match MERGE + upsert)": step}


def measure(tables: dict, shape, transactions: int, rounds: int) -> dict[str, float]:
    """CPU milliseconds per transaction of each client, over alternating rounds."""
    used = {name: 0.0 for name in tables}
    per_round = transactions // rounds
    for _ in range(rounds):
        for name, table in tables.items():
            for _ in range(per_round):
                used[name] += shape(table, next(_partitions))
    return {name: 1000 * seconds / (per_round * rounds) for name, seconds in used.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=300, help="transactions per client and shape")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds they are split into")
    args = parser.parse_args(argv)
    instance = azurite.start()
    try:
        tables = {}
        for name, kind in (("SDK", TableServiceClient), ("lean", LeanTableServiceClient)):
            service = kind.from_connection_string(instance.connection_string, transport=transport())
            tables[name] = service.create_table(f"cpu{uuid.uuid4().hex[:12]}")
        for shape in SHAPES.values():  # warm both: imports, connections, caches
            measure(tables, shape, 20, 1)
        print(f"client CPU per transaction (process CPU, {args.transactions} each, {args.rounds} alternating rounds)")
        for label, shape in SHAPES.items():
            ms = measure(tables, shape, args.transactions, args.rounds)
            print(f"  {label:<44} SDK {ms['SDK']:5.2f} ms   lean {ms['lean']:5.2f} ms   "
                  f"({100 * (1 - ms['lean'] / ms['SDK']):.0f}% less)")
    finally:
        instance.stop()


if __name__ == "__main__":
    main()
