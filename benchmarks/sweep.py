"""The supervisor's sweep as the history grows: 100 in-flight orders beside 0, 10,000 and
(optionally) 100,000 finished ones, next to the naive full-table filter on the same data.

The in-flight orders are mid-workflow (their first step done, the second claimed:
Processing), indexed an hour ago and due in an hour: every sweep reads all of them
(they are old enough to have expired) and acts on none, so the figure is the sweep's
read cost. The finished orders are what the app leaves behind: an order row, a
Processed state row and one row per step (5 rows for the 3-step workflow), no index
row. Both are made by the app's own lifecycle decisions and written by its store
(``StateStore.import_order``, one transaction per order).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

from azure.data.tables import TableClient

from adapters import clients
from adapters.messaging import Nudger, Publisher
from adapters.store import StateStore
from core import lifecycle, names
from core.models import AgentResponse, Context, LineRecord, OrderRequest, OrderState, Outcome, ProcessState, utcnow
from core.workflow import CURRENT, StepPolicy
from devtools.orders import order_body
from supervisor.supervision import policy_from, sweep

IN_FLIGHT = 100
#: Steps an in-flight order has done (it is running the next one).
IN_FLIGHT_STEPS_DONE = 1
#: Rows a finished order leaves in its partition: order, state, one per step.
FINISHED_ROWS = 2 + len(CURRENT.steps)
#: Rows of an in-flight order's partition (plus its index row).
IN_FLIGHT_ROWS = 2 + IN_FLIGHT_STEPS_DONE
#: Finished orders written per task of the writer processes.
CHUNK = 500
#: The supervisor skips index rows younger than min(step timeout, pending timeout).
YOUNGEST = timedelta(seconds=30)
#: What a supervisor without the active index would ask: the expired Processing state
#: rows, by a filter over the whole table. The store has no such query (that is the
#: point of the index), so this one comparison query names the state row's layout
#: itself (RowKey ``state``, the ProcessState and CompleteBy properties).
NAIVE_FILTER = "RowKey eq @rk and ProcessState eq @state and CompleteBy lt @now"
NAIVE_STATE_ROW = "state"


@dataclass
class SweepPoint:
    history: int
    sweep_ms: float
    supervisor_ms: float
    index_query_ms: float
    naive_ms: float
    table_ops: dict[str, int]

    @property
    def rows_examined_sweep(self) -> int:
        """Rows Azure Table Storage reads for one sweep: the index rows, then one point read each."""
        return IN_FLIGHT + IN_FLIGHT

    @property
    def rows_examined_naive(self) -> int:
        """Rows Azure Table Storage reads for the naive filter: every row of the table
        (a filter on RowKey and properties without a PartitionKey is a table scan)."""
        return FINISHED_ROWS * self.history + IN_FLIGHT_ROWS * IN_FLIGHT + IN_FLIGHT


class SweepBench:
    def __init__(self, stack, *, table: str = "benchsweep") -> None:
        settings = stack.settings_object(ORDERS_TABLE=table)
        self.settings = settings
        self.connection_string = stack.azurite.connection_string
        self.table_name = table
        tables = clients.table_service(settings)
        tables.create_table_if_not_exists(table)
        self.table: TableClient = tables.get_table_client(table)
        self.store = StateStore(self.table)
        self.publisher = Publisher(clients.servicebus_client(settings))
        self.nudger = Nudger([clients.queue_client(settings, queue) for queue, _ in names.SCHEDULER_QUEUES])
        self.history = 0

    def close(self) -> None:
        self.publisher.close()

    # -- data -------------------------------------------------------------------------------

    def add_in_flight(self) -> None:
        """100 orders mid-workflow, Processing, indexed an hour ago and due in an hour
        (written by the app's store)."""
        long_ago = utcnow() - timedelta(hours=1)

        def one(i: int) -> None:
            order = OrderRequest.model_validate_json(order_body(f"inflight-{i:04d}", i))
            state, lines = in_flight_order(order.order_id, long_ago, due=long_ago + timedelta(hours=2))
            self.store.import_order(order, state, lines)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(IN_FLIGHT)))

    def add_history(self, count: int, *, processes: int = 2, threads: int = 4, progress=None) -> float:
        """``count`` more finished orders, one transaction (order, state and step rows) each, from
        ``processes`` x ``threads`` writers; returns the seconds it took. ``progress`` is
        called with the number written so far."""
        from multiprocessing import get_context

        started = time.monotonic()
        chunks = [(lo, min(lo + CHUNK, self.history + count)) for lo in range(self.history, self.history + count, CHUNK)]
        written = 0
        with get_context("spawn").Pool(processes) as pool:
            jobs = [(self.connection_string, self.table_name, lo, hi, threads) for lo, hi in chunks]
            for n in pool.imap_unordered(_write_history, jobs):
                written += n
                if progress is not None:
                    progress(written)
        self.history += count
        return time.monotonic() - started

    # -- measurement ------------------------------------------------------------------------

    def measure(self, repeats: int) -> SweepPoint:
        policy = policy_from(self.settings)
        samples: dict[str, list[float]] = {"sweep": [], "supervisor": [], "index": [], "naive": []}
        ops: dict[str, int] = {}
        for _ in range(repeats):
            now = utcnow()
            before = dict(self.store.ops)
            started = time.perf_counter()
            states = list(self.store.sweep(now, younger_than_cannot_expire=YOUNGEST))
            samples["sweep"].append((time.perf_counter() - started) * 1000)
            ops = {k: v - before.get(k, 0) for k, v in self.store.ops.items() if v - before.get(k, 0)}
            assert not states, "no in-flight order should be due"

            started = time.perf_counter()
            done = sweep(
                store=self.store, publisher=self.publisher, nudger=self.nudger, policy=policy, now=utcnow(),
                alerts_queue=self.settings.alerts_queue,
            )
            samples["supervisor"].append((time.perf_counter() - started) * 1000)
            assert not done, f"the supervisor acted: {dict(done)}"

            started = time.perf_counter()
            self.store.active_ids(indexed_before=now - YOUNGEST)
            samples["index"].append((time.perf_counter() - started) * 1000)

            started = time.perf_counter()
            list(  # the whole result, page by page, as the supervisor would read it
                self.table.query_entities(
                    NAIVE_FILTER,
                    parameters={"rk": NAIVE_STATE_ROW, "state": ProcessState.PROCESSING.value, "now": now},
                )
            )
            samples["naive"].append((time.perf_counter() - started) * 1000)
        return SweepPoint(
            history=self.history,
            sweep_ms=statistics.median(samples["sweep"]),
            supervisor_ms=statistics.median(samples["supervisor"]),
            index_query_ms=statistics.median(samples["index"]),
            naive_ms=statistics.median(samples["naive"]),
            table_ops=ops,
        )


