"""A circuit breaker per remote service per host instance: stop calling a service that is
down, resume by itself.

- closed: calls go through; ``failure_threshold`` transient failures in a row open it.
- open: no call for ``open_seconds``; the agent postpones its line instead of failing it.
- half-open: after that, one trial call at a time; a success closes it, a failure
  opens it again.

A permanent refusal (4xx) is an answer from a service that is up: it counts as a
success here. No I/O: the clock is injected, so the states are tested without waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from enum import Enum

log = logging.getLogger(__name__)


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerOpen(Exception):
    """The remote service is considered down: try again in ``retry_after`` seconds."""

    def __init__(self, service: str, retry_after: float) -> None:
        super().__init__(f"{service} unavailable: circuit breaker open, next try in {retry_after:.0f} s")
        self.service = service
        self.retry_after = retry_after


class CircuitBreaker:
    def __init__(
        self, service: str, *, failure_threshold: int, open_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.failure_threshold = failure_threshold
        self.open_seconds = open_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial = False
        #: State changes, by the state entered (logged, and counted for tests and figures).
        self.changes: Counter[str] = Counter()

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._half_open_if_due()
            return self._state

    def before_call(self) -> None:
        """Raise :class:`BreakerOpen` unless a call may go now (in half-open: one trial)."""
        with self._lock:
            self._half_open_if_due()
            if self._state is BreakerState.CLOSED:
                return
            if self._state is BreakerState.HALF_OPEN and not self._trial:
                self._trial = True
                return
            wait = self._opened_at + self.open_seconds - self._clock()
            raise BreakerOpen(self.service, max(wait, 1.0))

    def succeeded(self) -> None:
        with self._lock:
            self._failures, self._trial = 0, False
            if self._state is not BreakerState.CLOSED:
                self._enter(BreakerState.CLOSED)

    def failed(self) -> None:
        with self._lock:
            self._trial = False
            self._failures += 1
            if self._state is BreakerState.HALF_OPEN or (
                self._state is BreakerState.CLOSED and self._failures >= self.failure_threshold
            ):
                self._opened_at = self._clock()
                self._enter(BreakerState.OPEN)

    def _half_open_if_due(self) -> None:
        if self._state is BreakerState.OPEN and self._clock() >= self._opened_at + self.open_seconds:
            self._enter(BreakerState.HALF_OPEN)

    def _enter(self, state: BreakerState) -> None:
        log.warning("circuit breaker for %s: %s -> %s", self.service, self._state.value, state.value)
        self._state = state
        self.changes[state.value] += 1
