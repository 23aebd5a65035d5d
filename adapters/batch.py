"""Entity-group transactions without the ``email`` package: the same ``$batch`` bytes, cheaper.

A table transaction is one ``POST .../$batch`` whose body is a ``multipart/mixed`` batch
holding one change set, itself ``multipart/mixed``, of ``application/http`` requests; the
answer has the same shape (Azure's "Performing entity group transactions",
https://learn.microsoft.com/rest/api/storageservices/performing-entity-group-transactions,
read 2026-11-25: one change set per batch, at most 100 entities and 4 MiB, applied atomically).
azure-data-tables 12.7.0 hands the requests to azure-core 1.41.0, which builds that body with
the ``email`` package's generator (a ``Message`` per part, flattened, then split) and parses
the answer with its parser, each way after running the per-part policies on a new thread
pool. That was ~37% (building) and ~24% (parsing) of a transaction's client CPU
(BENCHMARKS.md, "Where the CPU goes, and what was cut").

No documented extension point reaches it: azure-core's ``Pipeline.run`` builds the body before
any policy or the transport sees the request. :class:`LeanTableClient` overrides the one
method of the SDK that builds, sends and reads a transaction (``_batch_send``, the only
caller of the multipart code for tables) and keeps everything else the SDK's:

* the body: :func:`encode_batch` writes exactly the bytes azure-core's encoder writes
  (the same parts, headers, ``Content-ID`` numbering and line endings; each sub-request in
  the ``application/http`` form ``http.client`` gives it, If-Match and all), for the
  requests it can prove it writes alike; for anything else (a body or header value with a
  line break, a byte past ASCII, on which azure-core's encoder fails, an empty transaction)
  the SDK's own ``_batch_send`` runs instead, unchanged;
* the outer request: built as the SDK builds it (same headers, in the same order) and sent
  through the client's own pipeline, so the retry policy, the shared-key or bearer-token
  signing and the tracing policy see the same request;
* the answer: :func:`split_multipart` splits it where the ``email`` parser would, for
  the strict shape of a well-formed answer (every boundary exact, every part header a plain
  ``Name: value`` line, ``application/http`` parts in one change set); anything else goes to
  the SDK's own parser. Each part becomes the very object the SDK's ``parts()`` yields
  (``http.client`` parses it, its header block without the ``email`` parser as
  adapters/http_answer.py reads it, into a ``RestHttpClientTransportResponse`` paired with its
  request by position), and the SDK's own error mapping runs on them: a failed transaction
  raises the same ``TableTransactionError`` (same status, error code and ``index:`` message),
  a 413 the same ``RequestTooLargeError``.

The per-part policy (``StorageHeadersPolicy``: the ``x-ms-date`` and ``Date`` of each
sub-request) runs in a loop instead of a thread pool. :class:`LeanTableServiceClient` hands
out such table clients. tests/unit/test_batch_encoding.py holds the encoder and the parser to
azure-core's on generated input and pins the SDK code mirrored here (a new SDK version fails
it until this module is checked against it); tests/integration/test_batch.py compares the
two clients' requests and answers against Azurite.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from azure.core.pipeline import PipelineContext, PipelineRequest, PipelineResponse
from azure.core.rest import HttpRequest
from azure.core.rest._http_response_impl import RestHttpClientTransportResponse
from azure.core.utils._pipeline_transport_rest_shared import BytesIOSocket
from azure.data.tables import TableClient, TableServiceClient
from azure.data.tables._base_client import extract_batch_part_metadata
from azure.data.tables._error import (
    RequestTooLargeError, TableTransactionError, _decode_error, _validate_tablename_error,
)
from azure.data.tables._policies import StorageHeadersPolicy

from adapters.http_answer import LeanHTTPResponse
from adapters.ids import random_uuid

#: A header name that ``http.client`` sends and the ``email`` parser reads as one (printable
#: ASCII but the colon: the parser's own class of name characters).
_NAME = re.compile(r"[!-9;-~]+")
#: A part header line as the ``email`` parser (compat32) reads it: the value starts after
#: the colon and the blanks that follow it.
_HEADER_LINE = re.compile(rb"([!-9;-~]+):[ \t]*([^\r\n]*)")
#: Characters ``http.client`` refuses in a request line's URL.
_BAD_URL = re.compile(r"[\x00-\x20\x7f]")
#: A ``multipart/mixed`` content type with a plain boundary (RFC 2046's characters but the
#: space, no quotes): the only form read here; the ``email`` parser reads the same boundary.
_MULTIPART = re.compile(r"multipart/mixed;[ \t]*boundary=([0-9A-Za-z'()+_,\-./:=?]{1,70})")
_MULTIPART_BYTES = re.compile(rb"multipart/mixed;[ \t]*boundary=([0-9A-Za-z'()+_,\-./:=?]{1,70})", re.IGNORECASE)
#: The methods ``http.client`` gives a ``Content-Length: 0`` when they have no body.
_METHODS_EXPECTING_BODY = frozenset({"PATCH", "POST", "PUT"})
#: The headers azure-core's serializer leaves out of a sub-request (exact names, as it does).
_DROPPED = ("Host", "Accept-Encoding")


def application_http(request: HttpRequest) -> bytes | None:
    """One sub-request as azure-core serialises it (``http.client``'s request line, its
    ``Content-Length``, the request's headers, a blank line, the body), or None when the
    request is outside what this function is proven to write alike: then the SDK writes
    the whole transaction.

    The ``email`` generator rewrites every line break of a part to CRLF, and fails on a byte
    past ASCII; a body or header value with either is left to it (the SDK's JSON bodies are
    ASCII, with their line breaks escaped)."""
    method, url, body = request.method, request.url, request.body
    if not (isinstance(method, str) and method.isascii() and method.isalpha()):
        return None
    if not (isinstance(url, str) and url.isascii()) or _BAD_URL.search(url):
        return None
    if url.startswith("http"):
        try:
            urlsplit(url)  # http.client splits it for the Host header it then drops
        except ValueError:
            return None
    if body is None:
        data = b""
    elif isinstance(body, (bytes, str)) and body.isascii():
        data = body.encode("ascii") if isinstance(body, str) else body
    else:
        return None  # (the SDK's encoder fails on a byte past ASCII anywhere in a transaction)
    if b"\r" in data or b"\n" in data:
        return None
    lines = [f"{method} {url} HTTP/1.1"]
    headers = request.headers
    names = {name.lower() for name in headers if isinstance(name, str)}
    if "content-length" not in names:
        if "transfer-encoding" in names:
            return None
        if body is not None:
            lines.append(f"Content-Length: {len(data)}")
        elif method.upper() in _METHODS_EXPECTING_BODY:
            lines.append("Content-Length: 0")
    for name, value in headers.items():
        if not (isinstance(name, str) and isinstance(value, str)) or not _NAME.fullmatch(name):
            return None
        if "\r" in value or "\n" in value:
            return None
        if name not in _DROPPED:
            lines.append(f"{name}: {value}")
    lines.append("\r\n")
    head = "\r\n".join(lines)
    return head.encode("ascii") + data if head.isascii() else None


def encode_batch(parts: Sequence[bytes], batch_boundary: str, changeset_boundary: str) -> bytes:
    """The ``$batch`` body of one change set of serialised sub-requests (:func:`application_http`),
    byte for byte what azure-core's ``prepare_multipart_body`` writes for them."""
    batch, changeset = batch_boundary.encode("ascii"), changeset_boundary.encode("ascii")
    out = [b"--", batch, b"\r\nContent-Type: multipart/mixed; boundary=", changeset, b"\r\n\r\n"]
    for index, part in enumerate(parts):
        out += [b"\r\n--" if index else b"--", changeset,
                b"\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\nContent-ID: ",
                str(index).encode("ascii"), b"\r\n\r\n", part]
    out += [b"\r\n--", changeset, b"--\r\n\r\n--", batch, b"--\r\n"]
    return b"".join(out)


def split_multipart(body: bytes, boundary: bytes) -> list[tuple[dict[bytes, bytes], bytes]] | None:
    """The parts of a ``multipart/mixed`` body, each as (its headers by lower-case name, the
    first of each; its content), split where the ``email`` parser splits it; None when the
    body is not in the strict form read here: it starts with the first delimiter line, ends
    with the close delimiter (and at most a CRLF), every delimiter is ``CRLF--boundary`` at
    the start of a line with nothing after it, no part holds the delimiter anywhere else
    (RFC 2046, 5.1.1: it must not appear in what it encloses), and every part has plain
    ``Name: value`` header lines ended by an empty line."""
    delimiter = b"--" + boundary
    first, close = delimiter + b"\r\n", b"\r\n" + delimiter + b"--"
    if not body.startswith(first):
        return None
    end = body.find(close)
    if end < 0 or body[end + len(close):] not in (b"", b"\r\n"):
        return None
    parts = []
    for chunk in body[len(first):end].split(b"\r\n" + delimiter + b"\r\n"):
        if delimiter in chunk:
            return None
        head, blank, content = chunk.partition(b"\r\n\r\n")
        if not blank:
            return None
        headers: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n"):
            match = _HEADER_LINE.fullmatch(line)
            if match is None:
                return None
            headers.setdefault(match[1].lower(), match[2])
        parts.append((headers, content))
    return parts


def changeset_responses(response: Any, requests: Sequence[HttpRequest]) -> list[RestHttpClientTransportResponse] | None:
    """The sub-responses of a transaction's answer, as azure-core's ``parts()`` yields them (a
    ``RestHttpClientTransportResponse`` over ``http.client``'s parse of each, paired with the
    request at its position, else with the outer request), or None when the answer is not
    one change set of ``application/http`` parts in the strict form of :func:`split_multipart`."""
    outer = _MULTIPART.fullmatch(response.content_type or "")  # the SDK: a content type starting so
    if outer is None:
        return None
    batch = split_multipart(response.read(), outer[1].encode("ascii"))
    if batch is None or len(batch) != 1:
        return None
    inner = _MULTIPART_BYTES.fullmatch(batch[0][0].get(b"content-type", b""))
    changeset = None if inner is None else split_multipart(batch[0][1], inner[1])
    if not changeset:
        return None
    for headers, _ in changeset:
        if headers.get(b"content-type", b"").lower() != b"application/http":
            return None
        if headers.get(b"content-transfer-encoding", b"binary").lower() != b"binary":
            return None  # the parser would decode base64 or quoted-printable
    parts = []
    for index, (_, content) in enumerate(changeset):
        request = requests[index] if index < len(requests) else response.request
        raw = LeanHTTPResponse(BytesIOSocket(content), method=request.method)
        raw.begin()
        parts.append(RestHttpClientTransportResponse(request=request, internal_response=raw))
    return parts


def _run_on_request(policies: Sequence[Any], requests: Sequence[HttpRequest]) -> None:
    for request in requests:
        pipeline_request = PipelineRequest(request, PipelineContext(None))
        for policy in policies:
            policy.on_request(pipeline_request)


def _run_on_response(policies: Sequence[Any], responses: Sequence[Any]) -> None:
    for response in responses:
        context = PipelineContext(None)
        pipeline_request = PipelineRequest(response.request, context)
        pipeline_response = PipelineResponse(response.request, response, context=context)
        for policy in policies:
            policy.on_response(pipeline_request, pipeline_response)


class LeanTableClient(TableClient):
    """A ``TableClient`` whose transactions are encoded and read without the ``email``
    package (see the module); every other operation is the SDK's."""

    def _batch_send(self, table_name: str, *reqs: HttpRequest, **kwargs: Any) -> list[Mapping[str, Any]]:
        # The SDK's _batch_send (azure-data-tables 12.7.0, _base_client.py), with the body
        # written by encode_batch and the answer read by changeset_responses.
        policies = [StorageHeadersPolicy()]
        _run_on_request(policies, reqs)
        serialised = [application_http(request) for request in reqs]
        if not reqs or None in serialised:
            return super()._batch_send(table_name, *reqs, **kwargs)
        changeset_boundary, batch_boundary = f"changeset_{random_uuid()}", f"batch_{random_uuid()}"
        request = HttpRequest(
            method="POST",
            url=f"{self.scheme}://{self._primary_hostname}/$batch",
            headers={
                "x-ms-version": self.api_version,
                "DataServiceVersion": "3.0",
                "MaxDataServiceVersion": "3.0;NetFx",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        request.set_bytes_body(encode_batch(serialised, batch_boundary, changeset_boundary))
        request.headers["Content-Type"] = "multipart/mixed; boundary=" + batch_boundary
        response = self._client.send_request(request, stream=True, **kwargs)
        if response.status_code == 413:
            raise _decode_error(
                response, error_message="The transaction request was too large", error_type=RequestTooLargeError
            )
        if response.status_code != 202:
            decoded = _decode_error(response)
            _validate_tablename_error(decoded, table_name)
            raise decoded

        parts = changeset_responses(response, reqs)
        if parts is None:  # not the strict form: the SDK's own parser reads it, told what was sent
            changeset = HttpRequest("POST", "")
            changeset.set_multipart_mixed(*reqs, policies=policies, boundary=changeset_boundary)
            # (response.request, not request: the generated client sent a deep copy of it)
            response.request.set_multipart_mixed(
                changeset, policies=policies, enforce_https=False, boundary=batch_boundary
            )
            parts = list(response.parts())
        else:
            _run_on_response(policies, parts)
        error_parts = [p for p in parts if not 200 <= p.status_code < 300]
        if any(error_parts):
            if error_parts[0].status_code == 413:
                raise _decode_error(
                    response, error_message="The transaction request was too large", error_type=RequestTooLargeError
                )
            decoded = _decode_error(response=error_parts[0], error_type=TableTransactionError)
            _validate_tablename_error(decoded, table_name)
            raise decoded
        return [extract_batch_part_metadata(p) for p in parts]


class LeanTableServiceClient(TableServiceClient):
    """A ``TableServiceClient`` whose table clients (``get_table_client``, ``create_table``,
    ``create_table_if_not_exists``) are :class:`LeanTableClient`\\ s."""

    def get_table_client(self, table_name: str, **kwargs: Any) -> LeanTableClient:
        client = super().get_table_client(table_name, **kwargs)
        # The SDK builds a TableClient by name; the subclass adds no state, only the override.
        client.__class__ = LeanTableClient
        return client
