"""CPU time of processes, from /proc (Linux), to split an operation's cost between
the client and the servers."""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far; None if it cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


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
