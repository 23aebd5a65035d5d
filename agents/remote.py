"""The remote service call: retries with backoff and jitter, a stable idempotency key,
and never past the step's complete-by time.

The contract (docs/remote-contract.md): ``POST {base}/{action}`` with
the headers ``Idempotency-Key`` and ``Complete-By`` (RFC 3339 UTC); 2xx with a JSON
object is done (a 2xx with any other body is transient with an unknown outcome: it may
have been applied), 408, 429, 5xx, connection errors and timeouts are transient, any
other 4xx is a permanent refusal.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from adapters import telemetry
from agents.breaker import BreakerOpen, CircuitBreaker
from core import names
from core.models import AgentRequest
from core.workflow import Kind

log = logging.getLogger(__name__)

#: Status codes worth another try: timeout, throttling, and server-side failures.
TRANSIENT_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
#: A call with less time than this left is not started: it could not finish.
MIN_CALL_SECONDS = 0.2


class RemoteError(Exception):
    """Base class of the remote call's failures."""


class TransientRemoteError(RemoteError):
    """Worth another try (connection error, timeout, 408, 429, 5xx). ``unknown``: the
    request may have reached the service and been applied (a timeout, a dropped
    connection), as opposed to an answer saying it was not (408, 429, 5xx)."""

    def __init__(self, message: str, retry_after: float | None = None, *, unknown: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unknown = unknown


class PermanentRemoteError(RemoteError):
    """The service refused the step (4xx other than 408/429): never retried."""


class DeadlineReached(RemoteError):
    """The step's complete-by time came before the step could be done."""


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP-date); None
    when there is none or it cannot be read: the service's hint is ignored, never fatal."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" or no zone: HTTP-dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _json_object(text: str) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is not JSON or not an object."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


async def _text(response: aiohttp.ClientResponse) -> str:
    """The body as text, never failing on its bytes: what is not valid in its charset is
    replaced; a charset that is not a text encoding (or has no lenient decoder) is read as
    UTF-8."""
    try:
        return await response.text(errors="replace")
    except (LookupError, UnicodeError):
        return (await response.read()).decode("utf-8", errors="replace")


def complete_by_header(when: datetime) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-11-23T10:15:30.123Z``."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Tally:
    """One attempt's calls (its retries): ``key`` names the request to the breaker (the
    line's idempotency key: one request however often it is sent); ``failed``: has one
    of them failed transiently. ``counts``: False for lookups, which neither take the
    breaker's half-open trial nor count toward it (a lookup's 404 says nothing about
    whether the action would work)."""

    key: str
    failed: bool = False
    counts: bool = True
    #: Has a call of this attempt ended without telling whether it was applied (a
    #: timeout, a dropped connection, a 2xx without a JSON object)? It stays so: a later
    #: 503 says nothing about that call. And how did the last call fail?
    unknown: bool = False
    last_error: str = ""


