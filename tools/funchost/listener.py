"""What every trigger listener shares: a thread, readiness, and a stop that drains."""

from __future__ import annotations

import logging
import threading
import time

from .app import FunctionSpec
from .invoke import Invoker

log = logging.getLogger("funchost")


class Listener:
    """Drives one function's trigger in its own thread.

    The listener is the Functions host's side: it holds up to its trigger's limit of
    invocations in flight (host.json ``maxConcurrentCalls``, ``batchSize`` +
    ``newBatchThreshold``, one timer run) while the worker runs the functions (sync ones
    on the worker's shared thread pool, where they may queue; async ones on its event
    loop), and keeps their messages locked. The Service Bus and storage-queue triggers hand
    each function to the worker and are told when it returns, as the Functions host hands
    an invocation to the worker; a timer run and an HTTP request wait in their own thread.

    ``start()`` prepares (creates queues, ...) and starts the thread; ``ready`` is set
    once the listener is receiving. ``stop(deadline)`` stops taking new work; in-flight
    invocations may finish until ``deadline`` (``time.monotonic()``), after which their
    messages are abandoned. ``join()`` waits for all of it.
    """

    def __init__(self, spec: FunctionSpec, invoker: Invoker) -> None:
        self.spec = spec
        self.invoker = invoker
        self.ready = threading.Event()
        self._stopping = threading.Event()
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._guarded_run, name=f"listener-{spec.name}", daemon=True)

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> str:
        """A short description for the startup log, e.g. ``serviceBusTrigger queue=orders``."""
        return self.spec.trigger_type

    def concurrency(self) -> str:
        """The host's per-trigger limit on this function's invocations in flight, for the start-up log."""
        return "unlimited"

    def prepare(self) -> None:
        """Runs before the thread starts (may raise: the function is then reported in error)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, deadline: float) -> None:
        self._deadline = deadline
        self._stopping.set()
        self._wake()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def remaining(self) -> float:
        return min(max(0.0, self._deadline - time.monotonic()), 24 * 3600.0)

    def _wake(self) -> None:
        """Interrupt a wait in the listener thread (subclasses with their own events override)."""

    def _guarded_run(self) -> None:
        try:
            self._run()
        except Exception:  # a listener bug must be visible, and must not take the host down silently
            log.exception("listener for %s stopped unexpectedly", self.name)

    def _run(self) -> None:
        raise NotImplementedError
