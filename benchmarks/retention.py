"""``python -m benchmarks.retention --finished 100000``: what a retention tick costs beside
many finished orders that are not due yet.

On a fresh Azurite: orders as the app leaves them when they end (order, state and step
rows, one transaction each, written by the app's store) with their finished-index rows,
ended *now* (not due with ``RETENTION_DAYS=1``); then, in each round, ``--due`` more that
ended three days ago (due). Retention ticks run (``RETENTION_MAX_ORDERS_PER_TICK`` =
``--max-orders``) until nothing is due, and every HTTP request the tick sends is counted
at the SDK's transport, by service and kind. Round 1 has ``--first`` finished orders not
due, round 2 ``--finished``: a tick that costs O(what it deletes) costs the same in both.
Not a timed test: the figures go to BENCHMARKS.md ("Retention tick vs history").
"""

from __future__ import annotations

import time
from importlib import metadata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing import get_context
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import typer
from azure.core.exceptions import ServiceResponseError
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableServiceClient, UpdateMode
from azure.storage.blob import ContainerClient

from adapters import clients, finished
from adapters.archive import Archive
from adapters.retention import RetentionPolicy, tick
from adapters.store import StateStore
from benchmarks.machine import describe
from benchmarks.report import write_retention_section
from benchmarks.sweep import CHUNK, _write_history, finished_order
from core.models import OrderRequest, utcnow
from devtools import azurite as azurite_launcher
from devtools.orders import order_body

TABLE = "benchretention"
CONTAINER = "archive"


class CountingTransport(RequestsTransport):
    """A transport like the storage clients' (adapters/clients.py), counting each request
    it sends as ``<service> <what>``: ``table query``, ``table transaction``, ``blob put block``..."""

    def __init__(self, counts: Counter, service: str) -> None:
        super().__init__(session=clients.transport().session, session_owner=True, use_env_settings=False)
        self.counts, self.service = counts, service

    def send(self, request, **kwargs):
        self.counts[kind_of(self.service, request.method, request.url)] += 1
        return super().send(request, **kwargs)


def kind_of(service: str, method: str, url: str) -> str:
    parts = urlsplit(url)
    if service == "table":
        return "table transaction" if parts.path.endswith("$batch") else f"table {method.lower()}"
    comp = (parse_qs(parts.query).get("comp") or [""])[0]
    return f"blob {method.lower()} {comp}".strip()


@dataclass
class TickFigure:
    not_due: int
    archived: int
    requests: Counter
    seconds: float

    @property
    def table(self) -> int:
        return sum(n for k, n in self.requests.items() if k.startswith("table"))

    @property
    def blob(self) -> int:
        return sum(n for k, n in self.requests.items() if k.startswith("blob"))


@dataclass
class Bench:
    connection_string: str
    max_orders: int
    counts: Counter = field(default_factory=Counter)
    written_not_due: int = 0

    def __post_init__(self) -> None:
        service = TableServiceClient.from_connection_string(self.connection_string, transport=clients.transport())
        service.create_table_if_not_exists(TABLE)
        self.writer = StateStore(service.get_table_client(TABLE))

    def _counted(self, *, exists: bool) -> tuple[StateStore, Archive]:
        """The tick's clients, on fresh connections (Azurite closes a connection idle for 5 s,
        and the SDK does not retry a POST sent on one: a count with no such retry in it)."""
        counted = TableServiceClient.from_connection_string(
            self.connection_string, transport=CountingTransport(self.counts, "table")
        )
        container = ContainerClient.from_connection_string(
            self.connection_string, CONTAINER, transport=CountingTransport(self.counts, "blob")
        )
        return StateStore(counted.get_table_client(TABLE)), Archive(container, exists=exists)

    def _index(self, states) -> None:
        """Finished-index rows as closing the orders writes them, 100 per transaction (a bulk load)."""
        by_partition: dict[str, list[dict]] = {}
        for state in states:
            entity = finished.finished_entity(state, self.writer.shards)
            by_partition.setdefault(entity["PartitionKey"], []).append(entity)
        batches = [rows[i : i + 100] for rows in by_partition.values() for i in range(0, len(rows), 100)]

        def load(rows: list[dict]) -> None:
            # Upserts: sent again when a connection the pool kept idle was closed under the POST
            # (the SDK does not retry a POST; Azurite closes idle connections after 5 s).
            for attempt in range(3):
                try:
                    self.writer.table.submit_transaction([("upsert", row, {"mode": UpdateMode.MERGE}) for row in rows])
                    return
                except ServiceResponseError:
                    if attempt == 2:
                        raise

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(load, batches))

    def add_not_due(self, count: int, *, progress=print) -> float:
        """``count`` more orders that ended now (sweep.py's writers: 2 processes x 4 threads),
        and their index rows."""
        started = time.monotonic()
        first, end = self.written_not_due, self.written_not_due + count
        jobs = [(self.connection_string, TABLE, lo, min(lo + CHUNK, end), 4) for lo in range(first, end, CHUNK)]
        if count <= CHUNK:
            for job in jobs:
                _write_history(job)
        else:
            with get_context("spawn").Pool(2) as pool:
                for n, _ in enumerate(pool.imap_unordered(_write_history, jobs), start=1):
                    if n % 20 == 0:
                        progress(f"  {first + n * CHUNK:,} finished orders written")
        state, _ = finished_order("done-0000000", utcnow())
        self._index(state.model_copy(update={"order_id": f"done-{i:07d}"}) for i in range(first, end))
        self.written_not_due = end
        return time.monotonic() - started

    def add_due(self, count: int, round_: int) -> None:
        """``count`` orders that ended three days ago (due with RETENTION_DAYS=1), with their index rows."""
        ended = utcnow() - timedelta(days=3)
        order = OrderRequest.model_validate_json(order_body("due", 1))
        state, lines = finished_order("due", ended)
        ids = [f"due-{round_}-{i:06d}" for i in range(count)]

        def one(order_id: str) -> None:
            self.writer.import_order(order.model_copy(update={"order_id": order_id}), state, lines)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, ids))
        self._index(state.model_copy(update={"order_id": order_id}) for order_id in ids)

    def ticks(self, *, first_round: bool) -> list[TickFigure]:
        """Ticks until one archives nothing (that last, empty one included)."""
        figures = []
        policy = RetentionPolicy(days=1, include_error=False, max_orders=self.max_orders)
        store, archive = self._counted(exists=not first_round)
        while True:
            self.counts.clear()
            started = time.perf_counter()
            report = tick(store=store, archive=archive, policy=policy, now=utcnow())
            figures.append(TickFigure(self.written_not_due, report["archived"], Counter(self.counts),
                                      time.perf_counter() - started))
            if report["archived"] == 0:
                return figures


