"""Watched calls: events a test waits on, and a held answer it lets go.

``svc.watch("o-1/charge")`` returns a :class:`Watch` of every call of that order's
action (or compensation), at any service, from then on, whatever its fault. Each call
is a :class:`WatchedCall` whose events the fake sets as it serves the call:

- ``applied``: the ledger applied it (or replayed its first answer); a ``slow`` call
  then holds its answer for ``slow_seconds``;
- ``answered``: the call ended: its answer sent, or its connection closed.

:meth:`WatchedCall.release` ends a delayed call's wait at once (``slow``: the held
answer goes now; ``hang``: the call is applied and answered now), so a test acts at the
instant an answer is on its way, without a sleep: e.g. script a call ``slow``, wait for
``applied``, cancel the order, then release the answer. In-process only (the events are
the test's own objects); a watch lasts as long as the fake, ``reset()`` included.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime

from devtools.fake_remote.faults import FaultConfigError, split_script_key


@dataclass(eq=False)
class WatchedCall:
    """One valid call of a watched order's action, as the fake serves it."""

    service: str
    action: str
    order_id: str
    step: str
    key: str
    attempt: int
    #: The fault the fake decided for it (a kind), or None.
    fault: str | None
    #: When the fake read it (UTC, the fake's clock: the machine's), and its Complete-By header.
    arrived_at: datetime
    complete_by: datetime
    applied: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    #: How the call ended, as the fake logs it ("slow, applied, status=200"); "" until answered.
    outcome: str = ""

    def release(self) -> None:
        """End this call's delay (``slow``, ``hang``) now; a no-op for any other call."""
        self.released.set()


class Watch:
    """Every call of one order's action or compensation since :meth:`FakeRemote.watch`."""

    def __init__(self, script_key: str) -> None:
        order_id, action = split_script_key(script_key)
        if not order_id or not action:
            raise FaultConfigError(f"watch {script_key!r}: use '<order id>/<action>'")
        self.order_id, self.action = order_id, action
        self._calls: list[WatchedCall] = []
        self._changed = threading.Condition()

    def matches(self, order_id: str, action: str) -> bool:
        return (order_id, action) == (self.order_id, self.action)

    def add(self, call: WatchedCall) -> None:
        with self._changed:
            self._calls.append(call)
            self._changed.notify_all()

    @property
    def calls(self) -> list[WatchedCall]:
        """The calls so far, in arrival order."""
        with self._changed:
            return list(self._calls)

    def call(self, n: int = 1, *, timeout: float) -> WatchedCall:
        """The ``n``-th call (from 1), once it has arrived; TimeoutError if it has not
        arrived within ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._calls) >= n, timeout=timeout):
                raise TimeoutError(
                    f"call {n} of {self.order_id}/{self.action} did not arrive within {timeout:g} s "
                    f"({len(self._calls)} arrived)"
                )
            return self._calls[n - 1]

    def __repr__(self) -> str:
        return f"<Watch {self.order_id}/{self.action}: {len(self._calls)} call(s)>"
