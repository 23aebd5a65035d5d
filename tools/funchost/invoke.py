"""Call a user function the way the Python worker does, then flush its output bindings.

- Arguments are bound by binding name: the trigger value (the rich object, or the
  body as ``str``/``bytes`` when the parameter is annotated so), a fresh ``Out`` for
  each output binding, and ``context`` when the function asks for it.
- As in the Python worker (``azure_functions_worker/dispatcher.py``), every plain
  (sync) function of the app runs on ONE shared thread pool, sized by the app setting
  ``PYTHON_THREADPOOL_THREAD_COUNT`` or, unset (or invalid), by ``ThreadPoolExecutor``'s
  default ``min(32, os.cpu_count() + 4)``; every ``async def`` function runs on ONE
  event loop. An invocation beyond the pool's size waits in the pool's queue, while
  the trigger (the host's side) keeps its message locked. See README "Concurrency".
- Output values are sent only after the function returned; nothing is sent when it
  raised. A failure to send fails the invocation, so the trigger message is retried.
- :meth:`Invoker.invoke` runs one invocation and waits for it; :meth:`Invoker.start` hands
  the function to the worker and returns, telling the caller when the function has
  returned, and :meth:`Invoker.finish` then does the host's part (outputs, the log line),
  so that a trigger need not keep a thread of its own waiting for each invocation.
- An ``http`` output (an HTTP trigger's response) is not sent anywhere: it is encoded
  by the worker's own converter (``azure.functions.http.HttpResponseConverter``, which
  refuses what the worker refuses, failing the invocation) and handed back in the
  :class:`Outcome` for the HTTP server to write.
- Each invocation is logged in one line to stderr: function, trigger, id, duration
  and outcome (plus the traceback on the following lines when it failed), and
  ``Cpu=``: the CPU time the function itself used (its worker thread's CPU clock while
  it ran; for an ``async def``, the event loop thread's while it stepped the
  coroutine). That is the work Azure's Python worker would do; the rest of this
  process's CPU is this host emulating Azure's (triggers, settlement, outputs, HTTP).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import azure.functions as func
from azure.functions import _abc
from azure.functions.http import HttpResponseConverter

from .app import HTTP_OUTPUT, FunctionSpec

log = logging.getLogger("funchost")

#: Invocation ids and trace contexts (three random ids per invocation) are drawn here, not by
#: ``uuid.uuid4()``: that reads the kernel's random bytes, a system call around which CPython
#: lets go of the GIL, and under load every let-go is a hand-off to another thread. They must
#: be unique, not secret: a Mersenne Twister of this module's own, seeded from the kernel, again
#: in a forked child, and out of reach of code that seeds ``random``.
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


class Out(func.Out):
    """The value an output binding parameter was set to."""

    def __init__(self) -> None:
        self._value: Any = None

    def set(self, val: Any) -> None:
        self._value = val

    def get(self) -> Any:
        return self._value


class _TraceContext(_abc.TraceContext):
    def __init__(self, trace_parent: str) -> None:
        self._trace_parent = trace_parent

    @property
    def trace_state(self) -> str:
        return ""

    @property
    def trace_parent(self) -> str:
        return self._trace_parent

    @property
    def attributes(self) -> dict[str, str]:
        return {}


class _RetryContext(_abc.RetryContext):
    @property
    def retry_count(self) -> int:
        return 0

    @property
    def max_retry_count(self) -> int:
        return 0

    @property
    def exception(self) -> Any:
        return None


class Context(func.Context):
    """``azure.functions.Context`` for one invocation."""

    _local = threading.local()

    def __init__(self, invocation_id: str, function_name: str, function_directory: str) -> None:
        self._invocation_id = invocation_id
        self._function_name = function_name
        self._function_directory = function_directory
        trace_id, parent_id = _ids.getrandbits(128) or 1, _ids.getrandbits(64) or 1  # all-zero ids are invalid
        self._trace_context = _TraceContext(f"00-{trace_id:032x}-{parent_id:016x}-00")

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> threading.local:
        return self._local

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def function_directory(self) -> str:
        return self._function_directory

    @property
    def trace_context(self) -> _abc.TraceContext:
        return self._trace_context

    @property
    def retry_context(self) -> _abc.RetryContext:
        return _RetryContext()


class AsyncRunner:
    """One event loop in a daemon thread for ``async def`` functions."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="funchost-event-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


