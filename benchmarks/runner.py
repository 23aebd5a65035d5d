"""Runs the phases on their local stacks and builds the report.

Stacks (each started for the phases that need it, and stopped after them):

- *bare*: Azurite and the Service Bus emulator, no hosts: ``ceiling``, ``sweep``;
- *app*: plus the fake remote service and local hosts running ``function_app.py``:
  ``latency``, ``parallel`` (the workflow with a group against the same steps in sequence),
  ``pipeline`` (1 host, then 2), ``recovery``;
- *counted*: the app stack with Azurite writing its debug log (slower, so no timing is
  taken on it): ``idle``, ``ops``, and ``parallel``'s table requests per order;
- one app stack of its own per resilience phase (faults and hosts of its own, started
  there with the settings the phase needs): ``outage``, ``unknown``, ``concurrency``
  (the app's async agents, then the sync comparator on the same stack, or on a fresh
  one if the async run left orders in flight);
- ``temporal``: an app stack of its own, stopped, then the Temporal peer's
  (benchmarks/temporal_peer: its dev server, the fake remote, worker processes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from adapters import telemetry
from adapters.store import StateStore
from benchmarks import azurite_log, capacity, ceiling, hostcpu, pipeline, recovery, resilience, sync_agents
from benchmarks.azurite_log import FRIENDLY, AzuriteLog, service_of
from benchmarks.machine import describe
from benchmarks.procstat import HOST_PROCESS, WORKERS, CpuMeter, OtherLoad, by_group, process_group
from benchmarks.report import Report, Section, kept_sections, soak_section
from benchmarks.stack import BenchStack, OrderSender
from benchmarks.sweep import IN_FLIGHT, SweepBench
from core import names
from core.workflow import PARALLEL_WORKFLOW, remotes
from devtools.paths import ROOT

PHASES = ("ceiling", "sweep", "latency", "parallel", "pipeline", "recovery", "idle", "ops", "outage", "unknown",
          "concurrency", "temporal")
#: Each phase's section title in BENCHMARKS.md (a run of some phases keeps the others' by these).
TITLES = {
    "ceiling": "Ceiling: raw operations",
    "sweep": "Supervisor sweep vs history",
    "latency": "Latency per step at a light load",
    "parallel": "Steps that run at once against the same steps in sequence",
    "pipeline": "Pipeline throughput",
    "recovery": "Recovery after a host crash",
    "idle": "Idle cost",
    "ops": "Operations per step and per order",
    "outage": "Outage of a remote service",
    "unknown": "Unknown outcomes: applied, answered too late",
    "concurrency": "Slow remotes with the worker's default pool",
    "temporal": "This stack against Temporal on the same machine",
}
#: The order of the sections in BENCHMARKS.md.
SECTION_ORDER = ("ceiling", "pipeline", "temporal", "ops", "latency", "parallel", "sweep", "recovery", "outage", "unknown",
                 "concurrency", "idle")


@dataclass
class Plan:
    """How much of each phase to run (``quick`` for a smoke run)."""

    serial_ops: int = 300
    parallel: tuple[int, int] = (2, 4)
    parallel_ops: int = 1600
    op_budget: float = 10.0
    study: tuple[tuple[int, int], ...] = ((1, 1), (1, 8), (8, 1), (2, 4))
    study_ops: int = 800
    transport_reads: int = 400
    sweep_history: tuple[int, ...] = (0, 10_000)
    sweep_repeats: int = 5
    #: Orders sent at once (each runs every step of the workflow).
    pipeline_orders: int = 600
    pipeline_timeout: float = 300.0
    #: Host processes the pipeline runs with, one after the other (each adds one host).
    pipeline_hosts: tuple[int, ...] = (1, 2)
    #: A light load: orders/s (each of several steps) well below one host's throughput.
    latency_rate: float = 3.0
    latency_seconds: float = 40.0
    #: Parallel: each workflow at latency_rate for this long, then this many orders sent at once;
    #: every remote call taking parallel_apply_seconds (a remote API's own time).
    parallel_seconds: float = 30.0
    parallel_orders: int = 300
    parallel_apply_seconds: float = 0.2
    idle_seconds: float = 60.0
    ops_orders: int = 200
    recovery_trials: int = 3
    #: Orders through a stack's hosts before anything is measured (links and connections open).
    warm_up_orders: int = 20
    #: Outage: orders sent at an even rate while payments answers 503, for this long, on these hosts.
    outage_orders: int = 300
    outage_seconds: float = 60.0
    outage_hosts: int = 2
    #: BREAKER_OPEN_SECONDS for the outage (None: the app's default, 30 s).
    outage_open_seconds: float | None = None
    #: Other app settings of the outage's hosts (none: the app's defaults). The smoke test shortens the
    #: step timeout and the supervisor's period: an attempt the outage cut short waits for its Complete-By
    #: and the next sweep (30 s + up to 15 s by default) before it is run again.
    outage_settings: dict[str, str] = field(default_factory=dict)
    #: How long the orders may take to finish once payments is back.
    outage_timeout: float = 180.0
    #: Slow remotes: orders sent at once, every call taking this long, on these hosts.
    concurrency_orders: int = 300
    concurrency_apply_seconds: float = 2.0
    concurrency_hosts: int = 2
    #: How long each of the two runs (async, sync agents) may take.
    concurrency_cap: float = 180.0
    #: Unknown outcomes: this share of the calls answered after slow_seconds (> the call timeout).
    unknown_orders: int = 300
    unknown_rate: float = 0.2
    unknown_call_timeout: float = 2.0
    unknown_slow_seconds: float = 5.0
    unknown_hosts: int = 2
    unknown_timeout: float = 180.0
    #: The Temporal peer (benchmarks/temporal_peer): orders sent at once per saturation run, with
    #: these host / worker process counts; a light load at latency_rate for peer_latency_seconds;
    #: in peer_rounds rounds, the sides taking turns to go first (the ratios' median is reported).
    peer_orders: int = 300
    peer_processes: tuple[int, ...] = (1, 2)
    peer_latency_seconds: float = 20.0
    peer_rounds: int = 3

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            serial_ops=40, parallel=(2, 2), parallel_ops=200, op_budget=3.0, study=((1, 1), (1, 4), (4, 1)),
            study_ops=120, transport_reads=80, sweep_history=(0, 1000), sweep_repeats=3, pipeline_orders=200,
            pipeline_timeout=90.0, latency_seconds=8.0, idle_seconds=20.0, ops_orders=50, recovery_trials=1,
            parallel_seconds=8.0, parallel_orders=60,
            peer_orders=100, peer_latency_seconds=8.0, peer_rounds=1,
            **cls.quick_resilience(),
        )

    @staticmethod
    def quick_resilience() -> dict:
        """The resilience phases in small: a 10 s outage with a 2 s open breaker, 20-30 orders."""
        return dict(
            outage_orders=25, outage_seconds=10.0, outage_hosts=2, outage_open_seconds=2.0, outage_timeout=60.0,
            concurrency_orders=20, concurrency_apply_seconds=0.5, concurrency_hosts=1, concurrency_cap=30.0,
            unknown_orders=30, unknown_call_timeout=0.5, unknown_slow_seconds=1.5, unknown_hosts=1,
            unknown_timeout=60.0,
        )


@dataclass
class Options:
    quick: bool = False
    phases: tuple[str, ...] = PHASES
    sweep_100k: bool = False
    out: Path | None = ROOT / "BENCHMARKS.md"
    json_out: Path | None = None
    #: Where the ops phase writes the operation counts the capacity model reads (None: nowhere).
    operations_out: Path | None = None
    keep_logs: bool = False
    plan: Plan = field(default_factory=Plan)

    def words(self) -> dict:
        chosen = None if set(self.phases) == set(PHASES) else ",".join(self.phases)
        return {"quick": self.quick, "phases": chosen, "sweep_100k": self.sweep_100k}


def _idle_part(idle_count: float, idle_seconds: float, window: float) -> float:
    """What the idle rate (``idle_count`` over ``idle_seconds``) counts over ``window`` seconds."""
    return idle_count / max(idle_seconds, 1e-9) * window


def _over_idle(during: float, idle_count: float, idle_seconds: float, window: float) -> float:
    """What a run of ``window`` seconds counted beyond the idle rate, never below 0."""
    return max(0.0, during - _idle_part(idle_count, idle_seconds, window))


def _own_table_requests(operations) -> int:
    """The orders' own table requests: all but the supervisor's index queries, which run by the clock."""
    return operations.service_total("table") - operations.by_role.get(azurite_log.INDEX_QUERY, 0)


def _ordered(sections: list[Section]) -> list[Section]:
    """The sections in the report's order (:data:`SECTION_ORDER`)."""
    order = {key: i for i, key in enumerate(SECTION_ORDER)}
    return sorted(sections, key=lambda s: order.get(s.key, len(order)))


