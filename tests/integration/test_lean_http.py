"""Plain storage requests over http.client (adapters/lean_http.py): the same request on the
wire as requests' own adapter sends, the same answer back, and for each way a connection
fails the same azure-core error, so the SDKs' retry policies and the store's handling of
ambiguous writes see what they saw before. Every case runs both paths against the same
local server over real sockets and compares them."""

from __future__ import annotations

import gzip
import datetime
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest
import requests
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.core.rest import HttpRequest
from azure.data.tables import TableClient, TableServiceClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from requests.adapters import HTTPAdapter

from adapters import batch, clients, store, transport
from adapters.lean_http import HttpClientAdapter
from tests.polling import wait_until


def _requests_own() -> RequestsTransport:
    """azure-core's transport over a plain requests session: the path before the cut."""
    session = requests.Session()
    session.trust_env = False
    return RequestsTransport(session=session, session_owner=True, use_env_settings=False)


def _lean() -> RequestsTransport:
    return RequestsTransport(session=transport.new_session(), session_owner=True, use_env_settings=False)


class Server:
    """A TCP server answering each connection with ``handle(connection, request bytes)``."""

    def __init__(self, handle: Callable[[socket.socket, bytes], None], tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        port = self.listener.getsockname()[1]
        self.url = f"https://localhost:{port}" if tls else f"http://127.0.0.1:{port}"
        self._tls = tls
        self.requests: list[bytes] = []
        #: Connections this server has closed.
        self.closed = 0
        self._handle = handle
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        if self._tls is not None:
            try:
                connection = self._tls.wrap_socket(connection, server_side=True)
            except (ssl.SSLError, OSError):  # the client refused the certificate
                connection.close()
                self.closed += 1
                return
        with connection:
            while True:
                data = _read_request(connection)
                if not data:
                    break
                self.requests.append(data)
                if self._handle(connection, data) is False:
                    break
        self.closed += 1

    def close(self) -> None:
        self.listener.close()


def _read_request(connection: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += connection.recv(65536)
    return head + b"\r\n\r\n" + body


def _answer(connection: socket.socket, body: bytes = b'{"ok":true}', *, extra: str = "",
            status: str = "200 OK") -> None:
    connection.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                       f"{extra}\r\n".encode() + body)


@pytest.fixture
def server() -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def make(handle, tls: ssl.SSLContext | None = None) -> Server:
        made.append(Server(handle, tls))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _normalised(raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    """A request as sent: its request line, its headers (sorted; the client request id and
    the date differ per request), its body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *headers = head.split(b"\r\n")
    return line, sorted(h.lower() for h in headers), body


def test_a_request_goes_on_the_wire_as_requests_own_adapter_sends_it(server):
    s = server(lambda connection, data: _answer(connection))
    body = '{"CustomerName":"Zoë Ørsted","n":1}'  # text: sent as UTF-8, its length in bytes
    for path in (_requests_own(), _lean()):
        for method, data in (("PUT", body), ("GET", None), ("DELETE", None), ("POST", b"{}")):
            request = HttpRequest(method, s.url + "/acct/t(PartitionKey='p',RowKey='r')?$select=A%2CB",
                                  headers={"x-ms-version": "2019-02-02", "If-Match": "*"}, content=data)
            response = path.send(request, connection_timeout=5, read_timeout=5)
            assert response.status_code == 200 and response.json() == {"ok": True}
    before, after = s.requests[:4], s.requests[4:]
    assert [_normalised(r) for r in after] == [_normalised(r) for r in before]
    assert "Zoë Ørsted".encode() in after[0]


def test_the_answer_is_read_as_requests_reads_it(server):
    payload = b'{"value":[1,2,3]}'

    def handle(connection, data):
        _answer(connection, gzip.compress(payload), status="404 Not Found",
                extra="Content-Encoding: gzip\r\nx-ms-request-id: a\r\nx-ms-request-id: b\r\nETag: W/\"1\"\r\n")

    s = server(handle)
    seen = []
    for path in (_requests_own(), _lean()):
        response = path.send(HttpRequest("GET", s.url + "/t"), connection_timeout=5, read_timeout=5)
        seen.append((response.status_code, response.reason, response.content, response.headers["x-ms-request-id"],
                     response.headers["etag"], response.headers["content-type"]))
    assert seen[0] == seen[1]
    assert seen[1][:3] == (404, "Not Found", payload)


def _error(path: RequestsTransport, url: str, **timeouts) -> type[AzureError]:
    with pytest.raises(AzureError) as raised:
        path.send(HttpRequest("PUT", url + "/t", content=b"{}"), **{"connection_timeout": 5, "read_timeout": 5,
                                                                      **timeouts})
    return type(raised.value)


def _refused_url() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    probe.close()  # nothing listens there now
    return url


def _dropped(connection, data):
    return False  # the request was read; the connection closes with no answer


def _silent(connection, data):
    threading.Event().wait(3)  # no answer within the read timeout
    return False


def _cut_short(connection, data):
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\"")
    return False


def _not_http(connection, data):
    connection.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
    return False


@pytest.mark.parametrize(("handle", "expected"), [
    (_dropped, ServiceResponseError),  # maybe applied: the store reads its write id back
    (_silent, ServiceResponseTimeoutError),
    (_cut_short, IncompleteReadError),
    (_not_http, ServiceResponseError),
], ids=["dropped-after-the-request", "no-answer-in-time", "body-cut-short", "not-http"])
def test_each_failure_is_the_azure_error_requests_own_path_raises(server, handle, expected):
    s = server(handle)
    timeouts = {"read_timeout": 0.5} if handle is _silent else {}
    own, lean = _error(_requests_own(), s.url, **timeouts), _error(_lean(), s.url, **timeouts)
    assert lean is own
    assert issubclass(lean, expected)


def test_a_refused_connection_is_a_request_error_never_sent():
    url = _refused_url()
    own, lean = _error(_requests_own(), url), _error(_lean(), url)
    assert lean is own
    assert issubclass(lean, ServiceRequestError) and not issubclass(lean, ServiceResponseError)


def test_a_kept_alive_connection_is_reused_and_one_the_server_closed_is_not(server):
    closing = {"next": False}

    def handle(connection, data):
        close = closing["next"]  # read before answering: the client moves on once answered
        _answer(connection)
        return False if close else None  # answered with keep-alive, then closed while idle

    s = server(handle)
    session = transport.new_session()
    adapter = session.get_adapter(s.url)
    assert isinstance(adapter, HttpClientAdapter)

    def get():
        return session.request("GET", s.url + "/t", timeout=(5, 5), allow_redirects=False).status_code

    assert [get(), get()] == [200, 200]
    assert adapter.idle_connections() == 1  # the two requests shared one connection
    closing["next"] = True
    assert get() == 200
    wait_until(lambda: s.closed == 1, timeout=10, what="the server to close the idle connection")
    assert get() == 200  # on a new connection: the closed one was dropped, not sent on
    session.close()
    assert adapter.idle_connections() == 0


def test_a_transaction_goes_over_http_client_and_a_streamed_read_keeps_requests_own_adapter(server):
    s = server(lambda connection, data: _answer(connection))
    session = transport.new_session()
    adapter = session.get_adapter(s.url)
    for stream in (False, True):  # (the Tables SDK asks for a transaction's answer as a stream)
        response = session.request("POST", s.url + "/acct/$batch", data=b"x", timeout=(5, 5),
                                   allow_redirects=False, stream=stream)
        assert response.status_code == 200
        assert b"".join(response.iter_content(4)) == b'{"ok":true}' == response.content
    assert adapter.idle_connections() == 1 and not adapter.fallback.poolmanager.pools  # over http.client
    response = session.request("GET", s.url + "/blob", timeout=(5, 5), allow_redirects=False, stream=True)
    assert response.status_code == 200 and response.content == b'{"ok":true}'
    assert len(adapter.fallback.poolmanager.pools) == 1  # the streamed read through requests' adapter
    session.close()


def _transaction_error(table_client, url: str, transport_: RequestsTransport, **timeouts) -> Exception:
    """The error a two-entity transaction against ``url`` raises, after the SDK's retries (one)."""
    account = url + "/" + clients.DEV_ACCOUNT
    table = table_client.from_connection_string(
        clients.development_storage().split("TableEndpoint=")[0] + f"TableEndpoint={account};", "t",
        transport=transport_, retry_total=1, retry_backoff_factor=0.01,
    )
    with pytest.raises(Exception) as raised:
        table.submit_transaction([("create", {"PartitionKey": "p", "RowKey": "a"}),
                                  ("upsert", {"PartitionKey": "p", "RowKey": "b", "N": 1})], **timeouts)
    return raised.value


def _cut_short_multipart(connection, data):
    connection.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Type: multipart/mixed; boundary=batchresponse_1\r\n"
                       b"Content-Length: 500\r\n\r\n--batchresponse_1\r\n")
    return False


@pytest.mark.parametrize(("handle", "before", "after"), [
    (_dropped, ServiceResponseError, ServiceResponseError),
    (_silent, ServiceResponseError, ServiceResponseError),  # (the Tables SDK's read timeout)
    # A body cut short: the streamed read raised the base HttpResponseError, the whole read
    # raises its subclass IncompleteReadError (as for a plain request, above).
    (_cut_short, HttpResponseError, IncompleteReadError),
    # (an accepted answer cut short: the SDK's parts() let requests' own error through)
    (_cut_short_multipart, requests.exceptions.ChunkedEncodingError, IncompleteReadError),
    (_not_http, ServiceResponseError, ServiceResponseError),
], ids=["dropped-after-the-request", "no-answer-in-time", "body-cut-short", "answer-cut-short", "not-http"])
def test_a_failed_transaction_is_judged_as_the_sdk_s_streamed_read_after_as_many_tries(server, handle, before, after):
    """The SDK's own client (its answer streamed through requests' adapter: the path before
    the cut) against the app's (read whole, over http.client): the same error (a subclass of it
    for a body cut short), after the same number of requests on the wire; the store decides
    the same on both (a conflict or not: adapters/store.py), except that an answer cut short
    is an ambiguous write on the app's path (it may have been applied: the partition says),
    where the streamed read's base error was not."""
    timeouts = {"read_timeout": 0.5} if handle is _silent else {}
    errors, tries = [], []
    for table_client, path in ((TableClient, _requests_own()), (batch.LeanTableClient, _lean())):
        s = server(handle)
        errors.append(_transaction_error(table_client, s.url, path, **timeouts))
        tries.append(len(s.requests))
        assert all(r.startswith(b"POST /devstoreaccount1/$batch HTTP/1.1") for r in s.requests)
    assert isinstance(errors[0], before) and isinstance(errors[1], after)
    assert store._ambiguous(errors[1]) == (store._ambiguous(errors[0]) or after is IncompleteReadError)  # noqa: SLF001
    assert [store._is_conflict(e) for e in errors] == [False, False]  # noqa: SLF001
    # no status the store reads as gone, moved or a conflict (the streamed read's may be the 200 it cut)
    assert not {getattr(e, "status_code", None) for e in errors} & {404, 409, 412}
    assert tries[1] == tries[0] >= 1


def test_the_storage_clients_read_and_write_azurite_through_it(storage_connection_string, unique_name):
    service = TableServiceClient.from_connection_string(storage_connection_string, transport=clients.transport())
    table = service.create_table(unique_name("lean"))
    table.upsert_entity({"PartitionKey": "p", "RowKey": "r", "Name": "Zoë", "N": 1})
    entity = table.get_entity("p", "r")
    assert (entity["Name"], entity["N"]) == ("Zoë", 1)
    assert [e["RowKey"] for e in table.query_entities("PartitionKey eq @pk", parameters={"pk": "p"})] == ["r"]
    endpoint = storage_connection_string.split("TableEndpoint=")[1]
    assert transport.shared_session().get_adapter(endpoint).idle_connections()  # kept for the next request
    service.delete_table(table.table_name)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for ``localhost`` (its PEM file, and its key's), made here."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def _tls_server(server, certificate) -> Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    return server(lambda connection, data: _answer(connection), context)


def test_an_https_server_is_verified_as_requests_verifies_it(server, certificate):
    s = _tls_server(server, certificate)  # its certificate is in no trusted bundle
    own, lean = _error(_requests_own(), s.url), _error(_lean(), s.url)
    assert lean is own
    assert issubclass(lean, ServiceRequestError) and not issubclass(lean, ServiceResponseError)


def test_a_trusted_https_server_gets_the_same_request(server, certificate):
    s = _tls_server(server, certificate)
    own = _requests_own()
    response = own.send(HttpRequest("PUT", s.url + "/t?a=1", content='{"n":"Zoë"}'), connection_verify=certificate[0])
    assert response.status_code == 200
    session = transport.new_session()  # the lean adapter, trusting the test's certificate as its CA
    lean = HttpClientAdapter(HTTPAdapter(), pool_size=4, tls=ssl.create_default_context(cafile=certificate[0]))
    session.mount("https://", lean)
    path = RequestsTransport(session=session, session_owner=True, use_env_settings=False)
    response = path.send(HttpRequest("PUT", s.url + "/t?a=1", content='{"n":"Zoë"}'))
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert lean.idle_connections() == 1  # sent by http.client over TLS, kept for reuse
    assert _normalised(s.requests[1]) == _normalised(s.requests[0])
