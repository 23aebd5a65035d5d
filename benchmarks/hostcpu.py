"""Where an instance's CPU goes: the worker processes (the app side) against the host process.

In Azure a Functions instance runs the Functions host (.NET: triggers, polling, settlement,
output bindings, HTTP) and, beside it, the Python worker process, where Microsoft's runtime
(``azure-functions-runtime``) runs the functions. The local host (tools/funchost) is split the
same way: its host process stands in for the .NET host, and the worker processes it starts run
Microsoft's runtime and the app. So the CPU is read per process from ``/proc``
(:class:`benchmarks.procstat.CpuMeter`, the processes named by :attr:`benchmarks.stack.BenchStack.pids`):

- the *workers* (``worker-H``): what an Azure instance's Python worker spends, the runtime
  and the functions together: the app side;
- the *host process* (``host-H``): the local host emulating Azure's .NET host; Azure runs its
  own host there, whose cost this does not measure;
- Azurite and the Service Bus emulator: the infrastructure (Azure's services).

Inside the workers, the runtime's share apart from the functions' own is measured by sampling
them with py-spy (:class:`Sampler`, a pinned dev dependency; ``--nonblocking``: the sampled
process is never paused; every thread, only while it runs, no ``--gil``) in a run of its own,
never in a measured one: a sample is *the functions' own* when its stack holds a frame of the
app (``function_app.py``, ``scheduler/``, ``agents/``, ``supervisor/``, ``api/``, ``adapters/``,
``core/`` of this repository), whatever it called (the Azure SDKs, aiohttp, logging, the
runtime's log handler), or, with no app frame, of a library only the app uses (the Service Bus
SDK's keep-alive thread, aiohttp's callbacks on the event loop); *the runtime's* otherwise
(``azure_functions_runtime``, ``azure.functions``, the stand-in proxy ``tools/funchost/worker.py``
and its FunctionRpc modules, grpc, protobuf, and the standard library's asyncio, threading and
queue plumbing around them). Each side's CPU is every thread's CPU over that run (``/proc``)
split by the thread's own samples (:meth:`WorkerProfile.weigh`: the samples alone over-count
threads that wake often); each side's share of it, times the workers' measured CPU per order,
gives each side's milliseconds per order (:meth:`WorkerProfile.split`).

``python -m benchmarks.hostcpu [--orders 200] [--profile] [--top 25] [--no-telemetry]`` runs
orders through one host (one worker process) on a local stack of its own and prints the CPU per
order of the workers, the host process, Azurite and the emulator, and each thread's CPU and
context switches per order in both processes (from ``/proc``, the threads named by ``py-spy
dump``); with ``--profile`` it then runs as many orders again with the worker sampled and prints
the runtime / functions split of the measured run's worker CPU, the packages the samples were
within and their own frames, per side; with ``--no-telemetry`` the app writes no spans or
metrics files (run it both ways, back to back, for what the app's telemetry costs).
"""

from __future__ import annotations

import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import pipeline
from benchmarks.procstat import HOST_PROCESS, NO_TIME, WORKERS, ThreadTimes, by_group, thread_times
from devtools.paths import ROOT

# -- the processes' CPU ----------------------------------------------------------------------


def split_per_order(cpu_seconds: dict[str, float], orders: int) -> dict[str, float]:
    """CPU per order (ms) by group of processes (:func:`benchmarks.procstat.process_group`): the
    ``workers`` (the app side: Microsoft's runtime and the functions), the ``host_process`` (the
    local host, standing in for Azure's .NET host), ``instance`` (the two together: what one
    Azure instance's cores carry), ``azurite`` and ``servicebus`` (the infrastructure)."""
    groups = by_group(cpu_seconds)
    per_order = {name: seconds * 1000 / orders for name, seconds in groups.items()}
    per_order.setdefault(WORKERS, 0.0)
    per_order.setdefault(HOST_PROCESS, 0.0)
    per_order["instance"] = per_order[WORKERS] + per_order[HOST_PROCESS]
    return per_order


