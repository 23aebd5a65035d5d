"""A circuit breaker per remote service per host instance: stop calling a service that is
down, resume by itself.

- closed: calls go through; ``failure_threshold`` calls in a row that failed
  transiently open it, provided they came from at least two requests (one bad
  request alone, however often it retries, does not take a service out for everyone).
- open: no call for ``open_seconds``; the agent postpones its line instead of failing it.
- half-open: after that, one trial call at a time; a success closes it, a failure
  opens it again.

A permanent refusal (4xx) is an answer from a service that is up: it counts as a
success here. The wait a refused caller is told carries up to ``jitter`` of the open
time on top, so the lines postponed together do not all come back at the same moment
and the same line is not always the trial. No I/O: the clock and the randomness are
injected, so the states are tested without waiting.
"""

from __future__ import annotations

import logging
import random
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
        jitter: float = 0.25, clock: Callable[[], float] = time.monotonic,
        random_fraction: Callable[[], float] = random.random,
        on_change: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        self.service = service
        self.failure_threshold = failure_threshold
        self.open_seconds = open_seconds
        self.jitter = jitter
        self._clock = clock
        self._random = random_fraction
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0  # failed calls in a row
        self._requests = 0  # distinct requests among them
        self._opened_at = 0.0
        self._trial = False
        #: State changes, by the state entered (logged, and counted for tests and figures).
        self.changes: Counter[str] = Counter()
        #: Told of every state change: (service, state entered), e.g. to count it as a metric.
        self._on_change = on_change

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
            raise self._refusal()

    def refuse_if_open(self) -> None:
        """For a call that tells nothing about the action (a lookup): raise
        :class:`BreakerOpen` while open; it never takes the half-open trial."""
        with self._lock:
            self._half_open_if_due()
            if self._state is BreakerState.OPEN:
                raise self._refusal()

    def _refusal(self) -> BreakerOpen:
        wait = max(self._opened_at + self.open_seconds - self._clock(), 1.0)
        return BreakerOpen(self.service, wait + self.jitter * self.open_seconds * self._random())

    def succeeded(self) -> None:
        with self._lock:
            self._failures, self._requests, self._trial = 0, 0, False
            if self._state is not BreakerState.CLOSED:
                self._enter(BreakerState.CLOSED)

    def failed(self, *, new_request: bool = True) -> None:
        """A call failed transiently. ``new_request=False`` for a retry of a request that
        failed before: the call counts, the request does not count twice."""
        with self._lock:
            self._trial = False
            self._failures += 1
            self._requests += 1 if new_request else 0
            enough = self._failures >= self.failure_threshold and self._requests >= min(2, self.failure_threshold)
            if self._state is BreakerState.HALF_OPEN or (self._state is BreakerState.CLOSED and enough):
                self._opened_at = self._clock()
                self._enter(BreakerState.OPEN)

    def _half_open_if_due(self) -> None:
        if self._state is BreakerState.OPEN and self._clock() >= self._opened_at + self.open_seconds:
            self._enter(BreakerState.HALF_OPEN)

    def _enter(self, state: BreakerState) -> None:
        log.warning("circuit breaker for %s: %s -> %s", self.service, self._state.value, state.value)
        self._state = state
        self.changes[state.value] += 1
        if self._on_change is not None:
            self._on_change(self.service, state)
