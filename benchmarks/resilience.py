"""Resilience on the local stack: a remote service down, slow remotes with the worker's
default pool, and outcomes the agent cannot know. Printed figures, never asserted.

- :func:`outage`: payments answers 503 to every call for a while (the fake remote's
  ``transient`` rate 1.0) while orders flow through the hosts with the app's default
  settings; the agents' circuit breakers open, steps at payments are postponed, and
  when payments is back every order is to finish. Calls reaching payments while it is
  down are counted at the fake remote; breaker changes, postponements and drops are
  read from the hosts' logs (timestamped lines).
- :func:`agents_run`: every remote answering in ``apply_seconds`` (the fake remote's
  ``apply_seconds``), orders sent at once, hosts with the worker's default pool of
  ``min(32, cores + 4)`` threads for sync functions; run once with the app (async
  agents) and once with the sync comparator (:mod:`benchmarks.sync_agents`). Requests
  the agents drop past their complete-by are read from the hosts' logs.
- :func:`unknown_outcomes`: a share of the calls applied but answered after the call
  timeout (the fake remote's ``slow`` rate): where the service offers the lookup by
  idempotency key (inventory, payments) the agent asks before sending again; where it
  does not (shipping) it sends the action again with the same key. POSTs, lookups and
  replays per action applied, counted at the fake remote.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from adapters.settings import Settings
from adapters.store import StateStore
from benchmarks import pipeline
from benchmarks.stack import BenchStack, OrderSender
from core.models import OrderState, ProcessState, idempotency_key
from core.workflow import CURRENT
from tools.funchost.invoke import default_thread_count
from tools.funchost.testing import HostProcess

#: The remote service taken down in the outage (the workflow's middle step: charge).
DOWN = "payments"
#: The app's defaults (adapters/settings.py), for the figures' arithmetic.
DEFAULT_OPEN_SECONDS: float = Settings.model_fields["breaker_open_seconds"].default
DEFAULT_STEP_TIMEOUT: float = Settings.model_fields["step_timeout_seconds"].default
DEFAULT_CALL_TIMEOUT: float = Settings.model_fields["remote_call_timeout_seconds"].default
#: The worker's default pool for sync functions on this machine (tools/funchost/README.md).
WORKER_THREADS = default_thread_count()

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
#: agents/breaker.py: "circuit breaker for <service>: <from> -> <to>".
_BREAKER = re.compile(_STAMP + r".*circuit breaker for (\S+): (\S+) -> (\S+)", re.MULTILINE)
#: agents/agent.py: the request dropped, nothing sent (arrived late, or no result in time).
_DROPPED = re.compile(
    r"order (\S+) attempt \d+ \([^)]*\) arrived past complete-by|order (\S+) attempt \d+: no result before complete-by"
)
#: agents/agent.py: a call refused by the open breaker, answered "postponed".
_AGENT_POSTPONED = re.compile(r"order (\S+) (?:action|compensation) \S+ postponed: ")
#: scheduler/dispatch.py: a line put back to Pending with a delayed nudge.
_LINE_POSTPONED = re.compile(r"order (\S+): (?:action|compensation) \S+ postponed for ")


def _quiet(text: str, total: int | None = None):
    """The default ``status``: says nothing; returns what to call with progress (done so far)."""
    return lambda done: None


def _stamp(text: str) -> float:
    """A host log line's time (funchost: local time, milliseconds) as epoch seconds."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class HostLog:
    """What one host logged from a mark on (``offset``: the log's size at the mark)."""

    host: HostProcess
    offset: int = 0

    @classmethod
    def mark(cls, hosts: list[HostProcess]) -> list[HostLog]:
        return [cls(host, host.log_path.stat().st_size) for host in hosts]

    def text(self) -> str:
        with open(self.host.log_path, "rb") as handle:
            handle.seek(self.offset)
            return handle.read().decode("utf-8", "replace")


def _ids(pattern: re.Pattern, text: str, prefix: str) -> list[str]:
    """The order ids of the matching lines, for this run's orders only."""
    found = (next((g for g in m.groups() if g), "") for m in pattern.finditer(text))
    return [order_id for order_id in found if order_id.startswith(prefix)]


def wait_terminal(store: StateStore, prefix: str, count: int, *, timeout: float, interval: float = 0.5,
                  progress=None) -> dict[str, OrderState]:
    """The run's states once ``count`` of them are terminal, or at ``timeout`` (as they are)."""
    deadline = time.monotonic() + timeout
    while True:
        states = pipeline.state_rows(store, prefix)
        done = sum(1 for s in states.values() if s.process_state.terminal)
        if progress is not None:
            progress(done)
        if done >= count or time.monotonic() > deadline:
            return states
        time.sleep(interval)


