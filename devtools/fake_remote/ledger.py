"""The fake's state, independent of HTTP: per service, its settings, fault plan and ledger.

An *application* is the one application of an idempotency key at a service. The ledger
keeps the first response body per key and replays it byte for byte. Applying is
serialised per key and per (order id, step) at a service (locks created on demand and
dropped when nobody holds or waits for them): a compensation that arrives while its
step's forward action is being applied waits for it, then undoes it.

A forward action's application is *live* until a compensation of the same (order id,
step) undoes it. A compensation with nothing live to undo is a no-op success.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from devtools.fake_remote.catalog import ACTION, COMPENSATION, Service
from devtools.fake_remote.faults import FAULT_KINDS, FaultConfigError, FaultPlan, split_script_key
from devtools.fake_remote.watch import Watch, WatchedCall

#: A call is counted ``late`` when it arrives more than this after its ``Complete-By``.
#: "Arrives" is when the fake's handler thread reads the request: in the tests the fake
#: shares a process (and its GIL) with the test driver, and with two pytest workers on two
#: cores that thread was seen to read a request sent in time 0.6-0.7 s late (the caller's
#: own timeout had already ended it). The agents' guard itself (no call started with less
#: than 0.2 s left) is tested to the millisecond in tests/integration/test_agent.py.
LATE_TOLERANCE_SECONDS = 1.0

#: The settings a fault configuration may change, besides the script and the rates.
SETTING_NAMES = ("seed", "slow_seconds", "retry_after_seconds", "apply_seconds")


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    #: How long ``slow`` delays the response and ``hang`` delays the application.
    slow_seconds: float = 30.0
    #: The ``Retry-After`` value sent with ``throttle`` (429), whole seconds.
    retry_after_seconds: int = 1
    #: How long applying one call takes, inside its locks (0: instant).
    apply_seconds: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise FaultConfigError(f"seed must be an integer, got {self.seed!r}")
        for name in ("slow_seconds", "apply_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise FaultConfigError(f"{name} must be a number >= 0, got {value!r}")
        value = self.retry_after_seconds
        if isinstance(value, float) and value.is_integer():
            object.__setattr__(self, "retry_after_seconds", int(value))
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FaultConfigError(f"retry_after_seconds must be a whole number of seconds >= 0, got {value!r}")

    def describe(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SETTING_NAMES}


class Stopping(Exception):
    """The service is shutting down; the call ends without a response."""


@dataclass(frozen=True)
class Call:
    """One validated call: ``POST {url}/{service}/{action}``."""

    service: str
    action: str
    kind: str  # "action" or "compensation"
    order_id: str
    step: str
    key: str

    @property
    def identity(self) -> tuple[str, str, str]:
        return self.order_id, self.step, self.action


@dataclass(frozen=True)
class Applied:
    body: bytes
    replayed: bool


@dataclass(frozen=True)
class Refused:
    """Not applied, for a reason of the request's content (answered with 422)."""

    error: str
    message: str


@dataclass
class _Result:
    identity: tuple[str, str, str]
    body: bytes


def confirmation_for(key: str) -> str:
    """A stable confirmation id derived from the idempotency key."""
    return "cnf-" + hashlib.sha256(key.encode()).hexdigest()[:20]


