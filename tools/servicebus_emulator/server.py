"""The listening server, and the handle to run it in a background thread.

:class:`EmulatorServer` is the asyncio server (used as is by the command, in the
main thread). :func:`start` runs one in a daemon thread with its own event loop
and returns a :class:`ServiceBusEmulator` whose methods are safe to call from any
thread: they run on the loop and wait for the result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Self, TypeVar

from . import codec
from .broker import LINK_IDLE_TIMEOUT, Broker, QueueSettings
from .connection import Connection
from .faults import Faults

log = logging.getLogger(__package__)

T = TypeVar("T")

DEFAULT_DUPLICATE_DETECTION_WINDOW = timedelta(minutes=10)  # Service Bus's default


class EmulatorError(RuntimeError):
    """The emulator could not start (e.g. the port is taken)."""


def connection_string(host: str, port: int) -> str:
    """The connection string the SDK needs: no TLS, the port kept, any key accepted."""
    return f"Endpoint=sb://{host}:{port};SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;"


def queue_settings(
    queue: QueueSettings | str,
    *,
    lock_duration: timedelta = timedelta(seconds=60),
    max_delivery_count: int = 10,
    default_ttl: timedelta = timedelta(days=14),
    dead_letter_on_expiry: bool = False,
    duplicate_detection: bool = False,
    duplicate_detection_window: timedelta = DEFAULT_DUPLICATE_DETECTION_WINDOW,
) -> QueueSettings:
    """A :class:`QueueSettings` as is, or settings from a name and these properties (ValueError if invalid)."""
    if isinstance(queue, QueueSettings):
        return queue
    return QueueSettings(
        name=queue,
        lock_duration=lock_duration.total_seconds(),
        max_delivery_count=max_delivery_count,
        default_ttl=default_ttl.total_seconds(),
        dead_letter_on_expiry=dead_letter_on_expiry,
        duplicate_detection=duplicate_detection,
        duplicate_detection_window=duplicate_detection_window.total_seconds(),
    )


class EmulatorServer:
    """The AMQP listener and its broker, on the running event loop."""

    def __init__(
        self, host: str, port: int, queues: Iterable[QueueSettings | str] = (), faults: Faults | None = None, *,
        link_idle_timeout: float | None = LINK_IDLE_TIMEOUT,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.queues = [queue_settings(queue) for queue in queues]
        self.faults = faults or Faults()
        self.link_idle_timeout = link_idle_timeout
        self.port = 0
        self.connections: set[Connection] = set()
        self.loop: asyncio.AbstractEventLoop
        self.broker: Broker
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        codec.check_sdk_version()
        self.loop = asyncio.get_running_loop()
        self.broker = Broker(self.loop, self.faults, link_idle_timeout=self.link_idle_timeout)
        for settings in self.queues:
            self.broker.declare(settings)
        try:
            self._server = await self.loop.create_server(
                lambda: Connection(self.broker, self.connections), self.host, self.requested_port
            )
        except OSError as error:
            raise EmulatorError(f"cannot listen on {self.host}:{self.requested_port}: {error}") from error
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "Service Bus emulator listening on %s:%d (queues: %s)",
            self.host,
            self.port,
            ", ".join(self.broker.names()) or "none",
        )
        if self.faults.enabled:
            log.info("injecting faults: %s", self.faults.to_arg())

    def operation_counts(self) -> dict[str, int]:
        """What the emulator has done since it started (see the README's "Operation counters").

        Call it on the server's event loop (:meth:`ServiceBusEmulator.operation_counts` from any thread).
        """
        return dict(self.broker.operations)

    def set_faults(self, faults: Faults) -> None:
        """Inject these faults from now on (``Faults()``: none). Call it on the server's event loop."""
        self.faults = faults
        self.broker.faults.configure(faults)

    def fault_counts(self) -> dict[str, int]:
        """Faults injected so far, by kind: ``throttled``, ``lock_lost``, ``link_drop``, ``connection_drop``."""
        return self.broker.faults.counts()

    def set_link_idle_timeout(self, seconds: float | None) -> None:
        """Force-detach a queue's link after this many seconds without a call (None: never; Azure: 600).
        Call it on the server's event loop."""
        self.link_idle_timeout = self.broker.link_idle_timeout = seconds
        for connection in list(self.connections):
            connection.restart_idle_check()

    @property
    def connection_string(self) -> str:
        return connection_string(self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        self.broker.close()
        log.info("Service Bus emulator on port %d stopped", self.port)


class ServiceBusEmulator:
    """A running emulator (see :func:`start`). Its methods may be called from any thread."""

    def __init__(self, server: EmulatorServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._server = server
        self._loop = loop
        self._thread = thread
        self.host = server.host
        self.port = server.port

    @property
    def connection_string(self) -> str:
        return connection_string(self.host, self.port)

    def _call(self, function: Callable[[], T], timeout: float = 10.0) -> T:
        if not self._thread.is_alive():
            raise EmulatorError("the emulator is not running")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                future.set_exception(error)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def declare_queue(
        self,
        name: QueueSettings | str,
        *,
        lock_duration: timedelta = timedelta(seconds=60),
        max_delivery_count: int = 10,
        default_ttl: timedelta = timedelta(days=14),
        dead_letter_on_expiry: bool = False,
        duplicate_detection: bool = False,
        duplicate_detection_window: timedelta = DEFAULT_DUPLICATE_DETECTION_WINDOW,
    ) -> str:
        """Declare a queue (idempotent: an existing queue keeps its messages and takes these properties).

        ``name`` is a queue name (with these properties) or a :class:`QueueSettings`. Returns the name.
        """
        settings = queue_settings(
            name,
            lock_duration=lock_duration,
            max_delivery_count=max_delivery_count,
            default_ttl=default_ttl,
            dead_letter_on_expiry=dead_letter_on_expiry,
            duplicate_detection=duplicate_detection,
            duplicate_detection_window=duplicate_detection_window,
        )
        self._call(lambda: self._server.broker.declare(settings))
        return settings.name

    def message_counts(self, name: str) -> dict[str, int]:
        """``{"active", "dead_letter", "scheduled", "locked"}`` for a queue (KeyError if unknown).

        ``active`` counts messages ready for delivery, ``locked`` those received in peek-lock and
        not yet settled. Deferred messages are in none of them.
        """

        def counts() -> dict[str, int]:
            queue = self._server.broker.get(name)
            if queue is None:
                raise KeyError(f"no queue {name!r}")
            return queue.counts()

        return self._call(counts)

    def operation_counts(self) -> dict[str, int]:
        """What the emulator has done since it started, by kind (see the README's "Operation counters")."""
        return self._call(self._server.operation_counts)

    def set_faults(self, faults: Faults) -> None:
        """Inject these faults from now on (``Faults()``: none); see faults.py."""
        self._call(lambda: self._server.set_faults(faults))

    def fault_counts(self) -> dict[str, int]:
        """Faults injected so far, by kind: ``throttled``, ``lock_lost``, ``link_drop``, ``connection_drop``."""
        return self._call(self._server.fault_counts)

    def set_link_idle_timeout(self, seconds: float | None) -> None:
        """Force-detach a queue's link after this many seconds without a call (None: never), from now on;
        Azure's 10 minutes (``broker.LINK_IDLE_TIMEOUT``) by default."""
        self._call(lambda: self._server.set_link_idle_timeout(seconds))

    def stop(self, timeout: float = 10.0) -> None:
        """Close every connection and stop listening (idempotent)."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ServiceBusEmulator {self.host}:{self.port}>"


def start(
    host: str = "127.0.0.1",
    port: int = 0,
    queues: Iterable[QueueSettings | str] = (),
    *,
    faults: Faults | None = None,
    timeout: float = 10.0,
    link_idle_timeout: float | None = LINK_IDLE_TIMEOUT,
) -> ServiceBusEmulator:
    """Start an emulator in a background thread of this process.

    ``port=0`` picks a free port (read it from ``.port``). ``queues`` are :class:`QueueSettings`
    or names (Service Bus's default properties); more can be declared later with
    :meth:`ServiceBusEmulator.declare_queue`. ``faults``: Azure's push-back to inject (faults.py;
    none by default). ``link_idle_timeout``: seconds without a call before a queue's link is
    force-detached, as Azure detaches it after 10 minutes (None: never). Raises
    :class:`EmulatorError` if it cannot start.
    """
    settings = [queue_settings(queue) for queue in queues]
    server = EmulatorServer(host, port, settings, faults, link_idle_timeout=link_idle_timeout)
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[None] = concurrent.futures.Future()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread by start()
            started.set_exception(error)
            loop.close()
            return
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=run, name=f"servicebus-emulator-{host}:{port}", daemon=True)
    thread.start()
    try:
        started.result(timeout)
    except concurrent.futures.TimeoutError:
        raise EmulatorError(f"the emulator did not start within {timeout} s") from None
    return ServiceBusEmulator(server, loop, thread)
