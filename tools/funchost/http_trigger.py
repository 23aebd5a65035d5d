"""HTTP triggers (``@app.route``): one HTTP server on loopback for every HTTP function.

What the Functions host does for a v2-model Python app, and what this module does:

- **Routes.** Each function's ``route`` (a route template such as ``orders/{id}``,
  ``files/{*path}``, ``items/{id:int?}``) is served under the route prefix of host.json
  ``extensions.http.routePrefix`` (default ``api``; an empty string removes it). Literal
  segments match case-insensitively; a parameter matches one path segment, percent-decoded;
  ``{name?}`` is optional, ``{name=value}`` has a default, ``{*name}`` takes the rest of
  the path; the usual inline constraints (``int``, ``long``, ``bool``, ``alpha``,
  ``guid``, ``decimal``, ``double``, ``float``, ``datetime``, ``min``, ``max``,
  ``range``, ``minlength``, ``maxlength``, ``length``, ``regex``, ``required``) are
  checked. A trailing slash is ignored.
- **Order.** When several templates match a path the Functions host takes the first in
  its route table, which is in the alphabetical order of the function names, not the
  ASP.NET Core precedence (Azure/azure-functions-host#9876, #6062): so does this host.
- **Methods.** ``methods`` restricts a route; none means every method. A path whose
  route exists but not for this method gets **404**, as in Azure (the host answers 404,
  not 405: Azure/azure-functions-host#10098, #11625), as does a path no route matches.
  Both replies have an empty body.
- **The request** is the worker's ``azure.functions.HttpRequest``: the method, the URL
  as the host builds it (``http://{Host header}{path}{?query}``), the headers with
  lower-cased names (repeated ones joined with ``,``), the query parameters (a repeated
  one joined with ``,``, empty values left out), the route parameters (unmatched
  optional ones left out) and the body as bytes.
- **The response**: what the function returns (or sets on its ``func.Out``) for its
  ``http`` output, converted by the worker's own converter: an ``HttpResponse`` with its
  status, headers, content type (``mimetype``, ``charset``) and body; a ``str`` as a
  200 ``text/plain``; nothing as an empty 200. A function that raises, or returns what
  the converter refuses, gets a **500** with an empty body (the traceback goes to the
  log, never to the caller).
- **Where it runs**: each request is handled in a thread of the server (the host's
  side); the function runs in the worker as every other trigger's: sync functions on
  the shared thread pool, ``async def`` ones on the event loop.
- **Auth levels** are not enforced (as under Core Tools); no host keys, no admin API.

It listens on 127.0.0.1 only, on the port given to the host (``--port``, else
local.settings.json ``Host.LocalHttpPort``, else 7071, as Core Tools; 0 picks a free
port) and logs ``funchost http: listening on http://127.0.0.1:PORT`` once bound.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import http.server
import json
import logging
import re
import socketserver
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .app import FunctionLoadError, FunctionSpec
from .invoke import Invoker, TriggerValue
from .listener import Listener
from .rpc import protos
from .servicebus_message import merge_body_fields

log = logging.getLogger("funchost")

#: Logged once the server is bound; scripts and tests read the URL from it.
LISTENING_MARKER = "funchost http: listening on"
#: Core Tools' default port (``func start``).
DEFAULT_PORT = 7071
DEFAULT_ROUTE_PREFIX = "api"
LOOPBACK = "127.0.0.1"
#: The Functions host refuses request bodies over 100 MB (HTTP 413).
MAX_BODY_BYTES = 100 * 1024 * 1024
ALL_METHODS = ("GET", "POST", "DELETE", "HEAD", "PATCH", "PUT", "OPTIONS", "TRACE", "CONNECT")


class RouteError(ValueError):
    """A route template this host cannot use."""


# --- route templates ------------------------------------------------------------------


def _int_in(low: int, high: int):
    def check(value: str) -> bool:
        if not re.fullmatch(r"[+-]?\d+", value):
            return False
        return low <= int(value) <= high

    return check


def _float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return value.strip().lower() not in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity")


def _decimal(value: str) -> bool:
    try:
        return decimal.Decimal(value).is_finite()
    except decimal.InvalidOperation:
        return False


def _datetime(value: str) -> bool:
    try:
        _dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _guid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


_SIMPLE_CONSTRAINTS = {
    "int": _int_in(-(2**31), 2**31 - 1),
    "long": _int_in(-(2**63), 2**63 - 1),
    "bool": lambda value: value.lower() in ("true", "false"),
    "alpha": lambda value: re.fullmatch(r"[A-Za-z]+", value) is not None,
    "guid": _guid,
    "decimal": _decimal,
    "double": _float,
    "float": _float,
    "datetime": _datetime,
    "required": lambda value: value != "",
}


def _constraint(text: str):
    """The check for one inline constraint, e.g. ``int``, ``min(1)``, ``regex(^a+$)``."""
    match = re.fullmatch(r"([A-Za-z]+)(?:\((.*)\))?", text, re.DOTALL)
    if not match:
        raise RouteError(f"bad constraint {text!r}")
    name, args = match[1].lower(), match[2]
    if args is None:
        if name in _SIMPLE_CONSTRAINTS:
            return _SIMPLE_CONSTRAINTS[name]
        raise RouteError(f"unsupported route constraint {text!r}")
    if name == "regex":
        pattern = re.compile(args, re.IGNORECASE)  # ASP.NET: IsMatch, case-insensitive
        return lambda value: pattern.search(value) is not None
    try:
        numbers = [int(part) for part in args.split(",")]
    except ValueError as error:
        raise RouteError(f"bad constraint arguments in {text!r}") from error
    if name == "min" and len(numbers) == 1:
        return lambda value: _int_in(-(2**63), 2**63 - 1)(value) and int(value) >= numbers[0]
    if name == "max" and len(numbers) == 1:
        return lambda value: _int_in(-(2**63), 2**63 - 1)(value) and int(value) <= numbers[0]
    if name == "range" and len(numbers) == 2:
        return lambda value: _int_in(numbers[0], numbers[1])(value)
    if name == "minlength" and len(numbers) == 1:
        return lambda value: len(value) >= numbers[0]
    if name == "maxlength" and len(numbers) == 1:
        return lambda value: len(value) <= numbers[0]
    if name == "length" and len(numbers) == 1:
        return lambda value: len(value) == numbers[0]
    if name == "length" and len(numbers) == 2:
        return lambda value: numbers[0] <= len(value) <= numbers[1]
    raise RouteError(f"unsupported route constraint {text!r}")


@dataclass(frozen=True)
class Segment:
    """One segment of a route template: a literal, or a parameter."""

    literal: str | None = None
    name: str | None = None
    optional: bool = False
    catch_all: bool = False
    default: str | None = None
    checks: tuple = ()

    def accepts(self, value: str) -> bool:
        return all(check(value) for check in self.checks)


def _split_constraints(text: str) -> list[str]:
    """``int:min(1):regex(a:b)`` -> ``["int", "min(1)", "regex(a:b)"]`` (colons inside parentheses kept)."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == ":" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _parameter(text: str) -> Segment:
    catch_all = text.startswith("*")
    body = text.lstrip("*")
    optional = body.endswith("?")
    if optional:
        body = body[:-1]
    default = None
    # The default follows the name and the constraints: {name:int=5}; '=' inside a
    # constraint's parentheses is part of it.
    depth = 0
    for index, char in enumerate(body):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "=" and depth == 0:
            body, default = body[:index], body[index + 1 :]
            break
    name, *constraints = _split_constraints(body)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        raise RouteError(f"bad parameter name in {{{text}}}")
    if optional and default is not None:
        raise RouteError(f"{{{text}}}: an optional parameter cannot have a default value")
    return Segment(
        name=name,
        optional=optional or catch_all,
        catch_all=catch_all,
        default=default,
        checks=tuple(_constraint(c) for c in constraints if c),
    )


