"""CPU time of processes, from /proc (Linux), to split an operation's cost between
the client and the servers."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name; None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return data[data.rindex(b")") + 2 :].split()


def _cpu(fields: list[bytes]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICK


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far; None if it cannot be read."""
    fields = _stat(pid) if pid is not None else None
    return _cpu(fields) if fields is not None else None


def parent_pid(pid: int) -> int | None:
    """The parent of a live process; None if it is gone (or a zombie: it ended, unreaped)."""
    fields = _stat(pid)
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[1])


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's CPU seconds (user, system) and context switches so far."""

    user: float
    system: float
    voluntary: int  # it waited (a socket, a lock, the GIL)
    involuntary: int  # the kernel preempted it

    def __add__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.user + other.user, self.system + other.system,
                           self.voluntary + other.voluntary, self.involuntary + other.involuntary)

    def __sub__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.user - other.user, self.system - other.system,
                           self.voluntary - other.voluntary, self.involuntary - other.involuntary)


#: A thread with nothing counted yet.
NO_TIME = ThreadTimes(0.0, 0.0, 0, 0)


def _switches(path: str) -> tuple[int, int]:
    voluntary = involuntary = 0
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary = int(line.split()[1])
    except OSError:
        pass
    return voluntary, involuntary


def thread_times(pid: int) -> dict[int, ThreadTimes]:
    """Each live thread of a process (by its native id) with its CPU and context switches so far."""
    found: dict[int, ThreadTimes] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        fields = _stat(f"{pid}/task/{tid}")
        if fields is None:
            continue
        found[int(tid)] = ThreadTimes(int(fields[11]) / _TICK, int(fields[12]) / _TICK,
                                      *_switches(f"/proc/{pid}/task/{tid}/status"))
    return found


#: What each measured process is, by its name (a CPU meter's keys, benchmarks.stack.BenchStack.pids):
#: ``worker-H`` (``worker-H.N`` for a host's Nth worker) the app side, Microsoft's Python runtime running
#: the functions, what an Azure instance's Python worker spends; ``host-H`` the local host process
#: standing in for Azure's .NET Functions host (triggers, settlement, outputs); ``azurite`` and
#: ``servicebus`` (the emulator) the infrastructure, Azure's services. Temporal's worker processes
#: (``worker-N``, benchmarks.temporal_peer) are workers too: the app side there.
WORKERS, HOST_PROCESS = "workers", "host_process"


def process_group(name: str) -> str:
    """The group a measured process belongs to: ``workers``, ``host_process``, or its own name."""
    if name.startswith("worker-"):
        return WORKERS
    if name.startswith("host-"):
        return HOST_PROCESS
    return name


def by_group(used: dict[str, float]) -> dict[str, float]:
    """CPU (or any per-process figure) summed by :func:`process_group`; ``wall`` left out."""
    groups: dict[str, float] = {}
    for name, value in used.items():
        if name != "wall":
            groups[process_group(name)] = groups.get(process_group(name), 0.0) + value
    return groups


class CpuMeter:
    """CPU seconds used by a set of processes between two readings."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = {name: pid for name, pid in pids.items() if pid is not None}
        self._start: dict[str, float | None] = {}
        self._wall = 0.0

    def start(self) -> None:
        self._wall = time.monotonic()
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        """CPU seconds per process since :meth:`start` (processes that vanished are left out),
        plus ``"wall"``: the elapsed wall-clock seconds."""
        used: dict[str, float] = {}
        for name, pid in self.pids.items():
            before, after = self._start.get(name), cpu_seconds(pid)
            if before is not None and after is not None:
                used[name] = after - before
        used["wall"] = time.monotonic() - self._wall
        return used


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores have spent busy since boot (from /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def own_cpu_seconds() -> float:
    """CPU seconds of this process, its children that were reaped, and every live process
    descended from it: the local stack's processes, the benchmark's workers, and the worker
    processes each local Functions host starts (its children, this process's grandchildren)."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    try:
        entries = os.listdir("/proc")
    except OSError:
        return total
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
            cpu[int(entry)] = _cpu(fields)
    waiting = list(children.get(os.getpid(), []))
    while waiting:
        pid = waiting.pop()
        total += cpu[pid]
        waiting += children.get(pid, [])
    return total


class OtherLoad:
    """How many cores processes other than the benchmark's kept busy over a span of time
    (the machine is shared: other work there slows every figure down)."""

    def start(self) -> None:
        self._wall, self._busy, self._own = time.monotonic(), machine_busy_seconds(), own_cpu_seconds()

    def stop(self) -> float | None:
        busy = machine_busy_seconds()
        if busy is None or self._busy is None:
            return None
        wall = time.monotonic() - self._wall
        other = (busy - self._busy) - (own_cpu_seconds() - self._own)
        return max(0.0, other / wall) if wall > 0 else None