def report(section, cpu_seconds: dict[str, float], orders: int) -> dict[str, float]:
    """The ops phase's figures: CPU per order of the workers and of the host process; returns
    :func:`split_per_order`'s figures."""
    split = split_per_order(cpu_seconds, orders)
    section.figure("workers_cpu_per_order", "CPU per order, worker processes (the app side: Microsoft's Python "
                   "runtime and the functions, what an Azure instance's Python worker spends)", split[WORKERS], "ms",
                   note="the runtime's share apart from the functions' own: python -m benchmarks.hostcpu --profile, "
                   "and the temporal phase")
    section.figure("host_process_cpu_per_order", "CPU per order, host process (the local host standing in for "
                   "Azure's .NET Functions host: triggers, polling, settlement, outputs)", split[HOST_PROCESS], "ms",
                   note="in Azure the Functions host (.NET) does this work, on the same instance")
    return split


# -- the profile -----------------------------------------------------------------------------

FUNCTIONS, RUNTIME = "functions", "runtime"
SIDES = (FUNCTIONS, RUNTIME)
#: py-spy's samples per second (its default).
RATE = 100

#: The app's code: these files and packages at the repository's root (its script root).
APP_FILES = ("function_app.py",)
APP_PACKAGES = ("scheduler", "agents", "supervisor", "api", "adapters", "core")
#: Installed packages that are the runtime's (the Python worker Azure runs), not the app's:
#: Microsoft's runtime and programming model with their dependencies, and FunctionRpc's.
RUNTIME_LIBRARIES = ("azure_functions_runtime", "azurefunctions", "azure/functions", "werkzeug", "grpc",
                     "google/protobuf", "google/_upb", "typing_extensions")
#: The stand-in for Microsoft's proxy worker and its FunctionRpc modules: the runtime's side.
RUNTIME_FILES = ("tools/funchost",)

APP, LIBRARY, RUNTIME_CODE, STDLIB = "app", "library", "runtime", "stdlib"
_SITE = re.compile(r"/(?:site|dist)-packages/(.+)$")
_STDLIB = re.compile(r"/lib/python\d+\.\d+/(.+)$")


def origin(file: str, app_root: Path = ROOT) -> tuple[str, str]:
    """Whose code a frame's file is (:data:`APP`, :data:`LIBRARY`: a package only the app uses,
    :data:`RUNTIME_CODE`, :data:`STDLIB`), and its short name (``adapters/store``,
    ``azure/servicebus/_pyamqp/client``, ``stdlib/asyncio/base_events``). ``file`` as py-spy
    writes it with ``--full-filenames`` (its short names are ambiguous: ``core/...`` is both the
    app's package and ``azure/core``)."""
    site = _SITE.search(file)
    if site:
        name = site[1]
        kind = RUNTIME_CODE if any(name == lib or name.startswith(lib + "/") or name.startswith(lib + ".")
                                   for lib in RUNTIME_LIBRARIES) else LIBRARY
        return kind, name.removesuffix(".py")
    root = str(app_root).rstrip("/") + "/"
    if file.startswith(root):
        name = file[len(root):]
        top = name.split("/", 1)[0]
        if name in APP_FILES or top in APP_PACKAGES:
            return APP, name.removesuffix(".py")
        if any(name.startswith(prefix + "/") for prefix in RUNTIME_FILES):
            return RUNTIME_CODE, name.removesuffix(".py")
        return LIBRARY, name.removesuffix(".py")  # another module of the repository the app imported
    stdlib = _STDLIB.search(file)
    return STDLIB, "stdlib/" + (stdlib[1] if stdlib else file).removesuffix(".py")


def _package(kind: str, name: str) -> str:
    """A short name's package: ``azure/servicebus``, ``grpc``, ``adapters``, ``stdlib/asyncio``."""
    parts = name.split("/")
    if kind == STDLIB:
        return "/".join(parts[:2])
    if parts[0] in ("azure", "google", "tools") and len(parts) > 1:
        return "/".join(parts[:2])
    return parts[0]


