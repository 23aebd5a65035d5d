"""The capacity and cost model: ``python -m benchmarks.capacity --orders-per-second R [--steps K] [--shape ...] --json``.

It reads two files kept in the repo and types in no count of its own:

- ``benchmarks/results/operations.json``: the operations one order costs, its fixed part
  and each step apart (table requests and entities by role, storage-queue operations,
  Service Bus sends, deliveries and completes, function executions and their
  durations, the host's CPU, the bytes of each message), written by the ``ops`` phase
  of ``make bench`` (:func:`operations_record`);
- ``benchmarks/azure_limits.json``: Azure's documented limits and list prices, and the
  peers' published prices, one row per fact with its source and the date it was read.

For a load (orders/s) and a deployment's shape (the Bicep parameters; ``stamps`` is the
number of identical deployments the orders are spread over by order id, each with its
own namespace, accounts and function app), it gives each resource's use as a share of
its limit, the one that saturates first, and the cost per million orders by service.
Without ``--shape`` it finds the cheapest shape whose every resource stays at or below
``--max-utilisation`` (0.8 by default: Azure's figures are targets, not promises).

The model, stated once (docs/scale.md explains each line):

- Service Bus Standard: credits/s = orders/s x (sends + deliveries) per order, against
  1,000 per namespace; Premium: bytes in and out per order against ~4 MB/s per
  messaging unit (Microsoft's benchmark figure, ingress and egress counted together).
- Tables: the hottest active-index shard takes its share of the index rows written
  (each order upserts and deletes one), against 2,000 entities/s per partition; an
  order's own partition takes its entities over the order's lifetime; the state account
  takes every table request (with the storage queues too unless ``separateStateStorage``),
  against 20,000 requests/s.
- The scheduler's storage queue: messages enqueued/s against 2,000.
- Functions: an instance is busy per order for the longer of the host's CPU time over
  the instance's cores and the executions' waits (``--io-ms`` each, plus ``--remote-ms``
  for an agent's call) over its concurrency (``serviceBusMaxConcurrentCalls``);
  instances = orders/s x that, against ``maximumInstanceCount`` and the region's memory
  quota. Billed: those busy seconds x the instance's memory, and every execution.
- Costs per million orders: Functions (GB-s and executions), Service Bus (Standard's
  tiered operations and base charge, or Premium's messaging units by the hour), tables
  (transactions, and a month of the order's rows kept), queues (operations).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import azurite_log
from core import names
from core.workflow import remotes
from devtools.paths import ROOT

OPERATIONS_FILE = ROOT / "benchmarks" / "results" / "operations.json"
LIMITS_FILE = ROOT / "benchmarks" / "azure_limits.json"

#: Azure bills by the month of 730 hours.
MONTH_SECONDS = 730 * 3600
#: The share of each limit the cheapest-shape search allows by default.
MAX_UTILISATION = 0.8
#: What one execution waits for its storage and Service Bus calls in Azure (an assumption, ms).
IO_MS = 20.0
#: Fewer stamps are worth this much more cost (more of them only split the messaging units finer).
STAMP_TOLERANCE = 0.10
#: The loads docs/scale.md shows (orders/s).
DOC_LOADS = (100, 1000, 10000)
SERVICES = ("functions", "servicebus", "tables", "queues")


class CapacityError(ValueError):
    """Bad input (a shape, a file): said clearly, nothing computed."""


# --- written by the bench (the ops phase) ------------------------------------------------


def _agent_functions() -> set[str]:
    return {names.agent_function(remote) for remote in remotes()}


def operations_record(*, machine: dict, options: dict, orders: int, steps: int, steps_per_order: int, table: dict,
                      queue: dict[str, float], servicebus: dict, invocations: dict[str, list[int]],
                      cpu_seconds: dict[str, float], payload_bytes: dict[str, int], idle=None) -> dict:
    """The operations file's content, from what the ops phase counted over ``orders``
    orders (``steps`` steps done). A function is a step's when it is an agent (each step
    calls its remote's) or ran about once per step (the step's recording), the order's
    fixed part otherwise (submission, the first claim, the supervisor's ticks during the run)."""
    per_step_exec: dict[str, dict[str, float]] = {}
    fixed_exec: dict[str, dict[str, float]] = {}
    agents = _agent_functions()
    for function, durations in sorted(invocations.items()):
        step = function in agents or len(durations) >= 0.9 * steps
        divisor = steps if step else orders
        (per_step_exec if step else fixed_exec)[function] = {
            "executions": len(durations) / divisor, "ms": sum(durations) / divisor,
        }
    hosts = sum(value for name, value in cpu_seconds.items() if name.startswith("host"))
    record = {
        "about": "Operations per order of the app on the local stack, counted at the servers by the ops phase of "
                 "make bench (python -m benchmarks --phases ops); read by python -m benchmarks.capacity. "
                 "'per_step' scales with the workflow's steps, 'fixed' is paid once per order.",
        "date": machine.get("date"),
        "machine": {k: machine.get(k) for k in ("cpu", "cores", "memory", "os", "python", "node", "azurite")},
        "versions": {k: v for k, v in machine.items() if k.startswith("azure-")},
        "options": options,
        "orders": orders,
        "steps_per_order": steps_per_order,
        "steps_done": steps,
        "per_step": {
            "table": table["per_step"],
            "servicebus": servicebus["per_step"],
            "executions": {"total": sum(v["executions"] for v in per_step_exec.values()),
                           "ms": sum(v["ms"] for v in per_step_exec.values()), "by_function": per_step_exec},
        },
        "fixed": {
            "table": table["fixed"],
            "queue": {"total": sum(queue.values()), "by_operation": queue},
            "servicebus": servicebus["fixed"],
            "executions": {"total": sum(v["executions"] for v in fixed_exec.values()),
                           "ms": sum(v["ms"] for v in fixed_exec.values()), "by_function": fixed_exec},
        },
        "table_by_role": table["by_role"],
        "cpu_ms_per_order": {
            "host": hosts / orders * 1000,
            "azurite": cpu_seconds.get("azurite", 0.0) / orders * 1000,
            "servicebus_emulator": cpu_seconds.get("servicebus", 0.0) / orders * 1000,
            "note": "The local Functions host (tools/funchost) running function_app.py, CPU over the run / orders; "
                    "Azure's host (.NET, with the Python worker) is not the same program.",
        },
        "payload_bytes": payload_bytes,
    }
    if idle is not None:
        operations, seconds = idle
        minutes = seconds / 60
        record["idle_per_minute_per_host"] = {
            "table": operations.service_total("table") / minutes, "queue": operations.service_total("queue") / minutes,
        }
    return record


def write_operations(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")


# --- the inputs ---------------------------------------------------------------------------


def _load_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise CapacityError(f"{what} not found at {path}; run `make bench BENCH_ARGS=\"--phases ops\"`") from error
    except ValueError as error:
        raise CapacityError(f"{what} at {path} is not valid JSON: {error}") from error


class Limits:
    """The rows of ``azure_limits.json`` by name."""

    def __init__(self, data: dict) -> None:
        self.rows = {row["name"]: row for row in data["rows"]}

    @classmethod
    def load(cls, path: Path = LIMITS_FILE) -> Limits:
        return cls(_load_json(path, "the limits table"))

    def __getitem__(self, name: str):
        try:
            return self.rows[name]["value"]
        except KeyError as error:
            raise CapacityError(f"the limits table has no row {name!r}") from error

    def source(self, name: str) -> str:
        return self.rows[name]["source"]


@dataclass(frozen=True)
class Counts:
    """What one order of ``steps`` steps costs, from the operations file."""

    steps: int
    table_requests: float
    table_entities: float
    index_entities: float
    queue_operations: float
    queue_sends: float
    sb_sends: float
    sb_deliveries: float
    sb_completes: float
    sb_bytes: float
    executions: float
    execution_seconds: float
    agent_seconds: float
    cpu_seconds: float
    row_bytes: float

    @property
    def sb_operations(self) -> float:
        return self.sb_sends + self.sb_deliveries + self.sb_completes

    @property
    def sb_credits(self) -> float:
        return self.sb_sends + self.sb_deliveries


def counts(data: dict, steps: int | None = None, *, io_ms: float = IO_MS, remote_ms: float = 0.0) -> Counts:
    """The counts for an order of ``steps`` steps (the measured workflow's by default):
    the fixed part once, the per-step part ``steps`` times. The host's CPU, measured for
    the workflow's steps, is split the way the executions are.

    An execution's time in Azure is its CPU plus its waits: ``io_ms`` for its storage and
    Service Bus calls (an assumption: Azure's latency, not loopback's), and ``remote_ms``
    more for an agent's remote call. The durations the bench logged are not used: the
    ops phase sends its orders at once, so they measure the queueing inside a host sharing
    two cores with the servers, not an instance's."""
    measured = data["steps_per_order"]
    k = measured if steps is None else steps
    if k < 1:
        raise CapacityError(f"--steps must be at least 1, not {k}")
    step, fixed = data["per_step"], data["fixed"]
    index = sum(v["entities_written"] for role, v in data["table_by_role"].items()
                if role in (azurite_log.INDEX_UPSERT, azurite_log.INDEX_DELETE))
    sb_step, sb_fixed = step["servicebus"], fixed["servicebus"]
    sizes = data["payload_bytes"]
    # Each message is sent once and delivered once (in and out of the namespace).
    sb_bytes = 2 * (sb_fixed["sends"] * sizes["orders_message"]
                    + k * (sizes["request_message"] + sizes["response_message"]) * sb_step["sends"] / 2)
    exec_fixed, exec_step = fixed["executions"]["total"], step["executions"]["total"]
    measured_exec = exec_fixed + measured * exec_step
    cpu_ms = data["cpu_ms_per_order"]["host"] * (exec_fixed + k * exec_step) / measured_exec
    agents = sum(v["executions"] for f, v in step["executions"]["by_function"].items() if f in _agent_functions())
    rows = sizes["state_row"] + sizes["orders_message"] + k * sizes["step_row"]
    return Counts(
        steps=k,
        table_requests=fixed["table"]["requests"] + k * step["table"]["requests"],
        table_entities=fixed["table"]["entities_written"] + k * step["table"]["entities_written"],
        index_entities=index,
        queue_operations=fixed["queue"]["total"],
        queue_sends=fixed["queue"]["by_operation"].get("queue send", 0.0),
        sb_sends=sb_fixed["sends"] + k * sb_step["sends"],
        sb_deliveries=sb_fixed["deliveries"] + k * sb_step["deliveries"],
        sb_completes=sb_fixed["completes"] + k * sb_step["completes"],
        sb_bytes=sb_bytes,
        executions=exec_fixed + k * exec_step,
        execution_seconds=((exec_fixed + k * exec_step) * io_ms + k * agents * remote_ms) / 1000,
        agent_seconds=k * agents * remote_ms / 1000,
        cpu_seconds=cpu_ms / 1000,
        row_bytes=rows,
    )


# --- the shape ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A deployment's shape: the Bicep parameters (infra/main.bicep), and ``stamps``."""

    serviceBusSku: str = "Standard"  # noqa: N815 - the Bicep parameter's name
    serviceBusCapacity: int = 1  # noqa: N815
    serviceBusPartitions: int = 1  # noqa: N815
    separateStateStorage: bool = False  # noqa: N815
    maximumInstanceCount: int = 100  # noqa: N815
    instanceMemoryMB: int = 2048  # noqa: N815
    activeIndexShards: int = 16  # noqa: N815
    serviceBusMaxConcurrentCalls: int = 16  # noqa: N815
    stamps: int = 1

    def check(self) -> Shape:
        if self.serviceBusSku not in ("Standard", "Premium"):
            raise CapacityError(f"serviceBusSku must be Standard or Premium, not {self.serviceBusSku!r}")
        if self.serviceBusPartitions not in (1, 2, 4):
            raise CapacityError(f"serviceBusPartitions must be 1, 2 or 4, not {self.serviceBusPartitions}")
        if self.serviceBusCapacity not in (1, 2, 4, 8, 16) or self.serviceBusCapacity % self.serviceBusPartitions:
            raise CapacityError(f"serviceBusCapacity must be 1, 2, 4, 8 or 16 and a multiple of the partitions, "
                                f"not {self.serviceBusCapacity}")
        if self.instanceMemoryMB not in (512, 2048, 4096):
            raise CapacityError(f"instanceMemoryMB must be 512, 2048 or 4096, not {self.instanceMemoryMB}")
        for name in ("maximumInstanceCount", "activeIndexShards", "serviceBusMaxConcurrentCalls", "stamps"):
            if getattr(self, name) < 1:
                raise CapacityError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.maximumInstanceCount > 1000:
            raise CapacityError(f"maximumInstanceCount is at most 1000 on Flex Consumption, not "
                                f"{self.maximumInstanceCount}")
        return self

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``key=value,...`` with the Bicep parameters' names; the others keep their defaults."""
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in types:
                raise CapacityError(f"--shape takes key=value pairs of {', '.join(types)}; got {part!r}")
            if types[key] in ("bool", bool):
                if value.lower() not in ("true", "false"):
                    raise CapacityError(f"{key} must be true or false, not {value!r}")
                values[key] = value.lower() == "true"
            elif types[key] in ("int", int):
                try:
                    values[key] = int(value)
                except ValueError as error:
                    raise CapacityError(f"{key} must be a whole number, not {value!r}") from error
            else:
                values[key] = value
        return cls(**values).check()


# --- the model ----------------------------------------------------------------------------


@dataclass
class Result:
    orders_per_second: float
    steps: int
    shape: Shape
    #: resource -> share of its limit (per stamp: every stamp carries the same share).
    utilisation: dict[str, float]
    #: resource -> {"use", "limit", "unit"}
    detail: dict[str, dict[str, Any]]
    cost_per_million_orders_usd: dict[str, float]
    instances: float

    @property
    def bottleneck(self) -> str:
        return max(self.utilisation, key=self.utilisation.get)

    def holds(self, max_utilisation: float = 1.0) -> bool:
        return all(share <= max_utilisation for share in self.utilisation.values())

    def to_json(self, counts_: Counts, operations: dict) -> dict:
        return {
            "orders_per_second": self.orders_per_second,
            "steps": self.steps,
            "shape": asdict(self.shape),
            "bottleneck": self.bottleneck,
            "utilisation": {k: round(v, 4) for k, v in self.utilisation.items()},
            "limits": self.detail,
            "cost_per_million_orders_usd": {k: round(v, 4) for k, v in self.cost_per_million_orders_usd.items()},
            "cost_per_month_usd": round(self.cost_per_million_orders_usd["total"] * self.orders_per_second
                                        * MONTH_SECONDS / 1e6, 2),
            "functions_instances_per_stamp": round(self.instances, 2),
            "per_order": {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(counts_).items()},
            "operations_measured": {"date": operations.get("date"), "orders": operations.get("orders"),
                                    "machine": operations.get("machine")},
        }


def _tiered(quantity: float, tiers: list[list[float | None]]) -> float:
    """The cost of ``quantity`` units under ``[[up to N, price per million], ...]`` tiers."""
    cost, below = 0.0, 0.0
    for upper, price in tiers:
        top = quantity if upper is None else min(quantity, upper)
        if top > below:
            cost += (top - below) * price / 1e6
        if upper is None or quantity <= upper:
            break
        below = upper
    return cost


def evaluate(rate: float, shape: Shape, c: Counts, limits: Limits, *, order_seconds: float = 1.0) -> Result:
    """Each resource's use as a share of its limit, and the cost per million orders."""
    if rate <= 0:
        raise CapacityError(f"--orders-per-second must be positive, not {rate}")
    shape.check()
    r = rate / shape.stamps
    util: dict[str, float] = {}
    detail: dict[str, dict[str, Any]] = {}

    def use(resource: str, amount: float, limit: float, unit: str) -> None:
        util[resource] = amount / limit
        detail[resource] = {"use": round(amount, 3), "limit": limit, "unit": unit}

    # Service Bus: one namespace per stamp.
    if shape.serviceBusSku == "Standard":
        use("servicebus.namespace", r * c.sb_credits, limits["servicebus.standard.credits_per_second"],
            "credits/s (sends + deliveries)")
    else:
        use("servicebus.namespace", r * c.sb_bytes / 1e6,
            limits["servicebus.premium.mb_per_second_per_mu"] * shape.serviceBusCapacity, "MB/s in + out")
    # Tables: the hottest partitions, and the accounts.
    partition = limits["table.partition.entities_per_second"]
    use("table.partition.active_index_shard", r * c.index_entities / shape.activeIndexShards, partition,
        "entities/s on one shard of the active index")
    use("table.partition.order", (c.table_entities - c.index_entities) / order_seconds, partition,
        f"entities/s in one order's partition (its rows over {order_seconds:g} s)")
    account = limits["storage.account.requests_per_second"]
    if shape.separateStateStorage:
        use("storage.account.state", r * c.table_requests, account, "requests/s (tables)")
        use("storage.account.host", r * c.queue_operations, account, "requests/s (storage queues)")
    else:
        use("storage.account", r * (c.table_requests + c.queue_operations), account, "requests/s (tables + queues)")
    use("queue.scheduler", r * c.queue_sends, limits["queue.messages_per_second"], "messages/s enqueued")
    # Functions.
    cores = limits[f"functions.flex.cores.{shape.instanceMemoryMB}"]
    busy = max(c.cpu_seconds / cores, c.execution_seconds / shape.serviceBusMaxConcurrentCalls)
    instances = r * busy
    use("functions.instances", instances, shape.maximumInstanceCount, "instances busy")
    use("functions.regional_memory_quota", instances * shape.instanceMemoryMB,
        limits["functions.flex.regional_memory_quota_mb"], "MB of instance memory")

    # Cost per million orders.
    million = 1e6
    functions = million * (busy * shape.instanceMemoryMB / 1024 * limits["price.functions.flex.on_demand_gb_second"]
                           + c.executions * limits["price.functions.flex.per_million_executions"] / 1e6)
    orders_month = rate * MONTH_SECONDS
    if shape.serviceBusSku == "Standard":
        monthly = (limits["price.servicebus.standard.base_per_hour"] * 730
                   + _tiered(orders_month * c.sb_operations, limits["price.servicebus.standard.operations_tiers"]))
    else:
        monthly = limits["price.servicebus.premium.mu_per_hour"] * 730 * shape.serviceBusCapacity * shape.stamps
    servicebus = monthly / orders_month * million
    tables = million * (c.table_requests * limits["price.table.transactions_per_10k"] / 1e4
                        + c.row_bytes / 1e9 * limits["price.table.gb_month"])
    queues = million * c.queue_operations * limits["price.queue.operations_per_10k"] / 1e4
    cost = {"functions": functions, "servicebus": servicebus, "tables": tables, "queues": queues}
    cost["total"] = sum(cost.values())
    return Result(rate, c.steps, shape, util, detail, cost, instances)


def _sized(rate: float, shape: Shape, c: Counts, limits: Limits, ceiling: float, order_seconds: float) -> Shape | None:
    """``shape`` with the fewest index shards and the smallest instance ceiling that hold
    the load within ``ceiling``; None if no number of them does."""
    probe = evaluate(rate, replace(shape, activeIndexShards=1, maximumInstanceCount=1000), c, limits,
                     order_seconds=order_seconds)
    shards = 1
    while probe.utilisation["table.partition.active_index_shard"] / shards > ceiling:
        shards *= 2
        if shards > 1024:
            return None
    needed = probe.instances / ceiling
    if needed > 1000:
        return None
    maximum = min(1000, max(40, math.ceil(needed / 10) * 10))
    return replace(shape, activeIndexShards=shards, maximumInstanceCount=maximum)


def cheapest(rate: float, c: Counts, limits: Limits, *, max_utilisation: float = MAX_UTILISATION,
             order_seconds: float = 1.0, max_stamps: int = 256, concurrency: int = 16,
             stamp_tolerance: float = STAMP_TOLERANCE) -> Result:
    """The cheapest shape that holds ``rate`` with every resource at or below
    ``max_utilisation``: Standard or Premium (messaging units), one storage account or
    two, each instance size, the fewest shards and instances. More stamps split the
    messaging units finer, which can save a little: a shape with fewer stamps is kept
    unless the one with more costs ``stamp_tolerance`` (10%) less."""
    by_stamps: dict[int, Result] = {}
    tiers = [("Standard", 1)] + [("Premium", mu) for mu in (1, 2, 4, 8, 16)]
    for stamps in range(1, max_stamps + 1):
        for sku, mu in tiers:
            for separate in (False, True):
                for memory in (2048, 512, 4096):
                    base = Shape(serviceBusSku=sku, serviceBusCapacity=mu, separateStateStorage=separate,
                                 instanceMemoryMB=memory, stamps=stamps, serviceBusMaxConcurrentCalls=concurrency)
                    shape = _sized(rate, base, c, limits, max_utilisation, order_seconds)
                    if shape is None:
                        continue
                    result = evaluate(rate, shape, c, limits, order_seconds=order_seconds)
                    if not result.holds(max_utilisation):
                        continue
                    held = by_stamps.get(stamps)
                    if held is None or _total(result) < _total(held) - 1e-9:
                        by_stamps[stamps] = result
        if by_stamps and stamps >= 2 * min(by_stamps) + 8:
            break  # further stamps split the same messaging units ever finer
    if not by_stamps:
        raise CapacityError(f"no shape of up to {max_stamps} stamps holds {rate:g} orders/s within "
                            f"{max_utilisation:.0%} of every limit")
    lowest = min(_total(result) for result in by_stamps.values())
    return next(by_stamps[stamps] for stamps in sorted(by_stamps)
                if _total(by_stamps[stamps]) <= lowest * (1 + stamp_tolerance))


def _total(result: Result) -> float:
    return result.cost_per_million_orders_usd["total"]


# --- the peers ------------------------------------------------------------------------------


def peers(rate: float, limits: Limits, *, saga_seconds: float = 1.0) -> dict[str, dict[str, Any]]:
    """The same three-step saga on the peers at their published prices: the orchestration's
    own charge per million orders (their workers' or functions' compute is extra)."""
    orders_month = rate * MONTH_SECONDS
    actions = limits["peer.temporal.actions_per_saga"]
    usage = _tiered(orders_month * actions, limits["peer.temporal.price_per_million_actions"])
    temporal = (usage + max(500.0, 0.1 * usage)) / orders_month * 1e6
    transitions = limits["peer.stepfunctions.transitions_per_saga"]
    standard = transitions * limits["peer.stepfunctions.standard.per_1000_transitions"] * 1000
    billed_seconds = math.ceil(saga_seconds * 10 - 1e-9) / 10
    express = (limits["peer.stepfunctions.express.per_million_requests"]
               + 1e6 * billed_seconds * 64 / 1024 * limits["peer.stepfunctions.express.gb_second"])
    dts_actions = limits["peer.durabletask.actions_per_saga"]
    units = math.ceil(rate * dts_actions / limits["durabletask.dedicated.actions_per_second_per_cu"])
    cu_price = limits["price.durabletask.dedicated.cu_per_month"]
    dts = None if cu_price is None else units * cu_price / orders_month * 1e6
    return {
        "temporal_cloud": {"usd_per_million_orders": temporal, "source": limits.source("peer.temporal.price_per_million_actions"),
                           "basis": f"{actions} actions per order, volume tiers, plan fee (greater of $500/month or 10%)"},
        "step_functions_standard": {"usd_per_million_orders": standard,
                                    "source": limits.source("peer.stepfunctions.standard.per_1000_transitions"),
                                    "basis": f"{transitions} state transitions per order"},
        "step_functions_express": {"usd_per_million_orders": express,
                                   "source": limits.source("peer.stepfunctions.express.per_million_requests"),
                                   "basis": f"1 request + {billed_seconds:g} s at 64 MB per order"},
        "durable_task_scheduler": {"usd_per_million_orders": dts,
                                   "source": limits.source("peer.durabletask.actions_per_saga"),
                                   "basis": f"{dts_actions} actions per order: {units} capacity units at "
                                            f"2,000 actions/s (at most 3 per scheduler); price not found",
                                   "capacity_units": units},
    }


# --- output ---------------------------------------------------------------------------------


def _money(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:,.2f}" if value >= 0.995 or value == 0 else f"${value:.3f}"


def _shape_text(shape: Shape) -> str:
    sb = "Standard" if shape.serviceBusSku == "Standard" else (
        f"Premium {shape.serviceBusCapacity} MU" + (f", {shape.serviceBusPartitions} partitions"
                                                    if shape.serviceBusPartitions > 1 else ""))
    stamps = f"{shape.stamps} stamps × (" if shape.stamps > 1 else ""
    storage = "2 accounts" if shape.separateStateStorage else "1 account"
    shards = f"{shape.activeIndexShards} index shard" + ("s" if shape.activeIndexShards > 1 else "")
    return (f"{stamps}Service Bus {sb}; {storage}; {shards}; "
            f"≤ {shape.maximumInstanceCount} × {shape.instanceMemoryMB} MB instances" + (")" if shape.stamps > 1 else ""))


def markdown(c: Counts, limits: Limits, operations: dict, *, loads=DOC_LOADS, saga_seconds: float = 1.0,
             max_utilisation: float = MAX_UTILISATION) -> str:
    """docs/scale.md's tables, generated (``--markdown``)."""
    results = [cheapest(rate, c, limits, max_utilisation=max_utilisation) for rate in loads]
    lines = [
        f"Generated by `python -m benchmarks.capacity --markdown` from `benchmarks/results/operations.json` "
        f"(measured {operations.get('date')}, {operations.get('orders')} orders of {operations.get('steps_per_order')} "
        f"steps) and `benchmarks/azure_limits.json`; every resource at most {max_utilisation:.0%} of its limit.",
        "",
        "| orders/s | cheapest shape | saturates first (share) | Functions | Service Bus | tables | queues | "
        "total per million orders | per month |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        cost = result.cost_per_million_orders_usd
        month = cost["total"] * result.orders_per_second * MONTH_SECONDS / 1e6
        lines.append(
            f"| {result.orders_per_second:,.0f} | {_shape_text(result.shape)} | {result.bottleneck} "
            f"({result.utilisation[result.bottleneck]:.2f}) | "
            + " | ".join(_money(cost[s]) for s in SERVICES)
            + f" | **{_money(cost['total'])}** | ${month:,.0f} |"
        )
    lines += ["", "| orders/s | this app (all services) | Temporal Cloud | Step Functions Standard | "
              "Step Functions Express | Durable Task Scheduler |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for result in results:
        p = peers(result.orders_per_second, limits, saga_seconds=saga_seconds)
        dts = p["durable_task_scheduler"]
        lines.append(
            f"| {result.orders_per_second:,.0f} | {_money(result.cost_per_million_orders_usd['total'])} | "
            f"{_money(p['temporal_cloud']['usd_per_million_orders'])} | "
            f"{_money(p['step_functions_standard']['usd_per_million_orders'])} | "
            f"{_money(p['step_functions_express']['usd_per_million_orders'])} | "
            f"{_money(dts['usd_per_million_orders'])} ({dts['capacity_units']} CU) |"
        )
    return "\n".join(lines) + "\n"


def chart(path: Path, c: Counts, limits: Limits, *, saga_seconds: float = 1.0,
          max_utilisation: float = MAX_UTILISATION) -> None:
    """docs/cost.png: cost per million orders against orders/s, this app and the peers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    app = [cheapest(rate, c, limits, max_utilisation=max_utilisation).cost_per_million_orders_usd["total"]
           for rate in rates]
    series = {"this app (Functions + Service Bus + Storage)": app}
    for key, label in (("temporal_cloud", "Temporal Cloud (actions only)"),
                       ("step_functions_standard", "Step Functions Standard (transitions only)"),
                       ("step_functions_express", f"Step Functions Express ({saga_seconds:g} s per order)")):
        series[label] = [peers(rate, limits, saga_seconds=saga_seconds)[key]["usd_per_million_orders"]
                         for rate in rates]
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for label, values in series.items():
        ax.plot(rates, values, marker="o", label=label, linewidth=2.4 if label.startswith("this") else 1.4)
    ax.axhline(10, color="grey", linestyle=":", linewidth=1)
    ax.text(rates[0], 10.6, "target: $10 per million orders at 1,000 orders/s", color="grey", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("orders/s (three-step saga)")
    ax.set_ylabel("USD per million orders")
    ax.set_title("Cost per million orders, cheapest shape at each load (list prices)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "Durable Task Scheduler not drawn: its price was not found. Peers exclude their workers' "
             "compute.", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.capacity",
        description="Capacity and cost of a load on a deployment shape, from the bench's operation counts and "
                    "Azure's documented limits and prices (docs/scale.md).",
    )
    parser.add_argument("--orders-per-second", type=float, help="the load, in orders/s")
    parser.add_argument("--steps", type=int, help="steps per order (default: the measured workflow's)")
    parser.add_argument("--shape", help="key=value,... of serviceBusSku, serviceBusCapacity, serviceBusPartitions, "
                        "separateStateStorage, maximumInstanceCount, instanceMemoryMB, activeIndexShards, "
                        "serviceBusMaxConcurrentCalls, stamps (default: the cheapest shape that holds the load)")
    parser.add_argument("--max-utilisation", type=float, default=MAX_UTILISATION,
                        help="the share of each limit the cheapest shape may use (default 0.8)")
    parser.add_argument("--order-seconds", type=float, default=1.0,
                        help="an order's time from submission to its end, in Azure (default 1 s)")
    parser.add_argument("--io-ms", type=float, default=IO_MS,
                        help="what one execution waits for its storage and Service Bus calls in Azure (default 20 ms)")
    parser.add_argument("--remote-ms", type=float, default=0.0,
                        help="a remote call's time, added to each agent execution (default 0)")
    parser.add_argument("--saga-seconds", type=float, default=1.0,
                        help="the saga's duration billed by Step Functions Express (default 1 s)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--markdown", action="store_true", help="print docs/scale.md's tables (100, 1,000, 10,000 orders/s)")
    parser.add_argument("--chart", type=Path, help="write the cost chart (PNG) here")
    parser.add_argument("--operations", type=Path, default=OPERATIONS_FILE, help=argparse.SUPPRESS)
    parser.add_argument("--limits", type=Path, default=LIMITS_FILE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        operations = _load_json(args.operations, "the operations file")
        limits = Limits.load(args.limits)
        c = counts(operations, args.steps, io_ms=args.io_ms, remote_ms=args.remote_ms)
        if args.markdown or args.chart:
            if args.markdown:
                sys.stdout.write(markdown(c, limits, operations, saga_seconds=args.saga_seconds,
                                          max_utilisation=args.max_utilisation))
            if args.chart:
                chart(args.chart, c, limits, saga_seconds=args.saga_seconds, max_utilisation=args.max_utilisation)
            return 0
        if args.orders_per_second is None:
            parser.error("--orders-per-second is required (or --markdown / --chart)")
        if args.shape:
            result = evaluate(args.orders_per_second, Shape.parse(args.shape), c, limits,
                              order_seconds=args.order_seconds)
        else:
            result = cheapest(args.orders_per_second, c, limits, max_utilisation=args.max_utilisation,
                              order_seconds=args.order_seconds)
    except CapacityError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = result.to_json(c, operations)
    out["peers"] = peers(args.orders_per_second, limits, saga_seconds=args.saga_seconds)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.orders_per_second:g} orders/s of {result.steps} steps on: {_shape_text(result.shape)}")
    for resource, share in sorted(result.utilisation.items(), key=lambda item: -item[1]):
        d = result.detail[resource]
        print(f"  {resource:38} {share:6.1%}  ({d['use']:,} of {d['limit']:,} {d['unit']})")
    print(f"saturates first: {result.bottleneck}")
    cost = result.cost_per_million_orders_usd
    print("cost per million orders: " + ", ".join(f"{s} {_money(cost[s])}" for s in SERVICES)
          + f"; total {_money(cost['total'])} ({datetime.now(UTC):%Y-%m-%d}, list prices)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
