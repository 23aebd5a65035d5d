"""The agent against answers the fake remote service never gives, over real HTTP: a
loopback server in the test answers exactly what each test scripts. Whatever a service
answers, the agent ends with a response or none: nothing escapes it (an escaping error
gets the Service Bus request redelivered, again and again)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents import agent
from agents.breaker import BreakerOptions, BreakerState, CircuitBreaker
from agents.remote import RemoteClient, TransientRemoteError
from core.models import AgentPolicy, AgentRequest, Outcome, utcnow
from tests.integration.test_agent import FAST, request

#: An answer: (status, headers, body); or HANG: no answer until the server closes.
Answer = tuple[int, dict[str, str], bytes]
HANG = "hang"
#: Given when the script has no answer left: transient, so a test that calls more often
#: than it scripted runs out of calls and fails on its assertions.
UNSCRIPTED: Answer = (500, {"Content-Type": "text/plain"}, b"unscripted")
THREE = AgentPolicy(max_calls=3, backoff_initial=0.01, backoff_max=0.02)


def answer(status: int, body: bytes, content_type: str = "application/json", **headers: str) -> Answer:
    return status, {"Content-Type": content_type, **{k.replace("_", "-"): v for k, v in headers.items()}}, body


def ok(value=None, **headers: str) -> Answer:
    """A 2xx with the JSON body ``value`` (a result object unless told otherwise)."""
    return answer(200, json.dumps({"confirmation": "c-1"} if value is None else value).encode(), **headers)


NOT_FOUND = answer(404, b'{"error": "not found"}')
UNAVAILABLE = answer(503, b'{"error": "unavailable"}')


class ScriptedRemote:
    """A loopback HTTP server answering each method's requests, in the order they come,
    with the answers scripted for that method; it counts what it was asked."""

    def __init__(self, *, post: Sequence = (), get: Sequence = ()) -> None:
        self._script: dict[str, list] = {"POST": list(post), "GET": list(get)}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.seen: list[tuple[str, str]] = []
        remote = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with remote._lock:
                    remote.seen.append((self.command, self.path))
                    queue = remote._script.get(self.command, [])
                    scripted = queue.pop(0) if queue else UNSCRIPTED
                if scripted == HANG:
                    remote._release.wait()
                    return
                status, headers, body = scripted
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up on this call

            do_POST = do_GET = _answer

            def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, service: str = "inventory") -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/{service}"

    def count(self, method: str) -> int:
        with self._lock:
            return sum(1 for seen, _ in self.seen if seen == method)

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def scripted() -> Iterator:
    servers: list[ScriptedRemote] = []

    def start(**script) -> ScriptedRemote:
        servers.append(ScriptedRemote(**script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _closing(remote: RemoteClient, make):
    """``make()``'s coroutine on an event loop of its own, as the worker runs it; the client closed after."""

    async def once():
        try:
            return await make()
        finally:
            await remote.close()

    return asyncio.run(once())


def run_agent(sent: AgentRequest, remote: RemoteClient):
    return _closing(remote, lambda: agent.run(sent, remote=remote, now=utcnow))


def call(sent: AgentRequest, remote: RemoteClient):
    return _closing(remote, lambda: remote.call(sent, now=utcnow))


def lookup(sent: AgentRequest, remote: RemoteClient):
    return _closing(remote, lambda: remote.lookup(sent, now=utcnow))


# 1. Retry-After as an HTTP-date without a zone (or "-0000"), or one that cannot be read.

NAIVE_DATES = ["Wed, 21 Oct 2015 07:28:00 -0000", "Wed, 21 Oct 2015 07:28:00"]


@pytest.mark.parametrize("when", NAIVE_DATES)
def test_a_success_with_a_zoneless_retry_after_date_is_a_success(scripted, when):
    server = scripted(post=[ok(Retry_After=when)])
    response = run_agent(request(), RemoteClient(server.url(), call_timeout=5.0))
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "c-1"}
    assert server.count("POST") == 1


@pytest.mark.parametrize("when", [*NAIVE_DATES, "Wed, 21 Oct 99999999999999999999 07:28:00 GMT", "inf"])
def test_a_503_with_a_zoneless_or_unreadable_retry_after_is_retried(scripted, when):
    server = scripted(post=[answer(503, b'{"error": "busy"}', Retry_After=when), ok()])
    response = run_agent(request(), RemoteClient(server.url(), call_timeout=5.0))
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "c-1"}
    assert server.count("POST") == 2


