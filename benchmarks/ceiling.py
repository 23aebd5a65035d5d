"""The ceiling: what each storage and messaging operation of a workflow step (and an
order's fixed part) costs, raw.

Every operation is issued with the SDK clients the app builds (``adapters.clients``:
``RequestsTransport(use_env_settings=False)`` for tables and queues, the app's
Service Bus client), with message bodies and entities of the app's real shapes and
sizes, in the shape the app and its host use them:

- table and storage-queue operations from ``threads`` threads sharing one client per
  process (the app keeps one client per process);
- Service Bus sends from ``threads`` threads sharing one sender per process behind a
  lock (as ``adapters.messaging.Publisher`` does);
- storage-queue receives from one poller thread per process, pages of up to 16
  (host.json ``batchSize``), and Service Bus receives and completes from one pump
  thread per process, one message per receive call, as the local host does.

Each operation kind runs on its own (a barrier between kinds), for ``count`` operations
or ``budget`` seconds, whichever comes first. The cost of a kind is wall time per
operation with all workers busy. A step's cost is the sum over the operations one step
needs (``PER_STEP``: one transaction, two Service Bus messages); the ceiling in steps/s
is one over that. An order adds a fixed part once (``PER_ORDER``: submission, the
first claim, the nudge, the orders message, leaving the index), so with it a step
costs its own operations plus the fixed part divided by the workflow's steps. This
adds up the kinds' costs, which is right when they compete for the same thing: here
the two cores, shared by the client processes, Azurite and the Service Bus emulator.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import statistics
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any, get_args

from benchmarks.procstat import CpuMeter
from core.workflow import CURRENT
from devtools.stats import percentile

#: Steps of the workflow a new order runs (``core.workflow.CURRENT``).
STEPS = len(CURRENT.steps)

#: (kind, label, operations per step, operations per order once: its fixed part), on
#: the app's path with no faults.
OPERATIONS: tuple[tuple[str, str, int, int], ...] = (
    ("table.transaction", "table insert-transaction (order + state rows)", 0, 1),
    ("table.insert", "table insert, one entity (reference: not on the path)", 0, 0),
    ("table.read", "table point read (state row; reference: not on the path)", 0, 0),
    ("table.update", "table If-Match MERGE update (state row: the first claim)", 0, 1),
    ("table.step", "table step transaction (state row If-Match MERGE + step row)", 1, 0),
    ("table.upsert", "table upsert (index row)", 0, 1),
    ("table.delete", "table delete (index row)", 0, 1),
    ("queue.send", "storage queue send (nudge)", 0, 1),
    ("queue.receive", "storage queue receive (pages of ≤16, per message)", 0, 1),
    ("queue.delete", "storage queue delete", 0, 1),
    ("sb.send", "Service Bus send (one message)", 2, 1),
    ("sb.receive", "Service Bus receive (peek-lock, one per call)", 2, 1),
    ("sb.complete", "Service Bus complete", 2, 1),
)
PER_STEP = {kind: n for kind, _, n, _ in OPERATIONS}
PER_ORDER = {kind: n for kind, _, _, n in OPERATIONS}
PER_STEP_WHY = (
    f"Operations on the app's path with no faults. Per step: one entity-group transaction (the state row's "
    f"If-Match MERGE that records the step and claims the next one, or ends the order, plus the step's row; no "
    f"read: the agent echoes the fence, the order and the results so far) and two Service Bus messages (the "
    f"request on `<remote>-requests`, the response on `agent-responses`), each sent, received and completed. "
    f"Per order, once (its fixed part): submission = index upsert + one transaction (order + state rows); the "
    f"first claim = one If-Match update (the nudge carries the state snapshot and the document, so no read); "
    f"one nudge sent, received and deleted; the orders message sent (by the submitter), received and completed; "
    f"the index row deleted once the order is Processed. A point read and a single-entity insert are measured "
    f"for reference; neither is on the path. The workflow has {STEPS} steps."
)
RECEIVE_BATCH = 16


@dataclass
class WorkerSpec:
    storage: str
    servicebus: str
    table: str
    queue: str
    sb_queue: str
    run: str
    index: int
    threads: int
    #: Operations of each kind this process does (split over its threads).
    count: int
    budget: float
    plan: tuple[str, ...]


@dataclass
class KindResult:
    kind: str
    ops: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    client_cpu: float = 0.0
    server_cpu: dict[str, float] = field(default_factory=dict)
    errors: int = 0

    @property
    def cost_ms(self) -> float | None:
        """Wall milliseconds per operation with every worker busy."""
        return self.seconds / self.ops * 1000 if self.ops else None

    @property
    def per_second(self) -> float | None:
        return self.ops / self.seconds if self.ops and self.seconds else None

    def latency(self, q: int) -> float | None:
        return percentile(self.latencies_ms, q)

    def cpu_ms(self, who: str) -> float | None:
        if not self.ops:
            return None
        if who == "client":
            return self.client_cpu / self.ops * 1000
        value = self.server_cpu.get(who)
        return None if value is None else value / self.ops * 1000


# --- in a worker process ---------------------------------------------------------------


#: The ceiling's own table layout, shaped like the app's orders table (an order row, a
#: state row and a row per ended step per order, an index partition): its own rows,
#: not the store's code.
ORDER_KEY, STATE_KEY, INDEX_PARTITION = "order", "state", "_active"


def _property(value: Any, annotation: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):  # a step's result: one JSON string property
        return json.dumps(value, separators=(",", ":"))
    if value is None:  # written, not left out, so a MERGE clears it
        return 0 if int in get_args(annotation) else ""
    return value


def _entity(model, exclude: set[str]) -> dict[str, Any]:
    """Every field of a model by its PascalCase name (``order_id`` -> ``OrderId``),
    datetimes as ``Edm.DateTime``."""
    fields = type(model).model_fields
    return {
        "".join(word.title() for word in name.split("_")): _property(value, fields[name].annotation)
        for name, value in model.model_dump(exclude=exclude).items()
    }


def state_entity(state) -> dict[str, Any]:
    """A state row with the app's properties."""
    return {"PartitionKey": state.order_id, "RowKey": STATE_KEY, **_entity(state, {"etag"})}


