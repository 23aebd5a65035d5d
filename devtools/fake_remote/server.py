"""HTTP front of the fake remote services (standard library ``ThreadingHTTPServer``).

One server serves several services; service ``NAME``'s base URL is ``{url}/{NAME}``.
Endpoints:

- ``POST /{service}/{action}``: an action or a compensation, as the agents call it
  (the contract is in ``docs/fake-remote.md``).
- ``POST /_control/faults``, ``GET /_control/faults``, ``GET /_control/effects``,
  ``POST /_control/reset``, ``GET /_control/health``: control API for tests and demos.

Each connection is served by a daemon thread; HTTP/1.1 keep-alive is supported.
``stop()`` wakes every delayed call, shuts every open connection and returns without
waiting for slow or hanging calls to run their course.
"""

from __future__ import annotations

import json
import logging
import re
import select
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from devtools.fake_remote.catalog import COMPENSATION, DEFAULT_LOOKUPS, validate_services
from devtools.fake_remote.faults import FaultConfigError
from devtools.fake_remote.ledger import (
    LATE_TOLERANCE_SECONDS,
    SETTING_NAMES,
    Applied,
    Call,
    Ledger,
    Settings,
    Stopping,
)
from devtools.fake_remote.watch import Watch, WatchedCall

log = logging.getLogger("devtools.fake_remote")

#: Largest request body accepted.
MAX_BODY_BYTES = 1 << 20
#: Longest idempotency key accepted.
MAX_KEY_LENGTH = 255
#: How often a delayed call checks for a stop or a departed client.
_POLL_SECONDS = 0.05
#: An idle keep-alive connection is closed after this long.
_IDLE_SECONDS = 120

