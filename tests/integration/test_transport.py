"""The storage clients' shared HTTP session (adapters/transport.py): one pool per process, the
lean request path sends what requests' own path sends, a dropped connection is still the
error the SDK retries, and the shared session's connections are closed on shutdown."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from azure.core.exceptions import ServiceResponseError
from azure.core.pipeline.transport import HttpRequest
from azure.data.tables import TableServiceClient

from adapters import clients, transport, wiring


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def do_PUT(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _Echo.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        answer = b'{"ok": true}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Echo.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _send(session: requests.Session, url: str):
    return session.request("PUT", url + "/t/x?a=1%202", headers={"x-ms-version": "2019-02-02", "Accept": None},
                           data=b'{"k": "v"}', timeout=(5, 5), allow_redirects=False, stream=False)


def test_the_lean_path_sends_what_requests_own_path_sends(echo):
    lean = transport.new_session()
    plain = requests.Session()
    plain.trust_env = False
    for session in (lean, plain):
        response = _send(session, echo)
        assert response.status_code == 201 and response.json() == {"ok": True}
    (m1, p1, h1, b1), (m2, p2, h2, b2) = _Echo.seen
    assert (m1, p1, b1) == (m2, p2, b2) == ("PUT", "/t/x?a=1%202", b'{"k": "v"}')
    assert h1 == h2 and h1["x-ms-version"] == "2019-02-02" and "accept" not in h1


def test_every_storage_client_of_the_process_shares_one_session(storage_connection_string):
    a = TableServiceClient.from_connection_string(storage_connection_string, transport=clients.transport())
    b = TableServiceClient.from_connection_string(storage_connection_string, transport=clients.transport())
    sessions = {id(c._client._client._pipeline._transport.session) for c in (a, b)}
    assert sessions == {id(transport.shared_session())}
    a.close()  # a client does not own the session: the other keeps working on it
    assert transport.shared_session() is b._client._client._pipeline._transport.session
    list(b.list_tables(results_per_page=1).by_page())


def test_a_dropped_connection_is_the_error_the_sdk_retries():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def drop():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()  # the request was read, the answer never comes

    threading.Thread(target=drop, daemon=True).start()
    request = HttpRequest("PUT", f"http://127.0.0.1:{listener.getsockname()[1]}/t", data=b"{}")
    try:
        with pytest.raises(ServiceResponseError):
            clients.transport().send(request, connection_timeout=5, read_timeout=5)
    finally:
        listener.close()


def test_a_storage_account_that_never_answers_fails_a_request_within_the_read_timeout(monkeypatch):
    """A server that takes the request and never answers: the storage clients' transport
    gives up after READ_TIMEOUT_SECONDS (azure-core's default was 300 s a try), with the
    error the SDK retries, instead of holding the caller for minutes."""
    import time

    monkeypatch.setattr(clients, "READ_TIMEOUT_SECONDS", 1)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held = []

    def hold():
        conn, _ = listener.accept()
        conn.recv(65536)
        held.append(conn)  # the request was read; the answer never comes, the connection stays open

    threading.Thread(target=hold, daemon=True).start()
    request = HttpRequest("GET", f"http://127.0.0.1:{listener.getsockname()[1]}/t")
    started = time.monotonic()
    try:
        with pytest.raises(ServiceResponseError):
            clients.transport().send(request)  # the transport's own timeouts, as the SDK's clients send
        assert time.monotonic() - started < 10
    finally:
        for conn in held:
            conn.close()
        listener.close()


def test_the_shared_session_is_closed_on_shutdown_and_made_again_on_use(echo):
    session = transport.shared_session()
    _send(session, echo)
    adapter = session.get_adapter(echo)  # plain requests go over http.client (adapters/lean_http.py)
    assert adapter.idle_connections() >= 1  # a connection kept for the endpoint (and any other this process used)
    wiring.reset()
    assert adapter.idle_connections() == 0  # its connections closed
    again = transport.shared_session()
    assert again is not session
    assert _send(again, echo).status_code == 201