def line_entity(line) -> dict[str, Any]:
    """A step row (how one line of the workflow ended) with the app's properties."""
    prefix = "step" if line.kind.value == "action" else "undo"
    row_key = f"{prefix}-{line.step_index + 1:02d}-{line.step}"
    return {"PartitionKey": line.order_id, "RowKey": row_key, **_entity(line, {"order_id"})}


def _changes(before, after) -> dict[str, Any]:
    """The properties a MERGE writes to move the state row from ``before`` to ``after``
    (only those that differ, as the app's store writes it)."""
    old = state_entity(before)
    return {k: v for k, v in state_entity(after).items() if old.get(k) != v}


class _Payloads:
    """Entities and message bodies of the app's real shapes and sizes."""

    def __init__(self, defaults) -> None:
        from core import lifecycle
        from core.models import (
            AgentPolicy, AgentRequest, AgentResponse, Context, Nudge, OrderRequest, Outcome, idempotency_key, utcnow,
        )
        from devtools.orders import order_body

        now = utcnow()
        etag = 'W/"datetime\'2026-01-01T00%3A00%3A00.0000000Z\'"'
        self.order_message = order_body("bench-000000", 3)
        order = OrderRequest.model_validate_json(self.order_message)
        state = lifecycle.new_order(order.order_id, CURRENT, now, timedelta(seconds=30), None).model_copy(
            update={"etag": etag}
        )
        # The claim and the step's end come a little later, as they do (new UpdatedAt, CompleteBy).
        claimed_at, done_at = now + timedelta(milliseconds=10), now + timedelta(milliseconds=60)
        transition = lifecycle.claim(
            state, CURRENT, "benchhost-12345-abcdef", claimed_at, defaults, pending_timeout=timedelta(seconds=30)
        )
        assert transition is not None
        claimed = transition.state.model_copy(update={"etag": etag})
        self.document = order.document()
        self.order_row = {"RowKey": ORDER_KEY, "Document": self.document}
        self.state_row = state_entity(state)
        # The first claim is a MERGE of the properties that change, as the app's store writes it.
        self.claim_changes = _changes(state, claimed)
        self.nudge = Nudge(order_id=order.order_id, state=state, document=self.document).model_dump_json(
            exclude_none=True
        )
        # A step: the agent's response for step 1 records it and claims step 2 in one transaction.
        first = CURRENT.steps[0]
        result = {
            "order_id": order.order_id, "step": first.name, "service": first.remote, "action": first.action,
            "kind": "action", "confirmation": "cnf-0123456789abcdef0123", "applied_at": claimed_at.isoformat(),
        }
        context = Context(fence=claimed, order=order.model_dump(mode="json"))
        response = AgentResponse(
            order_id=order.order_id, step=first.name, kind=claimed.kind, attempt=claimed.attempt,
            outcome=Outcome.SUCCEEDED, result=result, context=context,
        )
        self.response = response.model_dump_json()
        step = lifecycle.complete(claimed, response, CURRENT, "benchhost-12345-abcdef", done_at, defaults)
        assert step is not None and step.lines
        self.step_changes = _changes(claimed, step.state)
        self.step_row = line_entity(step.lines[0])
        # Service Bus bodies: the request of a middle step (it carries the results so far);
        # its response is the same context echoed, plus the remote's result.
        nxt = CURRENT.steps[step.state.step_index]
        policy = nxt.policy_over(defaults)
        self.request = AgentRequest(
            order_id=order.order_id, step=nxt.name, kind=step.state.kind, action=nxt.action, remote=nxt.remote,
            attempt=step.state.attempt, complete_by=step.state.complete_by,
            idempotency_key=idempotency_key(order.order_id, nxt.name, nxt.action),
            policy=AgentPolicy(max_calls=policy.agent_max_calls, backoff_initial=policy.agent_backoff_initial,
                               backoff_max=policy.agent_backoff_max),
            context=Context(fence=step.state, order=order.model_dump(mode="json"), results={first.name: result}),
        ).model_dump_json()


