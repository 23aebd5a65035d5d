"""The proxy: an HTTP reverse proxy on loopback per storage service, injecting faults.

Each service (``table``, ``queue``, ``blob``) gets its own port and forwards to its
upstream (Azurite) unchanged: method, path, query, headers and body pass byte for
byte, so Shared Key signatures stay valid. A request may meet one fault
(:mod:`.faults`); every request and every fault is counted per service.

``GET /_faults`` on any port answers the counts as JSON; ``PUT /_faults`` with
``{"faults": "503=0.02,..."}`` changes the rates (a storage account name cannot start
with ``_``, so the path never shadows Azure's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from yarl import URL

from .faults import (
    APPLIED_500, BUSY, BUSY_MESSAGE, KINDS, LATENCY, PASS, RESET, RESET_APPLIED, TIMED_OUT_MESSAGE, StorageFaults,
    error_response,
)

log = logging.getLogger(__name__)

CONTROL_PATH = "/_faults"
#: Counted when forwarding itself failed (the proxy's upstream, not an injected fault).
UPSTREAM_ERROR = "upstream-error"
#: Hop-by-hop and framing headers, never forwarded (aiohttp frames each side itself).
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "upgrade"}


@dataclass
class Counts:
    requests: Counter = field(default_factory=Counter)
    #: service -> fault kind -> count
    faults: dict[str, Counter] = field(default_factory=dict)

    def as_dict(self) -> dict:
        by_kind: Counter = Counter()
        for per_service in self.faults.values():
            by_kind.update(per_service)
        return {
            "requests": dict(self.requests),
            "faults": {kind: by_kind.get(kind, 0) for kind in KINDS}
            | ({RESET: by_kind[RESET]} if by_kind.get(RESET) else {}),
            "faults_by_service": {service: dict(c) for service, c in self.faults.items()},
            "upstream_errors": by_kind.get(UPSTREAM_ERROR, 0),
        }


class FaultProxy:
    """Serve ``upstreams`` (service -> base URL such as ``http://127.0.0.1:10002``) on
    free loopback ports (or ``ports``), with ``faults``. Run it in an event loop
    (:meth:`start` / :meth:`stop`) or in a thread of its own (:func:`start_in_thread`)."""

    def __init__(self, upstreams: dict[str, str], faults: StorageFaults = StorageFaults(), *, seed: int | None = None,
                 host: str = "127.0.0.1", ports: dict[str, int] | None = None) -> None:
        self.upstreams = {service: url.rstrip("/") for service, url in upstreams.items()}
        self.faults = faults
        self.host = host
        self.ports = dict(ports or {})
        self.counts = Counts()
        self._rng = random.Random(seed)
        #: Faults for the next matching requests, before any drawn at the rates (tests).
        self._script: list[tuple[str | None, str | None, str]] = []
        self._runners: list[web.AppRunner] = []
        self._session: aiohttp.ClientSession | None = None
        #: service -> the proxy's base URL for it, once started.
        self.endpoints: dict[str, str] = {}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            # Idle upstream connections are let go before Node's 5 s keep-alive timeout
            # (Azurite's server) can close one under a request being sent on it.
            connector=aiohttp.TCPConnector(limit=512, limit_per_host=512, keepalive_timeout=2),
            auto_decompress=False, skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding", "Accept"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        for service in self.upstreams:
            app = web.Application(client_max_size=1024**3)
            app.router.add_route("*", "/{tail:.*}", self._handler(service))
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.ports.get(service, 0))
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the bound port of port 0
            self.endpoints[service] = f"http://{self.host}:{port}"
            self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def inject(self, kind: str, *, service: str | None = None, method: str | None = None, times: int = 1) -> None:
        """Give the next ``times`` requests to ``service`` with ``method`` (any when None) the fault ``kind``."""
        if kind not in (*KINDS, RESET, PASS):
            raise ValueError(f"unknown fault kind {kind!r}")
        self._script += [(service, method and method.upper(), kind)] * times

    def _next_fault(self, service: str, method: str) -> tuple[str | None, bool]:
        for i, (s, m, kind) in enumerate(self._script):
            if s in (None, service) and m in (None, method):
                del self._script[i]
                if kind == PASS:
                    return None, False
                return (None, True) if kind == LATENCY else (kind, False)
        return self.faults.draw(self._rng)

    def _count(self, service: str, kind: str) -> None:
        self.counts.faults.setdefault(service, Counter())[kind] += 1

    def _handler(self, service: str):
        upstream = self.upstreams[service]

        async def handle(request: web.Request) -> web.StreamResponse:
            if request.path == CONTROL_PATH:
                return await self._control(request)
            self.counts.requests[service] += 1
            fault, spike = self._next_fault(service, request.method)
            body = await request.read()
            if spike:
                self._count(service, LATENCY)
                await asyncio.sleep(self.faults.latency_seconds)
            if fault == RESET:  # the connection dropped before forwarding: nothing applied, no answer
                self._count(service, RESET)
                return self._drop(request)
            if fault == BUSY:  # refused before the store sees it: nothing applied
                self._count(service, BUSY)
                headers, payload = error_response(service, 503, "ServerBusy", BUSY_MESSAGE)
                return web.Response(status=503, reason="Server Busy", headers=headers, body=payload)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
            try:
                async with self._session.request(
                    request.method, URL(upstream + request.raw_path, encoded=True),
                    headers=headers, data=body or None, allow_redirects=False,
                ) as answer:
                    payload = await answer.read()
                    status, reason = answer.status, answer.reason
                    answer_headers = [(k, v) for k, v in answer.headers.items() if k.lower() not in _HOP]
            except aiohttp.ClientError as error:
                # The upstream failed us: the client sees what a network failure looks like,
                # a dropped connection, never an answer the storage service would not send.
                self._count(service, UPSTREAM_ERROR)
                log.warning("%s %s: upstream failed (%s); dropping the client's connection",
                            request.method, request.path, error)
                return self._drop(request)
            if fault == APPLIED_500:  # applied, then the answer lost: the client sees a timeout error
                self._count(service, APPLIED_500)
                headers, payload = error_response(service, 500, "OperationTimedOut", TIMED_OUT_MESSAGE)
                return web.Response(status=500, reason="Operation Timed Out", headers=headers, body=payload)
            if fault == RESET_APPLIED:  # applied, then the connection dropped with no answer
                self._count(service, RESET_APPLIED)
                return self._drop(request)
            response = web.Response(status=status, reason=reason, body=payload)
            for key, value in answer_headers:
                response.headers.add(key, value)
            return response

        return handle

    @staticmethod
    def _drop(request: web.Request):
        """Abort the client's connection with no answer."""
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # aiohttp ends the handler; nothing is written

    async def _control(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            try:
                self.faults = StorageFaults.parse(json.loads(await request.read())["faults"])
            except (ValueError, KeyError, TypeError) as error:
                return web.json_response({"error": f"expected {{\"faults\": \"503=0.02,...\"}}: {error}"}, status=400)
        return web.json_response({**self.counts.as_dict(), "rates": self.faults.to_arg()})


class RunningProxy:
    """A :class:`FaultProxy` on an event loop in a daemon thread."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="storage-faults", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(proxy.start(), self._loop).result(30)

    @property
    def endpoints(self) -> dict[str, str]:
        return self.proxy.endpoints

    def counts(self) -> dict:
        return self._call(lambda: self.proxy.counts.as_dict())

    def set_faults(self, faults: StorageFaults) -> None:
        self._call(lambda: setattr(self.proxy, "faults", faults))

    def inject(self, kind: str, *, service: str | None = None, method: str | None = None, times: int = 1) -> None:
        self._call(lambda: self.proxy.inject(kind, service=service, method=method, times=times))

    def _call(self, function):
        async def run():
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def start_in_thread(upstreams: dict[str, str], faults: StorageFaults = StorageFaults(), *, seed: int | None = None,
                    ports: dict[str, int] | None = None) -> RunningProxy:
    return RunningProxy(FaultProxy(upstreams, faults, seed=seed, ports=ports))


_ENDPOINT_KEYS = {"table": "TableEndpoint", "queue": "QueueEndpoint", "blob": "BlobEndpoint"}


def upstreams_of(connection_string: str, services: tuple[str, ...] = ("table", "queue")) -> dict[str, str]:
    """The scheme://host:port of each service's endpoint in a storage connection string."""
    parts = dict(p.split("=", 1) for p in connection_string.strip(";").split(";") if "=" in p)
    found = {}
    for service in services:
        url = parts.get(_ENDPOINT_KEYS[service])
        if not url:
            raise ValueError(f"the connection string has no {_ENDPOINT_KEYS[service]}")
        scheme, _, rest = url.partition("://")
        found[service] = f"{scheme}://{rest.split('/', 1)[0]}"
    return found


def proxied(connection_string: str, endpoints: dict[str, str]) -> str:
    """``connection_string`` with each proxied service's endpoint pointed at the proxy
    (same path, so the account name in it is kept)."""
    out = []
    for part in connection_string.strip(";").split(";"):
        key, sep, url = part.partition("=")
        service = next((s for s, k in _ENDPOINT_KEYS.items() if k == key), None)
        if sep and service in endpoints:
            scheme, _, rest = url.partition("://")
            path = rest.split("/", 1)[1] if "/" in rest else ""
            url = f"{endpoints[service]}/{path}" if path else endpoints[service]
        out.append(f"{key}{sep}{url}")
    return ";".join(out) + ";"
