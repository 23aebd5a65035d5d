"""The storage-queue trigger's hot calls (receive, delete) and the queue output's send as plain REST requests.

Every poll of every storage-queue listener is one Get Messages request, empty most of the
time; through the SDK (``QueueClient.receive_messages`` and its pager, azure-core's
pipeline, the generated deserializer, ``requests``) one empty poll cost this host 1.16 ms
of CPU against Azurite, the same request built and signed here and sent on a urllib3
connection pool 0.28-0.30 ms, on a kept-alive connection of :class:`HttpConnections` 0.11-0.13 ms
(BENCHMARKS.md, "Where the CPU goes, and what was cut"): the tool's own few lines
of HTTP/1.1, the request written in one ``sendall``, the answer's status line, headers and
body (``Content-Length``, chunked, or to the end of the connection) read from the socket,
where urllib3 added its pool's bookkeeping and ``http.client`` parses headers with the
``email`` package. The requests are the ones the SDK sends, with the same API version and
Shared Key signature, so the queue service sees the same calls: what the trigger receives,
deletes and leaves visible does not change.

Only a connection with an account key takes this path (Azurite, a connection string);
anything else (SAS, ``DefaultAzureCredential``) keeps the SDK client (:func:`lean_queue`
returns None). Errors are the SDK's types, so the listener handles both alike: 404 raises
``ResourceNotFoundError``, another refusal ``HttpResponseError``; no connection (refused,
unreachable, a connect timeout) ``ServiceRequestError``: never sent; a connection dropped or
timed out once the request was on it, or an answer that is not HTTP, ``ServiceResponseError``:
maybe applied (as urllib3's errors mapped before). A delete and a send are retried
as the Functions host's SDK client retries them (a dropped connection, 408, 429, 5xx: three
more tries, 0.8 s doubling, each wait ±20%: Azure.Core's ``RetryOptions`` defaults, azure-sdk-for-net
``sdk/core/Azure.Core/src/RetryOptions.cs`` and ``DelayStrategy.cs``, read 2026-11-25 and 2026-11-27); a poll is not (its listener
polls again after its back-off, as the Functions host's listener does after a failed poll).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
import socket
import ssl
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from urllib.parse import quote, unquote, urlsplit
from xml.sax.saxutils import escape

from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.queue import QueueClient, QueueMessage
from urllib3.util.wait import wait_for_read

#: The SDK's transport timeouts (azure-core: 20 s to connect, 60 s to read).
CONNECT_TIMEOUT, READ_TIMEOUT = 20.0, 60.0
#: Retries of a delete or a send, and the first wait before one (doubling): Azure.Core's RetryOptions defaults.
RETRIES = 3
RETRY_DELAY = 0.8
#: Each wait is drawn between these factors of its nominal delay, as Azure.Core's exponential
#: delay strategy draws it (``DelayStrategy.CreateExponentialDelayStrategy``: minJitterFactor 0.8,
#: maxJitterFactor 1.2; azure-sdk-for-net ``sdk/core/Azure.Core/src/DelayStrategy.cs``, read
#: 2026-11-27), so hosts whose calls failed together do not retry in step.
RETRY_JITTER = (0.8, 1.2)
#: How a retry waits (a name of its own, so that a test can take the waits without sleeping).
_sleep = time.sleep
_RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
XML = "application/xml"


class LeanQueue:
    """Receive and delete on one queue, signed with the account's Shared Key; thread-safe."""

    def __init__(self, endpoint: str, account_name: str, account_key: str, api_version: str, pool_size: int) -> None:
        parts = urlsplit(endpoint)
        self._path = parts.path.rstrip("/")  # /<account>/<queue> (Azurite) or /<queue> (Azure)
        self._resource = f"/{account_name}{unquote(self._path)}"
        self._account = account_name
        self._key = base64.b64decode(account_key)
        self._version = api_version
        self._http = HttpConnections(parts.scheme, parts.netloc, pool_size)

    def receive(self, count: int, visibility_timeout: int) -> list[QueueMessage]:
        """Get Messages: up to ``count`` messages, each hidden for ``visibility_timeout`` seconds."""
        query = {"numofmessages": str(count), "visibilitytimeout": str(visibility_timeout)}
        body = self._request("GET", "/messages", query, ok=200)
        return parse_messages(body) if b"<QueueMessage>" in body else []

    def send(self, text: str) -> None:
        """Put Message: ``text`` as the message's content, as stored (the caller encodes); retried as the
        SDK retries it (a retry after a send that was applied leaves a second message, as with the SDK)."""
        body = f"<?xml version='1.0' encoding='utf-8'?>\n<QueueMessage><MessageText>{escape(text)}</MessageText></QueueMessage>"
        self._retried("POST", "/messages", {}, ok=201, body=body.encode("utf-8"))

    def delete(self, message_id: str, pop_receipt: str) -> None:
        """Delete Message, retried as the SDK retries it."""
        self._retried("DELETE", f"/messages/{message_id}", {"popreceipt": pop_receipt}, ok=204)

    def _retried(self, method: str, path: str, query: dict[str, str], *, ok: int, body: bytes | None = None) -> None:
        delay = RETRY_DELAY
        for attempt in range(RETRIES + 1):
            try:
                self._request(method, path, query, ok=ok, body=body)
                return
            except (ServiceRequestError, ServiceResponseError, HttpResponseError) as error:
                status = getattr(error, "status_code", None)
                retried = status is None or status in _RETRIED_STATUS
                if isinstance(error, ResourceNotFoundError) or not retried or attempt == RETRIES:
                    raise
            _sleep(delay * random.uniform(*RETRY_JITTER))
            delay *= 2

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, query: dict[str, str], *, ok: int, body: bytes | None = None) -> bytes:
        date = formatdate(usegmt=True)
        headers = {"x-ms-date": date, "x-ms-version": self._version}
        signed = self._sign(method, path, query, headers, len(body) if body else 0, XML if body else "")
        headers["Authorization"] = f"SharedKey {self._account}:{signed}"
        if body:
            headers["Content-Type"] = XML
        url = self._path + path
        if query:
            url += "?" + "&".join(f"{name}={quote(value, safe='')}" for name, value in query.items())
        answer = self._http.request(method, url, headers, body)
        if answer.status != ok:
            raise _refusal(answer)
        return answer.body

    def _sign(self, method: str, path: str, query: dict[str, str], headers: dict[str, str], length: int,
              content_type: str) -> str:
        """Shared Key: the Blob, Queue and File services' string to sign (of the standard headers,
        only Content-Length, empty when 0, and Content-Type are ever set here)."""
        canonical_headers = "".join(f"{name}:{headers[name]}\n" for name in sorted(headers))
        canonical_query = "".join(f"\n{name}:{query[name]}" for name in sorted(query))
        standard = ["", "", str(length) if length else "", "", content_type, "", "", "", "", "", ""]
        to_sign = f"{method}\n" + "".join(f"{value}\n" for value in standard) + canonical_headers
        to_sign += self._resource + path + canonical_query
        return base64.b64encode(hmac.new(self._key, to_sign.encode("utf-8"), hashlib.sha256).digest()).decode()


