"""HTTP front of the fake remote service (standard library ``ThreadingHTTPServer``).

Endpoints:

- ``POST /fulfil``: the call the agents make (see ``docs/fake-remote.md``).
- ``POST /_control/faults``, ``GET /_control/faults``, ``GET /_control/effects``,
  ``POST /_control/reset``, ``GET /_control/health``: control API for tests and demos.

Each connection is served by a daemon thread; HTTP/1.1 keep-alive is supported.
``stop()`` wakes every delayed call, shuts every open connection and returns without
waiting for slow or hanging calls to run their course.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from devtools.fake_remote.faults import FaultConfigError
from devtools.fake_remote.ledger import Applied, Ledger, Settings, Stopping

log = logging.getLogger("devtools.fake_remote")

#: Largest request body accepted.
MAX_BODY_BYTES = 1 << 20
#: Longest idempotency key accepted.
MAX_KEY_LENGTH = 255
#: How often a delayed call checks for a stop or a departed client.
_POLL_SECONDS = 0.05
#: An idle keep-alive connection is closed after this long.
_IDLE_SECONDS = 120

_CONTROL_SETTINGS = ("seed", "slow_seconds", "retry_after_seconds", "apply_seconds")


class _Reply(Exception):
    """End the call early with this JSON error response."""

    def __init__(self, status: int, error: str, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.error, self.message, self.close = status, error, message, close


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default backlog is 5: a burst of concurrent clients gets resets.
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], ledger: Ledger, stopping: threading.Event) -> None:
        self.ledger = ledger
        self.stopping = stopping
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can take
        # seconds on some machines; the name is only cosmetic here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request, client_address) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # the client went away, or stop() closed it
            log.debug("connection error serving %s", client_address, exc_info=True)
        else:
            log.error("unexpected error serving %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeRemote/1.0"
    timeout = _IDLE_SECONDS
    # Headers and body go out in two writes; without TCP_NODELAY a keep-alive client
    # waits ~40 ms per call for the delayed ACK (Nagle).
    disable_nagle_algorithm = True
    server: _Server

    # --- routing -------------------------------------------------------------
    def do_POST(self) -> None:
        self._route({"/fulfil": self._fulfil, "/_control/faults": self._set_faults, "/_control/reset": self._reset})

    def do_GET(self) -> None:
        self._route({"/_control/effects": self._effects, "/_control/health": self._health, "/_control/faults": self._faults})

    def _route(self, routes: Mapping[str, Any]) -> None:
        path = urlsplit(self.path).path
        try:
            handler = routes.get(path)
            if handler is None:
                self._read_body()  # keep the connection usable
                known = ("/fulfil", "/_control/faults", "/_control/reset", "/_control/effects", "/_control/health")
                if path in known:
                    raise _Reply(HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", f"{self.command} {path} is not supported")
                raise _Reply(HTTPStatus.NOT_FOUND, "not_found", f"no such endpoint: {path}")
            handler()
        except _Reply as reply:
            if reply.close:
                self.close_connection = True
            self._send_json(reply.status, {"error": reply.error, "message": reply.message})

    # --- I/O helpers ---------------------------------------------------------
    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise _Reply(HTTPStatus.LENGTH_REQUIRED, "length_required", "chunked bodies are not supported", close=True)
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            raise _Reply(HTTPStatus.BAD_REQUEST, "bad_content_length", f"bad Content-Length: {raw!r}", close=True) from None
        if length > MAX_BODY_BYTES:
            raise _Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "too_large", f"body over {MAX_BODY_BYTES} bytes", close=True)
        return self.rfile.read(length)

    def _read_json(self, empty: Any = None) -> Any:
        body = self._read_body()
        if not body.strip():
            if empty is not None:
                return empty
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", "a JSON body is required")
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_json", f"the body is not valid JSON: {error}") from None

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> bool:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            return True
        except OSError:
            self.close_connection = True
            return False

    def _send_json(self, status: int, document: Any, headers: Mapping[str, str] | None = None) -> bool:
        return self._send(status, json.dumps(document).encode(), headers)

    def _client_gone(self) -> bool:
        """True when the client has closed its end (a timed-out client does)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _wait(self, seconds: float) -> str:
        """Wait; returns "done", "stopped" or "client_gone" (checked every 50 ms)."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.server.stopping.wait(min(_POLL_SECONDS, remaining)):
                return "stopped"
            if self._client_gone():
                return "client_gone"
        return "stopped" if self.server.stopping.is_set() else "done"

    # --- the service call ----------------------------------------------------
    def _fulfil(self) -> None:
        ledger = self.server.ledger
        started = time.monotonic()
        fields = {"order": "-", "step": "-", "attempt": "-", "key": "-"}
        outcome = "?"
        with ledger.call():
            try:
                outcome = self._fulfil_call(ledger, fields)
            except _Reply as reply:
                ledger.note_invalid()
                outcome = f"invalid ({reply.error}) status={reply.status}"
                raise
            finally:
                log.info(
                    "order=%s step=%s attempt=%s key=%s -> %s (%.3fs)",
                    fields["order"], fields["step"], fields["attempt"], fields["key"],
                    outcome, time.monotonic() - started,
                )  # fmt: skip

    def _fulfil_call(self, ledger: Ledger, fields: dict[str, Any]) -> str:
        body = self._read_body()
        try:
            document = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            document, invalid_json = None, error
        else:
            invalid_json = None
        if isinstance(document, dict):
            for name, field in (("order", "order_id"), ("step", "step"), ("attempt", "attempt")):
                if field in document:
                    fields[name] = document[field]
        key = self.headers.get("Idempotency-Key", "").strip()
        if not key:
            raise _Reply(HTTPStatus.BAD_REQUEST, "missing_idempotency_key", "the Idempotency-Key header is required")
        fields["key"] = key
        if len(key) > MAX_KEY_LENGTH:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_idempotency_key", f"Idempotency-Key over {MAX_KEY_LENGTH} characters")
        if invalid_json is not None:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_json", f"the body is not valid JSON: {invalid_json}")
        order_id, step = _validate_request(document)

        settings = ledger.settings
        fault = ledger.decide(order_id, step, key)
        if fault == "transient":
            self._error(503, "transient", "injected transient failure; not applied")
            return "transient, not applied, status=503"
        if fault == "throttle":
            seconds = str(settings.retry_after_seconds)
            self._error(429, "throttled", f"injected throttling; retry after {seconds}s; not applied", {"Retry-After": seconds})
            return f"throttle, not applied, status=429 Retry-After={seconds}"
        if fault == "permanent":
            self._error(422, "permanent", "injected permanent failure: the request cannot be fulfilled; not applied")
            return "permanent, not applied, status=422"
        if fault == "bad_request":
            self._error(400, "bad_request", "injected bad request; not applied")
            return "bad_request, not applied, status=400"
        if fault == "drop":
            self.close_connection = True
            return "drop, not applied, connection closed without a response"
        if fault == "hang":
            waited = self._wait(settings.slow_seconds)
            if waited != "done":
                self.close_connection = True
                return f"hang, not applied, {waited.replace('_', ' ')} after {settings.slow_seconds:g}s delay"

        try:
            result = ledger.apply(order_id, step, key)
        except Stopping:
            self.close_connection = True
            return f"{fault or 'ok'}, not applied, stopped"
        if not isinstance(result, Applied):
            self._error(
                422,
                "idempotency_key_reused",
                f"Idempotency-Key was first used for order {result.order_id!r} step {result.step!r}",
            )
            return "key reused for another order/step, status=422"
        what = "replayed" if result.replayed else "applied"

        if fault == "slow":
            waited = self._wait(settings.slow_seconds)
            if waited != "done":
                self.close_connection = True
                return f"slow, {what}, no response ({waited.replace('_', ' ')})"
        sent = self._send(200, result.body, {"Idempotent-Replayed": "true" if result.replayed else "false"})
        label = f"{fault}, " if fault else ""
        return f"{label}{what}, status=200" + ("" if sent else " (client gone)")

    def _error(self, status: int, error: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        self._send_json(status, {"error": error, "message": message}, headers)

    # --- control API ---------------------------------------------------------
    def _set_faults(self) -> None:
        document = self._read_json(empty={})
        if not isinstance(document, dict):
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", "the body must be a JSON object")
        unknown = set(document) - {"script", "rates", *_CONTROL_SETTINGS}
        if unknown:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", f"unknown fields: {', '.join(sorted(unknown))}")
        try:
            config = self.server.ledger.set_faults(**document)
        except FaultConfigError as error:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_faults", str(error)) from None
        log.info("faults set: script=%s rates=%s", config["script"], config["rates"])
        self._send_json(200, config)

    def _faults(self) -> None:
        self._read_body()
        self._send_json(200, self.server.ledger.config())

    def _reset(self) -> None:
        self._read_body()
        self.server.ledger.reset()
        log.info("reset")
        self._send_json(200, {"status": "reset"})

    def _effects(self) -> None:
        self._read_body()
        self._send_json(200, self.server.ledger.effects())

    def _health(self) -> None:
        self._read_body()
        self._send_json(200, {"status": "ok"})


def _validate_request(document: Any) -> tuple[str, str]:
    problems = []
    if not isinstance(document, dict):
        raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", "the body must be a JSON object")
    for name in ("order_id", "step"):
        if not isinstance(document.get(name), str) or not document[name]:
            problems.append(f"{name} must be a non-empty string")
    attempt = document.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        problems.append("attempt must be an integer >= 0")
    if not isinstance(document.get("payload"), dict):
        problems.append("payload must be an object")
    if problems:
        raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", "; ".join(problems))
    return document["order_id"], document["step"]


class FakeRemote:
    """A running fake remote service. Use :func:`start` to make one."""

    def __init__(self, host: str, port: int, ledger: Ledger, stopping: threading.Event) -> None:
        self._stopping = stopping
        self._ledger = ledger
        self._server = _Server((host, port), ledger, self._stopping)
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-remote-{self.port}", daemon=True
        )
        self._thread.start()
        self._stopped = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def set_faults(
        self,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> dict[str, Any]:
        """Replace the fault script and rates (omitted = none). Keyword settings
        (``seed``, ``slow_seconds``, ``retry_after_seconds``, ``apply_seconds``) change
        only when given. Raises FaultConfigError. Returns the resulting configuration."""
        unknown = set(settings) - set(_CONTROL_SETTINGS)
        if unknown:
            raise TypeError(f"set_faults() got unknown settings: {', '.join(sorted(unknown))}")
        return self._ledger.set_faults(script, rates, **settings)

    def config(self) -> dict[str, Any]:
        return self._ledger.config()

    def effects(self) -> dict[str, Any]:
        return self._ledger.effects()

    def reset(self) -> None:
        self._ledger.reset()

    def stop(self) -> None:
        """Stop promptly: in-flight slow or hanging calls end without a response."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeRemote:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<FakeRemote {self.url}{' stopped' if self._stopped else ''}>"


def start(
    port: int = 0,
    rates: Mapping[str, Any] | None = None,
    script: Mapping[str, Any] | None = None,
    seed: int = 0,
    slow_seconds: float = 30,
    retry_after_seconds: int = 1,
    *,
    host: str = "127.0.0.1",
    apply_seconds: float = 0.0,
) -> FakeRemote:
    """Start a fake remote service in a background thread (``port=0``: a free port).

    Raises FaultConfigError for invalid fault settings, OSError if the port is taken.
    """
    settings = Settings(
        seed=seed, slow_seconds=slow_seconds, retry_after_seconds=retry_after_seconds, apply_seconds=apply_seconds
    )
    stopping = threading.Event()  # wakes every delayed call on stop()
    return FakeRemote(host, port, Ledger(settings, script=script, rates=rates, stopping=stopping), stopping)
