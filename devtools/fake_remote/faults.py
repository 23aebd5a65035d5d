"""Fault kinds, validation of fault settings, and the per-call fault decision.

Each service of the fake has its own plan (the server keeps one per service). Two
ways to inject faults, which can be combined:

- a *script*: lists of entries consumed one per call, then success. A list is keyed
  by an order id (every call of the service for that order consumes an entry) or by
  ``"<order id>/<action>"`` (only that order's calls of that action or compensation
  do). An entry is a fault kind, ``"ok"`` (this call succeeds) or, as the last entry
  only, ``"always:<kind>"`` (every further call gets that fault). A call governed by a
  script (the ``order/action`` one if it exists, else the order's) ignores the rates.
- *rates*: a probability per fault kind, drawn per call. The draw is a hash of
  ``(seed, service, idempotency key, n)`` where ``n`` counts the calls made with that
  key, so a seed gives the same faults for the same calls whatever the thread
  interleaving. A rate-drawn ``permanent`` is sticky for its order id and kind (a real
  permanent failure does not go away on retry): the order's later forward actions at
  that service are refused too, its compensations are drawn on their own (and the
  other way round). A replay of an already applied key is never rejected by a
  rate-drawn ``permanent`` or ``bad_request`` (the service accepted that request
  already); transport faults (transient, throttle, slow, hang, drop) still hit it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

#: Every fault kind, in the order the rate bands are laid out.
FAULT_KINDS: tuple[str, ...] = ("transient", "throttle", "slow", "hang", "permanent", "bad_request", "drop")

#: Faults that reject the request's content: never drawn by rate for a replay.
CONTENT_FAULTS = frozenset({"permanent", "bad_request"})

#: A script entry meaning "this call succeeds".
OK = "ok"

#: Prefix of a script's last entry that repeats forever.
ALWAYS = "always:"


#: Separates the order id from the action in a per-action script key (order ids have no ``/``).
SCRIPT_SEPARATOR = "/"


class FaultConfigError(ValueError):
    """Settings that the service cannot honour (unknown kind, bad rate, unknown service...)."""


def validate_rates(rates: Mapping[str, Any] | None) -> dict[str, float]:
    """Return the non-zero rates, checked: known kinds, each in [0, 1], sum <= 1."""
    if rates is None:
        return {}
    if not isinstance(rates, Mapping):
        raise FaultConfigError(f"rates must be an object of kind -> probability, got {type(rates).__name__}")
    checked: dict[str, float] = {}
    for kind, rate in rates.items():
        if kind not in FAULT_KINDS:
            raise FaultConfigError(f"unknown fault kind {kind!r} in rates; known kinds: {', '.join(FAULT_KINDS)}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or not 0 <= rate <= 1:
            raise FaultConfigError(f"rate for {kind!r} must be a number between 0 and 1, got {rate!r}")
        if rate > 0:
            checked[kind] = float(rate)
    total = sum(checked.values())
    if total > 1 + 1e-9:
        raise FaultConfigError(f"fault rates add up to {total:g}, more than 1")
    return checked


def split_script_key(script_key: str) -> tuple[str, str | None]:
    """``"o-1/release"`` -> ``("o-1", "release")``; ``"o-1"`` -> ``("o-1", None)``."""
    if SCRIPT_SEPARATOR in script_key:
        order_id, action = script_key.rsplit(SCRIPT_SEPARATOR, 1)
        return order_id, action
    return script_key, None


def validate_script(
    script: Mapping[str, Any] | None, routes: Collection[str] | None = None
) -> dict[str, tuple[str, ...]]:
    """Return the script as script key -> tuple of entries, checked.

    A key is an order id or ``"<order id>/<action>"``; with ``routes`` given, the action
    must be one of them.
    """
    if script is None:
        return {}
    if not isinstance(script, Mapping):
        raise FaultConfigError(
            f"script must be an object of order id (or order id/action) -> list of faults, got {type(script).__name__}"
        )
    checked: dict[str, tuple[str, ...]] = {}
    for script_key, entries in script.items():
        if not isinstance(script_key, str) or not script_key:
            raise FaultConfigError(f"script keys must be non-empty strings, got {script_key!r}")
        order_id, action = split_script_key(script_key)
        if not order_id or action == "":
            raise FaultConfigError(f"script key {script_key!r} must be '<order id>' or '<order id>/<action>'")
        if action is not None and routes is not None and action not in routes:
            raise FaultConfigError(
                f"script key {script_key!r}: no action or compensation {action!r}; known: {', '.join(sorted(routes))}"
            )
        if isinstance(entries, str) or not isinstance(entries, Sequence):
            raise FaultConfigError(f"script for {script_key!r} must be a list of faults, got {entries!r}")
        for position, entry in enumerate(entries):
            last = position == len(entries) - 1
            name = entry[len(ALWAYS):] if isinstance(entry, str) and entry.startswith(ALWAYS) else entry
            if name is not entry and not last:
                raise FaultConfigError(f"script for {script_key!r}: {entry!r} must be the last entry")
            if name != OK and name not in FAULT_KINDS:
                raise FaultConfigError(
                    f"script for {script_key!r}: unknown entry {entry!r}; use a fault kind "
                    f"({', '.join(FAULT_KINDS)}), {OK!r}, or '{ALWAYS}<kind>' as the last entry"
                )
        checked[script_key] = tuple(entries)
    return checked


def uniform(seed: int, key: str, n: int, service: str = "") -> float:
    """A number in [0, 1) fixed by (seed, service, key, n)."""
    digest = hashlib.blake2b(f"{seed}\x00{service}\x00{key}\x00{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class FaultPlan:
    """One service's fault settings and their progress. Not thread-safe: the caller locks."""

    def __init__(
        self,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        routes: Collection[str] | None = None,
    ) -> None:
        self.script = validate_script(script, routes)
        self.rates = validate_rates(rates)
        self._remaining: dict[str, list[str]] = {key: list(entries) for key, entries in self.script.items()}
        self._sticky: set[tuple[str, str]] = set()  # (order id, kind)

    def decide(
        self,
        order_id: str,
        key: str,
        n: int,
        seed: int,
        replay: bool,
        *,
        action: str = "",
        kind: str = "action",
        service: str = "",
    ) -> str | None:
        """The fault for this call (a kind), or None for no fault.

        ``n`` counts earlier calls with this key; ``replay`` says the key is applied already.
        """
        for script_key in (f"{order_id}{SCRIPT_SEPARATOR}{action}", order_id):
            remaining = self._remaining.get(script_key)
            if remaining is None:
                continue
            if not remaining:
                return None
            entry = remaining[0]
            if entry.startswith(ALWAYS):
                entry = entry[len(ALWAYS):]
            else:
                remaining.pop(0)
            return None if entry == OK else entry
        if not replay and (order_id, kind) in self._sticky:
            return "permanent"
        if not self.rates:
            return None
        draw = uniform(seed, key, n, service)
        upper = 0.0
        for fault in FAULT_KINDS:
            upper += self.rates.get(fault, 0.0)
            if draw < upper:
                if fault in CONTENT_FAULTS and replay:
                    return None
                if fault == "permanent":
                    self._sticky.add((order_id, kind))
                return fault
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "script": {key: list(entries) for key, entries in self.script.items()},
            "rates": dict(self.rates),
            "script_remaining": {key: list(entries) for key, entries in self._remaining.items()},
            # kind ("action" / "compensation") -> the orders refused for good
            "sticky_permanent": {
                kind: sorted(order for order, k in self._sticky if k == kind) for kind in sorted({k for _, k in self._sticky})
            },
        }
