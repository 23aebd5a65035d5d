"""The whole app on the local stack: throughput, latency, operations per step, idle cost.

Orders are sent to the ``orders`` queue like any client sends them; each runs the
workflow's steps (``core.workflow.CURRENT``) and is done when its state row is
Processed. Times come from one clock: the send time taken here, the Processed row's
commit time (set by Azurite when it committed the write; read from the row's ETag, see
:func:`processed_at`) and the step rows' ``UpdatedAt`` (the scheduler's clock when it
recorded the step, on this machine too). Order state is read through the app's store
(:class:`adapters.store.StateStore`), never from the row layout.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote

from adapters.store import StateStore
from benchmarks.procstat import CpuMeter
from benchmarks.stack import BenchStack, OrderSender
from core import names
from core.models import LineState, OrderState, ProcessState
from core.workflow import CURRENT, Kind, remotes
from devtools.stats import percentile

#: Steps of the workflow every order of a run goes through.
STEPS = len(CURRENT.steps)


class Timeout(RuntimeError):
    pass


@dataclass
class RunResult:
    orders: int
    processed: int = 0
    errors: int = 0
    #: First send -> last Processed commit.
    seconds: float = 0.0
    #: Send -> Processed, per order (seconds).
    latencies: list[float] = field(default_factory=list)
    #: Send -> state row created (the orders queue and submit_order), per order (seconds).
    to_created: list[float] = field(default_factory=list)
    #: CPU seconds of each measured process over the run, by its name (``worker-H``, ``host-H``,
    #: ``azurite``, ``servicebus``: benchmarks.procstat.process_group; Temporal's ``worker-N``, ``temporal``).
    cpu: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0
    #: First send -> the commit that made 99% of the orders Processed.
    seconds_99: float = 0.0
    #: Function invocations that took 5 s or more (from the host logs), by function.
    slow_invocations: dict[str, int] = field(default_factory=dict)
    slowest_ms: int = 0
    #: Per-step hops (seconds): one step's row UpdatedAt to the next step's, within an order.
    hops: list[float] = field(default_factory=list)
    #: Send -> the first step recorded (the orders hop, submission, the nudge, the claim, step 1).
    to_first_step: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float | None:
        return self.processed / self.seconds if self.seconds else None

    @property
    def steps(self) -> int:
        """Steps done by the Processed orders (each ran every step of the workflow once)."""
        return self.processed * STEPS

    @property
    def steps_per_second(self) -> float | None:
        return self.steps / self.seconds if self.seconds else None

    @property
    def per_second_99(self) -> float | None:
        """Orders/s to the 99th percentile of completions: what stragglers do not skew."""
        return 0.99 * self.orders / self.seconds_99 if self.seconds_99 else None

    @property
    def steps_per_second_99(self) -> float | None:
        per_second = self.per_second_99
        return None if per_second is None else per_second * STEPS

    def percentile(self, q: int, values: list[float] | None = None) -> float | None:
        return percentile(self.latencies if values is None else values, q)


def state_rows(store: StateStore, prefix: str) -> dict[str, OrderState]:
    """The states of the orders whose id starts with ``prefix`` (one range query)."""
    return {state.order_id: state for state in store.list_states(id_prefix=prefix)}


def in_flight(store: StateStore, prefix: str) -> int:
    """In-flight orders whose id starts with ``prefix`` (one query of the active index)."""
    return len(store.active_ids(id_prefix=prefix))


def wait_applied(remote, count: int, effects_before: int, *, deadline: float, interval: float = 0.25,
                 progress=None) -> bool:
    """Until the fake remote (``remote``) has applied every step of ``count`` orders (its
    in-process counter: free); False at ``deadline`` (monotonic). Any engine's runs wait
    with it (the Temporal peer's too)."""
    steps = count * STEPS
    while True:
        done = remote.effects()["total"] - effects_before
        if progress is not None:
            progress(min(done, steps))
        if done >= steps:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def wait_done(stack: BenchStack, store: StateStore, prefix: str, count: int, effects_before: int, *, timeout: float,
              interval: float = 0.25, progress=None) -> bool:
    """Until every order of the run is finished (every step's remote effect applied, then
    out of the active index). Polls the fake remote's in-process counter first (free), the
    index partition only at the end, so the poll costs the stack next to nothing.
    ``progress`` is called with the steps done so far (of ``count`` x :data:`STEPS`)."""
    deadline = time.monotonic() + timeout
    if not wait_applied(stack.remote, count, effects_before, deadline=deadline, interval=interval, progress=progress):
        return False
    while in_flight(store, prefix):
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


_ETAG_TIME = re.compile(r"datetime'([^']+)'")


def processed_at(state: OrderState) -> float:
    """When a Processed state row was committed: its Table Timestamp (the server's clock),
    which Table Storage (and Azurite) also sends as the row's ETag,
    ``W/"datetime'<Timestamp>'"``; else the app's UpdatedAt."""
    match = _ETAG_TIME.search(state.etag or "")
    if match:
        try:
            return datetime.fromisoformat(unquote(match[1])).timestamp()
        except ValueError:
            pass
    return state.updated_at.timestamp()


def _finish(result: RunResult, store: StateStore, prefix: str, sent: dict[str, float], first_send: float) -> None:
    rows = state_rows(store, prefix)
    done: dict[str, float] = {}
    for order_id, at in sent.items():
        row = rows.get(order_id)
        if row is None:
            continue
        if row.process_state is ProcessState.PROCESSED:
            done[order_id] = processed_at(row)
            result.to_created.append(row.created_at.timestamp() - at)
        elif row.process_state is ProcessState.ERROR:
            result.errors += 1
    result.to_created.sort()
    completions(result, sent, done, first_send)


def completions(result: RunResult, sent: dict[str, float], done: dict[str, float], first_send: float) -> None:
    """The run's figures from each order's send time and the time it was done (epoch s, this
    machine's clock; ``done``: the orders done, of those ``sent``): orders done, latencies,
    first send -> last done, and -> the 99th percentile of completions. Any engine's runs
    are measured with it (the Temporal peer's too)."""
    result.processed += len(done)
    result.latencies = sorted(result.latencies + [at - sent[order_id] for order_id, at in done.items()])
    result.seconds = max([first_send, *done.values()]) - first_send
    done_at = sorted(done.values())
    needed = int(0.99 * result.orders + 0.999)
    if len(done_at) >= needed:
        result.seconds_99 = done_at[needed - 1] - first_send


def step_times(store: StateStore, order_ids: list[str]) -> dict[str, list[float]]:
    """When each order's steps were recorded (epoch seconds, in workflow order): the
    ``UpdatedAt`` of its step rows, set by the scheduler as it recorded the step (and, in
    the same transaction, claimed the next one). One partition read per order."""
    times: dict[str, list[float]] = {}
    for order_id in order_ids:
        lines = sorted(
            (line for line in store.read(order_id).lines if line.kind is Kind.ACTION and line.state is LineState.DONE),
            key=lambda line: line.step_index,
        )
        times[order_id] = [line.updated_at.timestamp() for line in lines]
    return times


def add_step_hops(result: RunResult, store: StateStore, prefix: str, sent: dict[str, float]) -> None:
    """The per-step hops of the run's Processed orders (see :func:`step_times`)."""
    rows = state_rows(store, prefix)
    processed = ProcessState.PROCESSED
    done = [order_id for order_id in sent if order_id in rows and rows[order_id].process_state is processed]
    for order_id, times in step_times(store, done).items():
        if times:
            result.to_first_step.append(times[0] - sent[order_id])
        result.hops += [b - a for a, b in zip(times, times[1:])]
    result.hops.sort()
    result.to_first_step.sort()


_EXECUTED = re.compile(r"Executed 'Functions\.([^']+)' \((?:Succeeded|Failed), Id=[^,]+, Duration=(\d+)ms\)")
#: The agents' durations are the remote service's: not counted as stalls.
AGENT_FUNCTIONS = frozenset(names.agent_function(remote) for remote in remotes())


def invocations(logs: list[Path], offsets: list[int]) -> dict[str, list[int]]:
    """The durations (ms) of the invocations logged after ``offsets``, by function."""
    durations: dict[str, list[int]] = {}
    for path, offset in zip(logs, offsets):
        with open(path, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", "replace")
        for match in _EXECUTED.finditer(text):
            durations.setdefault(match[1], []).append(int(match[2]))
    return durations


def slow_invocations(logs: list[Path], offsets: list[int], threshold_ms: int = 5000) -> tuple[Counter[str], int]:
    """Invocations logged after ``offsets`` that took ``threshold_ms`` or more, by function, and the slowest (ms)."""
    slow: Counter[str] = Counter()
    slowest = 0
    for function, durations in invocations(logs, offsets).items():
        if function in AGENT_FUNCTIONS:
            continue  # the agent's duration is the remote service's
        slowest = max([slowest, *durations])
        slow[function] += sum(1 for duration in durations if duration >= threshold_ms)
    return +slow, slowest


def warm_up(stack: BenchStack, sender: OrderSender, prefix: str, count: int = 20, timeout: float = 60) -> None:
    """A few orders through every function, so links and connections are open before timing."""
    store = StateStore(stack.table())
    before = stack.remote.effects()["total"]
    sender.send([f"{prefix}{i:05d}" for i in range(count)])
    if not wait_done(stack, store, prefix, count, before, timeout=timeout):
        raise Timeout(f"warm-up orders were not processed within {timeout:.0f} s (see the host logs in {stack.log_dir})")


def throughput(stack: BenchStack, sender: OrderSender, prefix: str, count: int, *, timeout: float,
               progress=None, workflow: str | None = None) -> RunResult:
    """Send ``count`` orders at once (on ``workflow``: none, the default); orders/s and
    steps/s from the first send to the last Processed."""
    store = StateStore(stack.table())
    ids = [f"{prefix}{i:05d}" for i in range(count)]
    result = RunResult(count)
    meter = CpuMeter(stack.pids)
    effects_before = stack.remote.effects()["total"]
    logs = list(stack.host_logs)
    offsets = [path.stat().st_size for path in logs]
    meter.start()
    first_send = time.time()
    sent = sender.send(ids, workflow=workflow)
    finished = wait_done(stack, store, prefix, count, effects_before, timeout=timeout, progress=progress)
    result.cpu = meter.stop()
    result.wall = result.cpu.pop("wall")
    _finish(result, store, prefix, sent, first_send)
    if not finished:
        result.seconds = time.time() - first_send
    slow, result.slowest_ms = slow_invocations(logs, offsets)
    result.slow_invocations = dict(slow)
    return result


def arrivals(count: int, rate: float):
    """``count`` evenly spaced arrivals at ``rate`` per second, the first 0.1 s from now: yields
    each one's index and how long to wait for it (0 when it is due), to be waited at once."""
    start = time.monotonic() + 0.1
    for i in range(count):
        yield i, max(0.0, start + i / rate - time.monotonic())


def steady(stack: BenchStack, sender: OrderSender, prefix: str, *, rate: float, seconds: float, timeout: float,
           progress=None, workflow: str | None = None) -> RunResult:
    """One order every 1/rate seconds for ``seconds`` (on ``workflow``: none, the default);
    latency of each, send -> Processed, and of each step hop (:func:`add_step_hops`)."""
    store = StateStore(stack.table())
    count = max(1, int(rate * seconds))
    result = RunResult(count)
    effects_before = stack.remote.effects()["total"]
    sent: dict[str, float] = {}
    first_send = time.time()
    for i, wait in arrivals(count, rate):
        time.sleep(wait)
        sent.update(sender.send([f"{prefix}{i:05d}"], start_index=i, workflow=workflow))
        if progress is not None:
            progress(i + 1)
    wait_done(stack, store, prefix, count, effects_before, timeout=timeout)
    _finish(result, store, prefix, sent, first_send)
    add_step_hops(result, store, prefix, sent)
    return result


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """What each counter gained from ``before`` to ``after`` (counters that did not move left out)."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