def payload_bytes(defaults) -> dict[str, int]:
    """Bytes of the app's message bodies and rows, of their real shapes (see :class:`_Payloads`):
    what a Service Bus Premium namespace's throughput per messaging unit is measured in."""
    p = _Payloads(defaults)

    def size(body: str | bytes) -> int:
        return len(body if isinstance(body, bytes) else body.encode())

    return {
        "orders_message": size(p.order_message),
        "request_message": size(p.request),
        "response_message": size(p.response),
        "nudge": size(p.nudge),
        "state_row": size(json.dumps(p.state_row, default=str)),
        "step_row": size(json.dumps(p.step_row, default=str)),
    }


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class _Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        from azure.servicebus import ServiceBusReceiveMode

        from adapters import clients
        from adapters.settings import Settings

        self.spec = spec
        settings = Settings(
            AzureWebJobsStorage=spec.storage, ServiceBusConnection=spec.servicebus
        )
        self.table = clients.table_service(settings).get_table_client(spec.table)
        self.queue = clients.queue_client(settings, spec.queue)
        self.sb = clients.servicebus_client(settings)
        # Links are opened now, as a running host has them open: not timed.
        self.sender = self.sb.get_queue_sender(spec.sb_queue)
        self.sender.create_message_batch()
        self.receiver = self.sb.get_queue_receiver(spec.sb_queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0)
        self.receiver.peek_messages(max_message_count=1)
        self._send_lock = threading.Lock()
        self.payloads = _Payloads(settings.step_defaults())
        # Per thread: what the previous kinds left for the next (rows with ETags, messages).
        self.rows: list[list[list[Any]]] = [[] for _ in range(spec.threads)]
        self.index_keys: list[list[str]] = [[] for _ in range(spec.threads)]
        self.queue_messages: list[Any] = []
        self.sb_messages: list[Any] = []

    def run_kind(self, kind: str) -> tuple[int, list[float], int]:
        deadline = time.monotonic() + self.spec.budget
        single = kind in ("queue.receive", "sb.receive", "sb.complete")
        if single:
            return getattr(self, "_" + kind.replace(".", "_"))(0, self.spec.count, deadline)
        shares = _split(self.spec.count, self.spec.threads)
        method = getattr(self, "_" + kind.replace(".", "_"))
        with ThreadPoolExecutor(self.spec.threads) as pool:
            results = list(pool.map(lambda t: method(t, shares[t], deadline), range(self.spec.threads)))
        return sum(r[0] for r in results), [x for r in results for x in r[1]], sum(r[2] for r in results)

    @staticmethod
    def _loop(items, deadline: float, call) -> tuple[int, list[float], int]:
        latencies, errors, done = [], 0, 0
        for item in items:
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            try:
                call(item)
            except Exception:  # noqa: BLE001 - counted and reported
                errors += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)
            done += 1
        return done, latencies, errors

    # -- tables ---------------------------------------------------------------------------

    def _table_transaction(self, thread: int, count: int, deadline: float):
        p = self.payloads
        keys = [f"{self.spec.run}-{self.spec.index}-{thread}-{i}" for i in range(count)]

        def call(pk: str) -> None:
            result = self.table.submit_transaction(
                [("create", {**p.order_row, "PartitionKey": pk}), ("create", {**p.state_row, "PartitionKey": pk, "OrderId": pk})]
            )
            self.rows[thread].append([pk, result[1]["etag"]])

        return self._loop(keys, deadline, call)

    def _table_insert(self, thread: int, count: int, deadline: float):
        p = self.payloads
        keys = [f"{self.spec.run}-{self.spec.index}-{thread}-{i}" for i in range(count)]
        return self._loop(keys, deadline, lambda pk: self.table.create_entity({**p.order_row, "PartitionKey": pk, "RowKey": "single"}))

    def _table_read(self, thread: int, count: int, deadline: float):
        return self._loop(list(self.rows[thread][:count]), deadline, lambda row: self.table.get_entity(row[0], STATE_KEY))

    def _table_update(self, thread: int, count: int, deadline: float):
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        changes = self.payloads.claim_changes

        def call(row: list[Any]) -> None:
            metadata = self.table.update_entity(
                {**changes, "PartitionKey": row[0], "RowKey": STATE_KEY},
                mode=UpdateMode.MERGE, etag=row[1], match_condition=MatchConditions.IfNotModified,
            )
            row[1] = metadata["etag"]

        return self._loop(list(self.rows[thread][:count]), deadline, call)

    def _table_step(self, thread: int, count: int, deadline: float):
        """A step's transaction: the state row's If-Match MERGE and the step's row, in one
        entity-group transaction (as the app's store writes a step's end and the next claim)."""
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        p = self.payloads

        def call(row: list[Any]) -> None:
            guard = {"mode": UpdateMode.MERGE, "etag": row[1], "match_condition": MatchConditions.IfNotModified}
            result = self.table.submit_transaction([
                ("update", {**p.step_changes, "PartitionKey": row[0], "RowKey": STATE_KEY}, guard),
                ("upsert", {**p.step_row, "PartitionKey": row[0]}, {"mode": UpdateMode.REPLACE}),
            ])
            row[1] = result[0]["etag"]

        return self._loop(list(self.rows[thread][:count]), deadline, call)

    def _table_upsert(self, thread: int, count: int, deadline: float):
        from azure.data.tables import UpdateMode

        from core.models import utcnow

        keys = [f"{self.spec.run}-{self.spec.index}-{thread}-{i}" for i in range(count)]

        def call(key: str) -> None:
            self.table.upsert_entity(
                {"PartitionKey": INDEX_PARTITION, "RowKey": key, "IndexedAt": utcnow()}, mode=UpdateMode.REPLACE
            )
            self.index_keys[thread].append(key)

        return self._loop(keys, deadline, call)

    def _table_delete(self, thread: int, count: int, deadline: float):
        return self._loop(list(self.index_keys[thread][:count]), deadline, lambda key: self.table.delete_entity(INDEX_PARTITION, key))

    # -- storage queue --------------------------------------------------------------------

    def _queue_send(self, thread: int, count: int, deadline: float):
        body = self.payloads.nudge
        return self._loop(range(count), deadline, lambda _: self.queue.send_message(body))

    def _queue_receive(self, thread: int, count: int, deadline: float):
        latencies, got, errors = [], 0, 0
        while got < count and time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                page = next(
                    self.queue.receive_messages(messages_per_page=min(RECEIVE_BATCH, count - got), visibility_timeout=600).by_page(),
                    [],
                )
                page = list(page)
            except Exception:  # noqa: BLE001
                errors += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)
            self.queue_messages += page
            got += len(page)
        return got, latencies, errors

    def _queue_delete(self, thread: int, count: int, deadline: float):
        mine = self.queue_messages[thread :: self.spec.threads]
        return self._loop(mine, deadline, lambda m: self.queue.delete_message(m.id, m.pop_receipt))

    # -- Service Bus ----------------------------------------------------------------------

    def _sb_send(self, thread: int, count: int, deadline: float):
        from azure.servicebus import ServiceBusMessage

        body = self.payloads.request

        def call(i: int) -> None:
            message = ServiceBusMessage(
                body, content_type="application/json", message_id=f"{self.spec.run}-{self.spec.index}-{thread}-{i}",
                correlation_id="bench-000000", reply_to="agent-responses", time_to_live=timedelta(minutes=10),
            )
            with self._send_lock:
                self.sender.send_messages(message)

        return self._loop(range(count), deadline, call)

    def _sb_receive(self, thread: int, count: int, deadline: float):
        latencies, got, errors = [], 0, 0
        while got < count and time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                # One per call, as the local host receives (see tools/funchost/servicebus_trigger.py).
                batch = self.receiver.receive_messages(max_message_count=1, max_wait_time=0.5)
            except Exception:  # noqa: BLE001
                errors += 1
                continue
            if batch:
                latencies.append((time.perf_counter() - started) * 1000)
            self.sb_messages += batch
            got += len(batch)
        return got, latencies, errors

    def _sb_complete(self, thread: int, count: int, deadline: float):
        return self._loop(list(self.sb_messages), deadline, self.receiver.complete_message)

    def close(self) -> None:
        for handler in (self.sender, self.receiver):
            if handler is not None:
                with contextlib.suppress(Exception):  # closing after the measurement: nothing to report
                    handler.close()
        self.sb.close()


