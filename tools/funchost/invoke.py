"""Invocations: the host's side of running a function in the worker.

A trigger hands over what the Functions host and its extension make of one event: the
trigger's data as ``TypedData`` (a string, bytes, JSON or an ``RpcHttp``) and its binding
data as ``trigger_metadata``. :class:`Invoker` wraps them in an ``InvocationRequest`` (a new
invocation id, the function's id, a new W3C trace context), sends it to a worker
(``channel.WorkerPool``) and, once the ``InvocationResponse`` is back, does the host's part:

- the function's outputs, only when it succeeded (the Functions host reads a worker's
  output data only from a successful response: ``GrpcWorkerChannel.InvokeResponse``,
  Azure/azure-functions-host, ``src/WebJobs.Script.Grpc/Channel/GrpcWorkerChannel.cs``):
  each ``output_data`` entry (and ``return_value`` for a ``$return`` binding) to the
  storage or Service Bus queue its binding names; a failed send fails the invocation, so
  its trigger retries;
- an HTTP trigger's response (``RpcHttp``) handed back in the :class:`Outcome`;
- one log line: ``Executed 'Functions.<name>' (Succeeded|Failed, Id=<id>, Duration=<ms>ms)``
  with the trigger's details and, when it failed, the exception the worker reported.

Nothing here converts a value into the Python objects a function receives, nor runs a
function: Microsoft's runtime does that in the worker process.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .app import HTTP_OUTPUT, FunctionSpec
from .channel import WorkerError, WorkerPool
from .rpc import protos

log = logging.getLogger("funchost")

#: Invocation ids and trace contexts are drawn here, not by ``uuid.uuid4()``: that reads the
#: kernel's random bytes, a system call around which CPython lets go of the GIL, and under load
#: every let-go is a hand-off to another thread. They must be unique, not secret: a Mersenne
#: Twister of this module's own, seeded from the kernel, again in a forked child, and out of
#: reach of code that seeds ``random``.
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


def _uuid4() -> str:
    value = _ids.getrandbits(128) & ~(0xF000 << 64) | (0x4000 << 64)  # version 4
    value = value & ~(0xC000 << 48) | (0x8000 << 48)  # RFC 4122 variant
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _trace_parent() -> str:
    """A new W3C ``traceparent``, as the host's activity for the invocation has (all-zero ids are invalid)."""
    return f"00-{_ids.getrandbits(128) or 1:032x}-{_ids.getrandbits(64) or 1:016x}-00"


# --- the worker's thread pool, as the runtime sizes it (for the start-up log) --------------

#: The runtime's app setting for the size of its sync-function thread pool.
THREAD_COUNT_SETTING = "PYTHON_THREADPOOL_THREAD_COUNT"


def default_thread_count() -> int:
    """``ThreadPoolExecutor``'s default size: ``min(32, cpu_count + 4)`` (3.13+: the CPUs this process may use)."""
    count_cpus = getattr(os, "process_cpu_count", os.cpu_count)
    return min(32, (count_cpus() or 1) + 4)


@dataclass(frozen=True)
class ThreadCount:
    """The size of the worker's sync-function pool, and where it comes from (for the start-up log)."""

    max_workers: int
    source: str
    warning: str | None = None


def worker_thread_count(environ: Mapping[str, str]) -> ThreadCount:
    """The pool ``azure-functions-runtime`` starts (``utils/threadpool.py``, ``start_threadpool_executor``).

    The app setting, when it is an integer of at least 1, is ``max_workers``; otherwise the
    runtime logs a warning and passes ``None``, so ``ThreadPoolExecutor`` picks its default
    ``min(32, cpu_count + 4)``. The worker runs on this machine, so the host can say which.
    """
    default = default_thread_count()
    default_source = f"ThreadPoolExecutor default min(32, cpu_count + 4) = {default}"
    text = environ.get(THREAD_COUNT_SETTING)
    if text is None:
        return ThreadCount(default, f"{THREAD_COUNT_SETTING} not set: {default_source}")
    try:
        value = int(text)
    except ValueError:
        return ThreadCount(
            default, default_source, f"{THREAD_COUNT_SETTING} must be an integer, got {text!r}; using the default"
        )
    if value < 1:
        return ThreadCount(
            default, default_source, f"{THREAD_COUNT_SETTING} must be at least 1, got {value}; using the default"
        )
    return ThreadCount(value, f"{THREAD_COUNT_SETTING}={value}")


# --- one invocation ------------------------------------------------------------------------


@dataclass
class TriggerValue:
    """What the trigger hands the worker: its data, its binding data, and details for the log line."""

    data: Any  # protos.TypedData
    metadata: Mapping[str, Any] = field(default_factory=dict)  # name -> protos.TypedData
    details: str = ""


class FunctionFailed(Exception):
    """The function raised (or the runtime could not convert its input or output): the worker's report."""

    def __init__(self, message: str, stack_trace: str = "") -> None:
        super().__init__(message)
        self.stack_trace = stack_trace


