"""The storage-queue trigger's REST calls (queue_rest.py) against Azurite: the same messages,
errors and visibility as through the SDK."""

from __future__ import annotations

import socket
import struct
import threading
import time
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError, ServiceRequestError, ServiceResponseError
from azure.storage.queue import QueueClient

from tools.funchost.queue_rest import RETRIES, RETRY_DELAY, RETRY_JITTER, HttpConnections, lean_queue

from .support import eventually


@pytest.fixture
def queue(storage_connection_string, unique_name) -> QueueClient:
    client = QueueClient.from_connection_string(storage_connection_string, unique_name("rest-"))
    client.create_queue()
    return client


def test_a_message_is_sent_received_and_deleted_as_through_the_sdk(queue):
    rest = lean_queue(queue, pool_size=2)
    text = "<order id=\"o&1\"> é ✓ +/= '"
    rest.send(text)
    (peeked,) = queue.peek_messages()  # what the SDK reads of it
    assert peeked.content == text

    (first,) = rest.receive(16, 3)
    assert first.id == peeked.id and first.dequeue_count == 1
    assert first.next_visible_on - first.inserted_on >= timedelta(seconds=2)  # hidden for the 3 s asked
    (message,) = eventually(lambda: rest.receive(16, 30), what="the message visible again after 3 s")
    assert (message.id, message.content, message.dequeue_count) == (peeked.id, text, 2)
    assert (message.inserted_on, message.expires_on) == (peeked.inserted_on, peeked.expires_on)
    assert message.next_visible_on > message.inserted_on and message.pop_receipt

    with pytest.raises(HttpResponseError) as refused:
        rest.delete(message.id, "AgAAAAMAAAAAAAAA+/==")  # not its pop receipt: refused, not "gone"
    assert refused.value.status_code == 400 and not isinstance(refused.value, ResourceNotFoundError)
    rest.delete(message.id, message.pop_receipt)
    assert queue.get_queue_properties().approximate_message_count == 0
    with pytest.raises(ResourceNotFoundError):
        rest.delete(message.id, message.pop_receipt)
    rest.close()


def test_a_missing_queue_is_not_found_for_each_call(storage_connection_string, unique_name):
    rest = lean_queue(QueueClient.from_connection_string(storage_connection_string, unique_name("gone-")), 1)
    with pytest.raises(ResourceNotFoundError):
        rest.receive(1, 30)
    with pytest.raises(ResourceNotFoundError):
        rest.send("x")


def test_without_an_account_key_the_sdk_is_kept(queue):
    sas = QueueClient.from_queue_url(f"{queue.url}?sv=2024-08-04&sig=not-a-real-signature")
    assert lean_queue(sas, pool_size=1) is None



# --- the HTTP/1.1 client, against a server that answers as scripted -----------------------------