@dataclass
class WorkerProfile:
    """py-spy's samples of the worker processes, each the functions' own or the runtime's (see
    the module's docstring), and each side's CPU: every thread's CPU over the profiled run (from
    /proc) split by its own samples (:meth:`weigh`). The samples alone would over-count the
    threads that wake often: py-spy takes a thread that is runnable as running, and on a busy
    machine a thread woken by a socket waits for a core (in this stack's runs the samples came to
    about twice the workers' CPU). Also the packages each side's samples were within, their own
    (leaf) frames and their threads."""

    samples: Counter[str] = field(default_factory=Counter)
    #: The functions' samples with no frame of the app: a library only the app uses, on its own
    #: thread or called back by the event loop.
    libraries_only: int = 0
    #: Samples without a stack (py-spy could not read one without pausing the process).
    unread: int = 0
    #: py-spy's own count of the samples it failed to take (``--nonblocking`` reads race the process).
    errors: int = 0
    #: Each thread's samples by side, by (process name, native thread id).
    thread_samples: dict[tuple[str, int], Counter[str]] = field(default_factory=dict)
    #: CPU seconds by side over the profiled run (:meth:`weigh`); empty when not weighed.
    cpu: Counter[str] = field(default_factory=Counter)
    #: CPU seconds of threads no sample caught, by the kernel's name for them (grpc's C-core threads
    #: run no Python: py-spy sees none of them); counted as the runtime's.
    unsampled: Counter[str] = field(default_factory=Counter)
    within: dict[str, Counter[str]] = field(default_factory=lambda: {side: Counter() for side in SIDES})
    own: dict[str, Counter[str]] = field(default_factory=lambda: {side: Counter() for side in SIDES})
    threads: dict[str, Counter[str]] = field(default_factory=lambda: {side: Counter() for side in SIDES})

    @property
    def total(self) -> int:
        """Samples with a stack."""
        return sum(self.samples[side] for side in SIDES)

    def weigh(self, thread_cpu: dict[tuple[str, int], tuple[float, str]]) -> None:
        """Each side's CPU from each thread's CPU over the profiled run (``(process name, thread
        id) -> (seconds, the thread's kernel name)``), split by that thread's samples; a thread
        without a sample is the runtime's (:attr:`unsampled`)."""
        self.cpu, self.unsampled = Counter(), Counter()
        for key, (seconds, comm) in thread_cpu.items():
            if seconds <= 0:
                continue
            counts = self.thread_samples.get(key)
            sampled = sum(counts.values()) if counts else 0
            if not sampled:
                self.cpu[RUNTIME] += seconds
                self.unsampled[comm] += seconds
                continue
            for side in SIDES:
                self.cpu[side] += seconds * counts[side] / sampled

    def share(self, side: str, *, by_samples: bool = False) -> float | None:
        """The side's share of the workers' CPU (:meth:`weigh`), or of the samples with a stack
        (``by_samples``, or when not weighed); None without any."""
        weighed = sum(self.cpu[s] for s in SIDES)
        if weighed and not by_samples:
            return self.cpu[side] / weighed
        return self.samples[side] / self.total if self.total else None

    def split(self, workers_ms: float | None) -> dict[str, float] | None:
        """The workers' CPU (``workers_ms``, e.g. per order, from /proc) split by :meth:`share`:
        ``{"functions": ..., "runtime": ...}``, the two adding up to ``workers_ms``."""
        share = self.share(FUNCTIONS)
        if workers_ms is None or share is None:
            return None
        functions = workers_ms * share
        return {FUNCTIONS: functions, RUNTIME: workers_ms - functions}


_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]+?)(?::\d+)?\)$")
_THREAD = re.compile(r"^thread \((?P<id>\w+)\)(?:: (?P<name>.*))?$")


def read_profile(files: dict[str, Path], app_root: Path = ROOT) -> WorkerProfile:
    """py-spy's raw output (``record --format raw --threads --full-filenames``: one line per
    distinct stack, ``thread (TID): NAME;frame (file:line);... COUNT``, outermost frame first) of
    one or more worker processes (``files``: by the process's name), classified sample by sample."""
    profile = WorkerProfile()
    for process, path in files.items():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            head, *frames = stack.split(";")
            thread = _THREAD.match(head)
            parsed = [m for m in (_FRAME.match(frame) for frame in frames) if m]
            if thread is None or not parsed:
                profile.unread += n
                continue
            origins = [origin(m["file"], app_root) for m in parsed]
            kinds = {kind for kind, _ in origins}
            side = FUNCTIONS if kinds & {APP, LIBRARY} else RUNTIME
            if side == FUNCTIONS and APP not in kinds:
                profile.libraries_only += n
            profile.samples[side] += n
            if thread["id"].isdigit():  # the native thread id (py-spy knows it on Python 3.11 and later)
                profile.thread_samples.setdefault((process, int(thread["id"])), Counter())[side] += n
            profile.threads[side][re.sub(r"_\d+$", "", thread["name"] or "?")] += n
            profile.own[side][f"{parsed[-1]['name']} ({origins[-1][1]})"] += n
            for package in {_package(kind, name) for kind, name in origins}:
                profile.within[side][package] += n
    return profile