# 2. A 2xx whose body is not a JSON object: the outcome is unknown.

NOT_OBJECTS = [b"[1]", b'"ok"', b"true", b"null", b"not json"]


@pytest.mark.parametrize("body", NOT_OBJECTS)
def test_a_2xx_without_a_json_object_is_an_unknown_outcome_asked_about_before_each_retry(scripted, body):
    server = scripted(post=[answer(200, body)] * 3, get=[NOT_FOUND] * 2)
    with pytest.raises(TransientRemoteError) as raised:
        call(request(policy=THREE), RemoteClient(server.url(), call_timeout=5.0))
    assert raised.value.unknown
    # It may have been applied: each retry asks first (404: not applied, so it is sent).
    assert (server.count("POST"), server.count("GET")) == (3, 2)


def test_the_agent_answers_nothing_to_a_2xx_without_a_json_object(scripted):
    server = scripted(post=[answer(200, b"[1]")] * 3, get=[NOT_FOUND] * 2)
    assert run_agent(request(policy=THREE), RemoteClient(server.url(), call_timeout=5.0)) is None
    assert server.count("POST") == 3


def test_a_2xx_without_a_json_object_is_settled_by_the_lookup_on_retry(scripted):
    server = scripted(post=[answer(200, b"[1]")], get=[ok()])
    response = run_agent(request(), RemoteClient(server.url(), call_timeout=5.0))
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "c-1"}
    assert (server.count("POST"), server.count("GET")) == (1, 1)


def test_a_breaker_refusing_the_retry_after_a_2xx_without_a_json_object_does_not_postpone(scripted):
    """The 2xx may have been applied: the line is not 'postponed' (= nothing was sent)."""
    server = scripted(post=[answer(200, b"[1]"), UNAVAILABLE, UNAVAILABLE])
    options = BreakerOptions(failure_ratio=0.6, minimum_throughput=2, sampling_seconds=30, open_seconds=30, jitter=0.0)
    breaker = CircuitBreaker("inventory", options)
    once = AgentPolicy(max_calls=1, backoff_initial=0.01, backoff_max=0.02)

    async def others_fail_meanwhile(seconds: float) -> None:
        # While o-1 waits to retry, two other lines' calls fail: the breaker opens.
        for order in ("o-2", "o-3"):
            with pytest.raises(TransientRemoteError):
                await remote.call(request(order, policy=once), now=utcnow)

    remote = RemoteClient(server.url(), call_timeout=5.0, breaker=breaker, sleep=others_fail_meanwhile)
    assert run_agent(request("o-1"), remote) is None
    assert breaker.state is BreakerState.OPEN
    assert (server.count("POST"), server.count("GET")) == (3, 0)


@pytest.mark.parametrize("body", [b"[1]", b'"ok"', b"true"])  # (null and not JSON: None already)
def test_a_lookup_answering_200_without_a_json_object_could_not_tell(scripted, body):
    server = scripted(get=[answer(200, body)])
    assert lookup(request(), RemoteClient(server.url(), call_timeout=5.0)) is None
    assert server.count("GET") == 1


def test_a_lookup_answering_200_without_a_json_object_sends_the_action(scripted):
    server = scripted(get=[answer(200, b"[1]")], post=[ok()])
    sent = request(attempt=2).model_copy(update={"settle_first": True})
    response = run_agent(sent, RemoteClient(server.url(), call_timeout=5.0))
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "c-1"}
    assert (server.count("GET"), server.count("POST")) == (1, 1)


# 3. Bodies that are not valid in their charset.


def test_a_503_whose_body_is_not_utf8_is_retried_and_a_declared_charset_is_honoured(scripted):
    latin1 = json.dumps({"confirmation": "réservé"}, ensure_ascii=False).encode("latin-1")
    server = scripted(post=[
        answer(503, b"\xe9chec", "text/plain"),
        answer(503, b"\xe9chec", "text/plain; charset=utf-8"),
        answer(200, latin1, "application/json; charset=latin-1"),
    ])
    response = run_agent(request(), RemoteClient(server.url(), call_timeout=5.0))
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "réservé"}
    assert server.count("POST") == 3


