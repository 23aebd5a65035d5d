"""Where the host's CPU goes: the functions' own work against the local host's.

In Azure a Functions instance runs the Functions host (.NET: triggers, polling, settlement,
output bindings, HTTP) and the Python worker, which runs the functions. The local host
(tools/funchost) is one Python process that does both; each invocation's log line carries
``Cpu=``, the CPU time the function itself used on its worker thread (the Python worker's
share, tools/funchost/invoke.py). The rest of the process's CPU is the local host emulating
Azure's: it is not what the app costs in Azure, where the .NET host does that work.

``python -m benchmarks.hostcpu [--orders 200] [--profile] [--top 25] [--no-telemetry]`` runs
orders through one host on a local stack of its own and prints both per order, by trigger
type, and each of the host's threads' CPU and context switches per order (from ``/proc``, the
threads named by ``py-spy dump``: the ground truth the py-spy samples are not, since
``--gil`` samples over-weight the event loop's thread); with ``--profile`` it also samples the
host with py-spy (a pinned dev dependency) and prints the functions the samples were in, the
function side's threads apart from the host's; with ``--no-telemetry`` the host writes no
spans or metrics files (run it both ways, back to back, for what the app's telemetry costs).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.procstat import NO_TIME, ThreadTimes

_EXECUTED = re.compile(
    r"Executed 'Functions\.([^']+)' \((?:Succeeded|Failed), Id=[^,]+, Duration=\d+ms\) Cpu=([\d.]+)ms trigger=(\S+)"
)


@dataclass
class FunctionCpu:
    """CPU milliseconds the functions themselves used, from the invocations' log lines."""

    by_function: Counter[str] = field(default_factory=Counter)
    by_trigger: Counter[str] = field(default_factory=Counter)
    invocations: Counter[str] = field(default_factory=Counter)

    @property
    def total_ms(self) -> float:
        return sum(self.by_trigger.values())


