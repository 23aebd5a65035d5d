"""Fault kinds, validation of fault settings, and the per-call fault decision.

Two ways to inject faults, which can be combined:

- a *script* per order id: a list of entries consumed one per call for that order,
  then success. An entry is a fault kind, ``"ok"`` (this call succeeds) or, as the
  last entry only, ``"always:<kind>"`` (every further call gets that fault). An order
  id that has a script is governed by its script alone: rates never apply to it.
- *rates*: a probability per fault kind, drawn per call. The draw is a hash of
  ``(seed, idempotency key, n)`` where ``n`` counts the calls made with that key, so a
  seed gives the same faults for the same calls whatever the thread interleaving.
  A rate-drawn ``permanent`` is sticky for its order id (a real permanent failure
  does not go away on retry). A replay of an already applied key is never rejected
  by a rate-drawn ``permanent`` or ``bad_request`` (the service accepted that request
  already); transport faults (transient, throttle, slow, hang, drop) still hit it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

#: Every fault kind, in the order the rate bands are laid out.
FAULT_KINDS: tuple[str, ...] = ("transient", "throttle", "slow", "hang", "permanent", "bad_request", "drop")

#: Faults that reject the request's content: never drawn by rate for a replay.
CONTENT_FAULTS = frozenset({"permanent", "bad_request"})

#: A script entry meaning "this call succeeds".
OK = "ok"

#: Prefix of a script's last entry that repeats forever.
ALWAYS = "always:"


class FaultConfigError(ValueError):
    """Fault settings that the service cannot honour (unknown kind, bad rate...)."""


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


def validate_script(script: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]]:
    """Return the script as order id -> tuple of entries, checked."""
    if script is None:
        return {}
    if not isinstance(script, Mapping):
        raise FaultConfigError(f"script must be an object of order id -> list of faults, got {type(script).__name__}")
    checked: dict[str, tuple[str, ...]] = {}
    for order_id, entries in script.items():
        if not isinstance(order_id, str) or not order_id:
            raise FaultConfigError(f"script order ids must be non-empty strings, got {order_id!r}")
        if isinstance(entries, str) or not isinstance(entries, Sequence):
            raise FaultConfigError(f"script for {order_id!r} must be a list of faults, got {entries!r}")
        for position, entry in enumerate(entries):
            last = position == len(entries) - 1
            name = entry[len(ALWAYS):] if isinstance(entry, str) and entry.startswith(ALWAYS) else entry
            if name is not entry and not last:
                raise FaultConfigError(f"script for {order_id!r}: {entry!r} must be the last entry")
            if name != OK and name not in FAULT_KINDS:
                raise FaultConfigError(
                    f"script for {order_id!r}: unknown entry {entry!r}; use a fault kind "
                    f"({', '.join(FAULT_KINDS)}), {OK!r}, or '{ALWAYS}<kind>' as the last entry"
                )
        checked[order_id] = tuple(entries)
    return checked


def uniform(seed: int, key: str, n: int) -> float:
    """A number in [0, 1) fixed by (seed, key, n)."""
    digest = hashlib.blake2b(f"{seed}\x00{key}\x00{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class FaultPlan:
    """The current fault settings and their progress. Not thread-safe: the caller locks."""

    def __init__(self, script: Mapping[str, Any] | None = None, rates: Mapping[str, Any] | None = None) -> None:
        self.script = validate_script(script)
        self.rates = validate_rates(rates)
        self._remaining: dict[str, list[str]] = {order: list(entries) for order, entries in self.script.items()}
        self._sticky: set[str] = set()

    def decide(self, order_id: str, key: str, n: int, seed: int, replay: bool) -> str | None:
        """The fault for this call (a kind), or None for no fault.

        ``n`` counts earlier calls with this key; ``replay`` says the key is applied already.
        """
        if order_id in self._remaining:
            remaining = self._remaining[order_id]
            if not remaining:
                return None
            entry = remaining[0]
            if entry.startswith(ALWAYS):
                entry = entry[len(ALWAYS):]
            else:
                remaining.pop(0)
            return None if entry == OK else entry
        if not replay and order_id in self._sticky:
            return "permanent"
        if not self.rates:
            return None
        draw = uniform(seed, key, n)
        upper = 0.0
        for kind in FAULT_KINDS:
            upper += self.rates.get(kind, 0.0)
            if draw < upper:
                if kind in CONTENT_FAULTS and replay:
                    return None
                if kind == "permanent":
                    self._sticky.add(order_id)
                return kind
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "script": {order: list(entries) for order, entries in self.script.items()},
            "rates": dict(self.rates),
            "script_remaining": {order: list(entries) for order, entries in self._remaining.items()},
            "sticky_permanent": sorted(self._sticky),
        }