class Runner:
    def __init__(self, options: Options, console: Console | None = None) -> None:
        self.options = options
        self.plan = Plan.quick() if options.quick else options.plan
        if options.sweep_100k and 100_000 not in self.plan.sweep_history:
            self.plan.sweep_history = tuple(self.plan.sweep_history) + (100_000,)
        self.console = console or Console()
        self.report = Report(machine=describe(), options=options.words())
        self.report.machine["load"] = f"{os.getloadavg()[0]:.1f}"
        self.logs = Path(tempfile.mkdtemp(prefix="bench-logs-"))
        self.results: dict[str, object] = {}
        self.progress: Progress | None = None

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        wanted = set(self.options.phases)
        started = time.monotonic()
        with Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, transient=True,
        ) as progress:
            self.progress = progress
            if wanted & {"ceiling", "sweep"}:
                with self._stack("bare", with_remote=False, hosts=0) as stack:
                    if "ceiling" in wanted:
                        self._phase("ceiling", self._ceiling, stack)
                    if "sweep" in wanted:
                        self._phase("sweep", self._sweep, stack)
            if wanted & {"latency", "parallel", "pipeline", "recovery"}:
                with self._stack("app", hosts=1) as stack:
                    sender = OrderSender(stack.servicebus_connection_string)
                    try:
                        pipeline.warm_up(stack, sender, "warm1-", count=self.plan.warm_up_orders)
                        if "latency" in wanted:
                            self._phase("latency", self._latency, stack, sender)
                        if "parallel" in wanted:
                            self._phase("parallel", self._parallel, stack, sender)
                        if "pipeline" in wanted:
                            self._phase("pipeline", self._pipeline, stack, sender)
                        if "recovery" in wanted:
                            self._phase("recovery", self._recovery, stack, sender)
                    finally:
                        sender.close()
            if wanted & {"idle", "ops", "parallel"}:
                debug_log = self.logs / "counted" / "azurite-debug.log"
                with self._stack("counted", hosts=1, azurite_debug_log=debug_log) as stack:
                    sender = OrderSender(stack.servicebus_connection_string)
                    try:
                        pipeline.warm_up(stack, sender, "warm-", count=self.plan.warm_up_orders)
                        log = AzuriteLog(debug_log, stack.azurite.connection_string)
                        if "idle" in wanted:
                            self._phase("idle", self._idle, stack, log)
                        if "ops" in wanted:
                            self._phase("ops", self._ops, stack, sender, log)
                        if "parallel" in wanted:
                            self._phase("parallel", self._parallel_counted, stack, sender, log)
                    finally:
                        sender.close()
            for key in ("outage", "unknown", "concurrency", "temporal"):  # each on stacks of its own
                if key in wanted:
                    self._phase(key, getattr(self, f"_{key}"))
        self.report.machine["duration"] = f"{time.monotonic() - started:.0f} s"
        self._order_sections()
        return self.report

    def finish(self) -> None:
        if self.options.out is not None:
            # The last `make soak` and retention benchmark results and the CPU profile's notes stay.
            kept = soak_section(self.options.out)
            # The sections of the phases not run this time stay as the last report had them.
            measured = {section.key for section in self.report.sections}
            not_run = {key: title for key, title in TITLES.items() if key not in measured}
            sections = _ordered(self.report.sections + kept_sections(self.options.out, not_run))
            merged = replace(self.report, sections=sections)
            text = merged.to_markdown() + (f"\n{kept}" if kept else "")
            self.options.out.write_text(text, encoding="utf-8")
        if self.options.json_out is not None:
            self.options.json_out.write_text(self.report.to_json(), encoding="utf-8")
        if self.options.operations_out is not None and "operations" in self.results:
            capacity.write_operations(self.options.operations_out, self.results["operations"])
        if self.options.keep_logs:
            self.console.print(f"logs kept in {self.logs}")
        else:
            shutil.rmtree(self.logs, ignore_errors=True)

    def _order_sections(self) -> None:
        self.report.sections = _ordered(self.report.sections)

    @contextmanager
    def _stack(self, name: str, *, hosts: int, **kwargs):
        self._status(f"starting the {name} stack")
        stack = BenchStack(log_dir=self.logs / name, **kwargs)
        stack.start(hosts=hosts)
        try:
            yield stack
        finally:
            self._status(f"stopping the {name} stack")
            stack.stop()

    def _phase(self, key: str, body, *args) -> None:
        title = TITLES[key]
        # A phase measured on two stacks (parallel) adds to its section.
        earlier = next((s for s in self.report.sections if s.key == key), None)
        section = earlier or self.report.section(key, title)
        started = time.monotonic() - (earlier.seconds or 0 if earlier else 0)
        load_before = os.getloadavg()[0]
        other = OtherLoad()
        other.start()
        try:
            body(section, *args)
        except Exception as error:  # noqa: BLE001 - one phase failing must not lose the others
            section.error = section.error or f"{type(error).__name__}: {error}".splitlines()[0]
            self.console.print(f"[red]{title} failed[/red]:\n{traceback.format_exc()}")
        section.seconds = time.monotonic() - started
        section.load = (load_before, os.getloadavg()[0])
        section.other_cores = other.stop()
        self.console.print(f"[green]✓[/green] {title} ({section.seconds:.0f} s)")

    def _status(self, text: str, total: int | None = None):
        if self.progress is None:
            return None
        for task in list(self.progress.tasks):
            self.progress.remove_task(task.id)
        return self.progress.add_task(text, total=total)

    def _counter(self, text: str, total: int | None = None):
        task = self._status(text, total)
        return lambda done: self.progress.update(task, completed=done) if self.progress is not None else None

    # -- phases ---------------------------------------------------------------------------

    def _ceiling(self, section: Section, stack: BenchStack) -> None:
        plan = self.plan
        kinds = tuple(kind for kind, *_ in ceiling.OPERATIONS)
        section.intro = ceiling.__doc__.split("\n\n", 1)[1].strip()
        tick = self._counter("ceiling: one client, one thread", len(kinds))
        serial = ceiling.measure(
            stack, processes=1, threads=1, count=plan.serial_ops, budget=plan.op_budget, plan=kinds,
            sb_queue="bench-serial", progress=tick,
        )
        processes, threads = plan.parallel
        tick = self._counter(f"ceiling: {processes} processes x {threads} threads", len(kinds))
        parallel = ceiling.measure(
            stack, processes=processes, threads=threads, count=plan.parallel_ops, budget=plan.op_budget, plan=kinds,
            sb_queue="bench-parallel", progress=tick,
        )
        self.results["ceiling"] = parallel
        rows = []
        for kind, label, per_step, per_order in ceiling.OPERATIONS:
            s, p = serial[kind], parallel[kind]
            rows.append([
                label, per_step, per_order, s.latency(50), s.per_second, p.per_second, p.cost_ms,
                p.cpu_ms("client"), p.cpu_ms("azurite"), p.cpu_ms("servicebus"), p.errors + s.errors,
            ])
        section.table(
            "operations",
            ["operation", "per step", "per order (fixed part)", "1 thread: p50 ms", "1 thread: ops/s",
             f"{processes}×{threads}: ops/s", f"{processes}×{threads}: ms/op", "client CPU ms/op",
             "Azurite CPU ms/op", "emulator CPU ms/op", "errors"],
            rows,
            note=ceiling.PER_STEP_WHY,
        )
        steps = ceiling.STEPS
        best = ceiling.steps_per_second(parallel)
        section.figure(
            "steps_per_s", f"ceiling: one step's operations, {processes} processes × {threads} threads "
            "(the pipeline's reference)", best, "steps/s",
        )
        section.figure("steps_per_s_serial", "ceiling: one step's operations, one client doing one at a time",
                       ceiling.steps_per_second(serial), "steps/s")
        orders = ceiling.orders_per_second(parallel)
        section.figure(
            "order_steps_per_s", f"ceiling with every order's fixed part too ({steps} steps per order), "
            f"{processes}×{threads}", ceiling.order_steps_per_second(parallel), "steps/s",
            note=f"{orders:.1f} orders/s" if orders else "",
        )
        section.figure("step_ms", f"wall time of one step's operations, {processes}×{threads}",
                       ceiling.cost_ms(parallel, ceiling.PER_STEP), "ms")
        section.figure("order_fixed_ms", f"wall time of an order's fixed part, {processes}×{threads}",
                       ceiling.cost_ms(parallel, ceiling.PER_ORDER), "ms")
        cores = float(self.report.machine.get("cores") or 1)
        cpu_step, cpu_fixed = ceiling.cpu_ms(parallel, ceiling.PER_STEP), ceiling.cpu_ms(parallel, ceiling.PER_ORDER)
        if cpu_step and cpu_fixed:
            step_total, fixed_total = sum(cpu_step.values()), sum(cpu_fixed.values())
            section.figure(
                "cpu_ms_per_step", "CPU per step (client + Azurite + emulator)", step_total, "ms",
                note=", ".join(f"{who} {value:.1f}" for who, value in cpu_step.items()),
            )
            section.figure(
                "cpu_ms_per_order_fixed", "CPU of an order's fixed part (client + Azurite + emulator)", fixed_total,
                "ms", note=", ".join(f"{who} {value:.1f}" for who, value in cpu_fixed.items()),
            )
            # What the stack's CPU per step is compared with: a step plus its share of the fixed part.
            self.results["cpu_per_step_in_order"] = step_total + fixed_total / steps
            self.results["cpu_bound"] = cores * 1000 / step_total
            section.figure("cpu_bound_steps_per_s", f"CPU bound: {cores:.0f} cores / CPU per step (no waiting at all)",
                           cores * 1000 / step_total, "steps/s")
        # If-Match updates: threads in one process vs processes.
        study_rows = []
        for processes, threads in plan.study:
            tick = self._counter(f"ceiling: updates with {processes}×{threads}", 2)
            result = ceiling.measure(
                stack, processes=processes, threads=threads, count=plan.study_ops, budget=plan.op_budget,
                plan=("table.transaction", "table.update"), sb_queue="bench-study", progress=tick,
            )
            update = result["table.update"]
            study_rows.append([
                f"{processes} process{'es' if processes > 1 else ''} × {threads} thread{'s' if threads > 1 else ''}",
                update.per_second, update.latency(50), update.latency(99), update.cpu_ms("client"), update.cpu_ms("azurite"),
            ])
            section.figure(f"update_ops_per_s.{processes}x{threads}", f"If-Match updates, {processes}×{threads}",
                           update.per_second, "ops/s")
        section.table(
            "If-Match MERGE updates: threads in one process vs processes",
            ["workers", "updates/s", "p50 ms", "p99 ms", "client CPU ms/op", "Azurite CPU ms/op"], study_rows,
            note="Threads of one process share one client and one interpreter lock: the client's ~1.5-2 ms of CPU "
            "per call is serialised, so more threads add waiting, not throughput. Processes add a core each.",
        )
        tick = self._counter("ceiling: transport settings", 1)
        medians = ceiling.transport_comparison(stack, reads=plan.transport_reads)
        tick(1)
        gain = (1 - medians["app"] / medians["default"]) * 100 if medians["default"] else None
        section.table(
            "client transport (point read, one thread, median)",
            ["transport", "ms"],
            [["SDK default RequestsTransport()", medians["default"]],
             ["the app's RequestsTransport(use_env_settings=False)", medians["app"]]],
        )
        section.figure("transport_gain_pct", "point read faster with the app's transport settings", gain, "%")

    def _sweep(self, section: Section, stack: BenchStack) -> None:
        from benchmarks import sweep as sweep_module

        section.intro = sweep_module.__doc__.split("\n\n", 1)[1].strip()
        bench = SweepBench(stack)
        try:
            bench.add_in_flight()
            points = []
            for history in self.plan.sweep_history:
                add = history - bench.history
                if add > 0:
                    tick = self._counter(f"sweep: writing finished orders up to {history:,}", add)
                    seconds = bench.add_history(add, progress=tick)
                    section.notes.append(
                        f"{add:,} finished orders written in {seconds:.0f} s ({add / seconds:.0f} transactions/s, "
                        f"{sweep_module.FINISHED_ROWS} rows each)."
                    )
                self._status(f"sweep: measuring beside {history:,} finished orders")
                points.append(bench.measure(self.plan.sweep_repeats))
        finally:
            bench.close()
        base = points[0]
        rows = []
        for point in points:
            rows.append([
                f"{point.history:,}", point.sweep_ms, point.supervisor_ms, point.index_query_ms, point.naive_ms,
                point.rows_examined_sweep, point.rows_examined_naive,
                ", ".join(f"{k} {v}" for k, v in sorted(point.table_ops.items())),
            ])
            section.figure(f"sweep_ms.{point.history}", f"StateStore.sweep beside {point.history:,} finished orders",
                           point.sweep_ms, "ms")
            section.figure(f"naive_ms.{point.history}", f"naive full-table filter beside {point.history:,}",
                           point.naive_ms, "ms")
        section.table(
            f"{IN_FLIGHT} in-flight orders beside N finished ones (median of {self.plan.sweep_repeats})",
            ["finished orders", "StateStore.sweep ms", "supervision.sweep ms", "index query alone ms",
             "naive filter ms", "rows read by a sweep in Azure", "rows read by the naive filter in Azure",
             "table operations per sweep"],
            rows,
            note="The naive filter is `RowKey eq 'state' and ProcessState eq 'Processing' and CompleteBy lt now` "
            "over the whole table. Azurite evaluates every query, single-partition ones included, by scanning "
            "all the table's entities in memory (its Loki store filters with a JavaScript predicate), and does so "
            "fast, while each point read costs the Python client ~1.5-2 ms of CPU: locally the naive filter is "
            "the cheaper one. Azure Table Storage has no secondary index: the naive filter reads every row of "
            "the table (billed and paged at 1,000 rows or 5 s per page), while the sweep reads one partition "
            "of the index and then one row per in-flight order, whatever the history.",
        )
        last = points[-1]
        if base.sweep_ms and last is not base:
            ratio = last.sweep_ms / base.sweep_ms
            full = last.history >= 100_000
            section.figure(
                "ratio", f"sweep({last.history:,}) / sweep(0)", ratio, "", target="≤ 2 (at 100,000)",
                met=(ratio <= 2) if full else None,
                note="" if full else "run with --sweep-100k for the 100,000 step",
            )
            section.figure("naive_ratio", f"naive({last.history:,}) / naive(0)", last.naive_ms / base.naive_ms if base.naive_ms else None)

    def _latency(self, section: Section, stack: BenchStack, sender: OrderSender) -> None:
        plan = self.plan
        steps = pipeline.STEPS
        count = int(plan.latency_rate * plan.latency_seconds)
        tick = self._counter(f"latency: {plan.latency_rate:g} orders/s for {plan.latency_seconds:g} s (1 host)", count)
        result = pipeline.steady(
            stack, sender, "lat-", rate=plan.latency_rate, seconds=plan.latency_seconds, timeout=120, progress=tick
        )
        hop = result.percentile(50, result.hops)
        section.figure("hop_p50", "p50 step hop (one step recorded → the next recorded)", hop, "s",
                       target="≤ 0.1 s", met=hop <= 0.1 if hop is not None else None)
        section.figure("hop_p95", "p95 step hop", result.percentile(95, result.hops), "s")
        section.figure("hop_p99", "p99 step hop", result.percentile(99, result.hops), "s")
        section.figure("hops", "step hops measured", len(result.hops), "")
        section.figure("first_step_p50", "p50 submission → first step recorded (orders queue, submit_order, nudge, "
                       "claim, step 1)", result.percentile(50, result.to_first_step), "s")
        section.figure("p50", f"p50 submission → Processed ({steps} steps)", result.percentile(50), "s")
        section.figure("p95", "p95 submission → Processed", result.percentile(95), "s")
        section.figure("p99", "p99 submission → Processed", result.percentile(99), "s")
        section.figure("to_created_p50", "p50 submission → state row written (orders queue + submit_order)",
                       result.percentile(50, result.to_created), "s")
        section.figure("processed", "orders Processed", f"{result.processed} / {result.orders}")
        section.intro = (
            f"{count} orders sent one by one at {plan.latency_rate:g} orders/s ({plan.latency_rate * steps:g} steps/s) "
            f"to one host. A *step hop* is the time from one step's row being recorded to the next step's, within an "
            f"order ({steps - 1} hops per order): the step-rows' UpdatedAt, the scheduler's clock as it recorded each "
            "step (and claimed the next in the same transaction). A hop is the transaction, the request to the next "
            "remote's agent, the remote call, the response and its pickup by the scheduler. Submission → Processed "
            "is from the send here to the commit of the Processed row (its Timestamp), all on this machine's clock."
        )

    def _parallel(self, section: Section, stack: BenchStack, sender: OrderSender) -> None:
        """The parallel workflow (``order-parallel``: reserve and charge at once, then ship)
        beside the same three steps in sequence (``order``), on the same host, in turns."""
        plan = self.plan
        runs = (("sequential", None), ("parallel", PARALLEL_WORKFLOW.name))
        stack.remote.set_faults(apply_seconds=plan.parallel_apply_seconds)
        try:
            light, burst = {}, {}
            for name, workflow in runs:
                count = int(plan.latency_rate * plan.parallel_seconds)
                tick = self._counter(f"parallel: {name}, {plan.latency_rate:g} orders/s for {plan.parallel_seconds:g} s",
                                     count)
                light[name] = pipeline.steady(stack, sender, f"pl{name[:3]}-", rate=plan.latency_rate,
                                              seconds=plan.parallel_seconds, timeout=120, progress=tick,
                                              workflow=workflow)
            for name, workflow in runs:
                tick = self._counter(f"parallel: {name}, {plan.parallel_orders} orders at once",
                                     plan.parallel_orders * pipeline.STEPS)
                burst[name] = pipeline.throughput(stack, sender, f"pb{name[:3]}-", plan.parallel_orders,
                                                  timeout=plan.pipeline_timeout, progress=tick, workflow=workflow)
        finally:
            stack.remote.set_faults(apply_seconds=0.0)
        for name, _ in runs:
            result = light[name]
            section.figure(f"p50.{name}", f"p50 submission → Processed, {name}", result.percentile(50), "s",
                           note=f"{result.processed}/{result.orders} Processed")
            section.figure(f"p95.{name}", f"p95 submission → Processed, {name}", result.percentile(95), "s")
            section.figure(f"orders_per_s.{name}", f"orders/s, {plan.parallel_orders} sent at once, {name}",
                           burst[name].per_second, "orders/s",
                           note=f"{burst[name].processed}/{burst[name].orders} Processed")

        def ratio(a, b):
            return a / b if a and b else None

        p50 = ratio(light["parallel"].percentile(50), light["sequential"].percentile(50))
        section.figure("p50_ratio", "p50 parallel / sequential", p50, "", target="≤ 0.75",
                       met=(p50 <= 0.75) if p50 is not None else None)
        section.figure("p95_ratio", "p95 parallel / sequential",
                       ratio(light["parallel"].percentile(95), light["sequential"].percentile(95)), "")
        section.figure("throughput_ratio", "orders/s parallel / sequential",
                       ratio(burst["parallel"].per_second, burst["sequential"].per_second), "")
        section.intro = (
            f"The same three steps (reserve, charge, ship) as the workflow `order` runs them, one after the other, and "
            f"as `{PARALLEL_WORKFLOW.name}` runs them: reserve and charge at once (a group: core/workflow.py "
            f"`Parallel`), then ship. One host; every remote call takes {plan.parallel_apply_seconds:g} s at the fake "
            f"remote (a remote API's own time, which a group overlaps). First a light load, "
            f"{plan.latency_rate:g} orders/s for {plan.parallel_seconds:g} s of each workflow in turn (latency from "
            f"the send to the Processed commit), then {plan.parallel_orders} orders of each sent at once (orders/s "
            "from the first send to the last Processed). Then, on the counted stack (no timing there), the table "
            "requests per order of each workflow."
        )

    def _parallel_counted(self, section: Section, stack: BenchStack, sender: OrderSender, log: AzuriteLog) -> None:
        """Table requests per order of each workflow, counted by Azurite as the ops phase
        counts them (the idle background subtracted), the two runs one after the other."""
        count = self.plan.ops_orders
        idle, idle_seconds = self._background("parallel", log)
        store = StateStore(stack.table())
        per_order = {}
        for name, workflow, prefix in (("sequential", None, "pcs-"), ("parallel", PARALLEL_WORKFLOW.name, "pcp-")):
            tick = self._counter(f"parallel: {count} orders, {name}, counted at the servers", count * pipeline.STEPS)
            effects_before = stack.remote.effects()["total"]
            start, t0 = log.mark(), time.monotonic()
            sender.send([f"{prefix}{i:05d}" for i in range(count)], workflow=workflow)
            if not pipeline.wait_done(stack, store, prefix, count, effects_before, timeout=self.plan.pipeline_timeout,
                                      progress=tick):
                raise pipeline.Timeout(f"the {count} orders ({name}) were not all processed")
            during = log.since(start, log.mark())
            window = time.monotonic() - t0

            def net(during_count: float, idle_count: float) -> float:
                return _over_idle(during_count, idle_count, idle_seconds, window) / count

            per_order[name] = net(_own_table_requests(during), _own_table_requests(idle))
            written = net(sum(during.writes_by_role.values()), sum(idle.writes_by_role.values()))
            reads = net(*(sum(ops.by_role.get(role, 0) for role in (azurite_log.POINT_READ, azurite_log.QUERY))
                          for ops in (during, idle)))
            sweeps = net(during.by_role.get(azurite_log.INDEX_QUERY, 0), idle.by_role.get(azurite_log.INDEX_QUERY, 0))
            section.figure(f"table_per_order.{name}", f"table requests per order, {name}", per_order[name], "",
                           note=f"{count} orders, counted by Azurite; of them {reads:.2f} reads; {written:.2f} "
                           f"entities in the writes (a transaction that lost a race counted too); the supervisor's "
                           f"index queries left out ({sweeps:.2f} per order over the idle rate)")
        ratio = per_order["parallel"] / per_order["sequential"] if per_order["sequential"] else None
        section.figure("table_ratio", "table requests per order, parallel / sequential", ratio, "", target="≤ 1",
                       met=(round(ratio, 2) <= 1) if ratio is not None else None)

    def _pipeline(self, section: Section, stack: BenchStack, sender: OrderSender) -> None:
        plan = self.plan
        ceiling_results = self.results.get("ceiling")
        best = ceiling.steps_per_second(ceiling_results) if ceiling_results else None
        like = ceiling.order_steps_per_second(ceiling_results) if ceiling_results else None
        steps = pipeline.STEPS
        rows = []
        for hosts in plan.pipeline_hosts:
            if hosts > len(stack.alive_hosts()):
                self._status(f"pipeline: starting {hosts - len(stack.alive_hosts())} more host(s)")
                stack.start_hosts(hosts - len(stack.alive_hosts()))
                pipeline.warm_up(stack, sender, f"warm{hosts}-", count=self.plan.warm_up_orders)
            tick = self._counter(f"pipeline: {plan.pipeline_orders} orders × {steps} steps, {hosts} host(s)",
                                 plan.pipeline_orders * steps)
            result = pipeline.throughput(stack, sender, f"run{hosts}-", plan.pipeline_orders,
                                         timeout=plan.pipeline_timeout, progress=tick)
            key = f"{hosts}_host" + ("s" if hosts > 1 else "")
            hosts_text = f"{hosts} host{'s' if hosts > 1 else ''}"
            section.figure(f"steps_per_s.{key}", f"throughput, {hosts} host process{'es' if hosts > 1 else ''}",
                           result.steps_per_second, "steps/s",
                           note=f"{result.per_second or 0:.1f} orders/s; {result.processed}/{result.orders} Processed")
            section.figure(f"steps_per_s_99.{key}", f"throughput to 99% of the orders, {hosts_text}",
                           result.steps_per_second_99, "steps/s", note="a few stragglers do not count")
            ratio = result.steps_per_second / best if best and result.steps_per_second else None
            section.figure(f"ratio.{key}", f"{hosts_text} / ceiling of one step's operations", ratio, "",
                           target="≥ 0.5", met=(ratio >= 0.5) if ratio is not None else None)
            like_ratio = result.steps_per_second / like if like and result.steps_per_second else None
            section.figure(f"ratio_with_fixed.{key}", f"{hosts_text} / ceiling with each order's fixed part "
                           "(like for like)", like_ratio, "", target="≥ 0.5",
                           met=(like_ratio >= 0.5) if like_ratio is not None else None)
            bound = self.results.get("cpu_bound")
            if bound and result.steps_per_second:
                section.figure(f"ratio_cpu_bound.{key}", f"{hosts_text} / CPU-bound ceiling",
                               result.steps_per_second / bound, "")
            done = max(result.steps, 1)
            groups = by_group(result.cpu)
            cpu = {name: value / done * 1000 for name, value in groups.items()}
            stack_cpu = sum(cpu.get(name) or 0 for name in (WORKERS, HOST_PROCESS, "azurite", "servicebus"))
            ceiling_cpu = self.results.get("cpu_per_step_in_order")
            if ceiling_cpu and stack_cpu and result.steps:
                section.figure(f"cpu_efficiency.{key}",
                               f"{hosts_text}: ceiling CPU per step / the stack's CPU per step",
                               ceiling_cpu / stack_cpu, "",
                               note="both with the order's fixed part spread over its steps; the stack's: the worker "
                               "and host processes, Azurite, the emulator; insensitive to other load")
            workers = sum(1 for name in result.cpu if process_group(name) == WORKERS)
            rows.append([
                f"{hosts}", result.steps_per_second, result.per_second, result.seconds, result.percentile(50),
                cpu.get(WORKERS), cpu.get(HOST_PROCESS),
                groups.get(WORKERS, 0) / result.wall / workers if result.wall and workers else None,
                groups.get(HOST_PROCESS, 0) / result.wall / hosts if result.wall else None, cpu.get("azurite"),
                cpu.get("servicebus"), sum(result.cpu.values()) / result.wall if result.wall else None,
                ", ".join(f"{name} {n}" for name, n in sorted(result.slow_invocations.items())) or "none",
                result.slowest_ms / 1000,
            ])
        section.table(
            f"{plan.pipeline_orders} orders of {steps} steps sent at once, no faults",
            ["hosts", "steps/s", "orders/s", "seconds", "p50 send → Processed s (queued in the burst)",
             "worker processes CPU ms/step", "host processes CPU ms/step", "cores busy per worker process",
             "cores busy per host process", "Azurite CPU ms/step", "emulator CPU ms/step", "cores busy (stack)",
             "invocations ≥ 5 s", "slowest invocation s"],
            rows,
            note="CPU per step is each process's CPU over the run divided by the steps done (orders × "
            f"{steps}), so it carries each order's fixed part (submission, the first claim) spread over its steps. "
            "Each host runs one worker process: the workers' CPU is the app side (Microsoft's Python runtime "
            "running the functions: message conversion, the functions, their logging and the agents' HTTP "
            "calls, which the ceiling does not have); the host process's is the local host standing in for "
            "Azure's .NET Functions host (triggers, settlement, outputs). Each is one Python process, bounded by "
            "about one core. The fake remote service and this benchmark share a third process (not counted in "
            "'cores busy'). Invocations of 5 s or more (the agents' excepted: their time is the remote service's) "
            "are counted from the host logs: a stall there shows as a long tail in the throughput to the last "
            "order but not in the throughput to 99%.",
        )
        section.intro = (
            f"Steps/s from the first send to the last Processed commit: {plan.pipeline_orders} orders sent at once, "
            f"each running the {steps} steps of the workflow, with the app's default settings (host.json: 16 "
            "concurrent Service Bus calls per trigger, storage-queue batches of 16). The ratio is against the "
            "ceiling measured in the same run: one step's raw operations (the target), and, like for like, with "
            "every order's fixed part (submission, the first claim, the nudge, the orders message) spread over "
            "its steps."
        )

    def _recovery(self, section: Section, stack: BenchStack, sender: OrderSender) -> None:
        section.intro = recovery.__doc__.split("\n\n", 1)[1].strip()
        self._status(f"recovery: restarting hosts with a {recovery.STEP_TIMEOUT:g} s step timeout and a 2 s supervisor")
        stack.stop_hosts()
        stack.settings.update(recovery.SETTINGS)
        stack.start_hosts(1)
        pipeline.warm_up(stack, sender, "warm3-", count=self.plan.warm_up_orders)
        trials = []
        tick = self._counter("recovery: trials", self.plan.recovery_trials)
        for i in range(self.plan.recovery_trials):
            trials.append(recovery.trial(stack, sender, f"crash-{i:03d}"))
            tick(i + 1)
        steps = len(recovery.CURRENT.steps)
        held = recovery.HELD
        rows = []
        for t in trials:
            rows.append([
                t.order_id, t.killed - t.claimed, t.complete_by - t.killed,
                (t.reset - t.complete_by) if t.reset else None,
                (t.redone - t.reset) if t.redone and t.reset else None,
                (t.processed - t.redone) if t.processed and t.redone else None,
                t.from_kill, t.from_claim, t.effects, t.twice,
            ])
        section.table(
            "trials (seconds)",
            ["order", f"{held.name} claimed → kill", "kill → CompleteBy", "CompleteBy → reset (supervisor tick)",
             f"reset → {held.name} recorded (backoff, queue poll, the step)",
             f"{held.name} recorded → Processed (the steps after it)", "kill → Processed", "claim → Processed",
             "actions applied at the remotes", "applied twice"],
            rows,
            note=f"The order is held at step {recovery.HELD_INDEX + 1} of {steps} ({held.name} at {held.remote}). "
            f"Settings: STEP_TIMEOUT_SECONDS={recovery.STEP_TIMEOUT:g}, SUPERVISOR_SCHEDULE='*/2 * * * * *', the "
            "default RETRY_BACKOFF_BASE_SECONDS=2 (first retry nudged 2 s after the reset) and host.json "
            "maxPollingInterval 2 s (an idle queue is polled at most every 2 s). Target: "
            f"{recovery.STEP_TIMEOUT:g} + {recovery.SUPERVISOR_PERIOD:g} + 2 = {recovery.TARGET:g} s.",
        )
        from_kill = [t.from_kill for t in trials if t.from_kill is not None]
        from_claim = [t.from_claim for t in trials if t.from_claim is not None]
        worst_kill = max(from_kill) if len(from_kill) == len(trials) else None
        worst_claim = max(from_claim) if len(from_claim) == len(trials) else None
        section.figure("from_kill", "kill → Processed on the other host (worst trial)", worst_kill, "s",
                       target=f"≤ {recovery.TARGET:g} s", met=(worst_kill <= recovery.TARGET) if worst_kill else None)
        section.figure("from_claim", "claim → Processed (a kill at the worst moment; worst trial)", worst_claim, "s",
                       target=f"≤ {recovery.TARGET:g} s", met=(worst_claim <= recovery.TARGET) if worst_claim else None)
        worst = max(trials, key=lambda t: (abs(t.effects - steps) + t.twice, t.twice), default=None)
        section.figure(
            "effects", "remote actions applied per recovered order (worst trial)",
            worst.effects if worst else None, "", target=f"{steps}, none twice",
            met=all(t.effects == steps and t.twice == 0 for t in trials) if trials else None,
        )

    def _idle(self, section: Section, stack: BenchStack, log: AzuriteLog) -> None:
        seconds = self.plan.idle_seconds
        self._status(f"idle: {seconds:g} s with no orders (1 host)")
        start, sb_before, t0 = log.mark(), stack.sb_counts(), time.monotonic()
        deadline = t0 + seconds
        while time.monotonic() < deadline:  # a measurement window, nothing to wait for
            time.sleep(min(1.0, deadline - time.monotonic()))
        end, sb_after, t1 = log.mark(), stack.sb_counts(), time.monotonic()
        minutes = (t1 - t0) / 60
        operations = log.since(start, end)
        self.results["idle"] = (operations, t1 - t0)
        sb = pipeline.delta(sb_after, sb_before)
        rows = [[FRIENDLY.get(op, op), n / minutes] for op, n in sorted(operations.by_operation.items())]
        rows += [[f"Service Bus {kind}", n / minutes] for kind, n in sorted(sb.items())]
        section.table(f"per minute, one host, no orders ({seconds:g} s window)", ["operation", "per minute"], rows)
        storage = operations.service_total("table") + operations.service_total("queue")
        section.figure("storage_per_min", "storage operations per minute", storage / minutes, "/min",
                       note=f"table {operations.service_total('table') / minutes:.1f}, "
                       f"queue {operations.service_total('queue') / minutes:.1f}")
        section.figure("storage_per_month", "storage operations per month (30 days) per idle instance",
                       storage / minutes * 60 * 24 * 30, "")
        receive_calls = sb.get("frame.flow", 0)
        section.figure("servicebus_receive_calls_per_min", "Service Bus receive calls (AMQP flow frames) per minute",
                       receive_calls / minutes, "/min")
        section.figure("servicebus_frames_per_min", "Service Bus AMQP frames per minute (all kinds)",
                       sum(n for k, n in sb.items() if k.startswith("frame.")) / minutes, "/min")
        section.intro = (
            "What one host costs with nothing to do: the supervisor's timer (default every 15 s: one index "
            "query each), the storage-queue poller (backs off to host.json maxPollingInterval, 2 s) and the "
            f"Service Bus receivers (one per Service Bus trigger: orders, the {len(remotes())} remotes' request "
            "queues and agent-responses; one receive call each, waiting up to 0.5 s, in the local host; the "
            "Functions host's own receivers hold a long-lived link instead). Counted at the servers."
        )

    def _background(self, phase: str, log: AzuriteLog):
        """The storage requests of the counted stack at rest, and over how long, to subtract:
        the idle phase's, or a short idle window now."""
        if "idle" in self.results:
            return self.results["idle"]
        self._status(f"{phase}: 10 s idle window for the background rate")
        start, t0 = log.mark(), time.monotonic()
        while time.monotonic() < t0 + 10:  # a measurement window, nothing to wait for
            time.sleep(0.5)
        return log.since(start, log.mark()), time.monotonic() - t0

    def _ops(self, section: Section, stack: BenchStack, sender: OrderSender, log: AzuriteLog) -> None:
        count = self.plan.ops_orders
        steps_per_order = pipeline.STEPS
        idle, idle_seconds = self._background("ops", log)
        idle_end = log.mark()
        tick = self._counter(f"ops: {count} orders × {steps_per_order} steps counted at the servers (1 host)",
                             count * steps_per_order)
        sb_before = stack.sb_counts()
        effects_before = stack.remote.effects()["total"]
        logs = list(stack.host_logs)
        offsets = [path.stat().st_size for path in logs]
        telemetry_files = [(path, path.stat().st_size if path.exists() else 0)
                           for path in (*stack.spans_files, *stack.metrics_files)]
        meter = CpuMeter(stack.pids)
        meter.start()
        t1 = time.monotonic()
        sender.send([f"ops-{i:05d}" for i in range(count)])
        store = StateStore(stack.table())
        if not pipeline.wait_done(stack, store, "ops-", count, effects_before, timeout=self.plan.pipeline_timeout,
                                  progress=tick):
            raise pipeline.Timeout(f"the {count} orders were not all processed")
        steps = stack.remote.effects()["total"] - effects_before  # forward actions applied: the steps done
        expected = f"settle.accepted {names.AGENT_RESPONSES_QUEUE}"
        deadline = time.monotonic() + 10
        while pipeline.delta(stack.sb_counts(), sb_before).get(expected, 0) < steps and time.monotonic() < deadline:
            time.sleep(0.1)
        cpu = meter.stop()
        end, t2 = log.mark(), time.monotonic()
        sb = pipeline.delta(stack.sb_counts(), sb_before)
        time.sleep(max(telemetry.LOCAL_SPAN_DELAY_MS, telemetry.LOCAL_METRIC_INTERVAL_MS) / 1000 + 1)  # the last exports
        spans_files = set(stack.spans_files)
        telemetry_counts = capacity.telemetry_record(
            orders=count, prefix="ops-", processes=len(stack.hosts),
            spans=[(path, offset) for path, offset in telemetry_files if path in spans_files],
            metrics=[(path, offset) for path, offset in telemetry_files if path not in spans_files],
            logs=list(zip(logs, offsets)),
        )
        operations = log.since(idle_end, end)
        invoked = pipeline.invocations(logs, offsets)
        window = t2 - t1

        def background(idle_count: int) -> float:
            return _idle_part(idle_count, idle_seconds, window)

        def net(during: int, idle_count: int) -> float:
            return _over_idle(during, idle_count, idle_seconds, window)

        # Storage requests by operation, as Azurite names them.
        rows = []
        net_total: Counter[str] = Counter()
        for op, n in sorted(operations.by_operation.items(), key=lambda item: (service_of(item[0]), item[0])):
            net_total[service_of(op)] += net(n, idle.by_operation.get(op, 0))
            rows.append([FRIENDLY.get(op, op), service_of(op), n, background(idle.by_operation.get(op, 0)),
                         net(n, idle.by_operation.get(op, 0)) / count])
        section.table(
            f"storage operations counted by Azurite during {count} orders ({steps} steps)",
            ["operation", "service", "during the run", "idle background (same time)", "per order"], rows,
            note="Background is the idle rate measured just before, over the run's duration; 'per order' is "
            "(during − background) / orders.",
        )
        # Table requests by their role in the app's layout: a step's, or the order's fixed part.
        step_roles = {azurite_log.STEP_TRANSACTION}
        per_step_requests = per_step_writes = fixed_requests = fixed_writes = reads = 0.0
        role_rows = []
        for role in [*azurite_log.ROLES, *sorted(set(operations.by_role) - set(azurite_log.ROLES))]:
            n = operations.by_role.get(role, 0)
            if not n:
                continue
            requests = net(n, idle.by_role.get(role, 0))
            written = net(operations.writes_by_role.get(role, 0), idle.writes_by_role.get(role, 0))
            if role in step_roles:
                per_step_requests += requests
                per_step_writes += written
            else:
                fixed_requests += requests
                fixed_writes += written
            if role in azurite_log.READS:
                reads += requests
            part = "per step" if role in step_roles else "fixed (per order)"
            divisor = steps if role in step_roles else count
            role_rows.append([role, part, n, requests / divisor, written / divisor])
        section.table(
            "table requests by role (counted by Azurite, background subtracted)",
            ["role", "part", "during the run", "requests per step or per order",
             "entities written per step or per order"],
            role_rows,
            note="Roles come from the request URL and, for a transaction, its sub-requests as Azurite logs them "
            "(benchmarks/azurite_log.py): a transaction that writes a step's row is the step's; everything else is "
            "the order's fixed part. A transaction is one request (one billed transaction in Azure) that writes "
            "several entities.",
        )
        failed = operations.failed()
        if failed:
            section.table("storage requests answered with an error status", ["operation status", "count"],
                          [[k, v] for k, v in sorted(failed.items())])
        steps = max(steps, 1)
        step_reads = sum(
            net(operations.by_role.get(role, 0), idle.by_role.get(role, 0))
            for role in (azurite_log.POINT_READ, azurite_log.QUERY)
        ) / steps
        # One decimal where a background subtraction is involved: it is an estimate.
        section.figure("table_writes_per_step", "table writes per step (entities written by the step's requests)",
                       per_step_writes / steps, "", target="≤ 2", met=round(per_step_writes / steps, 1) <= 2,
                       note=f"in {per_step_requests / steps:.2f} requests (transactions)")
        section.figure("table_reads_per_step", "table reads per step (point reads and partition queries, all "
                       "attributed to the steps)", step_reads, "", target="≤ 1", met=round(step_reads, 1) <= 1)
        section.figure("table_requests_per_step", "table requests per step", per_step_requests / steps, "")
        section.figure("table_fixed_per_order", "table requests per order, fixed part", fixed_requests / count, "",
                       note=f"{fixed_writes / count:.2f} entities written; the supervisor's index queries included")
        section.figure("table_per_order", f"table requests per order ({steps_per_order} steps)",
                       net_total["table"] / count, "")
        section.figure("queue_per_order", "storage-queue operations per order (fixed part: the nudge)",
                       net_total["queue"] / count, "")
        # Service Bus: the orders queue is the order's fixed part; request and response queues are the steps'.
        step_queues = (*(names.requests_queue(remote) for remote in remotes()), names.AGENT_RESPONSES_QUEUE)
        queues = (names.ORDERS_QUEUE, *step_queues)
        sb_rows, totals = [], {"step": Counter(), "fixed": Counter()}
        columns = ("sends", "deliveries", "completes", "released", "renewals")
        for queue in queues:
            counts = {
                "sends": sb.get(f"enqueue {queue}", 0),
                "deliveries": sb.get(f"deliver {queue}", 0),
                "completes": sb.get(f"settle.accepted {queue}", 0),
                "released": sb.get(f"settle.released {queue}", 0),
                "renewals": sum(
                    v for k, v in sb.items() if k.startswith("management.renew") and k.endswith(f" {queue}")
                ),
            }
            totals["step" if queue in step_queues else "fixed"].update(counts)
            sb_rows.append([queue, *(counts[k] / count for k in columns)])
        for part, divisor in (("step", steps), ("fixed", count)):
            label = "per step (request + response queues)" if part == "step" else "per order, fixed part (orders)"
            sb_rows.append([label, *(totals[part][k] / divisor for k in columns)])
        section.table(
            "Service Bus operations, counted by the emulator (per order unless said)",
            ["queue", "messages sent", "deliveries", "completes", "deliveries released unread", "lock renewals"],
            sb_rows,
            note="Messages are counted one by one (the submitter sends orders in batches of up to 100). "
            "A released delivery is a message the SDK's receive call got after its wait ended and handed "
            "back; it is delivered again (not a failure, but broker work).",
        )
        per_step = {k: totals["step"][k] / steps for k in ("sends", "deliveries", "completes")}
        fixed = {k: totals["fixed"][k] / count for k in ("sends", "deliveries", "completes")}
        section.figure("servicebus_per_step", "Service Bus operations per step (sends + deliveries + completes)",
                       sum(per_step.values()), "", note=", ".join(f"{k} {v:.2f}" for k, v in per_step.items()))
        section.figure("servicebus_fixed_per_order", "Service Bus operations per order, fixed part",
                       sum(fixed.values()), "", note=", ".join(f"{k} {v:.2f}" for k, v in fixed.items()))
        every = sum(totals["step"][k] + totals["fixed"][k] for k in ("sends", "deliveries", "completes"))
        section.figure("servicebus_per_order", f"Service Bus operations per order ({steps_per_order} steps)",
                       every / count, "")
        section.figure("servicebus_frames_per_order", "Service Bus AMQP frames from clients per order",
                       sum(n for k, n in sb.items() if k.startswith("frame.")) / count, "")
        section.figure("steps", "steps done (forward actions applied at the remotes)", steps, "",
                       note=f"{count} orders × {steps_per_order} steps = {count * steps_per_order}")
        self.results["operations"] = capacity.operations_record(
            machine=self.report.machine, options=self.options.words(), orders=count, steps=steps,
            steps_per_order=steps_per_order,
            table={"per_step": {"requests": per_step_requests / steps, "entities_written": per_step_writes / steps,
                                "reads": step_reads},
                   "fixed": {"requests": fixed_requests / count, "entities_written": fixed_writes / count},
                   "by_role": {row[0]: {"part": "step" if row[1] == "per step" else "fixed", "requests": row[3],
                                        "entities_written": row[4]} for row in role_rows}},
            queue={FRIENDLY.get(op, op): net(n, idle.by_operation.get(op, 0)) / count
                   for op, n in operations.by_operation.items() if service_of(op) == "queue"},
            servicebus={"per_step": {k: totals["step"][k] / steps for k in columns},
                        "fixed": {k: totals["fixed"][k] / count for k in columns}},
            invocations=invoked,
            cpu_seconds=cpu, payload_bytes=ceiling.payload_bytes(stack.settings_object().step_defaults()),
            idle=self.results.get("idle"), telemetry=telemetry_counts,
        )
        section.figure("spans_per_order", "the app's spans per order (kept in Azure at traceSampleRatio)",
                       telemetry_counts["spans_per_order"], "",
                       note=f"{telemetry_counts['span_bytes_per_order']:,.0f} bytes per order as the spans files "
                            "write them (JSON lines)")
        hostcpu.report(section, cpu, count)
        section.intro = (
            f"{count} orders of {steps_per_order} steps with no faults through one host, counted at the servers: "
            "Azurite's debug log (one line per request; a transaction is one request, as it is one billed "
            "transaction in Azure) and the Service Bus emulator's own operation counters "
            "(tools/servicebus_emulator, --stats-stdin). A step's cost and the order's fixed part are counted "
            "apart: table requests by their role (the step's transaction, or the rest), Service Bus by queue "
            "(the remotes' request queues and agent-responses, or orders). The same counts, with the CPU per order "
            "of the worker and host processes and the function executions per order, go to "
            "benchmarks/results/operations.json, which the capacity and cost model reads (`python -m "
            "benchmarks.capacity`, docs/scale.md)."
        )

    # -- resilience (benchmarks/resilience.py): each phase on stacks of its own ----------------

    def _outage(self, section: Section) -> None:
        plan = self.plan
        with self._stack("outage", hosts=0) as stack:
            sender = OrderSender(stack.servicebus_connection_string)
            try:
                r = resilience.outage(
                    stack, sender, orders=plan.outage_orders, seconds=plan.outage_seconds, hosts=plan.outage_hosts,
                    open_seconds=plan.outage_open_seconds, warm_up=plan.warm_up_orders, timeout=plan.outage_timeout,
                    settings=plan.outage_settings,
                    status=self._counter,
                )
            finally:
                sender.close()
        down = resilience.DOWN
        undone = r.states["Compensated"] + r.states["Error"]
        section.figure(
            "compensated_or_error", "orders ending Compensated or Error", undone, "", target="0", met=undone == 0,
            note=f"Processed {r.states['Processed']} / {r.orders}" + (
                f", {r.states['unfinished']} unfinished {plan.outage_timeout:g} s after {down} was back"
                if r.states["unfinished"] else ""),
        )
        section.figure(
            "calls_per_host_period", f"calls to {down} while down, per host per open period (all calls / "
            f"({r.hosts} hosts × {r.periods:.1f} periods))", r.per_host_period, "", target="≤ 5",
            met=r.per_host_period <= 5,
            note=f"{r.calls_down} calls in {r.outage_seconds:.0f} s, BREAKER_OPEN_SECONDS={r.open_seconds:g}",
        )
        after = None if r.calls_before_open is None else r.calls_down - r.calls_before_open
        section.figure(
            "calls_after_open_per_host_period", f"calls to {down} after every host's breaker had opened, per "
            "host per open period", None if after is None else after / (r.hosts * r.periods), "",
            note="a host's breaker never opened" if after is None else
            f"{r.calls_before_open} calls before (the requests in flight as the breakers opened), {after} after",
        )
        section.figure("back_to_processed", f"{down} back → every order Processed", r.back_to_done, "s",
                       target="≤ 30 s", met=r.back_to_done is not None and r.back_to_done <= 30)
        per_host = " / ".join
        section.figure("openings", "breaker openings (closed → open), per host",
                       per_host(str(b.openings) for b in r.breakers))
        section.figure("half_open_failures", "half-open trials that failed (→ open again), per host",
                       per_host(str(b.trials_failed) for b in r.breakers),
                       note="and that succeeded (→ closed): " + per_host(str(b.trials_ok) for b in r.breakers))
        section.figure("lines_postponed", "lines postponed (the scheduler's 'postponed for': back to Pending, "
                       "nudged after the wait)", r.lines_postponed, "",
                       note=f"{r.orders_postponed} orders postponed at least once")
        section.figure("failures", "failed attempts counted on the orders' lines", r.failures, "")
        section.figure("dropped", "attempts the agents ended unanswered (calls ran out, or the breaker refused a "
                       "retry after the attempt's own call failed: counted at complete-by)",
                       sum(b.dropped for b in r.breakers), "")
        section.table(
            f"the breakers for {down}, per host (from the host logs)",
            ["host", "first opened (s after the outage began)", "openings", "half-open trials failed",
             "half-open trials succeeded", f"closed again (s after {down} was back)",
             "requests its agent answered 'postponed' (no call)", "attempts ended unanswered"],
            [[b.name, b.first_open, b.openings, b.trials_failed, b.trials_ok, b.closed_after_back,
              b.postponed_requests, b.dropped] for b in r.breakers],
            note=f"The fake remote counts calls per service, not per caller, so the per-host figure is the total "
            "over hosts × open periods (outage / BREAKER_OPEN_SECONDS = "
            f"{r.outage_seconds:.0f} / {r.open_seconds:g}). "
            "The host logs split it in time: each breaker change is a timestamped line ('circuit breaker for "
            f"{down}: closed -> open'), as is every call the fake remote answers (its log, in this process): the calls "
            "answered before the "
            "last host's first opening are the burst of requests already past the breaker; after it, a host calls "
            "only for a half-open trial (one call: the table's trials).",
        )
        changed = {**({} if plan.outage_open_seconds is None else
                      {"BREAKER_OPEN_SECONDS": f"{plan.outage_open_seconds:g}"}), **plan.outage_settings}
        settings = "the app's defaults" + (
            f" but {', '.join(f'{name}={value}' for name, value in changed.items())}" if changed else "")
        section.intro = (
            f"{down} answers 503 to every call for {plan.outage_seconds:g} s (the fake remote's `transient` rate "
            f"1.0) while {r.orders} orders of {pipeline.STEPS} steps are sent at an even rate over that time to "
            f"{r.hosts} hosts with {settings} (breaker: {resilience.DEFAULT_OPEN_SECONDS:g} s open, opened by half of at least 5 "
            "distinct requests failing within 30 s; step timeout 30 s; supervisor every 15 s; 10 postponements in a row count one failure); then "
            f"{down} is back, and every order is waited for ({plan.outage_timeout:g} s at most). Targets: no order "
            f"undone or in Error, at most 5 calls to {down} per host per open period while it is down, every order "
            f"Processed within 30 s of {down}'s return."
        )

    def _unknown(self, section: Section) -> None:
        plan = self.plan
        with self._stack("unknown", hosts=0) as stack:
            sender = OrderSender(stack.servicebus_connection_string)
            try:
                r = resilience.unknown_outcomes(
                    stack, sender, orders=plan.unknown_orders, hosts=plan.unknown_hosts, rate=plan.unknown_rate,
                    call_timeout=plan.unknown_call_timeout, slow_seconds=plan.unknown_slow_seconds,
                    warm_up=plan.warm_up_orders, timeout=plan.unknown_timeout, status=self._counter,
                )
            finally:
                sender.close()
        for s in r.services:
            label = f"POSTs per action applied at {s.service}"
            if s.lookup:
                section.figure(f"posts_per_action.{s.service}", f"{label} (offers the lookup)", s.posts_per_action,
                               "", target="≤ 1.05",
                               met=s.posts_per_action is not None and s.posts_per_action <= 1.05,
                               note=f"{s.lookups_per_action or 0:.2f} lookups per action")
            else:
                section.figure(f"posts_per_action.{s.service}", f"{label} (no lookup: sent again with the same key)",
                               s.posts_per_action, "", note=f"{s.replays} replays")
        section.figure("lookups_per_action", "lookups per action applied, where offered",
                       sum(s.lookups for s in r.services if s.lookup) / max(1, sum(s.applied for s in r.services
                                                                                   if s.lookup)), "")
        section.figure("twice", "actions applied twice", r.twice, "", target="0", met=r.twice == 0)
        section.figure("processed", "orders Processed", f"{r.states['Processed']} / {r.orders}",
                       note=", ".join(f"{k} {v}" for k, v in sorted(r.states.items()) if k != "Processed"))
        section.figure("seconds", "first send → last order final", r.seconds, "s",
                       note=f"breaker openings {r.breaker_openings}, lines postponed {r.lines_postponed}, "
                       f"requests dropped past complete-by {r.dropped_steps}")
        section.table(
            "calls per service, counted at the fake remote",
            ["service", "lookup by key", "actions applied", "POSTs", "POSTs per action", "answered too late (slow)",
             "replays", "lookups", "lookups per action"],
            [[s.service, "yes" if s.lookup else "no", s.applied, s.posts, s.posts_per_action, s.slow, s.replays,
              s.lookups, s.lookups_per_action] for s in r.services],
            note="A call answered too late was applied all the same; the agent's call timed out, so its outcome "
            "is unknown. Where the service offers `GET {base}/{action}/{idempotency key}`, the agent's next try "
            "asks first and is done without a POST; where it does not, it POSTs again with the same key and the "
            "service replays its first answer (a replay can be slow again: another try). Every POST counts, the "
            "replays included.",
        )
        section.intro = (
            f"{r.orders} orders of {pipeline.STEPS} steps sent at once to {r.hosts} host(s); at every service "
            f"{r.rate:.0%} of the calls (drawn per call) are applied but answered after {r.slow_seconds:g} s (the "
            f"fake remote's `slow` rate), past the agents' call timeout, shortened to keep the phase short: "
            f"REMOTE_CALL_TIMEOUT_SECONDS={r.call_timeout:g} (default {resilience.DEFAULT_CALL_TIMEOUT:g}); every "
            "other setting is the app's default. Target: at most 1.05 POSTs per action applied at the services "
            "that offer the lookup (inventory, payments); shipping, without it, for contrast."
        )

    def _temporal(self, section: Section) -> None:
        from benchmarks.temporal_peer import phase as temporal_peer  # temporalio: imported by this phase only

        # One worker process per host (Azure's default; pinned against a shell that sets another).
        temporal_peer.run(section, self.plan,
                          app_stack=lambda telemetry: self._stack("peer-app-traced" if telemetry else "peer-app",
                                                                  hosts=1, telemetry=telemetry,
                                                                  settings={"FUNCTIONS_WORKER_PROCESS_COUNT": "1"}),
                          log_dir=self.logs / "peer-temporal", profile_dir=self.logs / "peer-profile",
                          counter=self._counter)

    def _concurrency(self, section: Section) -> None:
        plan = self.plan
        runs: list[resilience.AgentsRun] = []
        with ExitStack() as cleanup:
            stack = sender = None
            for agents in ("async", "sync"):
                if runs:
                    self._status("concurrency: stopping the async agents' hosts")
                    stack.stop_hosts()
                if not runs or runs[-1].capped:  # a fresh stack, unless the async run left nothing in flight
                    stack = cleanup.enter_context(self._stack(f"concurrency-{agents}", hosts=0))
                    sender = OrderSender(stack.servicebus_connection_string)
                    cleanup.callback(sender.close)
                app_dir = sync_agents.write_app(self.logs / "sync-app") if agents == "sync" else None
                runs.append(resilience.agents_run(
                    stack, sender, agents=agents, app_dir=app_dir, orders=plan.concurrency_orders,
                    hosts=plan.concurrency_hosts, apply_seconds=plan.concurrency_apply_seconds,
                    warm_up=plan.warm_up_orders, cap=plan.concurrency_cap, status=self._counter,
                ))
        by = {run.agents: run for run in runs}
        section.figure("threads", "worker threads for sync functions per host: min(32, cores + 4) on this machine",
                       by["async"].threads, "", note=f"the hosts' start-up line; {os.cpu_count()} cores")
        for run in runs:
            target = {"target": "0", "met": run.dropped_steps == 0} if run.agents == "async" else {}
            section.figure(f"dropped_steps.{run.agents}", f"{run.agents} agents: requests dropped past complete-by",
                           run.dropped_steps, "", note=f"{run.dropped_orders} orders affected", **target)
            section.figure(f"steps_per_s.{run.agents}", f"{run.agents} agents: steps/s", run.steps_per_second,
                           "steps/s", note=f"{run.steps} steps in {run.seconds:.0f} s"
                           + (f", stopped at the {plan.concurrency_cap:g} s cap" if run.capped else ""))
        a, s = by["async"].steps_per_second, by["sync"].steps_per_second
        section.figure("ratio", "steps/s, async agents / sync agents (same run)", a / s if a and s else None, "")
        section.table(
            "the two runs",
            ["agents", "hosts", "worker threads per host", "orders", "Processed", "Compensated", "Error",
             "not final at the end", "steps applied", "undos applied", "seconds", "steps/s",
             "requests dropped past complete-by", "orders with a drop", "calls past Complete-By at the remote"],
            [[r.agents, r.hosts, r.threads, r.orders, r.states["Processed"], r.states["Compensated"], r.states["Error"],
              r.states["unfinished"], r.steps, r.undos, r.seconds, r.steps_per_second, r.dropped_steps,
              r.dropped_orders, r.late_calls] for r in runs],
            note="Steps are the forward actions applied at the remote services for the run's orders; seconds from the "
            "first send to the last order's final commit, or to the cap. A dropped request is an agent's "
            "'arrived past complete-by' or 'no result before complete-by' log line: nothing was sent back, and the "
            "supervisor runs the step again once it expires (30 s), up to 3 failures, then undoes the order.",
        )
        hosts = plan.concurrency_hosts
        section.intro = (
            f"{plan.concurrency_orders} orders of {pipeline.STEPS} steps sent at once, every remote service taking "
            f"{plan.concurrency_apply_seconds:g} s per call (the fake remote's `apply_seconds`), on {hosts} host(s) "
            f"with the Python worker's default pool for sync functions on this machine, PYTHON_THREADPOOL_THREAD_COUNT "
            f"= min(32, cores + 4) = {resilience.WORKER_THREADS} (the local stack otherwise sets 16); app defaults "
            "otherwise (host.json: 16 concurrent calls per trigger; step timeout 30 s). Run twice: first the "
            "app (async agents: they hold no thread while waiting), then the sync comparator "
            "(benchmarks/sync_agents.py: each call holds a pool thread, shared with the scheduler's functions) on the "
            "same stack once the async run has left nothing in flight (else on a fresh one), each until every order "
            f"is final or {plan.concurrency_cap:g} s."
        )
        queueing = plan.concurrency_orders * plan.concurrency_apply_seconds / 16
        if hosts > 1 and queueing > resilience.DEFAULT_STEP_TIMEOUT:
            section.intro += (
                f" {hosts} hosts, as one host could not drop nothing even with async agents: "
                f"{plan.concurrency_orders} calls × {plan.concurrency_apply_seconds:g} s / 16 concurrent calls = "
                f"{queueing:.1f} s of queueing at the first step, past its "
                f"{resilience.DEFAULT_STEP_TIMEOUT:g} s timeout."
            )