def function_cpu(logs: list[Path], offsets: list[int]) -> FunctionCpu:
    """The functions' own CPU time in the invocations logged after ``offsets``."""
    found = FunctionCpu()
    for path, offset in zip(logs, offsets):
        with open(path, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", "replace")
        for match in _EXECUTED.finditer(text):
            function, ms, trigger = match[1], float(match[2]), match[3]
            found.by_function[function] += ms
            found.by_trigger[trigger] += ms
            found.invocations[function] += 1
    return found


def split_per_order(host_cpu_seconds: float, functions: FunctionCpu, orders: int) -> dict:
    """Host CPU per order, split into the functions' own (by trigger type) and the local host's."""
    host_ms = host_cpu_seconds * 1000 / orders
    functions_ms = functions.total_ms / orders
    return {
        "host": host_ms,
        "functions": functions_ms,
        "functions_by_trigger": {k: v / orders for k, v in sorted(functions.by_trigger.items())},
        "host_emulation": max(0.0, host_ms - functions_ms),
    }


# -- the profile ---------------------------------------------------------------------------

#: Threads that run the functions (tools/funchost/invoke.py names them): the Python worker's share.
FUNCTION_THREADS = ("worker-sync", "funchost-event-loop")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -r requirements-dev.txt")
    return found


def start_profile(pid: int, out: Path, rate: int = 100) -> subprocess.Popen:
    """Sample ``pid`` with py-spy into ``out`` as collapsed stacks: only the thread holding the
    GIL (``--gil``: the one running Python code; a thread waiting on a socket or a lock holds
    none), so the samples are where the process's Python CPU goes."""
    return subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--output", str(out), "--rate", str(rate),
         "--threads", "--gil"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def stop_profile(process: subprocess.Popen, timeout: float = 60) -> None:
    process.send_signal(subprocess.signal.SIGINT)
    process.wait(timeout=timeout)


_DUMPED_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "(.*)"$', re.MULTILINE)


def thread_names(pid: int) -> dict[int, str]:
    """The Python name of each thread of ``pid`` by its native id (``py-spy dump``), a pool's
    number dropped (``worker-sync_3`` -> ``worker-sync``); {} when py-spy cannot read it."""
    try:
        dumped = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    except (SystemExit, OSError, subprocess.TimeoutExpired):  # py-spy missing, or it could not read the process
        return {}
    return {int(m[1]): re.sub(r"_\d+$", "", m[2]) for m in _DUMPED_THREAD.finditer(dumped.stdout)}


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


@dataclass
class Profile:
    samples: Counter[str] = field(default_factory=Counter)  # by side: "functions" / "host"
    own: dict[str, Counter[str]] = field(default_factory=lambda: {"functions": Counter(), "host": Counter()})
    within: dict[str, Counter[str]] = field(default_factory=lambda: {"functions": Counter(), "host": Counter()})


_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


#: The app's and the local host's top packages (py-spy names a file from its sys.path entry).
_OURS = ("adapters", "core", "scheduler", "supervisor", "agents", "api", "tools")


def _package(file: str) -> str:
    """A frame's file as a short package name: azure/core/pipeline, requests, the app's
    modules (adapters/store), or the standard library's (stdlib/ssl)."""
    parts = Path(file).parts
    if len(parts) == 1:
        return "stdlib/" + Path(file).stem
    if parts[0] in _OURS:
        return "/".join(parts[:2]).removesuffix(".py")
    return "/".join(parts[:3] if parts[0] == "azure" else parts[:1]).removesuffix(".py")


def read_profile(path: Path) -> Profile:
    """Collapsed stacks (``thread;frame;...;frame count``) by side (the thread's name), with each
    sample's own frame and the packages it was within."""
    profile = Profile()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        side = "functions" if any(name in frames[0] for name in FUNCTION_THREADS) else "host"
        n = int(count)
        profile.samples[side] += n
        parsed = [m for m in (_FRAME.match(f) for f in frames[1:]) if m]
        if not parsed:
            continue
        leaf = parsed[-1]
        profile.own[side][f"{leaf['name']} ({_package(leaf['file'])})"] += n
        for package in {_package(m["file"]) for m in parsed}:
            profile.within[side][package] += n
    return profile


def main(argv: list[str] | None = None) -> None:
    import argparse

    from adapters.store import StateStore
    from benchmarks import pipeline
    from benchmarks.procstat import CpuMeter, thread_times
    from benchmarks.stack import BenchStack, OrderSender

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="sample the host with py-spy during the run")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second (with --profile)")
    parser.add_argument("--keep", type=Path, help="copy the raw profile here")
    parser.add_argument("--no-telemetry", action="store_true",
                        help="run the host without its spans and metric files (what tracing costs)")
    args = parser.parse_args(argv)

    logs_dir = Path(tempfile.mkdtemp(prefix="hostcpu-"))
    stack = BenchStack(log_dir=logs_dir / "stack", telemetry=not args.no_telemetry)
    stack.start(hosts=1)
    sender = OrderSender(stack.servicebus_connection_string)
    try:
        pipeline.warm_up(stack, sender, "warm-", count=20)
        logs = list(stack.host_logs)
        offsets = [path.stat().st_size for path in logs]
        host_pid = stack.pids["host-1"]
        sampler = start_profile(host_pid, logs_dir / "profile.txt", args.rate) if args.profile else None
        meter = CpuMeter({"host": host_pid})
        before = stack.remote.effects()["total"]
        threads_before = thread_times(host_pid)
        meter.start()
        sender.send([f"cpu-{i:05d}" for i in range(args.orders)])
        if not pipeline.wait_done(stack, StateStore(stack.table()), "cpu-", args.orders, before, timeout=600):
            raise SystemExit("the orders were not all processed")
        used = meter.stop()
        threads_after = thread_times(host_pid)
        if sampler is not None:
            stop_profile(sampler)  # before py-spy dump reads the process: one reader at a time
        threads = per_thread(threads_before, threads_after, thread_names(host_pid), args.orders)
        functions = function_cpu(logs, offsets)
    finally:
        sender.close()
        stack.stop()
    split = split_per_order(used["host"], functions, args.orders)
    print(f"{args.orders} orders in {used['wall']:.1f} s ({args.orders / used['wall']:.1f} orders/s), one host")
    print(f"host process CPU per order      {split['host']:7.1f} ms")
    print(f"  the functions' own (worker)   {split['functions']:7.1f} ms")
    for trigger, ms in split["functions_by_trigger"].items():
        print(f"    {trigger:<27} {ms:7.1f} ms")
    for function, ms in functions.by_function.most_common():  # each function's own, not the host's
        print(f"    function {function:<24} {ms / max(functions.invocations[function], 1):6.2f} ms per invocation, "
              f"{functions.invocations[function] / args.orders:.2f} per order")
    print(f"  the local host's (emulation)  {split['host_emulation']:7.1f} ms")
    print("host threads, per order (/proc: each thread's CPU and context switches; the worker's are "
          "worker-sync and funchost-event-loop)")
    for name, user, system, voluntary, involuntary in threads:
        print(f"    {name:<32} {user + system:6.2f} ms ({system:5.2f} in the kernel), "
              f"switches {voluntary:6.1f} waiting, {involuntary:5.1f} preempted")
    if args.profile:
        profile = read_profile(logs_dir / "profile.txt")
        if args.keep:
            shutil.copy(logs_dir / "profile.txt", args.keep)
        for side in ("functions", "host"):
            total = max(profile.samples[side], 1)
            print(f"\n{side}: {profile.samples[side]} samples; packages the samples were within (% of the side's)")
            for package, n in profile.within[side].most_common(args.top):
                print(f"  {100 * n / total:5.1f}%  {package}")
            print(f"{side}: own frames (% of the side's)")
            for frame, n in profile.own[side].most_common(args.top):
                print(f"  {100 * n / total:5.1f}%  {frame}")
    print(f"(logs in {logs_dir})")


if __name__ == "__main__":
    main()


def report(section, host_cpu_seconds: float, functions: FunctionCpu, orders: int) -> dict:
    """The ops phase's figures: host CPU per order, the functions' own by trigger type, the
    local host's; returns them (ms per order) for benchmarks/results/operations.json."""
    split = split_per_order(host_cpu_seconds, functions, orders)
    section.figure("host_cpu_per_order", "host process CPU per order (local host running the app)",
                   split["host"], "ms")
    section.figure("function_cpu_per_order", "CPU per order, function side (the functions' own: the Python "
                   "worker's work in Azure)", split["functions"], "ms",
                   note=", ".join(f"{k} {v:.1f}" for k, v in split["functions_by_trigger"].items())
                   + "; against Temporal's worker on this machine: the temporal phase")
    section.figure("host_emulation_cpu_per_order", "CPU per order, the local host emulating Azure's (triggers, "
                   "polling, settlement, outputs)", split["host_emulation"], "ms",
                   note="in Azure the Functions host (.NET) does this work")
    return split
