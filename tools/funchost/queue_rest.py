"""The storage-queue trigger's hot calls (receive, delete) and the queue output's send as plain REST requests.

Every poll of every storage-queue listener is one Get Messages request, empty most of the
time; through the SDK (``QueueClient.receive_messages`` and its pager, azure-core's
pipeline, the generated deserializer, ``requests``) one empty poll cost this host 1.16 ms
of CPU against Azurite, the same request built and signed here and sent on a urllib3
connection pool 0.30 ms (500 polls each, issue 21; BENCHMARKS.md, "Where the CPU goes, and
what was cut"). The requests are the ones the SDK sends, with the same API version and
Shared Key signature, so the queue service sees the same calls: what the trigger receives,
deletes and leaves visible does not change.

Only a connection with an account key takes this path (Azurite, a connection string);
anything else (SAS, ``DefaultAzureCredential``) keeps the SDK client (:func:`lean_queue`
returns None). Errors are the SDK's types, so the listener handles both alike: 404 raises
``ResourceNotFoundError``, another refusal ``HttpResponseError``, a refused or dropped
connection ``ServiceRequestError`` / ``ServiceResponseError``. A delete and a send are retried
as the Functions host's SDK client retries them (a dropped connection, 408, 429, 5xx: three
more tries, 0.8 s doubling: Azure.Core's ``RetryOptions`` defaults, azure-sdk-for-net
``sdk/core/Azure.Core/src/RetryOptions.cs``, read 2026-11-25); a poll is not (its listener
polls again after its back-off, as the Functions host's listener does after a failed poll).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import xml.etree.ElementTree as ET
from email.utils import formatdate, parsedate_to_datetime
from urllib.parse import quote, unquote, urlsplit
from xml.sax.saxutils import escape

import urllib3
from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.queue import QueueClient, QueueMessage

#: The SDK's transport timeouts (azure-core: 20 s to connect, 60 s to read).
TIMEOUT = urllib3.Timeout(connect=20, read=60)
#: Retries of a delete or a send, and the first wait before one (doubling): Azure.Core's RetryOptions defaults.
RETRIES = 3
RETRY_DELAY = 0.8
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
        self._pool = urllib3.connection_from_url(
            f"{parts.scheme}://{parts.netloc}", maxsize=pool_size, block=False, retries=False, timeout=TIMEOUT
        )

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
            time.sleep(delay)
            delay *= 2

    def close(self) -> None:
        self._pool.close()

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
        try:
            response = self._pool.urlopen(
                method, url, body=body, headers=headers, redirect=False, preload_content=True
            )
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as error:
            raise ServiceRequestError(str(error), error=error) from error
        except urllib3.exceptions.HTTPError as error:
            raise ServiceResponseError(str(error), error=error) from error
        if response.status != ok:
            raise _refusal(response)
        return response.data

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


def _refusal(response: urllib3.BaseHTTPResponse) -> HttpResponseError:
    code = response.headers.get("x-ms-error-code", "")
    message = f"{response.status} {response.reason}: {code}".rstrip(": ")
    error_type = ResourceNotFoundError if response.status == 404 else HttpResponseError
    error = error_type(message=message)
    error.status_code = response.status
    error.error_code = code or None
    return error


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