def kernel_name(pid: int, tid: int) -> str:
    """A thread's name as the kernel knows it (``/proc/PID/task/TID/comm``: ``python`` for every
    Python thread on 3.13, grpc's C-core threads name themselves, e.g. ``event_engine``)."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def _thread_cpu(before: dict[str, dict[int, ThreadTimes]], after: dict[str, dict[int, ThreadTimes]],
                pids: dict[str, int]) -> dict[tuple[str, int], tuple[float, str]]:
    """Each thread's CPU seconds between two readings and its kernel name, by (process, thread id)."""
    found = {}
    for process, threads in after.items():
        for tid, now in threads.items():
            used = now - before.get(process, {}).get(tid, NO_TIME)
            found[(process, tid)] = (used.user + used.system, kernel_name(pids[process], tid))
    return found


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -r requirements-dev.txt")
    return found


class ProfileError(RuntimeError):
    """py-spy could not sample a process (not installed, not allowed to read it, the process gone)."""


def start_profile(pid: int, out: Path, rate: int = RATE, timeout: float = 30.0) -> subprocess.Popen:
    """Sample ``pid`` with py-spy into ``out`` (raw, collapsed stacks with each thread and full
    file names) without pausing it (``--nonblocking``): every thread while it runs (not ``--gil``,
    which keeps only the thread holding the interpreter lock). Returns once py-spy samples."""
    process = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--output", str(out), "--rate", str(rate),
         "--threads", "--nonblocking", "--full-filenames"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline()
            if line.startswith("py-spy> Sampling"):
                return process
            if not line:
                break
        elif process.poll() is not None:
            break
    process.kill()
    _, error = process.communicate(timeout=10)
    reason = error.strip().splitlines()[0] if error.strip() else "no answer"
    raise ProfileError(f"py-spy could not sample process {pid}: {reason}")


_WROTE = re.compile(r"Samples: (\d+) Errors: (\d+)")


def stop_profile(process: subprocess.Popen, timeout: float = 60) -> int:
    """Stop py-spy (it writes its output); returns the samples it failed to take."""
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=timeout)
    wrote = _WROTE.search(out or "")
    return int(wrote[2]) if wrote else 0


class Sampler:
    """py-spy on each of some processes (:func:`start_profile`), as a context, with each of their
    threads' CPU read from /proc as it starts and ends: the profile (:attr:`profile`, weighed by
    those CPU times) is there once the block is left."""

    def __init__(self, pids: dict[str, int], out_dir: Path, rate: int = RATE, *, app_root: Path = ROOT) -> None:
        self.pids, self.out_dir, self.rate, self.app_root = dict(pids), out_dir, rate, app_root
        self.files = {name: out_dir / f"profile-{name}.txt" for name in self.pids}
        self._running: list[subprocess.Popen] = []
        self._before: dict[str, dict[int, ThreadTimes]] = {}
        self.profile: WorkerProfile | None = None

    def __enter__(self) -> Sampler:
        if not self.pids:
            raise ProfileError("no worker process to sample")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            for name, pid in self.pids.items():
                self._running.append(start_profile(pid, self.files[name], self.rate))
        except BaseException:
            self._stop()
            raise
        self._before = {name: thread_times(pid) for name, pid in self.pids.items()}
        return self

    def _stop(self) -> int:
        errors = 0
        for process in self._running:
            errors += stop_profile(process)
        self._running = []
        return errors

    def __exit__(self, *exc_info) -> None:
        after = {name: thread_times(pid) for name, pid in self.pids.items()}
        errors = self._stop()
        if exc_info[0] is None:
            self.profile = read_profile({name: path for name, path in self.files.items() if path.exists()},
                                        self.app_root)
            self.profile.errors = errors
            self.profile.weigh(_thread_cpu(self._before, after, self.pids))


def profiled_throughput(stack, sender, prefix: str, count: int, *, out_dir: Path, timeout: float, rate: int = RATE,
                        progress=None):
    """One saturation run (:func:`benchmarks.pipeline.throughput`) with every live worker process
    of the stack sampled: a run of its own, never one whose figures are reported as measured.
    Returns the run and the profile."""
    with Sampler(stack.worker_pids(), out_dir, rate) as sampler:
        result = pipeline.throughput(stack, sender, prefix, count, timeout=timeout, progress=progress)
    return result, sampler.profile