def tally(states: dict[str, OrderState], ids: list[str]) -> Counter[str]:
    """Orders by final state; ``unfinished`` for those not terminal (or never created)."""
    counts: Counter[str] = Counter()
    for order_id in ids:
        state = states.get(order_id)
        counts[state.process_state.value if state and state.process_state.terminal else "unfinished"] += 1
    return counts


def failures_counted(store: StateStore, ids: list[str]) -> int:
    """Failed attempts counted on the orders' lines (an expired step, a run of postponements)."""
    total = 0
    for order_id in ids:
        record = store.read(order_id)
        total += sum(line.failure_count for line in record.lines) + record.state.failure_count
    return total


class _CallTimes(logging.Handler):
    """When the fake remote (in this process) answered each POST to one service: its log
    line per call (``devtools.fake_remote``, INFO), caught while in a ``with`` block."""

    _LOGGER = "devtools.fake_remote"

    def __init__(self, service: str) -> None:
        super().__init__(logging.INFO)
        self.service = service
        self.times: list[float] = []
        self._logger = logging.getLogger(self._LOGGER)
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("%s/%s order=") and record.args and record.args[0] == self.service:
            self.times.append(record.created)

    def __enter__(self) -> _CallTimes:
        self._logger.addHandler(self)
        if not self._logger.isEnabledFor(logging.INFO):
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc_info) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def between(self, start: float, end: float) -> int:
        return sum(1 for t in self.times if start <= t <= end)


# --- the outage -----------------------------------------------------------------------


@dataclass
class HostBreaker:
    """One host's breaker for the service down, from its log."""

    name: str
    #: closed -> open.
    openings: int = 0
    #: half_open -> open: a trial call that failed.
    trials_failed: int = 0
    #: half_open -> closed: a trial call that succeeded.
    trials_ok: int = 0
    #: Seconds from the outage's start to this host's first opening.
    first_open: float | None = None
    #: Seconds from the service's return to this host's breaker closing again.
    closed_after_back: float | None = None
    #: Requests its agent answered "postponed" (refused by the open breaker, no call).
    postponed_requests: int = 0
    #: Requests its agent dropped (past complete-by, nothing sent back).
    dropped: int = 0


@dataclass
class OutageResult:
    orders: int
    hosts: int
    outage_seconds: float
    open_seconds: float
    states: Counter[str]
    #: POSTs reaching the service while it was down (counted at the fake remote).
    calls_down: int
    #: Of those, the ones before the last host's breaker first opened (the burst in flight).
    calls_before_open: int | None
    #: Seconds from the service's return to the last order's Processed commit (None: not all Processed).
    back_to_done: float | None
    #: Lines the scheduler put back to Pending with a delayed nudge ("postponed for").
    lines_postponed: int
    #: Orders postponed at least once.
    orders_postponed: int
    failures: int
    breakers: list[HostBreaker] = field(default_factory=list)

    @property
    def periods(self) -> float:
        return self.outage_seconds / self.open_seconds

    @property
    def per_host_period(self) -> float:
        return self.calls_down / (self.hosts * self.periods)


