"""Azure's push-back, on purpose: throttling, lost locks, dropped links and dropped connections.

Off by default. :class:`Faults` says what to inject (``--faults SPEC`` on the command line,
``start(faults=...)`` or ``set_faults`` in Python); the broker's :class:`FaultInjector`
decides, operation by operation, and counts what it injected in the operation counters
(``fault.<kind>``). What Azure does, and so what the emulator does:

* **Throttling** as on the Standard tier: a namespace gets a number of credits at the start
  of each second; each message sent, received or peeked costs one (a batch of 100 costs
  100); settlements, lock renewals and token puts cost nothing (the documentation charges
  data operations by the message and management operations on entities, which the emulator
  does not have, 10 each). Once the credits are used up, a send is refused (its transfer
  ``rejected``), a receive link is detached and a ``$management`` request answered 503, each
  with ``com.microsoft:server-busy`` and Azure's text, until the next second; the SDKs raise
  ``ServiceBusServerBusyError`` and retry. A request that costs more than what is left still
  passes and takes the balance below zero, and the next seconds' credits pay that back first
  (so a batch or a peek larger than a second's credits is never refused for good, and the
  rate over time stays the limit). Source: Microsoft Learn, "Throttling operations on Azure
  Service Bus", https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling
  (read 2026-11-24: "1000 credits every second (per namespace)", "if the credits are
  depleted, subsequent operations will be throttled until the start of the next time
  period", the credit costs, and the server response quoted in :data:`THROTTLED`). How a
  request costing more than the balance is charged is not documented: the balance going
  below zero is how it is reported to behave (https://www.danielstocker.net/azure-service-bus-throttling/).
* **Lock lost**: a peek-lock delivery loses its lock as soon as it is sent, as when Azure
  moves the entity: the message is available again at once (its delivery count + 1) while
  the first receiver still holds it, and that receiver's settlement or renewal is answered
  ``com.microsoft:message-lock-lost`` (``MessageLockLostError``).
* **Link dropped**: a frame on a queue's link (a message sent, credit for messages, a
  settlement) is not handled and the link is detached with ``amqp:link:detach-forced``
  (``ServiceBusConnectionError``; the SDKs open a new link). Nothing was applied.
* **Connection dropped**: such a frame *is* handled, then the socket is closed before the
  answer is written: the client cannot know whether its send or settlement took effect
  (a retried send is a duplicate unless the queue detects duplicates; a completed message
  may look failed; a message delivered just before may never have arrived and comes back
  when its lock expires).

Links to ``$cbs`` and ``$management`` are not dropped; ``$management`` requests that send,
receive or peek messages are throttled, ``$cbs`` (token puts) never is.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

SERVER_BUSY = "com.microsoft:server-busy"
#: The server response Azure documents for a throttled request (Standard tier).
THROTTLED = (
    "The request was terminated because the entity is being throttled. Error code : 50009. "
    "Please wait 2 seconds and try again."
)
DETACH_FORCED = "amqp:link:detach-forced"
DETACHED = "The link is force detached by the emulator (injected fault: a dropped link)."

#: The operation counter of each kind of fault.
COUNTERS = {
    "throttled": "fault.throttled",
    "lock_lost": "fault.lock-lost",
    "link_drop": "fault.link-drop",
    "connection_drop": "fault.connection-drop",
}


@dataclass(frozen=True)
class Faults:
    """What to inject. ``throttle``: credits per second per namespace (None: no throttling;
    Azure Standard: 1000); the others: the probability per operation (a lock per peek-lock
    delivery; a drop per frame on a queue's link). ``seed`` makes a run repeatable.

    As text (``--faults``): ``throttle=1000,lock-lost=0.01,link-drop=0.005,connection-drop=0.002,seed=7``.
    """

    throttle: float | None = None
    lock_lost: float = 0.0
    link_drop: float = 0.0
    connection_drop: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.throttle is not None and self.throttle <= 0:
            raise ValueError("throttle must be a positive number of credits per second")
        for name in ("lock_lost", "link_drop", "connection_drop"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name.replace('_', '-')} must be a probability between 0 and 1")
        if self.link_drop + self.connection_drop > 1.0:
            raise ValueError("link-drop + connection-drop must not exceed 1")

    @property
    def enabled(self) -> bool:
        return self.throttle is not None or any((self.lock_lost, self.link_drop, self.connection_drop))

    @classmethod
    def parse(cls, text: str) -> Faults:
        """``key=value,...`` with the keys ``throttle``, ``lock-lost``, ``link-drop``,
        ``connection-drop``, ``seed`` (``_`` or ``-``); empty or ``none``: no faults. Raises ValueError."""
        text = text.strip()
        if text.lower() in ("", "none", "off"):
            return cls()
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, float | int] = {}
        for option in filter(None, (part.strip() for part in text.split(","))):
            key, equals, raw = (item.strip() for item in option.partition("="))
            name = key.replace("-", "_")
            if name not in kinds or not equals:
                known = ", ".join(k.replace("_", "-") for k in kinds)
                raise ValueError(f"unknown fault option {option!r} (known: {known})")
            try:
                values[name] = int(raw) if name == "seed" else float(raw)
            except ValueError:
                raise ValueError(f"invalid value {raw!r} for {key}") from None
        return cls(**values)  # type: ignore[arg-type]

    def to_arg(self) -> str:
        """The text :meth:`parse` reads (only what is set), ``none`` for no faults."""
        parts = [
            f"{f.name.replace('_', '-')}={getattr(self, f.name):g}"
            for f in fields(self)
            if getattr(self, f.name) not in (None, 0.0) and f.name != "seed"
        ]
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return ",".join(parts) or "none"


class FaultInjector:
    """Decides, operation by operation, on the emulator's event loop; counts what it injects."""

    def __init__(
        self,
        faults: Faults | None,
        operations: collections.Counter[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.operations = operations
        self._clock = clock
        self.configure(faults or Faults())

    def configure(self, faults: Faults) -> None:
        self.faults = faults
        self._random = random.Random(faults.seed)
        self._second = None
        self._credits = 0.0

    @property
    def active(self) -> bool:
        return self.faults.enabled

    def _count(self, kind: str) -> None:
        self.operations[COUNTERS[kind]] += 1

    def charge(self, credits: int) -> bool:
        """Spend ``credits``; False (and counted) when none are left this second: throttled.

        Each new second adds the limit's credits, up to the limit, to what is left (below zero
        when the last request cost more than was left)."""
        limit = self.faults.throttle
        if limit is None:
            return True
        second = int(self._clock())
        if self._second is None:
            self._second, self._credits = second, limit
        elif second > self._second:
            self._credits = min(limit, self._credits + limit * (second - self._second))
            self._second = second
        if self._credits <= 0:
            self._count("throttled")
            return False
        self._credits -= credits
        return True

    def lose_lock(self) -> bool:
        if self.faults.lock_lost and self._random.random() < self.faults.lock_lost:
            self._count("lock_lost")
            return True
        return False

    def drop(self) -> str | None:
        """``"link"``, ``"connection"`` (counted) or None, for one frame on a queue's link."""
        link, connection = self.faults.link_drop, self.faults.connection_drop
        if not (link or connection):
            return None
        draw = self._random.random()
        if draw < link:
            self._count("link_drop")
            return "link"
        if draw < link + connection:
            self._count("connection_drop")
            return "connection"
        return None

    def counts(self) -> dict[str, int]:
        """Faults injected so far, by kind (``throttled``, ``lock_lost``, ``link_drop``, ``connection_drop``)."""
        return {kind: self.operations.get(counter, 0) for kind, counter in COUNTERS.items()}
