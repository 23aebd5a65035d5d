"""A circuit breaker per remote service per host instance: stop calling a service that is
down, resume by itself. Modelled on Polly v8's circuit breaker
(``CircuitBreakerStrategyOptions``: FailureRatio, MinimumThroughput, SamplingDuration,
BreakDuration; https://www.pollydocs.org/strategies/circuit-breaker.html) and
resilience4j's (failureRateThreshold, minimumNumberOfCalls, slidingWindowSize), with one
change: it counts **requests**, not calls.

- closed: calls go through. Each request (a line: its idempotency key, the same across
  its retries and attempts) counts once in the sampling window, as failing if its last
  call there failed transiently. It opens when, over the last ``sampling_seconds``, at
  least ``minimum_throughput`` distinct requests called and at least ``failure_ratio``
  of them are failing: evidence that the service is down for everyone, not that a few
  requests fail (one bad request, however often it retries, is one request).
- open: no call for ``open_seconds``; the agent postpones a line that has not called
  yet instead of failing it.
- half-open: after that, one trial call at a time; a success closes it (with a fresh
  window), a failure opens it again. The trial goes to a request that has not just
  failed when others wait: a request that failed since the window before the opening
  is refused the trial, once per half-open period, while a request refused during the
  open time is due back; so a line whose own calls fail does not stand in for the
  service's health, and a service that is back is not held open by it.

A permanent refusal (4xx) is an answer from a service that is up: it counts as a
success here. The wait a refused caller is told carries up to ``jitter`` of the open
time on top, so the lines postponed together do not all come back at the same moment.
No I/O: the clock and the randomness are injected, so the states are tested without
waiting. State changes are events: logged, counted in ``changes`` and told to
``on_change`` (metrics, the published breaker rows).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BreakerOptions:
    """When a breaker opens and for how long: named data, from the app settings
    (BREAKER_FAILURE_RATIO, BREAKER_MINIMUM_THROUGHPUT, BREAKER_SAMPLING_SECONDS,
    BREAKER_OPEN_SECONDS)."""

    #: Failing requests / requests in the window at or above which it opens (0 < r <= 1).
    failure_ratio: float = 0.5
    #: Distinct requests in the window below which it never opens (at least 2).
    minimum_throughput: int = 5
    #: The window's length.
    sampling_seconds: float = 30.0
    #: How long it stays open before one trial call.
    open_seconds: float = 30.0
    #: Up to this fraction of the open time is added to the wait a refused caller is told.
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.failure_ratio <= 1:
            raise ValueError(f"failure_ratio must be in (0, 1], not {self.failure_ratio}")
        if self.minimum_throughput < 2:
            raise ValueError("minimum_throughput must be at least 2: one request alone must never open a breaker")
        if self.sampling_seconds <= 0 or self.open_seconds <= 0 or self.jitter < 0:
            raise ValueError("sampling_seconds and open_seconds must be positive, jitter not negative")


class CircuitBreaker:
    def __init__(
        self, service: str, options: BreakerOptions, *, clock: Callable[[], float] = time.monotonic,
        random_fraction: Callable[[], float] = random.random,
        on_change: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        self.service = service
        self.options = options
        self._clock = clock
        self._random = random_fraction
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        #: The sampling window: request key -> (time of its last call, did that call fail),
        #: oldest first.
        self._window: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        self._failing = 0  # requests in the window whose last call failed
        #: Requests that failed since the window before the last opening (cleared on close).
        self._failed: set[str] = set()
        #: Requests refused while open or half-open, with the time they are due back.
        self._waiting: dict[str, float] = {}
        #: Failed requests that already gave way to a waiting one in this half-open period.
        self._gave_way: set[str] = set()
        self._opened_at = 0.0
        self._trial: str | None = None
        self._trial_at = 0.0
        #: State changes, by the state entered (logged, and counted for tests and figures).
        self.changes: Counter[str] = Counter()
        #: Told of every state change: (service, state entered), e.g. to count it as a metric.
        self._on_change = on_change

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._half_open_if_due()
            return self._state

    def before_call(self, request: str) -> None:
        """Raise :class:`BreakerOpen` unless ``request`` may call now (in half-open: the
        one trial, which a request that has just failed leaves to a waiting one)."""
        with self._lock:
            now = self._clock()
            self._half_open_if_due()
            if self._state is BreakerState.CLOSED:
                return
            if self._trial is not None and now - self._trial_at > self.options.open_seconds:
                self._trial = None  # a trial that never reported (no call made after all): not held for ever
            if self._state is BreakerState.HALF_OPEN and self._trial is None:
                if not self._should_give_way(request, now):
                    self._trial, self._trial_at = request, now
                    self._waiting.pop(request, None)
                    return
                self._gave_way.add(request)
            raise self._refusal(request, now)

    def _should_give_way(self, request: str, now: float) -> bool:
        if request not in self._failed or request in self._gave_way:
            return False
        # Someone else was refused meanwhile and is due back (not long overdue: a request
        # that went to another host, or ended, is not waited for).
        return any(key != request and due >= now - self.options.open_seconds for key, due in self._waiting.items())

    def confirm(self, request: str) -> None:
        """Just before a call that waited after :meth:`before_call` (for a bulkhead slot):
        raise :class:`BreakerOpen` unless the breaker is still closed or ``request`` holds
        the half-open trial, so no call goes out on a breaker that opened meanwhile."""
        with self._lock:
            self._half_open_if_due()
            if self._state is BreakerState.CLOSED or self._trial == request:
                return
            raise self._refusal(request, self._clock())

    def refuse_if_open(self) -> None:
        """For a call that tells nothing about the action (a lookup): raise
        :class:`BreakerOpen` while open; it never takes the half-open trial."""
        with self._lock:
            self._half_open_if_due()
            if self._state is BreakerState.OPEN:
                raise self._refusal(None, self._clock())

    def _refusal(self, request: str | None, now: float) -> BreakerOpen:
        open_seconds = self.options.open_seconds
        wait = max(self._opened_at + open_seconds - now, 1.0) + self.options.jitter * open_seconds * self._random()
        if request is not None:
            self._waiting[request] = now + wait
        return BreakerOpen(self.service, wait)

    def succeeded(self, request: str) -> None:
        """A call of ``request`` was answered (a success, or a permanent refusal)."""
        with self._lock:
            self._sample(request, failed=False)
            if self._trial == request:
                self._trial = None
            if self._state is not BreakerState.CLOSED:
                # The service answers: close, with a fresh window.
                self._window.clear()
                self._failing = 0
                self._failed.clear()
                self._waiting.clear()
                self._gave_way.clear()
                self._trial = None
                self._enter(BreakerState.CLOSED)

    def failed(self, request: str) -> None:
        """A call of ``request`` failed transiently (the request counts once in the window,
        however many of its calls fail)."""
        with self._lock:
            self._sample(request, failed=True)
            if self._state is BreakerState.CLOSED:
                if self._down():
                    self._failed = {key for key, (_, failing) in self._window.items() if failing}
                    self._open()
                return
            self._failed.add(request)
            if self._state is BreakerState.HALF_OPEN and self._trial in (request, None):
                # The trial failed (or a call from before the opening did): open again.
                self._trial = None
                self._open()

    def _sample(self, request: str, *, failed: bool) -> None:
        now = self._clock()
        previous = self._window.pop(request, None)
        if previous is not None and previous[1]:
            self._failing -= 1
        self._window[request] = (now, failed)
        self._failing += failed
        horizon = now - self.options.sampling_seconds
        while self._window:
            key, (at, failing) = next(iter(self._window.items()))
            if at >= horizon:
                break
            del self._window[key]
            self._failing -= failing

    def _down(self) -> bool:
        requests = len(self._window)
        return requests >= self.options.minimum_throughput and self._failing >= self.options.failure_ratio * requests

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._gave_way.clear()
        self._enter(BreakerState.OPEN)

    def _half_open_if_due(self) -> None:
        now = self._clock()
        if self._state is BreakerState.OPEN and now >= self._opened_at + self.options.open_seconds:
            self._trial = None
            horizon = now - self.options.open_seconds
            self._waiting = {key: due for key, due in self._waiting.items() if due >= horizon}
            self._enter(BreakerState.HALF_OPEN)

    def _enter(self, state: BreakerState) -> None:
        log.warning("circuit breaker for %s: %s -> %s", self.service, self._state.value, state.value)
        self._state = state
        self.changes[state.value] += 1
        if self._on_change is not None:
            self._on_change(self.service, state)