class _ServiceState:
    """One service's settings, plan and ledger. Guarded by the Ledger's lock."""

    def __init__(self, service: Service, settings: Settings, plan: FaultPlan) -> None:
        self.service = service
        self.settings = settings
        self.plan = plan
        self.in_flight = 0
        self.clear()

    def clear(self) -> None:
        self.results: dict[str, _Result] = {}
        self.by_key: Counter[str] = Counter()
        self.key_calls: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.calls = self.replays = self.invalid = self.late = self.noop_compensations = self.twice = 0
        self.lookups = 0
        self.applied: dict[str, list[str]] = {}  # order id -> forward actions applied, in order
        self.undone: dict[str, list[str]] = {}  # order id -> compensations that undid something
        self.undid: dict[str, list[str]] = {}  # order id -> the forward actions they undid
        self.live: dict[tuple[str, str], list[str]] = {}  # (order id, step) -> applied actions not undone
        self.done: Counter[tuple[str, str, str]] = Counter()  # (order id, step, action) -> applications
        #: order id -> the W3C traceparent header of each call (action, header), in arrival order
        self.traceparents: dict[str, list[dict[str, str | None]]] = {}

    def effects(self) -> dict[str, Any]:
        return {
            "applied": {order: list(actions) for order, actions in self.applied.items()},
            "undone": {order: list(compensations) for order, compensations in self.undone.items()},
            "noop_compensations": self.noop_compensations,
            "twice": self.twice,
            "late": self.late,
            "calls": self.calls,
            "lookups": self.lookups,
            "replays": self.replays,
            "invalid": self.invalid,
            "in_flight": self.in_flight,
            "faults": {kind: self.faults[kind] for kind in FAULT_KINDS},
            "by_key": dict(self.by_key),
            "traceparents": {order: [dict(call) for call in calls] for order, calls in self.traceparents.items()},
        }

    def config(self) -> dict[str, Any]:
        return {"actions": self.service.as_mapping(), **self.plan.describe(), **self.settings.describe()}

    # --- applying (the Ledger holds its lock) -------------------------------
    def record(self, call: Call, now: datetime) -> bytes | Refused:
        """Apply a first call of its key; the response body, or why it is refused."""
        body: dict[str, Any] = {
            "order_id": call.order_id,
            "step": call.step,
            "service": call.service,
            "action": call.action,
            "kind": call.kind,
            "confirmation": confirmation_for(call.key),
            "applied_at": now.isoformat(),
        }
        live = self.live.setdefault((call.order_id, call.step), [])
        if call.kind == ACTION:
            live.append(call.action)
            self.applied.setdefault(call.order_id, []).append(call.action)
        else:
            undoable = self.service.compensations[call.action]
            target = next((action for action in reversed(live) if action in undoable), None)
            if target is None and live:
                return Refused(
                    "not_its_compensation",
                    f"{call.action!r} does not undo {', '.join(map(repr, live))} "
                    f"(applied for order {call.order_id!r} step {call.step!r})",
                )
            if target is not None:
                del live[len(live) - 1 - live[::-1].index(target)]  # its latest application
                self.undone.setdefault(call.order_id, []).append(call.action)
                self.undid.setdefault(call.order_id, []).append(target)
                body.update(undone=True, undid=target, outcome="undone")
            elif any(self.done[(call.order_id, call.step, action)] for action in undoable):
                body.update(
                    undone=False, undid=None, outcome="already_undone",
                    message=f"nothing to undo: step {call.step!r} of order {call.order_id!r} was undone already",
                )  # fmt: skip
            else:
                self.noop_compensations += 1
                body.update(
                    undone=False, undid=None, outcome="nothing_to_undo",
                    message=f"nothing to undo: {' or '.join(undoable)} was never applied "
                    f"for order {call.order_id!r} step {call.step!r}",
                )  # fmt: skip
        if not live:
            del self.live[(call.order_id, call.step)]
        self.done[call.identity] += 1
        if self.done[call.identity] > 1:
            self.twice += 1
        encoded = json.dumps(body).encode()
        self.results[call.key] = _Result(call.identity, encoded)
        self.by_key[call.key] += 1
        return encoded