def outage(stack: BenchStack, sender: OrderSender, *, orders: int, seconds: float, hosts: int,
           open_seconds: float | None, warm_up: int, timeout: float, status=_quiet,
           settings: dict[str, str] | None = None) -> OutageResult:
    """Payments down for ``seconds`` while ``orders`` are sent at an even rate over that
    time; then back, and every order waited for (``timeout`` s at most). ``settings``: other
    app settings of the hosts (the app's defaults otherwise)."""
    settings = {**(settings or {}), **({} if open_seconds is None else {"BREAKER_OPEN_SECONDS": f"{open_seconds:g}"})}
    status(f"outage: starting {hosts} host(s) with the app's defaults{' and ' + str(settings) if settings else ''}")
    started = stack.start_app_hosts(hosts, **settings)
    pipeline.warm_up(stack, sender, "warm-out-", count=warm_up)
    logs = HostLog.mark(started)
    store = StateStore(stack.table())
    prefix = "out-"
    ids = [f"{prefix}{i:05d}" for i in range(orders)]
    with _CallTimes(DOWN) as calls:
        calls_before = stack.remote.effects()["services"][DOWN]["calls"]
        stack.remote.set_faults(service=DOWN, rates={"transient": 1.0})
        down = time.time()
        sent = status(f"outage: {DOWN} answers 503 for {seconds:g} s; orders sent at an even rate", orders)
        for i, order_id in enumerate(ids):
            delay = down + i * seconds / orders - time.time()
            if delay > 0:
                time.sleep(delay)
            sender.send([order_id], start_index=i)
            sent(i + 1)
        if (left := down + seconds - time.time()) > 0:
            time.sleep(left)  # the outage lasts its time, whatever the sends took
        calls_down = stack.remote.effects()["services"][DOWN]["calls"] - calls_before
        stack.remote.set_faults(service=DOWN)  # back
        back = time.time()
        tick = status(f"outage: {DOWN} back; orders finished", orders)
        states = wait_terminal(store, prefix, orders, timeout=timeout, progress=tick)
    counts = tally(states, ids)
    processed = [s for s in states.values() if s.process_state is ProcessState.PROCESSED]
    back_to_done = max(pipeline.processed_at(s) for s in processed) - back if len(processed) == orders else None
    breakers, opened_at, postponed_lines, postponed_orders = [], [], 0, set()
    for index, log in enumerate(logs, 1):
        text = log.text()
        breaker = HostBreaker(f"host {index}")
        for stamp, service, before, after in _BREAKER.findall(text):
            if service != DOWN:
                continue
            at = _stamp(stamp)
            if after == "open":
                if before == "closed":
                    breaker.openings += 1
                    if breaker.first_open is None:
                        breaker.first_open = at - down
                        opened_at.append(at)
                else:
                    breaker.trials_failed += 1
            elif after == "closed":
                breaker.trials_ok += 1
                if at >= back:
                    breaker.closed_after_back = at - back
        breaker.postponed_requests = len(_ids(_AGENT_POSTPONED, text, prefix))
        breaker.dropped = len(_ids(_DROPPED, text, prefix))
        lines = _ids(_LINE_POSTPONED, text, prefix)
        postponed_lines += len(lines)
        postponed_orders.update(lines)
        breakers.append(breaker)
    calls_before_open = None
    if len(opened_at) == len(logs) and opened_at:
        calls_before_open = min(calls_down, calls.between(down, max(opened_at)))
    open_time = open_seconds if open_seconds is not None else DEFAULT_OPEN_SECONDS
    return OutageResult(
        orders=orders, hosts=hosts, outage_seconds=back - down, open_seconds=open_time, states=counts,
        calls_down=calls_down, calls_before_open=calls_before_open, back_to_done=back_to_done,
        lines_postponed=postponed_lines, orders_postponed=len(postponed_orders),
        failures=failures_counted(store, [i for i in ids if i in states]), breakers=breakers,
    )


# --- slow remotes, the worker's default pool: async vs sync agents ----------------------


@dataclass
class AgentsRun:
    agents: str
    orders: int
    hosts: int
    #: The worker's pool for sync functions, as the hosts reported it at start-up.
    threads: int
    #: First send -> the last order's final commit, or the cap.
    seconds: float
    capped: bool
    states: Counter[str]
    #: Forward actions applied at the remote services for the run's orders.
    steps: int
    #: Compensations that undid something.
    undos: int
    #: Requests dropped by an agent past their complete-by (arrived late, or no result in time).
    dropped_steps: int
    dropped_orders: int
    #: Calls that reached a remote service after their Complete-By (the fake remote's count).
    late_calls: int

    @property
    def steps_per_second(self) -> float | None:
        return self.steps / self.seconds if self.seconds else None


def agents_run(stack: BenchStack, sender: OrderSender, *, agents: str, app_dir: Path | None, orders: int,
               hosts: int, apply_seconds: float, warm_up: int, cap: float, status=_quiet) -> AgentsRun:
    """``orders`` sent at once with every remote service taking ``apply_seconds`` per call,
    on hosts with the worker's default pool; until every order is final, or ``cap`` s."""
    status(f"concurrency: starting {hosts} host(s), {agents} agents, {WORKER_THREADS} worker threads")
    started = stack.start_app_hosts(hosts, app_dir=app_dir, PYTHON_THREADPOOL_THREAD_COUNT=str(WORKER_THREADS))
    pipeline.warm_up(stack, sender, f"warm-{agents}-", count=warm_up)
    logs = HostLog.mark(started)
    store = StateStore(stack.table())
    prefix = f"{agents}-"
    ids = [f"{prefix}{i:05d}" for i in range(orders)]
    before = stack.remote.effects()
    stack.remote.set_faults(apply_seconds=apply_seconds)  # every service, every call
    tick = status(f"concurrency: {orders} orders, every remote answering in {apply_seconds:g} s ({agents} agents); "
                  "orders finished", orders)
    first_send = time.time()
    sender.send(ids)
    states = wait_terminal(store, prefix, orders, timeout=cap, progress=tick)
    ended = time.time()
    stack.remote.set_faults(apply_seconds=0)
    effects = stack.remote.effects()
    counts = tally(states, ids)
    final = [pipeline.processed_at(s) for s in states.values() if s.process_state.terminal]
    capped = counts["unfinished"] > 0
    seconds = (ended if capped or not final else max(final)) - first_send
    steps = sum(n for order_id, n in effects["by_order"].items() if order_id.startswith(prefix))
    undos = sum(
        len(undone) for service in effects["services"].values()
        for order_id, undone in service["undone"].items() if order_id.startswith(prefix)
    )
    dropped = [order_id for log in logs for order_id in _ids(_DROPPED, log.text(), prefix)]
    return AgentsRun(
        agents=agents, orders=orders, hosts=hosts, threads=min(h.sync_threads for h in started), seconds=seconds,
        capped=capped, states=counts, steps=steps, undos=undos, dropped_steps=len(dropped),
        dropped_orders=len(set(dropped)), late_calls=effects["late"] - before["late"],
    )