# -- the threads -----------------------------------------------------------------------------

_DUMPED_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "(.*)"$', re.MULTILINE)


def thread_names(pid: int) -> dict[int, str]:
    """The Python name of each thread of ``pid`` by its native id (``py-spy dump``), a pool's
    number dropped (``ThreadPoolExecutor-0_3`` -> ``ThreadPoolExecutor-0``); {} when py-spy
    cannot read it."""
    try:
        dumped = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    except (SystemExit, OSError, subprocess.TimeoutExpired):  # py-spy missing, or it could not read the process
        return {}
    return {int(m[1]): re.sub(r"_\d+$", "", m[2]) for m in _DUMPED_THREAD.finditer(dumped.stdout)}


def all_thread_names(pid: int, tids) -> dict[int, str]:
    """:func:`thread_names`, and for a thread with no Python name (one that runs no Python, such as
    grpc's C-core threads) its kernel name, marked ``(native)``."""
    names = thread_names(pid)
    if not names:  # py-spy could not read the process: no thread is known to be native
        return {}
    return {tid: names.get(tid) or f"{kernel_name(pid, tid)} (native)" for tid in tids}


def per_thread(before: dict[int, ThreadTimes], after: dict[int, ThreadTimes], names: dict[int, str],
               orders: int) -> list[tuple[str, float, float, float, float]]:
    """Each thread kind's (name, user ms, system ms, voluntary and involuntary context switches)
    per order between two readings, busiest first; threads that used no CPU are left out, and so
    are threads that ended between the readings (their time is in the process's total only)."""
    kinds: dict[str, ThreadTimes] = {}
    for tid, now in after.items():
        name = names.get(tid, f"thread {tid}")
        kinds[name] = kinds.get(name, NO_TIME) + (now - before.get(tid, NO_TIME))
    rows = [(name, 1000 * t.user / orders, 1000 * t.system / orders, t.voluntary / orders, t.involuntary / orders)
            for name, t in kinds.items() if t.user + t.system > 0]
    return sorted(rows, key=lambda row: -(row[1] + row[2]))


#: What each process's threads are, for the reader of the thread table.
THREADS_NOTE = {
    "worker": "Microsoft's runtime: sync functions on ThreadPoolExecutor-0, async functions (the agents) and the "
              "runtime's own work on MainThread (its event loop), the FunctionRpc stream on grpc-thread and grpc's "
              "Thread-N (_run)",
    "host": "the triggers' threads (listener-*, servicebus-*, queue-*, timer-*), FunctionRpc (funchost-grpc*, "
            "funchost-worker-*)",
}


# -- the command line ------------------------------------------------------------------------