def _worker_main(spec: WorkerSpec, barrier, results) -> None:
    out: list[dict[str, Any]] = []
    worker = None
    try:
        worker = _Worker(spec)
        for kind in spec.plan:
            barrier.wait(timeout=300)
            started, cpu = time.monotonic(), time.process_time()
            ops, latencies, errors = worker.run_kind(kind)
            ended, cpu = time.monotonic(), time.process_time() - cpu
            barrier.wait(timeout=300)
            out.append({
                "kind": kind, "ops": ops, "started": started, "ended": ended, "latencies": latencies, "cpu": cpu,
                "errors": errors,
            })
        results.put((spec.index, out, None))
    except BaseException:  # noqa: BLE001 - reported to the coordinator
        barrier.abort()
        results.put((spec.index, out, traceback.format_exc()))
    finally:
        if worker is not None:
            worker.close()


# --- the coordinator -------------------------------------------------------------------


def measure(
    stack, *, processes: int, threads: int, count: int, budget: float, plan: tuple[str, ...], sb_queue: str,
    table: str = "benchceiling", progress=None,
) -> dict[str, KindResult]:
    """Run ``plan`` (operation kinds, in order) with ``processes`` x ``threads`` workers;
    ``count`` operations of each kind in total. Returns each kind's result."""
    from adapters import clients

    settings = stack.settings_object()
    clients.table_service(settings).create_table_if_not_exists(table)
    queue_name = f"ceiling-{uuid.uuid4().hex[:10]}"
    queue = clients.queue_client(settings, queue_name)
    queue.create_queue()
    run = uuid.uuid4().hex[:8]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes + 1)
    results_queue = context.Queue()
    shares = _split(count, processes)
    specs = [
        WorkerSpec(
            storage=stack.azurite.connection_string, servicebus=stack.servicebus_connection_string, table=table,
            queue=queue_name, sb_queue=sb_queue, run=run, index=i, threads=threads, count=shares[i], budget=budget,
            plan=plan,
        )
        for i in range(processes)
    ]
    workers = [context.Process(target=_worker_main, args=(spec, barrier, results_queue), daemon=True) for spec in specs]
    for process in workers:
        process.start()
    servers = {name: pid for name, pid in stack.pids.items() if name in ("azurite", "servicebus")}
    server_cpu: dict[str, dict[str, float]] = {}
    failure = None
    try:
        for done, kind in enumerate(plan, 1):
            meter = CpuMeter(servers)
            barrier.wait(timeout=300)
            meter.start()
            barrier.wait(timeout=300)
            server_cpu[kind] = meter.stop()
            if progress is not None:
                progress(done)  # kinds measured so far
    except threading.BrokenBarrierError:
        failure = "a worker failed"
    collected: list[tuple[int, list[dict[str, Any]], str | None]] = []
    for _ in workers:
        try:
            collected.append(results_queue.get(timeout=60))
        except Exception:  # noqa: BLE001
            break
    for process in workers:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    errors = [error for _, _, error in collected if error]
    if failure or errors or len(collected) < processes:
        raise RuntimeError(f"ceiling workers failed: {errors[0] if errors else failure or 'no result'}")
    with contextlib.suppress(Exception):  # a leftover queue in a throwaway Azurite is harmless
        queue.delete_queue()
    results: dict[str, KindResult] = {}
    for kind in plan:
        rows = [row for _, out, _ in collected for row in out if row["kind"] == kind]
        result = KindResult(kind)
        result.ops = sum(row["ops"] for row in rows)
        result.seconds = max(row["ended"] for row in rows) - min(row["started"] for row in rows)
        result.latencies_ms = [x for row in rows for x in row["latencies"]]
        result.client_cpu = sum(row["cpu"] for row in rows)
        result.errors = sum(row["errors"] for row in rows)
        result.server_cpu = {k: v for k, v in server_cpu.get(kind, {}).items() if k != "wall"}
        results[kind] = result
    return results