@dataclass(frozen=True)
class RouteTemplate:
    text: str
    segments: tuple[Segment, ...]

    @classmethod
    def parse(cls, route: str, prefix: str = DEFAULT_ROUTE_PREFIX) -> RouteTemplate:
        """The route ``route`` under ``prefix`` (both without leading or trailing slashes)."""
        route = route.strip()
        if route.startswith("~/"):
            route = route[2:]
        route = route.strip("/")
        prefix = prefix.strip().strip("/")
        full = "/".join(part for part in (prefix, route) if part)
        segments: list[Segment] = []
        names: set[str] = set()
        parts = full.split("/") if full else []
        for index, part in enumerate(parts):
            if part == "":
                raise RouteError(f"route {full!r}: the separator '/' cannot appear twice in a row")
            if "{" not in part and "}" not in part:
                if "?" in part:
                    raise RouteError(f"route {full!r}: '?' is not allowed in a literal segment")
                segments.append(Segment(literal=part))
                continue
            if not (part.startswith("{") and part.endswith("}")) or part.count("{") != 1 or part.count("}") != 1:
                raise RouteError(
                    f"route {full!r}: segment {part!r} mixes text and parameters (complex segments are not "
                    "supported by this host)"
                )
            segment = _parameter(part[1:-1])
            if segment.name.lower() in names:
                raise RouteError(f"route {full!r}: parameter {segment.name!r} appears twice")
            names.add(segment.name.lower())
            if segment.catch_all and index != len(parts) - 1:
                raise RouteError(f"route {full!r}: a catch-all parameter must be the last segment")
            segments.append(segment)
        # Only trailing parameters may be left out of a path.
        seen_optional = False
        for segment in segments:
            if segment.optional or segment.default is not None:
                seen_optional = True
            elif seen_optional:
                raise RouteError(f"route {full!r}: an optional parameter must be at the end of the route")
        return cls(full, tuple(segments))

    def match(self, path_segments: list[str]) -> dict[str, str] | None:
        """The route parameters if ``path_segments`` (raw, not yet decoded) match, else None."""
        values: dict[str, str] = {}
        for index, segment in enumerate(self.segments):
            if segment.catch_all:
                rest = "/".join(unquote(part) for part in path_segments[index:])
                if rest:
                    if not segment.accepts(rest):
                        return None
                    values[segment.name] = rest
                elif segment.default is not None:
                    values[segment.name] = segment.default
                return values
            if index >= len(path_segments):
                if segment.literal is not None:
                    return None
                if segment.default is not None:
                    values[segment.name] = segment.default
                elif not segment.optional:
                    return None
                continue
            raw = path_segments[index]
            if segment.literal is not None:
                if unquote(raw).casefold() != segment.literal.casefold():
                    return None
                continue
            value = unquote(raw)
            if value == "" or not segment.accepts(value):
                return None
            values[segment.name] = value
        if len(path_segments) > len(self.segments):
            return None
        return values