class RemoteClient:
    """Calls ``POST {base_url}/{action}`` for one remote service, without holding a thread:
    an aiohttp session (connection pool) per event loop, sleeps that yield. How often it
    retries within an attempt is the request's policy (the step's); the supervisor
    retries attempts."""

    def __init__(
        self,
        base_url: str,
        *,
        call_timeout: float = 10.0,
        breaker: CircuitBreaker | None = None,
        max_concurrent_calls: int = 16,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.call_timeout = call_timeout
        self.breaker = breaker
        #: The bulkhead: calls to this service in flight from this instance at most.
        self.max_concurrent_calls = max_concurrent_calls
        self._sleep = sleep
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._bulkheads: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def _session(self) -> aiohttp.ClientSession:
        # A session belongs to the loop it was made on (the worker has one loop).
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = self._sessions[loop] = aiohttp.ClientSession(trust_env=False)
        return session

    def _bulkhead(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._bulkheads:
            self._bulkheads[loop] = asyncio.Semaphore(self.max_concurrent_calls)
        return self._bulkheads[loop]

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()

    async def call(
        self, request: AgentRequest, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> dict[str, Any]:
        """The remote result; raises PermanentRemoteError, DeadlineReached, or
        TransientRemoteError when the calls ran out before the deadline did, or when the
        breaker refused a retry after this attempt's own call had failed; BreakerOpen
        only when the breaker refused the attempt's first call (nothing was sent)."""
        policy = request.policy

        def time_left() -> float:
            return (request.complete_by - now()).total_seconds()

        # Exponential from backoff_initial, plus up to one more backoff_initial of jitter.
        exponential = wait_exponential_jitter(
            multiplier=policy.backoff_initial, jitter=policy.backoff_initial, max=policy.backoff_max
        )

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            backoff = exponential(state)
            if isinstance(error, TransientRemoteError) and error.retry_after is not None:
                return max(error.retry_after, policy.backoff_initial)  # the service said when
            return backoff

        def past_deadline(state: RetryCallState) -> bool:
            return time_left() - (state.upcoming_sleep or 0.0) < MIN_CALL_SECONDS

        tally = _Tally(request.idempotency_key)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientRemoteError),
            wait=wait,
            stop=stop_after_attempt(policy.max_calls) | past_deadline,
            sleep=self._sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        telemetry.remote_retried(request.remote, request.action)
                    if tally.unknown and request.lookup:
                        # The last call may have been applied: ask before sending it again.
                        settled = await self.lookup(request, now=now)
                        if settled is not None:
                            log.info("%s for order %s: applied already, settled by lookup", request.action, request.order_id)
                            return settled
                    left = time_left()
                    if left < MIN_CALL_SECONDS:
                        raise DeadlineReached(f"complete-by {request.complete_by.isoformat()} reached")
                    try:
                        return await self._post(
                            request, timeout=min(self.call_timeout, left), time_left=time_left, tally=tally
                        )
                    except TransientRemoteError as error:
                        # Once a call's outcome is unknown, it stays so for the attempt:
                        # every later retry asks first (a 503 after a timeout does not say
                        # the timed-out call was not applied).
                        tally.unknown = tally.unknown or error.unknown
                        tally.last_error = str(error)
                        raise
        except BreakerOpen as error:
            if not tally.failed:
                raise  # no call of this attempt was made: the line is postponed, not failed
            # This attempt's own call failed, then the breaker opened: the attempt is judged
            # by the line's own policy, as exhausted retries are (no response; the
            # supervisor counts the failure at complete-by, when the call that failed can
            # no longer take effect).
            raise TransientRemoteError(f"{tally.last_error}; then {error}", unknown=tally.unknown) from error
        raise AssertionError("unreachable")  # pragma: no cover - AsyncRetrying returns or raises

    async def lookup(
        self, request: AgentRequest, *, now: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> dict[str, Any] | None:
        """``GET {base}/{action}/{idempotency key}``: the result if that action was applied,
        None if not (404) or if the lookup could not tell (then the caller sends the action:
        the idempotency key keeps that safe)."""

        def time_left() -> float:
            return (request.complete_by - now()).total_seconds()

        url = f"{self.base_url}/{request.action}/{request.idempotency_key}"
        try:
            status, text, _ = await self._request(
                request, "GET", f"{request.action}/{{key}}", url, None, {}, min(self.call_timeout, time_left()),
                time_left, _Tally(request.idempotency_key, counts=False),
            )
        except TransientRemoteError as error:
            log.info("lookup %s failed (%s): sending the action", url, error)
            return None
        if status == 200:
            settled = _json_object(text)
            if settled is None:
                log.info("lookup %s answered 200 without a JSON object: sending the action", url)
            return settled
        if status != 404:
            log.info("lookup %s answered HTTP %s: sending the action", url, status)
        return None

    async def _request(
        self, request: AgentRequest, method: str, route: str, url: str, body: dict | None, headers: dict[str, str],
        timeout: float, time_left: Callable[[], float], tally: _Tally,
    ) -> tuple[int, str, str | None]:
        """One call through the breaker and the bulkhead: (status, text, Retry-After).
        Transient failures are recorded by the breaker, once per request (``tally.key``); a
        wait for a bulkhead slot never outlasts the deadline. Each call is an HTTP client
        span whose context goes to the remote service in the ``traceparent`` header."""
        if self.breaker is not None:
            self.breaker.before_call(tally.key) if tally.counts else self.breaker.refuse_if_open()
        bulkhead = self._bulkhead()
        if bulkhead.locked():  # every slot taken: wait for one, never past the deadline
            try:
                await asyncio.wait_for(bulkhead.acquire(), timeout=max(0.0, time_left() - MIN_CALL_SECONDS))
            except asyncio.TimeoutError as error:
                raise DeadlineReached("no free call slot before complete-by") from error
            if self.breaker is not None:  # the breaker may have opened while this call waited
                try:
                    self.breaker.confirm(tally.key) if tally.counts else self.breaker.refuse_if_open()
                except BreakerOpen:
                    bulkhead.release()
                    raise
        else:  # a free slot: taken at once, without wait_for's task and timer (issue 21)
            await bulkhead.acquire()
        # The wait for the slot took time: send only with enough of it left, and no longer.
        left = time_left()
        if left < MIN_CALL_SECONDS:
            self._bulkhead().release()
            raise DeadlineReached("complete-by reached while waiting for a call slot")
        timeout = min(timeout, left)
        try:
            with telemetry.client_span(
                names.SPAN_HTTP.format(method=method, route=route),
                order_id=request.order_id, step=request.step, kind=request.kind, attempt=request.attempt,
                remote=request.remote, action=request.action,
            ) as span:
                if span.is_recording():
                    span.set_attributes({"http.request.method": method, "url.full": url})
                headers = {**headers, **telemetry.current()}
                try:
                    async with self._session().request(
                        method, url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
                    ) as response:
                        status, text = response.status, await _text(response)
                        retry_after = response.headers.get("Retry-After")
                except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                    self._record(ok=False, tally=tally)
                    # Refused before it was sent: not applied. Otherwise it may have been.
                    sent = not isinstance(error, aiohttp.ClientConnectorError)
                    raise TransientRemoteError(f"{type(error).__name__}: {error}", unknown=sent) from error
                if span.is_recording():
                    span.set_attribute("http.response.status_code", status)
                    if status >= 400:
                        telemetry.error(f"HTTP {status}")
        finally:
            self._bulkhead().release()
        self._record(ok=status not in TRANSIENT_STATUS, tally=tally)
        return status, text, retry_after

    def _record(self, *, ok: bool, tally: _Tally) -> None:
        if self.breaker is None or not tally.counts:
            return
        if ok:
            self.breaker.succeeded(tally.key)
        else:
            self.breaker.failed(tally.key)
            tally.failed = True

    async def _post(
        self, request: AgentRequest, *, timeout: float, time_left: Callable[[], float], tally: _Tally
    ) -> dict[str, Any]:
        body = {
            "order_id": request.order_id,
            "step": request.step,
            "kind": request.kind.value,
            "attempt": request.attempt,
            "order": request.order,
        }
        if request.kind is Kind.COMPENSATION:
            body["result"] = request.result
        headers = {"Idempotency-Key": request.idempotency_key, "Complete-By": complete_by_header(request.complete_by)}
        status, text, retry_after = await self._request(
            request, "POST", request.action, f"{self.base_url}/{request.action}", body, headers, timeout, time_left, tally
        )
        retry_after = _retry_after(retry_after)
        if status in TRANSIENT_STATUS:
            raise TransientRemoteError(f"HTTP {status}", retry_after=retry_after)
        if status >= 400:
            raise PermanentRemoteError(f"HTTP {status}: {text[:500]}")
        result = _json_object(text)
        if result is None:
            # The service said it did it but not what came of it: the action may well have
            # been applied (its outcome is unknown, a retry asks first), and this call failed.
            tally.failed = True
            raise TransientRemoteError(
                f"HTTP {status} with a body that is not a JSON object: {text[:200]!r}", unknown=True
            )
        return result