# --- unknown outcomes: applied, answered too late ----------------------------------------


@dataclass
class ServiceCalls:
    service: str
    lookup: bool
    #: The run's forward actions applied (one per key).
    applied: int
    posts: int
    lookups: int
    replays: int
    #: Calls answered after the call timeout (drawn ``slow`` at the fake remote).
    slow: int

    @property
    def posts_per_action(self) -> float | None:
        return self.posts / self.applied if self.applied else None

    @property
    def lookups_per_action(self) -> float | None:
        return self.lookups / self.applied if self.applied else None


@dataclass
class UnknownResult:
    orders: int
    hosts: int
    rate: float
    call_timeout: float
    slow_seconds: float
    seconds: float
    states: Counter[str]
    services: list[ServiceCalls]
    twice: int
    breaker_openings: int
    lines_postponed: int
    dropped_steps: int


def unknown_outcomes(stack: BenchStack, sender: OrderSender, *, orders: int, hosts: int, rate: float,
                     call_timeout: float, slow_seconds: float, warm_up: int, timeout: float,
                     status=_quiet) -> UnknownResult:
    """``orders`` sent at once; a share ``rate`` of the calls at every service applied but
    answered after ``slow_seconds`` (beyond the agents' ``call_timeout``)."""
    status(f"unknown outcomes: starting {hosts} host(s), REMOTE_CALL_TIMEOUT_SECONDS={call_timeout:g}")
    started = stack.start_app_hosts(hosts, REMOTE_CALL_TIMEOUT_SECONDS=f"{call_timeout:g}")
    pipeline.warm_up(stack, sender, "warm-unk-", count=warm_up)
    logs = HostLog.mark(started)
    stack.remote.reset()  # the ledger from here on holds this run only (nothing else in flight)
    store = StateStore(stack.table())
    prefix = "unk-"
    ids = [f"{prefix}{i:05d}" for i in range(orders)]
    stack.remote.set_faults(rates={"slow": rate}, slow_seconds=slow_seconds)
    tick = status(f"unknown outcomes: {orders} orders, {rate:.0%} of calls answered after {slow_seconds:g} s; "
                  "orders finished", orders)
    first_send = time.time()
    sender.send(ids)
    states = wait_terminal(store, prefix, orders, timeout=timeout, progress=tick)
    stack.remote.set_faults()
    final = [pipeline.processed_at(s) for s in states.values() if s.process_state.terminal]
    effects = stack.remote.effects()
    services = []
    for step in CURRENT.steps:
        keys = {idempotency_key(order_id, step.name, step.action) for order_id in ids}
        counts = effects["services"][step.remote]
        services.append(ServiceCalls(
            service=step.remote, lookup=step.lookup, applied=sum(1 for key in counts["by_key"] if key in keys),
            posts=counts["calls"], lookups=counts["lookups"], replays=counts["replays"], slow=counts["faults"]["slow"],
        ))
    texts = [log.text() for log in logs]
    return UnknownResult(
        orders=orders, hosts=hosts, rate=rate, call_timeout=call_timeout, slow_seconds=slow_seconds,
        seconds=(max(final) if final else time.time()) - first_send, states=tally(states, ids), services=services,
        twice=effects["twice"],
        breaker_openings=sum(1 for text in texts for m in _BREAKER.finditer(text) if m[4] == "open"),
        lines_postponed=sum(len(_ids(_LINE_POSTPONED, text, prefix)) for text in texts),
        dropped_steps=sum(len(_ids(_DROPPED, text, prefix)) for text in texts),
    )
