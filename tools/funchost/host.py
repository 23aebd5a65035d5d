"""The host: settings, the worker processes, one listener per trigger, readiness, and a draining stop."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable, MutableMapping
from pathlib import Path

from .app import (
    HTTP_TRIGGER,
    QUEUE_TRIGGER,
    SERVICE_BUS_TRIGGER,
    TIMER_TRIGGER,
    AppLoadError,
    FunctionLoadError,
    FunctionSpec,
    build_spec,
    is_disabled,
)
from .channel import AppIndexError, WorkerPool, process_count
from .config import (
    HostOptions,
    apply_settings,
    host_options,
    read_host_json,
    read_local_http_port,
    read_local_settings,
)
from .connections import Clients
from .http_trigger import DEFAULT_PORT, HttpServer, HttpTriggerListener
from .invoke import Invoker, worker_thread_count
from .listener import Listener
from .outputs import OutputSender
from .queue_trigger import QueueTriggerListener
from .servicebus_trigger import ServiceBusTriggerListener
from .timer_trigger import TimerTriggerListener

log = logging.getLogger("funchost")

#: Logged once every listener is receiving; tests and scripts wait for it.
READY_MARKER = "funchost ready:"
STOPPED_MARKER = "funchost stopped:"
INSTANCE_ID_SETTING = "WEBSITE_INSTANCE_ID"


class HostStartError(RuntimeError):
    """The host cannot start at all (e.g. the HTTP port is taken)."""


class Host:
    """Runs the functions of one app directory until stopped.

    ``load()`` reads local.settings.json into the environment (values already set win),
    gives this process an instance id, reads host.json, starts the worker process (which
    indexes the app) and loads the functions it will run into it;
    ``start()`` creates the queues the functions use and starts their listeners (and,
    when the app has HTTP functions, one HTTP server on loopback, on ``http_port``: else
    local.settings.json ``Host.LocalHttpPort``, else 7071; 0 for a free port);
    ``stop(drain_timeout)`` lets in-flight invocations finish (their messages are then
    settled) and abandons whatever is still running at the deadline.
    """

    def __init__(
        self,
        app_dir: Path,
        settings_file: Path | None = None,
        *,
        functions: Iterable[str] | None = None,
        environ: MutableMapping[str, str] | None = None,
        http_port: int | None = None,
    ) -> None:
        self.app_dir = Path(app_dir).resolve()
        self.settings_file = Path(settings_file) if settings_file else self.app_dir / "local.settings.json"
        self.only = set(functions) if functions else None
        self.environ = os.environ if environ is None else environ
        self.options: HostOptions | None = None
        self.specs: list[FunctionSpec] = []
        self.errors: dict[str, str] = {}
        self.listeners: list[Listener] = []
        self.instance_id = ""
        self._ready = threading.Event()
        #: Set when the host stops by itself (its workers kept failing), as the Functions host recycles.
        self.failed = threading.Event()
        self._workers: WorkerPool | None = None
        self.thread_count = worker_thread_count(self.environ)
        self._clients: Clients | None = None
        self._outputs: OutputSender | None = None
        self.http_port = http_port
        self._http: HttpServer | None = None

    # --- load -------------------------------------------------------------------------

    def load(self) -> None:
        applied = apply_settings(read_local_settings(self.settings_file), self.environ)
        if self.settings_file.exists():
            log.info("read %d setting(s) from %s", len(applied), self.settings_file.name)
        else:
            log.info("no %s: app settings come from the environment only", self.settings_file.name)
        self.environ.setdefault(INSTANCE_ID_SETTING, secrets.token_hex(32))
        self.environ.setdefault("AzureWebJobsScriptRoot", str(self.app_dir))
        self.instance_id = self.environ[INSTANCE_ID_SETTING]
        if self.http_port is None:
            self.http_port = read_local_http_port(self.settings_file)
            self.http_port = DEFAULT_PORT if self.http_port is None else self.http_port
        self.options = host_options(read_host_json(self.app_dir / "host.json", self.environ), self.environ)
        logging.getLogger().setLevel(self.options.log_level)

        self._workers = WorkerPool(
            self.app_dir, self.environ, count=process_count(self.environ),
            function_timeout=self.options.function_timeout.total_seconds() if self.options.function_timeout else None,
            startup_interval=self.options.worker_startup_interval, on_give_up=self._give_up,
        )
        try:
            functions = self._workers.index()
        except AppIndexError as error:
            raise AppLoadError(str(error)) from error
        names = [function.name for function in functions]
        if self.only:
            unknown = self.only - set(names)
            if unknown:
                self._workers.close(0)
                raise AppLoadError(
                    f"no function named {', '.join(sorted(unknown))} in the app (it has {', '.join(names)})"
                )
        loaded = []
        for function in functions:
            name = function.name
            if self.only is not None and name not in self.only:
                continue
            if is_disabled(name, self.environ):
                log.info("Function %s is disabled (AzureWebJobs.%s.Disabled)", name, name)
                continue
            try:
                self.specs.append(build_spec(name, function.function_id, list(function.bindings), self.environ))
            except FunctionLoadError as error:
                self.errors[name] = str(error)
                continue
            loaded.append(function)
        try:
            self._workers.load(loaded)
        except Exception as error:
            self._workers.close(0)
            raise AppLoadError(f"loading the functions into the worker failed: {error}") from error

    # --- start ------------------------------------------------------------------------

    @property
    def http_url(self) -> str | None:
        """The HTTP server's base URL (``http://127.0.0.1:PORT``), when the app has HTTP functions."""
        return self._http.url if self._http else None

    def start(self) -> None:
        assert self.options is not None, "load() first"
        if any(spec.trigger_type == HTTP_TRIGGER for spec in self.specs):
            try:
                self._http = HttpServer(int(self.http_port or 0), self.options.http.route_prefix)
            except OSError as error:
                raise HostStartError(
                    f"cannot listen on {self.http_port} for the HTTP functions: {error.strerror or error} "
                    "(use --port, or 0 for a free port)"
                ) from error
        assert self._workers is not None, "load() first"
        if self.thread_count.warning:
            log.warning("%s", self.thread_count.warning)
        self._clients = Clients(self.environ)
        self._outputs = OutputSender(self._clients, self.options.queues, self._notify_queue)
        invoker = Invoker(self._outputs.send, self._workers)
        for spec in self.specs:
            try:
                listener = self._listener(spec, invoker)
                listener.prepare()
                for output in spec.outputs:
                    self._outputs.prepare(output)
            except Exception as error:  # one function in error; the others run, as in the Functions host
                self.errors[spec.name] = f"cannot start the {spec.name} function: {type(error).__name__}: {error}"
                continue
            self.listeners.append(listener)
        for name, message in self.errors.items():
            log.error("Function %s is in error: %s", name, message)
        for listener in self.listeners:
            log.info("Function %s: %s", listener.name, listener.describe())
        log.info("%s", self.concurrency())
        if self._http is not None:
            if any(isinstance(listener, HttpTriggerListener) for listener in self.listeners):
                self._http.start()
            else:  # every HTTP function is in error: nothing to serve
                self._http.stop_accepting()
                self._http = None
        for listener in self.listeners:
            listener.start()
        threading.Thread(target=self._announce_ready, name="funchost-ready", daemon=True).start()

    def concurrency(self) -> str:
        """One line: the worker processes, the runtime's shared pool in each (size and source), and each trigger's limit."""
        assert self._workers is not None, "load() first"
        triggers = ", ".join(f"{listener.name} {listener.concurrency()}" for listener in self.listeners)
        return (
            f"concurrency: {self._workers.count} worker process(es); in each, sync functions share one thread "
            f"pool of {self.thread_count.max_workers} ({self.thread_count.source}) and async functions one "
            f"event loop; per trigger: {triggers or 'none'}"
        )

    def _listener(self, spec: FunctionSpec, invoker: Invoker) -> Listener:
        assert self.options is not None and self._clients is not None
        if spec.trigger_type == SERVICE_BUS_TRIGGER:
            return ServiceBusTriggerListener(spec, invoker, self._clients, self.options.service_bus)
        if spec.trigger_type == QUEUE_TRIGGER:
            return QueueTriggerListener(spec, invoker, self._clients, self.options.queues)
        if spec.trigger_type == TIMER_TRIGGER:
            return TimerTriggerListener(spec, invoker)
        if spec.trigger_type == HTTP_TRIGGER and self._http is not None:
            return HttpTriggerListener(spec, invoker, self._http)
        raise FunctionLoadError(spec.name, f"trigger {spec.trigger_type} is not supported")  # build_spec prevents it

    def _notify_queue(self, queue_name: str) -> None:
        for listener in self.listeners:
            if isinstance(listener, QueueTriggerListener) and listener.queue_name == queue_name:
                listener.notify()

    def _announce_ready(self) -> None:
        started = time.monotonic()
        reported = started
        for listener in self.listeners:
            while not listener.ready.wait(1.0):
                if time.monotonic() - reported >= 10:
                    reported = time.monotonic()
                    waiting = [item.name for item in self.listeners if not item.ready.is_set()]
                    log.info("still waiting for %s to start receiving", ", ".join(waiting))
        log.info(
            "%s functions=%d errors=%d instance=%s sync_threads=%d%s workers=%s startup=%.1fs",
            READY_MARKER,
            len(self.listeners),
            len(self.errors),
            self.instance_id,
            self.thread_count.max_workers,
            f" http={self._http.url}" if self._http else "",
            ",".join(str(pid) for pid in self.worker_pids),
            time.monotonic() - started,
        )
        self._ready.set()

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (they run the functions; this process is the host's side)."""
        return self._workers.pids if self._workers else []

    def _give_up(self, reason: str) -> None:
        self.failed.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    # --- stop -------------------------------------------------------------------------

    def stop(self, drain_timeout: float = 30.0) -> bool:
        """Stop receiving, let in-flight invocations finish until the deadline; True if every listener ended."""
        deadline = time.monotonic() + max(0.0, drain_timeout)
        if self._http is not None:
            self._http.stop_accepting()  # requests in flight go on until the deadline
        for listener in self.listeners:
            listener.stop(deadline)
        ended = True
        for listener in self.listeners:
            ended &= listener.join(timeout=max(0.0, deadline - time.monotonic()) + 15.0)
        if self._workers:
            self._workers.close()  # their invocations' messages are settled by now
        if self._outputs:
            self._outputs.close()
        if self._clients:
            self._clients.close()
        log.info("%s instance=%s drained=%s", STOPPED_MARKER, self.instance_id, ended)
        return ended

    def hurry(self) -> None:
        """Cut the drain short: abandon what is still running now."""
        now = time.monotonic()
        for listener in self.listeners:
            listener.stop(now)