def path_segments(path: str) -> list[str]:
    """A request path split into its raw segments; one trailing slash is ignored."""
    stripped = path.lstrip("/")
    if stripped.endswith("/"):
        stripped = stripped[:-1]
    return stripped.split("/") if stripped else []


# --- the server -------------------------------------------------------------------------


@dataclass
class _Route:
    template: RouteTemplate
    methods: frozenset[str] | None
    listener: HttpTriggerListener


@dataclass
class HttpReply:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


class _BadBody(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    # A stop lets requests in flight finish within the drain; the process does not wait
    # for idle keep-alive connections.
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        # A client that went away mid-reply, and the like: the connection's business only.
        log.debug("http: connection from %s ended with an error", client_address, exc_info=True)


class HttpServer:
    """One server on loopback for every HTTP function of the app."""

    def __init__(self, port: int, route_prefix: str = DEFAULT_ROUTE_PREFIX) -> None:
        self.route_prefix = route_prefix.strip().strip("/")
        self._routes: list[_Route] = []
        self._stopping = threading.Event()
        self.serving = threading.Event()
        #: Requests between their first byte read and their reply's last byte written.
        self._replying = 0
        self._replied = threading.Condition()
        handler = type("Handler", (_Handler,), {"owner": self})
        self._server = _ThreadingServer((LOOPBACK, port), handler)  # OSError when the port is taken
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._serve, name="funchost-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def add(self, listener: HttpTriggerListener) -> None:
        self._routes.append(_Route(listener.template, listener.methods, listener))
        # The Functions host tries routes in the alphabetical order of the function names.
        self._routes.sort(key=lambda route: route.listener.name.casefold())

    def start(self) -> None:
        log.info("%s %s (route prefix %r)", LISTENING_MARKER, self.url, self.route_prefix)
        self._thread.start()

    def _serve(self) -> None:
        self.serving.set()
        self._server.serve_forever(poll_interval=0.2)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def replying(self, delta: int) -> None:
        with self._replied:
            self._replying += delta
            self._replied.notify_all()

    def wait_replied(self, timeout: float) -> bool:
        """Wait until every request taken has its reply written (a stop drains replies too)."""
        deadline = time.monotonic() + timeout
        with self._replied:
            while self._replying and (left := deadline - time.monotonic()) > 0:
                self._replied.wait(min(0.5, left))
            return not self._replying

    def stop_accepting(self) -> None:
        """No new connections (nor requests on open ones); requests in flight go on."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def match(self, method: str, path: str) -> tuple[HttpTriggerListener, dict[str, str]] | None:
        segments = path_segments(path)
        for route in self._routes:
            if route.methods is not None and method not in route.methods:
                continue
            values = route.template.match(segments)
            if values is not None:
                return route.listener, values
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: HttpServer
    protocol_version = "HTTP/1.1"  # keep-alive; every reply has a Content-Length
    # The reply goes out in several writes (status line, headers, body): with Nagle's algorithm on, the
    # last waits for the client's delayed ACK of the first, ~40 ms on every keep-alive request.
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return "funchost"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("http %s " + format, self.address_string(), *args)

    def handle_one_request(self) -> None:
        if self.owner.stopping:
            self.close_connection = True
            return
        super().handle_one_request()

    def _any(self) -> None:
        self.owner.replying(+1)
        try:
            self._reply()
        finally:
            self.owner.replying(-1)

    def _reply(self) -> None:
        try:
            reply = self._dispatch()
        except Exception:  # a bug of this host, never the function's (its failures are invocations)
            log.exception("http: %s %s failed before or after its function ran", self.command, self.path)
            reply, self.close_connection = HttpReply(500), True
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        if self.owner.stopping:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD" and reply.body:
            self.wfile.write(reply.body)
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = _any

    def _body(self) -> bytes:
        """The request body (Content-Length or chunked); raises _BadBody with the reply's status."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks, total = [], 0
            while True:
                size_line = self.rfile.readline(65537).split(b";")[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise _BadBody(400) from None
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    raise _BadBody(413)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(3)
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            count = int(length)
        except ValueError:
            raise _BadBody(400) from None
        if count < 0:
            raise _BadBody(400)
        if count > MAX_BODY_BYTES:
            raise _BadBody(413)
        return self.rfile.read(count)

    def _dispatch(self) -> HttpReply:
        method = self.command.upper()
        parts = urlsplit(self.path)
        try:
            body = self._body()
        except _BadBody as bad:
            self.close_connection = True  # the rest of the stream cannot be trusted
            return HttpReply(bad.status)
        found = self.owner.match(method, parts.path)
        if found is None:
            return HttpReply(404)
        listener, route_params = found
        host = self.headers.get("Host") or f"{LOOPBACK}:{self.owner.port}"
        url = f"http://{host}{parts.path}" + (f"?{parts.query}" if parts.query else "")
        headers = _headers(self.headers.items())
        query = _query(parts.query)
        # The runtime asks for the body alone, as bytes (RpcHttpBodyOnly, RawHttpBodyBytes). The host sends one
        # when the request's Content-Length is above 0; in Azure a chunked request arrives with its length set
        # and its body is sent (under Core Tools it is not: Azure/azure-functions-python-worker#574), so here too.
        sent = body
        request = protos.RpcHttp(method=method, url=url, headers=headers, query=query, params=route_params)
        if sent:
            request.body.CopyFrom(protos.TypedData(bytes=sent))
        metadata = http_binding_data(sent, parts.query, route_params, headers)
        return listener.handle(request, metadata, parts.path)


def _headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header names lower-cased, repeated headers joined with ',' (as the host's ``ToRpcHttp``)."""
    headers: dict[str, list[str]] = {}
    for name, value in items:
        headers.setdefault(name.lower(), []).append(value)
    return {name: ",".join(values) for name, values in headers.items()}


def http_binding_data(body: bytes, query: str, route_params: Mapping[str, str],
                      headers: Mapping[str, str]) -> dict[str, Any]:
    """The HTTP trigger's binding data as the host sends it to a worker that removed the request from it
    (``RpcHttpTriggerMetadataRemoved``): the body's top-level JSON fields, each query parameter but ``code``,
    each route parameter, then ``Query`` and ``Headers`` as JSON (names ignore case; a later one wins)."""
    metadata: dict[str, Any] = {}
    if body:
        merge_body_fields(metadata, body.decode("utf-8", errors="replace"))
    entries = [(name, protos.TypedData(string=value)) for name, value in _query(query).items() if name != "code"]
    entries += [(name, protos.TypedData(string=value)) for name, value in route_params.items()]
    entries.append(("Query", protos.TypedData(json=json.dumps(_query(query), separators=(",", ":")))))
    entries.append(("Headers", protos.TypedData(json=json.dumps(dict(headers), separators=(",", ":")))))
    by_lower = {key.lower(): key for key in metadata}
    for name, value in entries:
        metadata[by_lower.setdefault(name.lower(), name)] = value
    return metadata


def _query(query: str) -> dict[str, str]:
    """Query parameters, a repeated one joined with ','; empty values are left out, as the host does."""
    values: dict[str, list[str]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        values.setdefault(name, []).append(value)
    joined = {name: ",".join(items) for name, items in values.items()}
    return {name: value for name, value in joined.items() if value}


def reply_from(value: Any) -> HttpReply:
    """The HTTP reply for what a function set on its http output (a ``TypedData`` from the worker)."""
    if value is None:
        return HttpReply(200)  # the host's OkResult when the function set no response
    kind = value.WhichOneof("data")
    if kind != "http":  # a bare value: the body of a 200 answer
        return HttpReply(200, [("Content-Type", _text_type(None))], _body_bytes(value))
    response = value.http
    try:
        status = int(response.status_code)  # the host's int.TryParse: empty or not a number is 200
    except ValueError:
        status = 200
    headers = [(name, text) for name, text in response.headers.items() if name.lower() != "content-type"]
    content_type = next((text for name, text in response.headers.items() if name.lower() == "content-type"), None)
    body = response.body if response.HasField("body") else None
    if body is not None and body.WhichOneof("data") in ("string", "json", "int", "double"):
        content_type = _text_type(content_type)  # a text body is written as a string, in UTF-8
    if content_type is not None:
        headers.insert(0, ("Content-Type", content_type))
    headers += [("Set-Cookie", _set_cookie(cookie)) for cookie in response.cookies]
    return HttpReply(status, headers, _body_bytes(body) if body is not None else b"")


def _text_type(content_type: str | None) -> str:
    """The Content-Type of a string body: the one given or ``text/plain``, with ``; charset=utf-8`` (ASP.NET Core's)."""
    content_type = content_type or "text/plain"
    return content_type if "charset=" in content_type.lower() else f"{content_type}; charset=utf-8"


def _body_bytes(value: Any) -> bytes:
    kind = value.WhichOneof("data")
    if kind in ("bytes", "stream"):
        return bytes(getattr(value, kind))
    if kind in ("string", "json"):
        return getattr(value, kind).encode("utf-8")
    if kind in ("int", "double"):
        return str(getattr(value, kind)).encode("utf-8")
    return b""


_SAME_SITE = {
    protos.RpcHttpCookie.SameSite.Lax: "lax",
    protos.RpcHttpCookie.SameSite.Strict: "strict",
    protos.RpcHttpCookie.SameSite.ExplicitNone: "none",
}


def _set_cookie(cookie: Any) -> str:
    """An ``RpcHttpCookie`` as a Set-Cookie header (ASP.NET Core's ``CookieOptions``, as the host appends it)."""
    parts = [f"{cookie.name}={cookie.value}"]
    if cookie.HasField("domain"):
        parts.append(f"domain={cookie.domain.value}")
    if cookie.HasField("path"):
        parts.append(f"path={cookie.path.value}")
    if cookie.HasField("expires"):
        moment = cookie.expires.value.ToDatetime()
        parts.append(f"expires={moment.strftime('%a, %d %b %Y %H:%M:%S GMT')}")
    if cookie.HasField("max_age"):
        parts.append(f"max-age={int(cookie.max_age.value)}")
    if cookie.HasField("secure") and cookie.secure.value:
        parts.append("secure")
    if cookie.same_site in _SAME_SITE:
        parts.append(f"samesite={_SAME_SITE[cookie.same_site]}")
    if cookie.HasField("http_only") and cookie.http_only.value:
        parts.append("httponly")
    return "; ".join(parts)


class HttpTriggerListener(Listener):
    """One HTTP function: its route on the shared server, and its requests in flight."""

    def __init__(self, spec: FunctionSpec, invoker: Invoker, server: HttpServer) -> None:
        super().__init__(spec, invoker)
        self.server = server
        self.route = str(spec.trigger.get("route") or spec.name)
        methods = spec.trigger.get("methods")
        self.methods = frozenset(str(m).upper() for m in methods) if methods else None
        self.template: RouteTemplate | None = None
        self._in_flight = 0
        self._idle = threading.Condition()

    def describe(self) -> str:
        methods = ",".join(sorted(self.methods)) if self.methods else "all methods"
        text = self.template.text if self.template else self.route
        return f"{self.spec.trigger_type} [{methods}] {self.server.url}/{text}"

    def concurrency(self) -> str:
        return "unbounded (a server thread per request)"

    def prepare(self) -> None:
        try:
            self.template = RouteTemplate.parse(self.route, self.server.route_prefix)
        except (RouteError, re.error) as error:
            raise FunctionLoadError(self.name, f"route {self.route!r}: {error}") from error
        self.server.add(self)

    def _run(self) -> None:
        self.server.serving.wait()
        self.ready.set()
        self._stopping.wait()
        with self._idle:
            while self._in_flight and self.remaining() > 0:
                self._idle.wait(min(0.5, self.remaining()))
        # A function that returned still has its reply to write: wait for that too.
        self.server.wait_replied(max(0.0, self.remaining()))
        if self._in_flight:
            log.warning("%s: %d request(s) still running at the shutdown deadline", self.name, self._in_flight)

    def handle(self, request: Any, metadata: Mapping[str, Any], path: str) -> HttpReply:
        with self._idle:
            self._in_flight += 1
        try:
            details = f"method={request.method} path={path}"
            outcome = self.invoker.invoke(self.spec, TriggerValue(protos.TypedData(http=request), metadata, details))
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
        if not outcome.succeeded:
            return HttpReply(500)
        return reply_from(outcome.http)