def run_steps(order_id: str, at, steps: int, *, timeout: timedelta) -> tuple[OrderState, tuple[LineRecord, ...]]:
    """An order claimed at ``at`` that has done its first ``steps`` steps, each answered at
    once, by the app's own lifecycle decisions: its state (the next step claimed, due
    ``timeout`` later; or Processed after the last step) and its step rows."""
    defaults = StepPolicy(timeout_seconds=timeout.total_seconds(), max_failures=3)
    pending = lifecycle.new_order(order_id, CURRENT, at, timedelta(seconds=30), None)
    claimed = lifecycle.claim(pending, CURRENT, "bench", at, defaults, pending_timeout=timedelta(seconds=30))
    assert claimed is not None
    state, lines = claimed.state, []
    for _ in range(steps):
        step = CURRENT.steps[state.step_index]
        response = AgentResponse(
            order_id=order_id, step=step.name, kind=state.kind, attempt=state.attempt, outcome=Outcome.SUCCEEDED,
            result={"step": step.name, "confirmation": "cnf-0123456789abcdef0123"}, context=Context(fence=state, order={}),
        )
        transition = lifecycle.complete(state, response, CURRENT, "bench", at, defaults)
        assert transition is not None
        state, lines = transition.state, [*lines, *transition.lines]
    return state, tuple(lines)


def in_flight_order(order_id: str, claimed_at, *, due) -> tuple[OrderState, tuple[LineRecord, ...]]:
    """An order mid-workflow: :data:`IN_FLIGHT_STEPS_DONE` steps done, the next one claimed
    at ``claimed_at`` and due at ``due``, as the scheduler leaves it."""
    state, lines = run_steps(order_id, claimed_at, IN_FLIGHT_STEPS_DONE, timeout=due - claimed_at)
    assert state.process_state is ProcessState.PROCESSING
    return state, lines


def finished_order(order_id: str, now) -> tuple[OrderState, tuple[LineRecord, ...]]:
    """An order that ran every step of its workflow and ended Processed, with its step rows."""
    state, lines = run_steps(order_id, now, len(CURRENT.steps), timeout=timedelta(seconds=30))
    assert state.process_state is ProcessState.PROCESSED
    return state, lines


def _write_history(job: tuple[str, str, int, int, int]) -> int:
    """In a worker process: finished orders ``first``..``end-1``, one transaction each
    (the order, its Processed state and its step rows, no index row), written by the app's store."""
    connection_string, table, first, end, threads = job
    from azure.data.tables import TableServiceClient

    from adapters.clients import transport

    client = TableServiceClient.from_connection_string(connection_string, transport=transport()).get_table_client(table)
    store = StateStore(client)
    now = utcnow()
    order = OrderRequest.model_validate_json(order_body("done-0000000", 1))
    state, lines = finished_order(order.order_id, now)

    def one(i: int) -> None:
        order_id = f"done-{i:07d}"
        store.import_order(order.model_copy(update={"order_id": order_id}), state, lines)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(first, end)))
    return end - first