class _ScriptedServer:
    """A loopback server: the n-th connection it accepts goes to ``script``'s n-th function, which
    answers (or drops it) as the case needs; every request it reads is kept in ``requests``."""

    def __init__(self, *script) -> None:
        self._script = script
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.closed = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        for handle in self._script:
            connection, _ = self._listener.accept()
            with connection:
                handle(self, connection)
            self.closed += 1
        self._listener.close()

    def read(self, connection: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += connection.recv(65536)
        head = data.partition(b"\r\n\r\n")[0]
        lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
        while len(data) < len(head) + 4 + int(lengths[0] if lengths else 0):
            data += connection.recv(65536)
        self.requests.append(data)
        return data


def _answer(status: str, *headers: str, body: bytes = b"") -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode() + body


def _reset(server: _ScriptedServer, connection: socket.socket) -> None:
    """Read the request, then drop the connection with a reset: no answer at all."""
    server.read(connection)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_answers_are_read_whole_whatever_their_framing_and_connections_are_kept_only_when_they_can_be():
    """Chunked (with an extension and a trailer), Content-Length, and to the end of the connection;
    a connection is used again after a kept-alive answer, not after ``Connection: close`` nor HTTP/1.0."""

    def three_answers(server, connection):
        server.read(connection)
        chunks = b"5;x=1\r\nhello\r\n1\r\n!\r\n0\r\nT: t\r\n\r\n"
        connection.sendall(_answer("200 OK", "Transfer-Encoding: chunked", body=chunks))
        server.read(connection)
        connection.sendall(_answer("201 Created", "Content-Length: 3", "x-ms-error-code: none", body=b"abc"))
        server.read(connection)
        connection.sendall(_answer("204 No Content", "Connection: close"))

    def to_the_end(server, connection):
        server.read(connection)
        connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")

    server = _ScriptedServer(three_answers, to_the_end)
    http = HttpConnections("http", f"127.0.0.1:{server.port}", pool_size=2)
    first = http.request("GET", "/a?x=1", {"x-ms-version": "v"}, None)
    assert (first.status, first.body, first.keep_alive) == (200, b"hello!", True)
    second = http.request("POST", "/b", {}, b"xyz")
    assert (second.status, second.reason, second.body) == (201, "Created", b"abc")
    assert second.headers["x-ms-error-code"] == "none"
    third = http.request("DELETE", "/c", {}, None)
    assert (third.status, third.body, third.keep_alive) == (204, b"", False)
    fourth = http.request("GET", "/d", {}, None)
    assert (fourth.status, fourth.body, fourth.keep_alive) == (200, b"all of it", False)
    get, post, delete, _ = server.requests
    assert get.startswith(b"GET /a?x=1 HTTP/1.1\r\n") and b"\r\nx-ms-version: v\r\n" in get
    assert post.startswith(b"POST /b HTTP/1.1\r\n") and post.endswith(b"Content-Length: 3\r\n\r\nxyz")
    assert b"Content-Length" not in delete
    http.close()


def test_an_idle_connection_the_server_closed_is_replaced_and_failures_are_the_sdks_errors():
    """A kept connection the server has closed since is not used again; no connection is a
    ServiceRequestError (never sent), a connection dropped under the request or an answer that is not
    HTTP a ServiceResponseError (maybe applied)."""

    def answer_once(server, connection):
        server.read(connection)
        connection.sendall(_answer("200 OK", "Content-Length: 2", body=b"ok"))

    def not_http(server, connection):
        server.read(connection)
        connection.sendall(b"SSH-2.0-nope\r\n\r\n")

    server = _ScriptedServer(answer_once, answer_once, _reset, not_http)
    http = HttpConnections("http", f"127.0.0.1:{server.port}", pool_size=1)
    assert http.request("GET", "/", {}, None).body == b"ok"
    eventually(lambda: server.closed == 1, what="the server closing the kept connection")
    assert http.request("GET", "/", {}, None).body == b"ok"
    eventually(lambda: server.closed == 2, what="the server closing the second one")
    with pytest.raises(ServiceResponseError):
        http.request("DELETE", "/m", {}, None)
    with pytest.raises(ServiceResponseError):
        http.request("GET", "/", {}, None)
    assert len(server.requests) == 4
    eventually(lambda: server.closed == 4, what="the script's end")
    with pytest.raises(ServiceRequestError):
        http.request("GET", "/", {}, None)  # nothing listens any more


def test_a_delete_is_retried_after_a_dropped_connection_a_poll_is_not(queue):
    """The Functions host's client retries a delete whose connection dropped under it (after 0.8 s
    ±20%, Azure.Core's default); the poller polls again after its back-off instead."""
    rest = lean_queue(queue, pool_size=1)
    rest.send("x")
    (message,) = rest.receive(1, 30)
    azurite = urlsplit(queue.url)

    def forward(server, connection):
        with socket.create_connection((azurite.hostname, azurite.port)) as upstream:
            upstream.sendall(server.read(connection))
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += upstream.recv(65536)
            connection.sendall(answer)  # a 204: no body

    server = _ScriptedServer(_reset, forward, _reset)
    through = QueueClient(
        f"http://127.0.0.1:{server.port}/{queue.account_name}", queue.queue_name, credential=queue.credential
    )
    started = time.monotonic()
    lean_queue(through, pool_size=1).delete(message.id, message.pop_receipt)
    assert time.monotonic() - started >= RETRY_DELAY * RETRY_JITTER[0] and len(server.requests) == 2
    assert queue.get_queue_properties().approximate_message_count == 0
    started = time.monotonic()
    with pytest.raises(ServiceResponseError):
        lean_queue(through, pool_size=1).receive(1, 30)
    assert time.monotonic() - started < RETRY_DELAY * RETRY_JITTER[0] and len(server.requests) == 3


def test_a_delete_failing_every_time_waits_doubling_delays_each_drawn_within_20_percent(queue, monkeypatch):
    """Three more tries after the first, as Azure.Core retries: waits of 0.8, 1.6 and 3.2 s, each
    drawn ±20% (so hosts that failed together spread out), then the error. The waits are taken
    from the sleep call, not slept."""
    waits: list[float] = []
    monkeypatch.setattr("tools.funchost.queue_rest._sleep", waits.append)
    server = _ScriptedServer(*[_reset] * (RETRIES + 1))
    through = QueueClient(
        f"http://127.0.0.1:{server.port}/{queue.account_name}", queue.queue_name, credential=queue.credential
    )
    with pytest.raises(ServiceResponseError):
        lean_queue(through, pool_size=1).delete("00000000-0000-0000-0000-000000000000", "receipt")
    assert len(server.requests) == RETRIES + 1 and len(waits) == RETRIES
    for attempt, wait in enumerate(waits):
        nominal = RETRY_DELAY * 2**attempt
        assert nominal * RETRY_JITTER[0] <= wait <= nominal * RETRY_JITTER[1], (attempt, wait)
    assert {round(wait / (RETRY_DELAY * 2**attempt), 9) for attempt, wait in enumerate(waits)} != {1.0}  # drawn