@dataclass
class Outcome:
    invocation_id: str
    succeeded: bool
    duration: float
    error: BaseException | None = None
    #: An HTTP trigger's response (``protos.RpcHttp``), or None when the function set none.
    http: Any = None


@dataclass
class Running:
    """An invocation sent to the worker by :meth:`Invoker.start`; :meth:`Invoker.finish` it once ``future`` is done."""

    spec: FunctionSpec
    trigger: TriggerValue
    invocation_id: str
    started: float
    future: concurrent.futures.Future  # of the protos.InvocationResponse
    returned: float = 0.0

    @property
    def sends_outputs(self) -> bool:
        """Whether finishing it may send output bindings (network calls: not on a thread that must not block)."""
        return any(binding.type != HTTP_OUTPUT for binding in self.spec.outputs)


class Invoker:
    """Sends invocations to the worker; once each is answered: its outputs, its log line."""

    def __init__(self, send_output: Callable[[Any, Any], None], workers: WorkerPool) -> None:
        self._send_output = send_output
        self._workers = workers

    def invoke(self, spec: FunctionSpec, trigger: TriggerValue) -> Outcome:
        """Run one invocation to its end (the calling thread waits while the worker runs the function)."""
        running = self.start(spec, trigger)
        concurrent.futures.wait([running.future])
        return self.finish(running)

    def start(
        self, spec: FunctionSpec, trigger: TriggerValue, on_return: Callable[[Running], None] | None = None
    ) -> Running:
        """Send the invocation and return; ``on_return(running)`` is called once the worker answered (on the
        thread that read the answer: keep it short)."""
        invocation_id = _uuid4()
        request = protos.InvocationRequest(
            invocation_id=invocation_id,
            function_id=spec.function_id,
            input_data=[protos.ParameterBinding(name=spec.trigger.name, data=trigger.data)],
            trigger_metadata=trigger.metadata,
            trace_context=protos.RpcTraceContext(trace_parent=_trace_parent(), trace_state="",
                                                 attributes={"ProcessId": str(os.getpid())}),
        )
        started = time.monotonic()
        future = self._workers.invoke(request, spec.name)
        running = Running(spec, trigger, invocation_id, started, future)

        def answered(_: concurrent.futures.Future) -> None:
            running.returned = time.monotonic()
            if on_return is not None:
                on_return(running)

        future.add_done_callback(answered)
        return running

    def finish(self, running: Running) -> Outcome:
        """The host's part once the worker answered: its outputs sent (only if it succeeded), the log line."""
        http = None
        error = running.future.exception()
        ended = running.returned or time.monotonic()
        if error is None:
            response = running.future.result()
            if response.result.status != protos.StatusResult.Success:
                exception = response.result.exception
                error = FunctionFailed(exception.message or "the function failed", exception.stack_trace)
            else:
                try:
                    http = self._outputs(running, response)
                except Exception as caught:  # a failed send fails the invocation
                    error = caught
                if running.sends_outputs:
                    ended = time.monotonic()
        outcome = Outcome(running.invocation_id, error is None, ended - running.started, error,
                          http=http if error is None else None)
        self._log(running.spec, running.trigger, outcome)
        return outcome

    def _outputs(self, running: Running, response: Any) -> Any:
        """Send each output binding's value; return the HTTP response, if any."""
        by_name = {item.name: item.data for item in response.output_data}
        if response.HasField("return_value"):
            by_name["$return"] = response.return_value
        http = None
        for binding in running.spec.outputs:
            value = by_name.get(binding.name)
            if value is None or value.WhichOneof("data") is None:
                continue
            if binding.type == HTTP_OUTPUT:
                http = value
            else:
                self._send_output(binding, value)
        return http

    @staticmethod
    def _log(spec: FunctionSpec, trigger: TriggerValue, outcome: Outcome) -> None:
        status = "Succeeded" if outcome.succeeded else "Failed"
        line = (
            f"Executed 'Functions.{spec.name}' ({status}, Id={outcome.invocation_id}, "
            f"Duration={outcome.duration * 1000:.0f}ms) trigger={spec.trigger_type}"
        )
        if trigger.details:
            line += f" {trigger.details}"
        if outcome.error is None:
            log.info(line)
            return
        error = outcome.error
        first = str(error).splitlines()[0] if str(error) else ""
        kind = "" if isinstance(error, FunctionFailed) else f"{type(error).__name__}: "
        line += f" error={kind}{first}".rstrip()
        trace = getattr(error, "stack_trace", "") or ""
        if trace:
            log.error("%s\n%s", line, "\n".join("    " + row for row in trace.rstrip().splitlines()))
        else:
            log.error("%s", line)


__all__ = ["FunctionFailed", "Invoker", "Outcome", "Running", "TriggerValue", "WorkerError"]