@pytest.mark.parametrize("charset", ["rot13", "undefined"])
def test_a_charset_that_cannot_decode_text_is_read_as_utf8(scripted, charset):
    server = scripted(post=[answer(200, b'{"confirmation": "c-1"}', f"application/json; charset={charset}")])
    response = run_agent(request(), RemoteClient(server.url(), call_timeout=5.0))
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "c-1"}


def test_a_half_open_trial_answered_with_undecodable_bytes_opens_the_breaker_again(scripted):
    server = scripted(post=[UNAVAILABLE, UNAVAILABLE, answer(503, b"\xe9chec", "text/plain")])
    clock = [0.0]
    options = BreakerOptions(failure_ratio=1.0, minimum_throughput=2, sampling_seconds=30, open_seconds=30, jitter=0.0)
    breaker = CircuitBreaker("inventory", options, clock=lambda: clock[0])
    remote = RemoteClient(server.url(), call_timeout=5.0, breaker=breaker)
    once = AgentPolicy(max_calls=1, backoff_initial=0.01, backoff_max=0.02)

    async def scenario():
        try:
            for order in ("o-1", "o-2"):
                assert await agent.run(request(order, policy=once), remote=remote, now=utcnow) is None
            assert breaker.state is BreakerState.OPEN
            clock[0] += 31
            assert breaker.state is BreakerState.HALF_OPEN
            # o-3 takes the trial; its 503 is recorded, so the breaker opens again (and the
            # trial is not held): o-3's retry is refused, and its attempt ends unanswered.
            return await agent.run(request("o-3"), remote=remote, now=utcnow)
        finally:
            await remote.close()

    assert asyncio.run(scenario()) is None
    assert breaker.state is BreakerState.OPEN and breaker.changes["open"] == 2
    assert server.count("POST") == 3


# 4. Once a call's outcome is unknown, every later retry of the attempt asks first.


def test_a_timeout_then_a_503_still_asks_before_the_next_retry(scripted):
    server = scripted(post=[HANG, UNAVAILABLE], get=[NOT_FOUND, ok()])
    response = run_agent(request(policy=FAST), RemoteClient(server.url(), call_timeout=0.3))
    # POST (timed out: applied?) -> GET 404, POST 503 -> GET: applied after all.
    assert response.outcome is Outcome.SUCCEEDED and response.result == {"confirmation": "c-1"}
    assert [method for method, _ in server.seen] == ["POST", "GET", "POST", "GET"]


# 5. The breaker opens while a call waits for a bulkhead slot.


def test_a_call_that_waited_for_a_slot_is_not_sent_once_the_breaker_opened_meanwhile(scripted):
    """Two requests, one slot: the first holds it (no answer), the second passed the breaker
    (closed) and waits for the slot; the breaker opens (other requests failing); the first
    times out and frees the slot. The second must not call: an open breaker sends nothing."""
    from agents.breaker import BreakerOpen

    server = scripted(post=[HANG])
    breaker = CircuitBreaker("inventory", BreakerOptions(failure_ratio=0.5, minimum_throughput=2))
    remote = RemoteClient(server.url(), call_timeout=1.0, breaker=breaker, max_concurrent_calls=1)
    one_call = AgentPolicy(max_calls=1, backoff_initial=0.01, backoff_max=0.02)

    async def scenario():
        try:
            first = asyncio.create_task(remote.call(request("o-1", policy=one_call), now=utcnow))
            second = asyncio.create_task(remote.call(request("o-2", policy=one_call), now=utcnow))
            deadline = asyncio.get_running_loop().time() + 10
            while not (server.count("POST") == 1 and remote._bulkhead()._waiters):
                assert asyncio.get_running_loop().time() < deadline, "the second call never waited for the slot"
                await asyncio.sleep(0.01)
            breaker.failed("other-1")
            breaker.failed("other-2")
            assert breaker.state is BreakerState.OPEN
            outcomes = await asyncio.gather(first, second, return_exceptions=True)
        finally:
            await remote.close()
        return outcomes

    first, second = asyncio.run(scenario())
    assert isinstance(first, TransientRemoteError)  # the hanging call timed out
    assert isinstance(second, BreakerOpen)  # refused after its wait: nothing was sent
    assert server.count("POST") == 1