class Ledger:
    """Thread-safe state of every service of one fake."""

    def __init__(
        self,
        services: Mapping[str, Service],
        settings: Settings,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        service_faults: Mapping[str, Mapping[str, Any]] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._named_locks: dict[tuple[str, ...], list] = {}  # name -> [lock, users]
        self._stopping = stopping or threading.Event()
        self._services = MappingProxyType(dict(services))
        self._states = {
            name: _ServiceState(service, settings, FaultPlan()) for name, service in self._services.items()
        }
        self._generation = 0
        self._not_found = 0
        self._watches: list[Watch] = []
        self.set_faults(None, script, rates)
        if service_faults is not None:
            if not isinstance(service_faults, Mapping):
                raise FaultConfigError(f"service_faults must be an object of service -> faults, got {service_faults!r}")
            for name, faults in service_faults.items():
                if not isinstance(faults, Mapping):
                    raise FaultConfigError(f"service_faults[{name!r}] must be an object, got {faults!r}")
                unknown = set(faults) - {"script", "rates", *SETTING_NAMES}
                if unknown:
                    raise FaultConfigError(f"service_faults[{name!r}]: unknown fields {', '.join(sorted(unknown))}")
                self.set_faults(name, **faults)
        self._initial = {name: (state.settings, state.plan.script, state.plan.rates) for name, state in self._states.items()}

    @property
    def services(self) -> Mapping[str, Service]:
        """The services served, read-only."""
        return self._services

    def lookup(self, service: str, action: str, key: str) -> bytes | None:
        """The first result of ``key`` if it was applied for ``action`` of ``service``, else None."""
        with self._lock:
            state = self._states[service]
            state.lookups += 1
            result = state.results.get(key)
            return result.body if result is not None and result.identity[2] == action else None

    # --- control -------------------------------------------------------------
    def set_faults(
        self,
        service: str | None = None,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        *,
        seed: int | None = None,
        slow_seconds: float | None = None,
        retry_after_seconds: int | None = None,
        apply_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Replace the script and the rates (omitted = none) of one service, or of every
        service (``service=None``); settings given are changed there, the others kept.

        With ``service=None`` each service gets its own copy of the script (without the
        ``order/action`` entries of actions it does not have) and keeps its own progress.
        Script progress and sticky permanent failures start afresh. The ledger is kept.
        Raises FaultConfigError and changes nothing when a setting is invalid.
        """
        if service is not None and service not in self._services:
            raise FaultConfigError(f"unknown service {service!r}; known: {', '.join(self._services)}")
        targets = [service] if service is not None else list(self._services)
        routes = frozenset().union(*(self._services[name].routes for name in targets))
        FaultPlan(script, rates, routes)  # validates against every target's routes together
        changes = {
            name: value
            for name, value in (
                ("seed", seed),
                ("slow_seconds", slow_seconds),
                ("retry_after_seconds", retry_after_seconds),
                ("apply_seconds", apply_seconds),
            )
            if value is not None
        }
        with self._lock:
            current = {name: self._states[name].settings for name in targets}
        new: dict[str, tuple[Settings, FaultPlan]] = {}
        for name in targets:
            own = self._services[name].routes
            mine = None
            if script is not None:
                mine = {key: entries for key, entries in script.items() if split_script_key(key)[1] in (None, *own)}
            new[name] = (replace(current[name], **changes), FaultPlan(mine, rates, own))
        with self._lock:
            for name, (settings, plan) in new.items():
                self._states[name].settings = settings
                self._states[name].plan = plan
        return self.config(service)

    def reset(self) -> None:
        """Back to the state the fake started in: empty ledgers, the start faults and settings."""
        with self._lock:
            self._generation += 1
            self._not_found = 0
            for name, state in self._states.items():
                settings, script, rates = self._initial[name]
                state.clear()
                state.settings = settings
                state.plan = FaultPlan(script, rates)
                # in_flight is kept: those calls are still running

    def config(self, service: str | None = None) -> dict[str, Any]:
        """One service's configuration, or ``{"services": {name: configuration}}``."""
        with self._lock:
            if service is not None:
                if service not in self._states:
                    raise FaultConfigError(f"unknown service {service!r}; known: {', '.join(self._services)}")
                return self._states[service].config()
            return {"services": {name: state.config() for name, state in self._states.items()}}

    def settings(self, service: str) -> Settings:
        with self._lock:
            return self._states[service].settings

    def effects(self) -> dict[str, Any]:
        with self._lock:
            services = {name: state.effects() for name, state in self._states.items()}
            net: dict[str, dict[str, dict[str, int]]] = {}
            for name, state in self._states.items():
                for order, actions in state.applied.items():
                    counts = Counter(actions)
                    counts.subtract(state.undid.get(order, []))
                    net.setdefault(order, {})[name] = dict(counts)
            not_found = self._not_found
        by_order: Counter[str] = Counter()
        by_key: Counter[str] = Counter()
        faults: Counter[str] = Counter()
        traceparents: dict[str, list[dict[str, str | None]]] = {}
        for name, effects in services.items():
            by_order.update({order: len(actions) for order, actions in effects["applied"].items()})
            by_key.update(effects["by_key"])
            faults.update(effects["faults"])
            for order, calls in effects["traceparents"].items():
                traceparents.setdefault(order, []).extend({"service": name, **call} for call in calls)

        def total(field: str) -> int:
            return sum(effects[field] for effects in services.values())

        return {
            "total": sum(by_order.values()),
            "by_order": dict(by_order),
            "by_key": dict(by_key),
            "in_flight": total("in_flight"),
            "calls": total("calls"),
            "replays": total("replays"),
            "invalid": total("invalid"),
            "late": total("late"),
            "twice": total("twice"),
            "undos": sum(len(undone) for effects in services.values() for undone in effects["undone"].values()),
            "noop_compensations": total("noop_compensations"),
            "not_found": not_found,
            "faults": {kind: faults[kind] for kind in FAULT_KINDS},
            "services": services,
            "net": net,
            "traceparents": traceparents,
        }

    def net(self, order_id: str) -> dict[str, dict[str, int]]:
        """What stays applied for one order: {service: {action: applied minus undone}}."""
        return self.effects()["net"].get(order_id, {})

    # --- calls ---------------------------------------------------------------
    @contextmanager
    def call(self, service: str) -> Iterator[None]:
        """Count one call to a service for its whole duration."""
        with self._lock:
            state = self._states[service]
            state.calls += 1
            state.in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                state.in_flight -= 1

    def note_invalid(self, service: str) -> None:
        with self._lock:
            self._states[service].invalid += 1

    def note_late(self, service: str) -> None:
        with self._lock:
            self._states[service].late += 1

    def note_traceparent(self, call: Call, traceparent: str | None) -> None:
        """Keep the ``traceparent`` header a call arrived with (None: it had none)."""
        with self._lock:
            calls = self._states[call.service].traceparents.setdefault(call.order_id, [])
            calls.append({"action": call.action, "key": call.key, "traceparent": traceparent})

    def note_not_found(self) -> None:
        with self._lock:
            self._not_found += 1

    def decide(self, call: Call) -> str | None:
        """The fault for this call, or None; counts the fault."""
        with self._lock:
            state = self._states[call.service]
            n = state.key_calls[call.key]
            state.key_calls[call.key] += 1
            first = state.results.get(call.key)
            replay = first is not None and first.identity == call.identity
            fault = state.plan.decide(
                call.order_id, call.key, n, state.settings.seed, replay,
                action=call.action, kind=call.kind, service=call.service,
            )  # fmt: skip
            if fault is not None:
                state.faults[fault] += 1
            return fault

    def watch(self, script_key: str) -> Watch:
        """Watch every call of ``"<order id>/<action>"`` from now on (devtools/fake_remote/watch.py)."""
        watch = Watch(script_key)
        if not any(watch.action in service.routes for service in self._services.values()):
            raise FaultConfigError(f"watch {script_key!r}: no service has an action or compensation {watch.action!r}")
        with self._lock:
            self._watches.append(watch)
        return watch

    def watched(
        self, call: Call, fault: str | None, attempt: int, arrived_at: datetime, complete_by: datetime
    ) -> WatchedCall | None:
        """The call as its watches see it (None when none watches it), added to each."""
        with self._lock:
            watches = [watch for watch in self._watches if watch.matches(call.order_id, call.action)]
        if not watches:
            return None
        seen = WatchedCall(
            call.service, call.action, call.order_id, call.step, call.key, attempt, fault, arrived_at, complete_by
        )
        for watch in watches:
            watch.add(seen)
        return seen

    @contextmanager
    def _locked(self, *names: tuple[str, ...]) -> Iterator[None]:
        """Hold the named locks, taken in the order given (always key, then step)."""
        with self._lock:
            entries = []
            for name in names:
                entry = self._named_locks.setdefault(name, [threading.Lock(), 0])
                entry[1] += 1
                entries.append((name, entry))
        held = []
        try:
            for _, entry in entries:
                entry[0].acquire()
                held.append(entry)
            yield
        finally:
            for entry in reversed(held):
                entry[0].release()
            with self._lock:
                for name, entry in entries:
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._named_locks[name]

    def apply(self, call: Call) -> Applied | Refused:
        """Apply the key once; a repeat returns the first body. Raises Stopping."""
        with self._locked(("key", call.service, call.key), ("step", call.service, call.order_id, call.step)):
            with self._lock:
                state = self._states[call.service]
                first = state.results.get(call.key)
                if first is not None and first.identity == call.identity:
                    state.replays += 1
                    return Applied(first.body, replayed=True)
                generation = self._generation
                apply_seconds = state.settings.apply_seconds
            if first is not None:
                order_id, step, action = first.identity
                return Refused(
                    "idempotency_key_reused",
                    f"Idempotency-Key was first used for order {order_id!r} step {step!r} action {action!r}",
                )
            if apply_seconds and self._stopping.wait(apply_seconds):
                raise Stopping()
            with self._lock:
                if generation != self._generation:  # reset meanwhile: answer as a fresh ledger would, record nothing
                    ghost = _ServiceState(state.service, state.settings, FaultPlan())
                    outcome = ghost.record(call, datetime.now(UTC))
                else:
                    outcome = state.record(call, datetime.now(UTC))
            if isinstance(outcome, Refused):
                return outcome
            return Applied(outcome, replayed=False)


__all__ = ["ACTION", "COMPENSATION", "Applied", "Call", "Ledger", "Refused", "Settings", "Stopping", "confirmation_for"]
