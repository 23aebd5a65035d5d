"""The service's state, independent of HTTP: settings, fault plan and the effect ledger.

An *effect* is the one application of an idempotency key. The ledger keeps the first
response body per key and replays it byte for byte; applying is serialised per key
(a lock per key, created on demand and dropped when nobody holds or waits for it).
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
from datetime import datetime, timezone
from typing import Any

from devtools.fake_remote.faults import FAULT_KINDS, FaultConfigError, FaultPlan


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    #: How long ``slow`` delays the response and ``hang`` delays the application.
    slow_seconds: float = 30.0
    #: The ``Retry-After`` value sent with ``throttle`` (429), whole seconds.
    retry_after_seconds: int = 1
    #: How long applying one effect takes, inside the key's lock (0: instant).
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


class Stopping(Exception):
    """The service is shutting down; the call ends without a response."""


@dataclass(frozen=True)
class Applied:
    body: bytes
    replayed: bool


@dataclass(frozen=True)
class KeyReused:
    """The key was first applied for another (order id, step)."""

    order_id: str
    step: str


@dataclass
class _Result:
    order_id: str
    step: str
    body: bytes


def confirmation_for(key: str) -> str:
    """A stable confirmation id derived from the idempotency key."""
    return "cnf-" + hashlib.sha256(key.encode()).hexdigest()[:20]


class Ledger:
    """Thread-safe state of one fake remote service."""

    def __init__(
        self,
        settings: Settings,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._key_locks: dict[str, list] = {}  # key -> [lock, users]
        self._stopping = stopping or threading.Event()
        self._initial = (settings, FaultPlan(script, rates))  # validates
        self._settings = settings
        self._plan = FaultPlan(script, rates)
        self._clear()

    # --- control -------------------------------------------------------------
    def _clear(self) -> None:
        self._generation = getattr(self, "_generation", 0) + 1
        self._results: dict[str, _Result] = {}
        self._by_key: Counter[str] = Counter()
        self._by_order: Counter[str] = Counter()
        self._key_calls: Counter[str] = Counter()
        self._faults: Counter[str] = Counter()
        self._calls = 0
        self._replays = 0
        self._invalid = 0
        self._in_flight = 0

    def set_faults(
        self,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        *,
        seed: int | None = None,
        slow_seconds: float | None = None,
        retry_after_seconds: int | None = None,
        apply_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Replace the script and the rates (omitted = none); settings given are changed.

        Script progress and sticky permanent failures start afresh. The ledger is kept.
        """
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
        plan = FaultPlan(script, rates)
        with self._lock:
            self._settings = replace(self._settings, **changes)
            self._plan = plan
        return self.config()

    def reset(self) -> None:
        """Back to the state the service started in: empty ledger, the start faults and settings."""
        settings, plan = self._initial
        with self._lock:
            in_flight = self._in_flight
            self._clear()
            self._in_flight = in_flight
            self._settings = settings
            self._plan = FaultPlan(plan.script, plan.rates)

    def config(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self._plan.describe(),
                "seed": self._settings.seed,
                "slow_seconds": self._settings.slow_seconds,
                "retry_after_seconds": self._settings.retry_after_seconds,
                "apply_seconds": self._settings.apply_seconds,
            }

    @property
    def settings(self) -> Settings:
        with self._lock:
            return self._settings

    def effects(self) -> dict[str, Any]:
        with self._lock:
            return {
                "by_key": dict(self._by_key),
                "by_order": dict(self._by_order),
                "total": sum(self._by_key.values()),
                "calls": self._calls,
                "faults": {kind: self._faults[kind] for kind in FAULT_KINDS},
                "replays": self._replays,
                "invalid": self._invalid,
                "in_flight": self._in_flight,
            }

    # --- calls ---------------------------------------------------------------
    @contextmanager
    def call(self) -> Iterator[None]:
        """Count one call to the service for its whole duration."""
        with self._lock:
            self._calls += 1
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def note_invalid(self) -> None:
        with self._lock:
            self._invalid += 1

    def decide(self, order_id: str, step: str, key: str) -> str | None:
        """The fault for this call, or None; counts the fault."""
        with self._lock:
            n = self._key_calls[key]
            self._key_calls[key] += 1
            first = self._results.get(key)
            replay = first is not None and (first.order_id, first.step) == (order_id, step)
            fault = self._plan.decide(order_id, key, n, self._settings.seed, replay)
            if fault is not None:
                self._faults[fault] += 1
            return fault

    @contextmanager
    def _key_locked(self, key: str) -> Iterator[None]:
        with self._lock:
            entry = self._key_locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._key_locks[key]

    def apply(self, order_id: str, step: str, key: str) -> Applied | KeyReused:
        """Apply the key once; a repeat returns the first body. Raises Stopping."""
        with self._key_locked(key):
            with self._lock:
                first = self._results.get(key)
                if first is not None and (first.order_id, first.step) == (order_id, step):
                    self._replays += 1
                    return Applied(first.body, replayed=True)
                generation = self._generation
                apply_seconds = self._settings.apply_seconds
            if first is not None:
                return KeyReused(first.order_id, first.step)
            if apply_seconds and self._stopping.wait(apply_seconds):
                raise Stopping()
            body = json.dumps(
                {
                    "order_id": order_id,
                    "step": step,
                    "confirmation": confirmation_for(key),
                    "applied_at": datetime.now(timezone.utc).isoformat(),
                }
            ).encode()
            with self._lock:
                if generation == self._generation:  # not reset meanwhile
                    self._results[key] = _Result(order_id, step, body)
                    self._by_key[key] += 1
                    self._by_order[order_id] += 1
            return Applied(body, replayed=False)