def _print_profile(profile: WorkerProfile, split: dict[str, float] | None, top: int) -> None:
    total = max(profile.total, 1)
    weighed = sum(profile.cpu[side] for side in SIDES)
    print(f"\nthe worker's CPU per order, split by the profiled run: each thread's CPU there ({weighed:.2f} s, /proc) "
          f"split by its py-spy samples ({profile.total}; {profile.unread} without a stack, {profile.errors} "
          "py-spy could not take)")
    for side, label in ((FUNCTIONS, "the functions' own"), (RUNTIME, "the runtime")):
        ms = f"{split[side]:7.1f} ms" if split else "    n/a"
        share, by_samples = profile.share(side), profile.share(side, by_samples=True)
        print(f"  {label:<29} {ms} ({100 * (share or 0):.1f}% of the CPU; {100 * (by_samples or 0):.1f}% of the "
              "samples)")
    print(f"    the functions' samples with no app frame (a library only the app uses, on its own thread or called "
          f"back by the event loop): {100 * profile.libraries_only / total:.1f}% of the samples")
    if profile.unsampled:
        print("    threads no sample caught, the runtime's: " + ", ".join(
            f"{name} {seconds:.2f} s" for name, seconds in profile.unsampled.most_common()))
    for side in SIDES:
        count = max(profile.samples[side], 1)
        print(f"\n{side}: {profile.samples[side]} samples; threads (% of the side's)")
        for thread, n in profile.threads[side].most_common(top):
            print(f"  {100 * n / count:5.1f}%  {thread}")
        print(f"{side}: packages the samples were within (% of the side's)")
        for package, n in profile.within[side].most_common(top):
            print(f"  {100 * n / count:5.1f}%  {package}")
        print(f"{side}: own frames (% of the side's)")
        for frame, n in profile.own[side].most_common(top):
            print(f"  {100 * n / count:5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    from adapters.store import StateStore
    from benchmarks.procstat import CpuMeter
    from benchmarks.stack import BenchStack, OrderSender

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--profile", action="store_true",
                        help="then run as many orders again with the worker sampled by py-spy (a run of its own)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=RATE, help="py-spy samples per second (with --profile)")
    parser.add_argument("--keep", type=Path, help="copy the raw profiles (one per worker process) to this folder")
    parser.add_argument("--no-telemetry", action="store_true",
                        help="run the host without its spans and metric files (what tracing costs)")
    args = parser.parse_args(argv)

    logs_dir = Path(tempfile.mkdtemp(prefix="hostcpu-"))
    # One host, one worker process (the app setting pinned against a shell that sets another).
    stack = BenchStack(log_dir=logs_dir / "stack", telemetry=not args.no_telemetry,
                       settings={"FUNCTIONS_WORKER_PROCESS_COUNT": "1"})
    stack.start(hosts=1)
    sender = OrderSender(stack.servicebus_connection_string)
    profile = None
    try:
        pipeline.warm_up(stack, sender, "warm-", count=20)
        pids = stack.pids
        if "worker-1" not in pids:
            raise SystemExit(f"the host's worker process was not found in its log ({stack.host_logs[0]})")
        processes = {"host": pids["host-1"], "worker": pids["worker-1"]}
        meter = CpuMeter(pids)
        before = stack.remote.effects()["total"]
        threads_before = {kind: thread_times(pid) for kind, pid in processes.items()}
        meter.start()
        sender.send([f"cpu-{i:05d}" for i in range(args.orders)])
        if not pipeline.wait_done(stack, StateStore(stack.table()), "cpu-", args.orders, before, timeout=600):
            raise SystemExit("the orders were not all processed")
        used = meter.stop()
        threads_after = {kind: thread_times(pid) for kind, pid in processes.items()}
        threads = {kind: per_thread(threads_before[kind], threads_after[kind],
                                    all_thread_names(pid, threads_after[kind]), args.orders)
                   for kind, pid in processes.items()}
        if args.profile:
            profiled, profile = profiled_throughput(stack, sender, "prof-", args.orders, out_dir=logs_dir,
                                                    timeout=600, rate=args.rate)
            profiled_cpu = split_per_order(profiled.cpu, max(profiled.processed, 1))
    finally:
        sender.close()
        stack.stop()
    split = split_per_order(used, args.orders)
    print(f"{args.orders} orders in {used['wall']:.1f} s ({args.orders / used['wall']:.1f} orders/s), one host, "
          "one worker process")
    print("CPU per order (/proc)")
    print(f"  worker process (the app side)  {split[WORKERS]:7.1f} ms   Microsoft's runtime and the functions")
    print(f"  host process                   {split[HOST_PROCESS]:7.1f} ms   the local host, standing in for "
          "Azure's .NET host")
    print(f"  Azurite                        {split.get('azurite', 0.0):7.1f} ms")
    print(f"  Service Bus emulator           {split.get('servicebus', 0.0):7.1f} ms")
    for kind in ("worker", "host"):
        print(f"{kind} process threads, per order (/proc: each thread's CPU and context switches; "
              f"{THREADS_NOTE[kind]})")
        for name, user, system, voluntary, involuntary in threads[kind]:
            print(f"    {name:<32} {user + system:6.2f} ms ({system:5.2f} in the kernel), "
                  f"switches {voluntary:6.1f} waiting, {involuntary:5.1f} preempted")
    if profile is not None:
        print(f"\nprofiled run: {profiled.processed} orders, {profiled.per_second or 0:.1f} orders/s, worker "
              f"{profiled_cpu[WORKERS]:.1f} ms per order while sampled (py-spy's own CPU is not the worker's)")
        _print_profile(profile, profile.split(split[WORKERS]), args.top)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for path in logs_dir.glob("profile-*.txt"):
                shutil.copy(path, args.keep)
    print(f"(logs in {logs_dir})")


if __name__ == "__main__":
    main()