#: The worker's app setting for the size of its sync-function thread pool.
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
    """Size the sync pool as the Python worker does on Python 3.9+ (``Dispatcher._get_sync_tp_max_workers``).

    The app setting, when it is an integer of at least 1, is ``max_workers`` (no upper
    bound since Python 3.8); otherwise the worker logs a warning and passes ``None``,
    so ``ThreadPoolExecutor`` picks its default ``min(32, cpu_count + 4)``.
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


class Worker:
    """Where the Python worker runs functions: one thread pool for all sync functions, one event loop for async ones."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.thread_count = worker_thread_count(environ)
        self._pool = ThreadPoolExecutor(max_workers=self.thread_count.max_workers, thread_name_prefix="worker-sync")
        self._runner = AsyncRunner()

    @property
    def max_workers(self) -> int:
        return self.thread_count.max_workers

    def run_sync(self, function: Callable[..., Any], args: dict[str, Any], context: Context, cpu: CpuTime) -> Any:
        """Run a plain function on the shared pool and wait for it (queued while every thread is busy);
        adds the CPU time its thread spent in it to ``cpu``."""
        return self.submit_sync(function, args, context, cpu).result()

    def submit_sync(
        self, function: Callable[..., Any], args: dict[str, Any], context: Context, cpu: CpuTime
    ) -> concurrent.futures.Future:
        """:meth:`run_sync` without waiting: the future of its result."""
        return self._pool.submit(self._call_sync, function, args, context, cpu)

    @staticmethod
    def _call_sync(function: Callable[..., Any], args: dict[str, Any], context: Context, cpu: CpuTime) -> Any:
        # As the worker's _run_sync_func: the invocation id in the pool thread's local storage.
        context.thread_local_storage.invocation_id = context.invocation_id
        started = time.thread_time()
        try:
            return function(**args)
        finally:
            cpu.seconds += time.thread_time() - started
            cpu.returned = time.monotonic()
            context.thread_local_storage.invocation_id = None

    def run_async(self, coroutine, cpu: CpuTime) -> Any:
        """Run a coroutine on the event loop and wait for it; adds the CPU time the loop's thread
        spent stepping it to ``cpu``."""
        return self.submit_async(coroutine, cpu).result()

    def submit_async(self, coroutine, cpu: CpuTime) -> concurrent.futures.Future:
        """:meth:`run_async` without waiting: the future of its result."""
        return self._runner.submit(_timed(coroutine, cpu))

    def close(self) -> None:
        """Drop what still waits for a thread (its messages are abandoned or released by then) and stop the loop."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._runner.close()


@dataclass
class CpuTime:
    """CPU seconds one invocation's function used, and when it returned (``time.monotonic()``);
    written by the thread that ran it."""

    seconds: float = 0.0
    returned: float = 0.0


class _TimedSteps:
    """Awaits a coroutine as ``await`` would, adding the thread CPU time of each of its steps
    to ``cpu`` (the time it waits, and other invocations' steps, are not counted)."""

    def __init__(self, coroutine, cpu: CpuTime) -> None:
        self._coroutine, self._cpu = coroutine, cpu

    def __await__(self):
        steps = self._coroutine.__await__()
        send, value = steps.send, None
        while True:
            started = time.thread_time()
            try:
                awaited = send(value)
            except StopIteration as done:
                self._cpu.returned = time.monotonic()
                return done.value
            except BaseException:
                self._cpu.returned = time.monotonic()
                raise
            finally:
                self._cpu.seconds += time.thread_time() - started
            try:
                value, send = (yield awaited), steps.send
            except BaseException as error:  # noqa: BLE001 - cancellation and the like go to the coroutine
                value, send = error, steps.throw


async def _timed(coroutine, cpu: CpuTime):
    return await _TimedSteps(coroutine, cpu)


@dataclass
class TriggerValue:
    """What the trigger delivers: the rich object, its body, and details for the log line."""

    rich: Any
    body: bytes
    details: str = ""

    def form(self, form: str) -> Any:
        if form == "bytes":
            return self.body
        if form == "str":
            return self.body.decode("utf-8")
        return self.rich


@dataclass
class Outcome:
    invocation_id: str
    succeeded: bool
    duration: float
    error: BaseException | None = None
    #: CPU seconds the function itself used (the Python worker's share, see the module's docstring).
    cpu: float = 0.0
    #: What the function set on its ``http`` output, encoded as the worker encodes it (None if nothing).
    http: Any = None


@dataclass
class Running:
    """An invocation handed to the worker by :meth:`Invoker.start`; :meth:`Invoker.finish` it once
    ``future`` is done."""

    spec: FunctionSpec
    trigger: TriggerValue
    invocation_id: str
    started: float
    cpu: CpuTime
    outs: dict[str, Out]
    future: concurrent.futures.Future

    @property
    def sends_outputs(self) -> bool:
        """Whether finishing it may send output bindings (network calls: not on a thread that must not block)."""
        return any(binding.type != HTTP_OUTPUT for binding in self.spec.outputs)


class Invoker:
    """Runs invocations: binds arguments, calls, sends outputs, logs one line per invocation."""

    def __init__(self, send_output: Callable[[Any, Any], None], worker: Worker, function_directory: str) -> None:
        self._send_output = send_output
        self._worker = worker
        self._function_directory = function_directory

    def invoke(self, spec: FunctionSpec, trigger: TriggerValue) -> Outcome:
        """Run one invocation to its end (the calling thread waits while the worker runs the function)."""
        running = self.start(spec, trigger)
        concurrent.futures.wait([running.future])
        return self.finish(running)

    def start(
        self, spec: FunctionSpec, trigger: TriggerValue, on_return: Callable[[Running], None] | None = None
    ) -> Running:
        """Hand the function to the worker and return; ``on_return(running)`` is called on the thread that ran
        it once it has returned or raised (keep it short: that thread is the worker's)."""
        invocation_id = str(uuid.UUID(int=_ids.getrandbits(128), version=4))
        started = time.monotonic()
        args: dict[str, Any] = {}
        outs: dict[str, Out] = {}
        context = Context(invocation_id, spec.name, self._function_directory)
        for param in spec.params:
            if param.kind == "trigger":
                args[param.name] = trigger.form(param.form)
            elif param.kind == "out":
                outs[param.name] = args[param.name] = Out()
            else:
                args[param.name] = context
        cpu = CpuTime()
        # The calling thread is the trigger's (the host's side); the function runs in the worker.
        try:
            if spec.is_async:
                future = self._worker.submit_async(spec.user_function(**args), cpu)
            else:
                future = self._worker.submit_sync(spec.user_function, args, context, cpu)
        except Exception as error:  # calling an async def can raise at once (its arguments)
            future = concurrent.futures.Future()
            future.set_exception(error)
        running = Running(spec, trigger, invocation_id, started, cpu, outs, future)
        if on_return is not None:
            future.add_done_callback(lambda _: on_return(running))
        return running

    def finish(self, running: Running) -> Outcome:
        """The host's part once the function returned: its outputs sent (only if it succeeded), the log line."""
        http = None
        try:
            error = running.future.exception()
        except concurrent.futures.CancelledError as cancelled:  # dropped from the pool's queue at shutdown
            error = cancelled
        ended = running.cpu.returned or time.monotonic()
        if error is None:
            try:
                http = self._send_outputs(running)
            except Exception as caught:  # a refused HTTP response or a failed send fails the invocation
                error = caught
            if running.sends_outputs:
                ended = time.monotonic()
        outcome = Outcome(
            running.invocation_id, error is None, ended - running.started, error,
            http=http if error is None else None, cpu=running.cpu.seconds,
        )
        self._log(running.spec, running.trigger, outcome)
        return outcome

    def _send_outputs(self, running: Running) -> Any:
        result = running.future.result()
        values = [
            (binding, result if binding.name == "$return" else running.outs[binding.name].get())
            for binding in running.spec.outputs
        ]
        http = None
        for binding, value in values:
            if binding.type == HTTP_OUTPUT and value is not None:
                # The worker encodes every output before the host sends any: a response
                # its converter refuses fails the invocation, and nothing is sent.
                try:
                    http = HttpResponseConverter.encode(value, expected_type=None)
                except NotImplementedError:
                    raise TypeError(
                        f'unable to encode outgoing TypedData: unsupported type "{HttpResponseConverter}" '
                        f'for Python type "{type(value).__name__}"'
                    ) from None
        for binding, value in values:
            if binding.type != HTTP_OUTPUT and value is not None:
                self._send_output(binding, value)
        return http

    @staticmethod
    def _log(spec: FunctionSpec, trigger: TriggerValue, outcome: Outcome) -> None:
        status = "Succeeded" if outcome.succeeded else "Failed"
        line = (
            f"Executed 'Functions.{spec.name}' ({status}, Id={outcome.invocation_id}, "
            f"Duration={outcome.duration * 1000:.0f}ms) Cpu={outcome.cpu * 1000:.2f}ms trigger={spec.trigger_type}"
        )
        if trigger.details:
            line += f" {trigger.details}"
        if outcome.error is None:
            log.info(line)
        else:
            error = outcome.error
            first = str(error).splitlines()[0] if str(error) else ""
            line += f" error={type(error).__name__}: {first}".rstrip()
            trace = _user_traceback(error)
            log.error("%s\n%s", line, "\n".join("    " + row for row in trace.splitlines()))


_HOST_DIR = os.path.dirname(os.path.abspath(__file__))
_PLUMBING = (_HOST_DIR, os.path.dirname(asyncio.__file__), os.path.dirname(concurrent.futures.__file__))


def _user_traceback(error: BaseException) -> str:
    """The traceback from the function down, without this host's and the thread/event-loop plumbing frames."""
    report = traceback.TracebackException.from_exception(error)
    for item in _chain(report):
        frames = [frame for frame in item.stack if not frame.filename.startswith(_PLUMBING)]
        item.stack = traceback.StackSummary.from_list(frames or list(item.stack))
    return "".join(report.format()).rstrip()


def _chain(report: traceback.TracebackException):
    seen = set()
    while report is not None and id(report) not in seen:
        seen.add(id(report))
        yield report
        report = report.__cause__ or (None if report.__suppress_context__ else report.__context__)