#: RFC 3339 date-time (``T`` or a space between date and time; ``Z`` or an offset required).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_CONTROL = {
    "POST": ("/_control/faults", "/_control/reset"),
    "GET": ("/_control/effects", "/_control/health", "/_control/faults"),
}


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

    def __init__(
        self, address: tuple[str, int], ledger: Ledger, stopping: threading.Event, lookups: frozenset[str] = DEFAULT_LOOKUPS
    ) -> None:
        self.ledger = ledger
        self.stopping = stopping
        self.lookups = lookups
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
        self._route({"/_control/faults": self._set_faults, "/_control/reset": self._reset}, calls=True)

    def do_GET(self) -> None:
        parts = urlsplit(self.path).path.split("/")
        if len(parts) == 4 and not parts[0] and parts[1] in self.server.ledger.services:
            self._lookup(*parts[1:])
            return
        self._route({"/_control/effects": self._effects, "/_control/health": self._health, "/_control/faults": self._faults})

    def _lookup(self, service: str, action: str, key: str) -> None:
        """``GET /{service}/{action}/{key}``: settle an unknown outcome by idempotency key."""
        if service not in self.server.lookups:
            self._send_json(
                HTTPStatus.METHOD_NOT_ALLOWED,
                {"error": "no_lookup", "message": f"service {service!r} offers no lookup by idempotency key"},
            )
            return
        body = self.server.ledger.lookup(service, action, key)
        if body is None:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "not_applied", "message": f"{action} {key!r} was not applied"})
        else:
            self._send(HTTPStatus.OK, body, {"Content-Type": "application/json"})

    def _route(self, routes: Mapping[str, Any], calls: bool = False) -> None:
        path = urlsplit(self.path).path
        try:
            handler = routes.get(path)
            if handler is not None:
                handler()
                return
            route = self._service_route(path)
            if route is not None and calls:
                self._service_call(*route)
                return
            self._read_body()  # keep the connection usable
            if route is not None or any(path in paths for paths in _CONTROL.values()):
                raise _Reply(HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", f"{self.command} {path} is not supported")
            self._not_found(path)
        except _Reply as reply:
            if reply.close:
                self.close_connection = True
            self._send_json(reply.status, {"error": reply.error, "message": reply.message})

    def _service_route(self, path: str) -> tuple[str, str] | None:
        """(service, action) when the path is one of a service's routes."""
        parts = path.split("/")
        if len(parts) != 3 or parts[0]:
            return None
        service = self.server.ledger.services.get(parts[1])
        if service is None or service.kind_of(parts[2]) is None:
            return None
        return parts[1], parts[2]

    def _not_found(self, path: str) -> None:
        services = self.server.ledger.services
        parts = path.split("/")
        if len(parts) >= 2 and parts[1] in services:
            self.server.ledger.note_not_found()
            known = ", ".join(sorted(services[parts[1]].routes))
            what = f"{parts[1]!r} has no action {'/'.join(parts[2:])!r}" if len(parts) > 2 else f"{parts[1]!r} needs an action"
            raise _Reply(HTTPStatus.NOT_FOUND, "unknown_action", f"service {what}; its actions: {known}")
        if len(parts) == 3 and not parts[0] and not parts[1].startswith("_"):
            self.server.ledger.note_not_found()
            raise _Reply(
                HTTPStatus.NOT_FOUND, "unknown_service", f"no service {parts[1]!r}; known: {', '.join(services)}"
            )
        raise _Reply(HTTPStatus.NOT_FOUND, "not_found", f"no such endpoint: {path}")

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
        """Wait; returns "done" (the delay ran out, or a test released a watched call:
        at once), "stopped" or "client_gone" (checked every 50 ms)."""
        released = self._watched.released if self._watched is not None else None
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if released is not None and released.wait(min(_POLL_SECONDS, remaining)):
                return "done"
            if self.server.stopping.wait(0 if released is not None else min(_POLL_SECONDS, remaining)):
                return "stopped"
            if self._client_gone():
                return "client_gone"
        return "stopped" if self.server.stopping.is_set() else "done"

    # --- the service call ----------------------------------------------------
    def _service_call(self, service: str, action: str) -> None:
        ledger = self.server.ledger
        arrived = time.time()
        started = time.monotonic()
        fields = {"order": "-", "step": "-", "attempt": "-", "key": "-", "late": ""}
        outcome = "?"
        self._watched: WatchedCall | None = None  # set for a valid call a test watches
        with ledger.call(service):
            try:
                outcome = self._service_call_run(ledger, service, action, arrived, fields)
            except _Reply as reply:
                ledger.note_invalid(service)
                outcome = f"invalid ({reply.error}) status={reply.status}"
                raise
            finally:
                if self._watched is not None:
                    self._watched.outcome = outcome
                    self._watched.answered.set()
                log.log(
                    logging.WARNING if fields["late"] else logging.INFO,
                    "%s/%s order=%s step=%s attempt=%s key=%s%s -> %s (%.3fs)",
                    service, action, fields["order"], fields["step"], fields["attempt"], fields["key"],
                    fields["late"], outcome, time.monotonic() - started,
                )  # fmt: skip

    def _service_call_run(self, ledger: Ledger, service: str, action: str, arrived: float, fields: dict[str, Any]) -> str:
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

        # Lateness is counted for any call that names a readable Complete-By, valid or not.
        raw_complete_by = self.headers.get("Complete-By", "").strip()
        complete_by = parse_complete_by(raw_complete_by)
        if complete_by is not None:
            late_by = arrived - complete_by.timestamp()
            if late_by > LATE_TOLERANCE_SECONDS:
                ledger.note_late(service)
                fields["late"] = f" LATE by {late_by:.3f}s"

        key = self.headers.get("Idempotency-Key", "").strip()
        if not key:
            raise _Reply(HTTPStatus.BAD_REQUEST, "missing_idempotency_key", "the Idempotency-Key header is required")
        fields["key"] = key
        if len(key) > MAX_KEY_LENGTH:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_idempotency_key", f"Idempotency-Key over {MAX_KEY_LENGTH} characters")
        if not raw_complete_by:
            raise _Reply(HTTPStatus.BAD_REQUEST, "missing_complete_by", "the Complete-By header is required (RFC 3339 UTC)")
        if complete_by is None:
            raise _Reply(
                HTTPStatus.BAD_REQUEST,
                "invalid_complete_by",
                f"Complete-By {raw_complete_by[:64]!r} is not an RFC 3339 date-time with a zone, "
                "e.g. 2026-11-23T10:15:30.123Z",
            )
        if invalid_json is not None:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_json", f"the body is not valid JSON: {invalid_json}")
        kind = ledger.services[service].kind_of(action)
        order_id, step = _validate_request(document, kind, f"/{service}/{action}")
        call = Call(service=service, action=action, kind=kind, order_id=order_id, step=step, key=key)
        ledger.note_traceparent(call, self.headers.get("traceparent"))

        settings = ledger.settings(service)
        fault = ledger.decide(call)
        self._watched = ledger.watched(
            call, fault, document["attempt"], datetime.fromtimestamp(arrived, UTC), complete_by
        )
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
            result = ledger.apply(call)
        except Stopping:
            self.close_connection = True
            return f"{fault or 'ok'}, not applied, stopped"
        if not isinstance(result, Applied):
            self._error(422, result.error, result.message)
            return f"refused ({result.error}), status=422"
        if self._watched is not None:
            self._watched.applied.set()
        what = "replayed" if result.replayed else "applied"
        if not result.replayed and kind == COMPENSATION:
            what = json.loads(result.body).get("outcome", what)

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
        unknown = set(document) - {"service", "script", "rates", *SETTING_NAMES}
        if unknown:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", f"unknown fields: {', '.join(sorted(unknown))}")
        service = document.pop("service", None)
        if service is not None and not isinstance(service, str):
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", f"service must be a string or null, got {service!r}")
        try:
            config = self.server.ledger.set_faults(service, **document)
        except FaultConfigError as error:
            raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_faults", str(error)) from None
        log.info("faults set for %s: script=%s rates=%s", service or "every service",
                 document.get("script"), document.get("rates"))  # fmt: skip
        self._send_json(200, config)

    def _faults(self) -> None:
        self._read_body()
        service = self._query_service()
        try:
            config = self.server.ledger.config(service)
        except FaultConfigError as error:
            raise _Reply(HTTPStatus.NOT_FOUND, "unknown_service", str(error)) from None
        self._send_json(200, config)

    def _query_service(self) -> str | None:
        values = parse_qs(urlsplit(self.path).query).get("service")
        return values[-1] if values else None

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
        services = {name: service.as_mapping() for name, service in self.server.ledger.services.items()}
        self._send_json(200, {"status": "ok", "services": services})


def parse_complete_by(text: str) -> datetime | None:
    """An RFC 3339 date-time with a zone (``2026-11-23T10:15:30.123Z``), or None."""
    if not _RFC3339.match(text):
        return None
    try:
        return datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return None


def _validate_request(document: Any, kind: str, route: str) -> tuple[str, str]:
    if not isinstance(document, dict):
        raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", "the body must be a JSON object")
    problems = []
    for name in ("order_id", "step"):
        if not isinstance(document.get(name), str) or not document[name]:
            problems.append(f"{name} must be a non-empty string")
    attempt = document.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        problems.append("attempt must be an integer >= 0")
    if not isinstance(document.get("order"), dict):
        problems.append("order must be an object (the order document)")
    if document.get("kind") not in ("action", "compensation"):
        problems.append('kind must be "action" or "compensation"')
    elif document["kind"] != kind:
        problems.append(f"{route} is {'a compensation' if kind == COMPENSATION else 'a forward action'}, kind was {document['kind']!r}")
    if kind == COMPENSATION and ("result" not in document or not isinstance(document["result"], dict | None)):
        problems.append("a compensation needs result: the forward action's result object, or null if unknown")
    if problems:
        raise _Reply(HTTPStatus.BAD_REQUEST, "invalid_request", "; ".join(problems))
    return document["order_id"], document["step"]


class FakeRemote:
    """Running fake remote services (one HTTP server). Use :func:`start` to make one."""

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
        """The server's root; service ``NAME`` is at ``{url}/{NAME}``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def services(self) -> dict[str, dict[str, str | None]]:
        """``{service: {action: compensation or None}}``, as served."""
        return {name: service.as_mapping() for name, service in self._ledger.services.items()}

    def base_url(self, service: str) -> str:
        """The base URL of one service (its ``REMOTE_<NAME>_URL``). KeyError if not served."""
        if service not in self._ledger.services:
            raise KeyError(f"this fake serves no service {service!r}; it serves {', '.join(self._ledger.services)}")
        return f"{self.url}/{service}"

    def app_settings(self) -> dict[str, str]:
        """``{"REMOTE_<NAME>_URL": base URL}`` for every service."""
        return {f"REMOTE_{name.upper().replace('-', '_')}_URL": self.base_url(name) for name in self._ledger.services}

    def set_faults(
        self,
        script: Mapping[str, Any] | None = None,
        rates: Mapping[str, Any] | None = None,
        *,
        service: str | None = None,
        **settings: Any,
    ) -> dict[str, Any]:
        """Replace the fault script and rates (omitted = none) of one service, or of every
        service when ``service`` is None. Keyword settings (``seed``, ``slow_seconds``,
        ``retry_after_seconds``, ``apply_seconds``) change only when given. Raises
        FaultConfigError (and changes nothing). Returns the resulting configuration:
        the service's, or ``{"services": {name: configuration}}``."""
        unknown = set(settings) - set(SETTING_NAMES)
        if unknown:
            raise TypeError(f"set_faults() got unknown settings: {', '.join(sorted(unknown))}")
        return self._ledger.set_faults(service, script, rates, **settings)

    def config(self, service: str | None = None) -> dict[str, Any]:
        """One service's faults and settings, or ``{"services": {name: ...}}``."""
        return self._ledger.config(service)

    def effects(self) -> dict[str, Any]:
        """What was applied and undone, per service and in aggregate (docs/fake-remote.md)."""
        return self._ledger.effects()

    def net(self, order_id: str) -> dict[str, dict[str, int]]:
        """What stays applied for one order: ``{service: {action: applied - undone}}``."""
        return self._ledger.net(order_id)

    def traceparents(self, order_id: str) -> list[dict[str, str | None]]:
        """The ``traceparent`` header of every call for one order (``service``, ``action``,
        ``key``, ``traceparent``; None when a call had none), per service in arrival order."""
        return self._ledger.effects()["traceparents"].get(order_id, [])

    def watch(self, script_key: str) -> Watch:
        """Every call of ``"<order id>/<action>"`` from now on, with events to wait on and a
        held answer to release (devtools/fake_remote/watch.py). FaultConfigError for an
        action no service has."""
        return self._ledger.watch(script_key)

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
        return f"<FakeRemote {self.url} {','.join(self._ledger.services)}{' stopped' if self._stopped else ''}>"


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
    services: Mapping[str, Mapping[str, str | None]] | None = None,
    service_faults: Mapping[str, Mapping[str, Any]] | None = None,
) -> FakeRemote:
    """Start the fake remote services in a background thread (``port=0``: a free port).

    ``services`` is ``{service: {action: compensation or None}}`` (default: the order
    workflow's inventory, payments and shipping). ``rates``, ``script`` and the settings
    apply to every service; ``service_faults`` then changes some services, e.g.
    ``{"payments": {"rates": {"transient": 0.2}}}`` (as ``set_faults(service=...)``:
    script and rates omitted there are none, settings omitted are kept).

    Raises FaultConfigError for invalid settings, OSError if the port is taken.
    """
    catalog = validate_services(services)
    settings = Settings(
        seed=seed, slow_seconds=slow_seconds, retry_after_seconds=retry_after_seconds, apply_seconds=apply_seconds
    )
    stopping = threading.Event()  # wakes every delayed call on stop()
    ledger = Ledger(catalog, settings, script=script, rates=rates, service_faults=service_faults, stopping=stopping)
    return FakeRemote(host, port, ledger, stopping)
