"""A ``requests`` adapter that sends a plain storage request straight over ``http.client``.

Under azure-core's ``RequestsTransport``, a point read of Table Storage spends about half
its client CPU below azure-core: ``requests``' ``HTTPAdapter`` (building urllib3's request,
its ``Retry`` and ``Timeout`` objects, the pool lookup, the ``Response``) and urllib3
(connection checks, ``HTTPHeaderDict``), around the ``http.client`` exchange that does the
actual work (issue 21; measured, BENCHMARKS.md "Where the CPU goes, and what was cut":
0.40-0.43 ms of a 0.81 ms point read against Azurite, of which the bare ``http.client``
exchange on a kept-alive connection is 0.16-0.18 ms).

:class:`HttpClientAdapter` sends such a request itself: the prepared request's method, URL,
headers and body as they are (the same bytes on the wire as urllib3 sends: ``requests``
prepared them, the ``Host`` header is the same, a ``str`` body goes as UTF-8 as urllib3
encodes it), on a kept-alive connection from its own pool per endpoint, and answers a
``requests.Response`` holding the whole body, as ``HTTPAdapter`` and a non-streamed read do.
Its failures are the ``requests`` exceptions ``HTTPAdapter`` raises for the same event, so
azure-core maps each to the same error and its retry policy decides as before:

- no connection (refused, unreachable, TLS handshake failed): ``ConnectionError`` (or
  ``SSLError``) not wrapping ``ProtocolError``: ``ServiceRequestError``, never applied,
  retried;
- connect timeout: ``ConnectTimeout``: ``ServiceRequestTimeoutError``;
- the connection dropped once the request was on it, or an answer that is not HTTP:
  ``ConnectionError(ProtocolError)``: ``ServiceResponseError``, maybe applied (the store
  then reads its write id back, adapters/store.py);
- no answer in time: ``ReadTimeout``: ``ServiceResponseTimeoutError``;
- a body cut short: ``ChunkedEncodingError`` naming ``IncompleteRead``, as urllib3's.

Two cases differ, each towards the safer reading for a write (adapters/store.py then reads
its write id back instead of taking it as never sent): a read timeout while the body streams
in is a ``ReadTimeout`` here, where urllib3 raises a ``ConnectionError`` (azure-core's
``ServiceRequestError``); a TLS error on a kept-alive connection mid-exchange is a
``ConnectionError(ProtocolError)`` here, an ``SSLError`` there.

Everything else goes to the wrapped ``HTTPAdapter`` unchanged: streamed responses (blob
downloads), client certificates, a CA bundle of the caller's, proxies, bodies that are not
bytes or text. A table transaction (``POST .../$batch``) is taken too: the Tables SDK asks
for its answer as a stream (so that azure-core's ``ContentDecodePolicy`` leaves the multipart
body alone) and then reads all of it at once (adapters/batch.py, or the SDK's ``parts()``);
here it is read whole before it is handed back, and ``requests.Response.iter_content``
serves the stream from that body. A failure while reading it is then raised in the
transport, as for a plain request, instead of from the stream later: the same error, or its
subclass ``IncompleteReadError`` for a body cut short, after the same number of tries
(tests/integration/test_lean_http.py compares the two against a faulty server). An idle
connection the server closed is dropped before reuse, as urllib3 does.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import zlib
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter, HTTPAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers
from urllib3.exceptions import ProtocolError
from urllib3.util.wait import wait_for_read

from adapters.http_answer import LeanHTTPConnection, LeanHTTPSConnection

_Endpoint = tuple[str, str, int]


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


class HttpClientAdapter(BaseAdapter):
    """Plain requests over ``http.client`` with a pool per endpoint; the rest to ``fallback``."""

    def __init__(self, fallback: HTTPAdapter, *, pool_size: int, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: the TLS settings of https requests; by default requests' (:meth:`_context`)."""
        super().__init__()
        self.fallback = fallback
        self.pool_size = pool_size
        self._idle: dict[_Endpoint, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._tls = tls

    # -- which requests -----------------------------------------------------------------

    def _takes(self, request: requests.PreparedRequest, stream, verify, cert, proxies) -> bool:
        if cert or proxies or verify is not True:
            return False
        if request.body is not None and not isinstance(request.body, (bytes, str)):
            return False
        url = urlsplit(request.url)
        if stream and not (request.method == "POST" and url.path.endswith("/$batch")):
            return False  # a transaction's answer is read whole, though the SDK asks for a stream
        return url.scheme in ("http", "https")

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        if not self._takes(request, stream, verify, cert, proxies):
            return self.fallback.send(request, stream=stream, timeout=timeout, verify=verify, cert=cert,
                                      proxies=proxies)
        connect_timeout, read_timeout = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        url = urlsplit(request.url)
        endpoint = (url.scheme, url.hostname or "", url.port or _default_port(url.scheme))
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        body = request.body.encode("utf-8") if isinstance(request.body, str) else request.body
        connection = self._connection(endpoint, connect_timeout, request)
        try:
            if connection.sock.gettimeout() != read_timeout:  # a kept connection has it already: no ioctl
                connection.sock.settimeout(read_timeout)
            connection.request(request.method, target, body=body, headers=request.headers)
            answer = connection.getresponse()
            data = answer.read()
        except (socket.timeout, TimeoutError) as error:
            connection.close()
            raise requests.exceptions.ReadTimeout(error, request=request) from error
        except http.client.IncompleteRead as error:
            connection.close()
            raise requests.exceptions.ChunkedEncodingError(
                ProtocolError(f"Connection broken: IncompleteRead({error!r})", error), request=request
            ) from error
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise requests.exceptions.ConnectionError(
                ProtocolError("Connection aborted.", error), request=request
            ) from error
        except BaseException:
            connection.close()  # anything else (a header http.client refuses): never pooled half-used
            raise
        if answer.will_close:
            connection.close()
        else:
            self._release(endpoint, connection)
        return self._response(request, answer, data)

    # -- connections --------------------------------------------------------------------

    def _connection(self, endpoint: _Endpoint, connect_timeout, request) -> http.client.HTTPConnection:
        """An idle connection to ``endpoint`` the server has not closed, else a new one."""
        with self._lock:
            idle = self._idle.get(endpoint)
            while idle:
                connection = idle.pop()
                if connection.sock is not None and not wait_for_read(connection.sock, timeout=0.0):
                    return connection
                connection.close()  # closed by the server while idle (or sent something unasked)
        scheme, host, port = endpoint
        if scheme == "https":
            connection = LeanHTTPSConnection(host, port, timeout=connect_timeout, context=self._context())
        else:
            connection = LeanHTTPConnection(host, port, timeout=connect_timeout)
        try:
            connection.connect()
        except (socket.timeout, TimeoutError) as error:
            connection.close()
            raise requests.exceptions.ConnectTimeout(error, request=request) from error
        except ssl.SSLError as error:
            connection.close()
            raise requests.exceptions.SSLError(error, request=request) from error
        except OSError as error:
            connection.close()
            raise requests.exceptions.ConnectionError(error, request=request) from error
        return connection

    def _context(self) -> ssl.SSLContext:
        """TLS as requests verifies it by default: certifi's CA bundle, the host name checked."""
        if self._tls is None:
            from requests.utils import DEFAULT_CA_BUNDLE_PATH

            self._tls = ssl.create_default_context(cafile=DEFAULT_CA_BUNDLE_PATH)
        return self._tls

    def _release(self, endpoint: _Endpoint, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(endpoint, [])
            if len(idle) < self.pool_size:
                idle.append(connection)
                return
        connection.close()

    def idle_connections(self) -> int:
        """Connections kept open for reuse, over every endpoint."""
        with self._lock:
            return sum(len(connections) for connections in self._idle.values())

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        self.fallback.close()

    # -- the answer ---------------------------------------------------------------------

    @staticmethod
    def _response(request, answer: http.client.HTTPResponse, data: bytes) -> requests.Response:
        """The answer as ``HTTPAdapter`` builds it: repeated headers joined with ", " (urllib3's
        ``HTTPHeaderDict``), a gzip or deflate body decoded (requests asks for them)."""
        headers: CaseInsensitiveDict = CaseInsensitiveDict()
        for name, value in answer.getheaders():
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        encoding = headers.get("Content-Encoding", "").strip().lower()
        try:
            if data and encoding in ("gzip", "x-gzip"):
                data = zlib.decompress(data, 16 + zlib.MAX_WBITS)
            elif data and encoding == "deflate":
                try:
                    data = zlib.decompress(data)
                except zlib.error:
                    data = zlib.decompress(data, -zlib.MAX_WBITS)
        except zlib.error as error:  # as requests raises it for urllib3's DecodeError
            raise requests.exceptions.ContentDecodingError(error, request=request) from error
        response = requests.Response()
        response.status_code = answer.status
        response.reason = answer.reason
        response.headers = headers
        response.url = request.url
        response.request = request
        response.encoding = get_encoding_from_headers(headers)
        response._content = data  # noqa: SLF001 - the body, read whole, as Response.content keeps it
        response._content_consumed = True  # noqa: SLF001
        response.raw = _Read(data)
        return response


class _Read:
    """The answer's ``raw``: the body already read (azure-core sets ``enforce_content_length``)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.enforce_content_length = True

    def read(self, *args, **kwargs) -> bytes:
        data, self._data = self._data, b""
        return data

    def close(self) -> None:
        self._data = b""