def run(*, first: int, finished_total: int, due: int, max_orders: int, progress=print) -> list[TickFigure]:
    """Both rounds on a fresh Azurite; every tick's figure."""
    instance = azurite_launcher.start()
    try:
        bench = Bench(instance.connection_string, max_orders)
        figures = []
        for round_, not_due in enumerate((first, finished_total), start=1):
            took = bench.add_not_due(not_due - bench.written_not_due, progress=progress)
            progress(f"round {round_}: {bench.written_not_due:,} finished orders not due ({took:.0f} s to write)")
            bench.add_due(due, round_)
            figures += bench.ticks(first_round=round_ == 1)
        return figures
    finally:
        instance.stop()


def table_of(figures: list[TickFigure]) -> str:
    lines = [
        "| finished orders not due | orders archived and deleted | table requests | blob requests "
        "| requests per archived order | table requests by kind | tick ms (Azurite) |",
        "| ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for f in figures:
        per = f"{(f.table + f.blob) / f.archived:.2f}" if f.archived else "-"
        table = sorted((k.removeprefix("table "), n) for k, n in f.requests.items() if k.startswith("table"))
        kinds = ", ".join(f"{k} {n}" for k, n in table)
        lines.append(
            f"| {f.not_due:,} | {f.archived:,} | {f.table} | {f.blob} | {per} | {kinds} | {f.seconds * 1000:.0f} |"
        )
    return "\n".join(lines)


TITLE = "## Retention tick vs history"


def section(figures: list[TickFigure], *, due: int, max_orders: int, took: float, machine: dict[str, str]) -> str:
    """The report's section (BENCHMARKS.md, between the retention markers)."""
    full = [f for f in figures if f.archived == max_orders]
    rounds = sorted({f.not_due for f in figures})
    per_round = {n: [f for f in full if f.not_due == n] for n in rounds}
    lines = [
        TITLE, "",
        f"*Written by `python -m benchmarks.retention --finished {rounds[-1]} --first {rounds[0]} --due {due} "
        f"--max-orders {max_orders}`, {machine['date']}, {machine['cores']} cores ({machine['cpu']}), Python "
        f"{machine['python']}, Azurite {machine['azurite']}, azure-data-tables {machine.get('azure-data-tables', '?')}, "
        f"azure-storage-blob {metadata.version('azure-storage-blob')}; {took:.0f} s in all, most of it writing the "
        "orders.*", "",
        "Finished orders as the app leaves them (order, state and three step rows each, and their finished-index "
        f"row), {rounds[0]:,} then {rounds[-1]:,} of them ended now and not due (`RETENTION_DAYS=1`); in each round "
        f"{due:,} more that ended three days ago, and retention ticks of at most {max_orders:,} orders "
        "(`RETENTION_MAX_ORDERS_PER_TICK`) until one archives nothing. Every request a tick sends is counted at the "
        "SDK's transport (`table get`: a query or a partition read; `table transaction`: an entity-group "
        "transaction of deletes or marks).", "",
        table_of(figures), "",
    ]
    if all(per_round.values()):
        cost = {n: sum(f.table + f.blob for f in fs) / sum(f.archived for f in fs) for n, fs in per_round.items()}
        lines.append(
            "Requests per archived order in a full tick: "
            + ", ".join(f"{c:.2f} beside {n:,} not due" for n, c in cost.items())
            + ". A tick reads the due day ranges only: its requests follow the orders it archives and deletes, "
            "never the finished orders waiting. Its time on Azurite grows with the table because Azurite answers a "
            "query by scanning every entity in memory; Azure Table Storage reads the key range."
        )
    return "\n".join(lines)


def main(
    finished_orders: int = typer.Option(100_000, "--finished", help="Finished orders not due in round 2."),
    first: int = typer.Option(1_000, help="Finished orders not due in round 1."),
    due: int = typer.Option(2_000, help="Due orders (ended 3 days ago) added in each round."),
    max_orders: int = typer.Option(1_000, help="RETENTION_MAX_ORDERS_PER_TICK."),
    out: Path | None = typer.Option(None, help="Also write the section of this report (e.g. BENCHMARKS.md)."),
) -> None:
    if not 0 <= first <= finished_orders:
        raise typer.BadParameter("--first must be between 0 and --finished")
    started = time.monotonic()
    figures = run(first=first, finished_total=finished_orders, due=due, max_orders=max_orders)
    text = section(figures, due=due, max_orders=max_orders, took=time.monotonic() - started, machine=describe())
    print("\n" + text)
    if out is not None:
        write_retention_section(out, text)


if __name__ == "__main__":
    typer.run(main)