def cost_ms(results: dict[str, KindResult], weights: dict[str, int]) -> float | None:
    """Wall milliseconds of a set of operations (kind -> how many), from each kind's cost
    with every worker busy; None if a kind was not measured."""
    total_ms = 0.0
    for kind, n in weights.items():
        if not n:
            continue
        result = results.get(kind)
        if result is None or result.cost_ms is None:
            return None
        total_ms += n * result.cost_ms
    return total_ms


def steps_per_second(results: dict[str, KindResult]) -> float | None:
    """The ceiling in steps/s: one over the cost of one step's operations."""
    step = cost_ms(results, PER_STEP)
    return 1000.0 / step if step else None


def orders_per_second(results: dict[str, KindResult]) -> float | None:
    """Whole orders/s: one over an order's fixed part plus its steps."""
    fixed, step = cost_ms(results, PER_ORDER), cost_ms(results, PER_STEP)
    if fixed is None or step is None or not fixed + STEPS * step:
        return None
    return 1000.0 / (fixed + STEPS * step)


def order_steps_per_second(results: dict[str, KindResult]) -> float | None:
    """Steps/s when every order's fixed part is paid too (spread over its steps)."""
    orders = orders_per_second(results)
    return None if orders is None else orders * STEPS


def cpu_ms(results: dict[str, KindResult], weights: dict[str, int]) -> dict[str, float] | None:
    """CPU milliseconds of a set of operations, by who spends them (client, azurite, servicebus)."""
    totals: dict[str, float] = {"client": 0.0, "azurite": 0.0, "servicebus": 0.0}
    for kind, n in weights.items():
        if not n:
            continue
        result = results.get(kind)
        if result is None or not result.ops:
            return None
        for who in totals:
            totals[who] += n * (result.cpu_ms(who) or 0.0)
    return totals


def transport_comparison(stack, *, reads: int, rounds: int = 4) -> dict[str, float]:
    """Point-read latency (ms, median) with the SDK's default transport and with the app's
    ``RequestsTransport(use_env_settings=False)``, one thread, alternating rounds."""
    from azure.data.tables import TableServiceClient

    from adapters import clients

    settings = stack.settings_object()
    table = "benchtransport"
    app = clients.table_service(settings).get_table_client(table)
    app.create_table()
    default = TableServiceClient.from_connection_string(stack.azurite.connection_string).get_table_client(table)
    app.upsert_entity({"PartitionKey": "p", "RowKey": "state", "Document": "x" * 300})
    samples: dict[str, list[float]] = {"default": [], "app": []}
    for _ in range(rounds):
        for name, client in (("default", default), ("app", app)):
            client.get_entity("p", "state")  # warm the connection
            for _ in range(max(1, reads // rounds)):
                started = time.perf_counter()
                client.get_entity("p", "state")
                samples[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}
