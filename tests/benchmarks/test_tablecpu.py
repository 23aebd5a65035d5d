"""``python -m benchmarks.tablecpu``'s measure: both clients run every shape, in rounds, on Azurite."""

from __future__ import annotations

from azure.data.tables import TableServiceClient

from adapters.clients import transport
from benchmarks.tablecpu import SHAPES, measure


def test_each_client_runs_each_shape_and_gets_a_cpu_figure(storage_connection_string, table_service, unique_name):
    sdk = TableServiceClient.from_connection_string(storage_connection_string, transport=transport())
    tables = {"SDK": sdk.create_table(unique_name("sdk")), "lean": table_service.create_table(unique_name("lean"))}
    try:
        for shape in SHAPES.values():
            ms = measure(tables, shape, transactions=4, rounds=2)
            assert set(ms) == {"SDK", "lean"} and all(value > 0 for value in ms.values())
        for table in tables.values():  # 2 rows per 2-entity transaction, state and line per step
            assert len(list(table.list_entities())) == 4 * 2 + 4 * 2
    finally:
        for table in tables.values():
            table.delete_table()