def _refusal(answer: Answer) -> HttpResponseError:
    code = answer.headers.get("x-ms-error-code", "")
    message = f"{answer.status} {answer.reason}: {code}".rstrip(": ")
    error_type = ResourceNotFoundError if answer.status == 404 else HttpResponseError
    error = error_type(message=message)
    error.status_code = answer.status
    error.error_code = code or None
    return error


# --- HTTP/1.1 ------------------------------------------------------------------------------

_MAX_HEAD = 64 * 1024


class NotHttp(ValueError):
    """The peer's answer is not HTTP/1.x as this client reads it."""


@dataclass
class Answer:
    status: int
    reason: str
    headers: dict[str, str]  # names in lower case; a repeated header's values joined with ", "
    body: bytes
    keep_alive: bool


class HttpConnections:
    """HTTP/1.1 requests to one endpoint on connections kept alive, at most ``pool_size`` of them
    idle (more are opened when all are busy, and closed after their request); thread-safe.

    An idle connection the server closed (Azurite lets one go after 5 s) is dropped before
    reuse, as urllib3's pool does. Failures are azure-core's errors for the same event:
    ``ServiceRequestError`` when no connection could be opened, ``ServiceResponseError`` once
    the request may have reached the server.
    """

    def __init__(self, scheme: str, netloc: str, pool_size: int) -> None:
        parts = urlsplit(f"{scheme}://{netloc}")
        self._address = (parts.hostname or "", parts.port or (443 if scheme == "https" else 80))
        self._host = netloc
        self._tls = ssl.create_default_context() if scheme == "https" else None
        self._pool_size = pool_size
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> Answer:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host}", "Accept-Encoding: identity"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        message = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        connection = self._take()
        try:
            connection.sendall(message)
            answer = _read_answer(connection)
        except (OSError, NotHttp) as error:
            connection.close()
            raise ServiceResponseError(f"{type(error).__name__}: {error}", error=error) from error
        except BaseException:
            connection.close()
            raise
        if answer.keep_alive:
            self._give_back(connection)
        else:
            connection.close()
        return answer

    def _take(self) -> socket.socket:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if not wait_for_read(connection, timeout=0.0):
                    return connection
                connection.close()  # closed by the server while idle (or it sent something unasked)
        try:
            connection = socket.create_connection(self._address, timeout=CONNECT_TIMEOUT)
        except OSError as error:
            raise ServiceRequestError(f"{type(error).__name__}: {error}", error=error) from error
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                connection = self._tls.wrap_socket(connection, server_hostname=self._address[0])
        except OSError as error:
            connection.close()
            raise ServiceRequestError(f"{type(error).__name__}: {error}", error=error) from error
        connection.settimeout(READ_TIMEOUT)
        return connection

    def _give_back(self, connection: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for connection in idle:
            connection.close()


class _Buffered:
    """What was read from a connection and not used yet."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self.data = bytearray()

    def more(self) -> bool:
        chunk = self._connection.recv(65536)
        self.data += chunk
        return bool(chunk)

    def until(self, marker: bytes, limit: int) -> bytes:
        """The bytes before ``marker`` (consumed with it)."""
        while (end := self.data.find(marker)) < 0:
            if len(self.data) > limit:
                raise NotHttp("a line or header block too long")
            if not self.more():
                raise ConnectionError("the connection closed before the answer ended")
        found = bytes(self.data[:end])
        del self.data[: end + len(marker)]
        return found

    def exactly(self, count: int) -> bytes:
        while len(self.data) < count:
            if not self.more():
                raise ConnectionError("the connection closed before the answer ended")
        found = bytes(self.data[:count])
        del self.data[:count]
        return found


def _read_answer(connection: socket.socket) -> Answer:
    reader = _Buffered(connection)
    while True:
        head = reader.until(b"\r\n\r\n", _MAX_HEAD).decode("latin-1").split("\r\n")
        version, _, rest = head[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not (len(code) == 3 and code.isdigit()):
            raise NotHttp(f"not an HTTP/1.x status line: {head[0][:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise NotHttp(f"not a header line: {line[:80]!r}")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if status >= 200:
            break  # an interim 1xx answer (100 Continue, ...) is followed by the real one
    keep_alive = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if status in (204, 304):
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = _chunked(reader)
    elif "content-length" in headers:
        length = headers["content-length"].split(",")[0].strip()
        if not length.isdigit():
            raise NotHttp(f"Content-Length {headers['content-length']!r}")
        body = reader.exactly(int(length))
    else:  # the body runs to the end of the connection
        while reader.more():
            pass
        body, keep_alive = bytes(reader.data), False
        reader.data.clear()
    if reader.data:  # more than the answer: this connection cannot be trusted with another request
        keep_alive = False
    return Answer(status, reason, headers, body, keep_alive)


def _chunked(reader: _Buffered) -> bytes:
    chunks = []
    while True:
        size_line = reader.until(b"\r\n", _MAX_HEAD).split(b";")[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise NotHttp(f"chunk size {size_line[:20]!r}") from None
        if size == 0:
            while reader.until(b"\r\n", _MAX_HEAD):  # trailer lines, up to the empty one
                pass
            return b"".join(chunks)
        chunks.append(reader.exactly(size))
        if reader.exactly(2) != b"\r\n":
            raise NotHttp("a chunk not followed by CRLF")


def parse_messages(body: bytes) -> list[QueueMessage]:
    """A Get Messages answer as the SDK's ``QueueMessage`` objects (content left as the raw text)."""
    messages = []
    for item in ET.fromstring(body).iter("QueueMessage"):
        message = QueueMessage(content=item.findtext("MessageText"))
        message.id = item.findtext("MessageId")
        message.pop_receipt = item.findtext("PopReceipt")
        message.dequeue_count = int(item.findtext("DequeueCount") or 0)
        message.inserted_on = _date(item.findtext("InsertionTime"))
        message.expires_on = _date(item.findtext("ExpirationTime"))
        message.next_visible_on = _date(item.findtext("TimeNextVisible"))
        messages.append(message)
    return messages


def _date(text: str | None):
    return parsedate_to_datetime(text) if text else None


def lean_queue(client: QueueClient, pool_size: int) -> LeanQueue | None:
    """A :class:`LeanQueue` for the queue ``client`` names, if its credential is an account key."""
    credential = client.credential
    key, account = getattr(credential, "account_key", None), getattr(credential, "account_name", None)
    if not key or not account or "?" in client.url:
        return None
    return LeanQueue(client.primary_endpoint, account, key, client.api_version, pool_size)
