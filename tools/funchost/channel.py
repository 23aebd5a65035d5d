"""The host side of FunctionRpc: worker processes, their gRPC streams, and invocations by id.

As the Functions host does (Azure/azure-functions-host, ``src/WebJobs.Script.Grpc``:
``Server/``, ``Channel/GrpcWorkerChannel.cs``; ``src/WebJobs.Script/Workers/Rpc``), this host
serves ``FunctionRpc`` on loopback and starts the worker processes itself:

- **One server, one stream per worker.** A worker connects and opens its stream with
  ``StartStream(worker_id)``; the host then sends ``WorkerInitRequest`` and, on the first
  worker, ``FunctionsMetadataRequest`` (the worker indexes ``function_app.py`` and answers
  with every function's bindings), then one ``FunctionLoadRequest`` per function the host
  will run. Each invocation is an ``InvocationRequest`` with a new id; its
  ``InvocationResponse`` is matched by that id.
- **Worker processes.** ``FUNCTIONS_WORKER_PROCESS_COUNT`` of them (default 1, at most 10,
  as the host's ``WorkerProcessCountOptions``); the invocations go round-robin to the ones
  that are ready, and wait while none is (the host buffers them the same way).
- **A worker that dies** fails every invocation it held (their triggers abandon or retry
  them, as for any failed invocation) and is started again. **A function that runs past
  host.json ``functionTimeout``** fails, and its worker is restarted, which fails what
  else it held: the Functions host, past the timeout, shuts down and starts again.
- **Logs.** Each ``RpcLog`` is logged by this host: the app's own records under their
  logger's name, the worker's and the runtime's under ``funchost.worker``.

The protocol's messages are ``.rpc.protos``; nothing here imports the app or Microsoft's runtime.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from .rpc import protos

log = logging.getLogger("funchost")
worker_log = logging.getLogger("funchost.worker")

#: ``python -m`` this to start a worker (``worker.py``: the stand-in for Microsoft's proxy worker).
WORKER_MODULE = f"{__package__}.worker"
#: Where ``tools.funchost`` imports from, put on the worker's PYTHONPATH.
IMPORT_ROOT = Path(__file__).resolve().parents[__package__.count(".") + 1]
PROCESS_COUNT_SETTING = "FUNCTIONS_WORKER_PROCESS_COUNT"
MAX_PROCESS_COUNT = 10
#: The host's limit on one gRPC message (``--grpcMaxMessageLength``: int.MaxValue in the Functions host).
MAX_MESSAGE_LENGTH = 2**31 - 1
#: The handshake's time limits, as the Functions host's ``WorkerProcessCountOptions`` and channel set them:
#: ``StartStream`` within 60 s of the start, ``WorkerInitResponse`` within 10 s, the metadata within 1 minute,
#: each load within max(functionTimeout, 1 minute).
START_STREAM_TIMEOUT_SECONDS = 60.0
INIT_TIMEOUT_SECONDS = 10.0
METADATA_TIMEOUT_SECONDS = 60.0
#: Workers after the first start one after another, this far apart (``ProcessStartupInterval``).
STARTUP_INTERVAL_SECONDS = 10.0
#: A worker that dies is started again after this long (``ProcessRestartInterval`` holds the next restart).
RESTART_DELAY_SECONDS = 1.0
#: The host gives up, and stops, at the third worker error (per worker process) within this window.
ERROR_WINDOW_SECONDS = 30 * 60.0
ERRORS_PER_PROCESS = 3
#: Past functionTimeout the invocation fails at once; if it has still not answered after this grace, its
#: worker is restarted (``WebScriptHostExceptionHandler.OnTimeoutExceptionAsync``: 2 s).
TIMEOUT_GRACE_SECONDS = 2.0
HOST_VERSION = "4.1043.0-funchost"
RUNTIME_NAME = "python"

_CLOSE = object()


class WorkerError(RuntimeError):
    """An invocation failed for a reason of the worker's, not the function's."""


class WorkerExited(WorkerError):
    """The worker process that held the invocation exited."""


class FunctionTimeout(WorkerError):
    """The invocation ran past host.json ``functionTimeout``."""


class AppIndexError(RuntimeError):
    """The worker could not start or index the app: no function can run."""


@dataclass(frozen=True)
class IndexedFunction:
    """A function as the worker indexed it: its id, name and bindings (raw, as in function.json)."""

    function_id: str
    name: str
    bindings: tuple[str, ...]
    metadata: Any = field(repr=False, compare=False)


def process_count(environ: Mapping[str, str]) -> int:
    """``FUNCTIONS_WORKER_PROCESS_COUNT``: 1 unless set to an integer from 1 to 10."""
    try:
        count = int(environ.get(PROCESS_COUNT_SETTING, "1"))
    except ValueError:
        return 1
    return count if 1 <= count <= MAX_PROCESS_COUNT else 1


def _exception_text(result: Any) -> str:
    exception = result.exception
    return (exception.message or result.result or "no details").strip()


# --- the gRPC server --------------------------------------------------------------------


class RpcServer:
    """The host's FunctionRpc server on 127.0.0.1; each worker's stream is handed to its channel."""

    def __init__(self) -> None:
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_LENGTH),
                   ("grpc.max_send_message_length", MAX_MESSAGE_LENGTH)]
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=2 * MAX_PROCESS_COUNT + 4,
                                                         thread_name_prefix="funchost-grpc")
        self._server = grpc.server(executor, options=options)
        protos.add_FunctionRpcServicer_to_server(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._expected: dict[str, WorkerChannel] = {}
        self._lock = threading.Lock()
        self._server.start()

    def expect(self, channel: WorkerChannel) -> None:
        with self._lock:
            self._expected[channel.worker_id] = channel

    def take(self, worker_id: str) -> WorkerChannel | None:
        with self._lock:
            return self._expected.pop(worker_id, None)

    def stop(self) -> None:
        self._server.stop(grace=1).wait(5)


class _Servicer(protos.FunctionRpcServicer):
    def __init__(self, server: RpcServer) -> None:
        self._server = server

    def EventStream(self, request_iterator: Iterator[Any], context: grpc.ServicerContext):  # noqa: N802 - the proto's name
        try:
            first = next(request_iterator)
        except (StopIteration, grpc.RpcError):
            return
        channel = self._server.take(first.start_stream.worker_id) if first.HasField("start_stream") else None
        if channel is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "expected StartStream from a worker this host started")
        outgoing: queue.Queue = queue.Queue()
        context.add_callback(lambda: outgoing.put(_CLOSE))
        channel.attach(outgoing, request_iterator)
        while (message := outgoing.get()) is not _CLOSE:
            yield message


# --- one worker -------------------------------------------------------------------------


class WorkerChannel:
    """One worker process and its stream: the handshake, invocations by id, and its end."""

    def __init__(self, server: RpcServer, app_dir: Path, environ: Mapping[str, str], number: int,
                 on_exit: Callable[[WorkerChannel, int], None]) -> None:
        #: Set when the host restarts it after a function timeout: what else it held is not failed.
        self.dropped = False
        self.server = server
        self.app_dir = app_dir
        self.environ = environ
        self.number = number
        self.worker_id = str(uuid.uuid4())
        self.request_id = str(uuid.uuid4())
        self._on_exit = on_exit
        self.process: subprocess.Popen | None = None
        self._outgoing: queue.Queue | None = None
        self._attached = threading.Event()
        self._replies: dict[str, queue.Queue] = {}
        self._pending: dict[str, tuple[concurrent.futures.Future, float, str]] = {}
        self._lock = threading.Lock()
        self.ready = False
        self.exited = threading.Event()
        self.exit_code: int | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    # --- the process ---

    def start(self) -> None:
        self.server.expect(self)
        env = dict(self.environ)
        env["FUNCTIONS_WORKER_DIRECTORY"] = str(Path(__file__).resolve().parent)
        env["FUNCTIONS_APPLICATION_DIRECTORY"] = str(self.app_dir)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(IMPORT_ROOT), env.get("PYTHONPATH", "")) if p)
        args = [sys.executable, "-m", WORKER_MODULE]
        args += ["--host", "127.0.0.1", "--port", str(self.server.port), "--workerId", self.worker_id,
                 "--requestId", self.request_id, "--grpcMaxMessageLength", str(MAX_MESSAGE_LENGTH),
                 "--functions-uri", f"http://127.0.0.1:{self.server.port}/", "--functions-worker-id",
                 self.worker_id, "--functions-request-id", self.request_id,
                 "--functions-grpc-max-message-length", str(MAX_MESSAGE_LENGTH)]
        self.started_at = time.monotonic()
        # The worker writes to the host's own stdout and stderr (before its stream opens, and if it fails). It runs
        # in a session of its own: a Ctrl-C at the terminal, or a signal to the host's process group, reaches the
        # host, which drains and then ends its workers (WorkerTerminate), as the Functions host does; the worker
        # exits by itself when its stream to the host ends (the host killed).
        self.process = subprocess.Popen(args, cwd=self.app_dir, env=env, start_new_session=True)
        log.info("worker %d: process %d started (worker id %s)", self.number, self.process.pid, self.worker_id)
        threading.Thread(target=self._watch, name=f"funchost-worker-{self.number}-watch", daemon=True).start()

    def _watch(self) -> None:
        assert self.process is not None
        code = self.process.wait()
        self.exit_code = code
        self.ready = False
        self.server.take(self.worker_id)
        self.exited.set()
        if self._outgoing is not None:
            self._outgoing.put(_CLOSE)
        for reply in list(self._replies.values()):
            reply.put(None)
        if not self.dropped:
            self._fail_all(WorkerExited(f"the worker process {self.process.pid} exited with code {code}"))
        self._on_exit(self, code)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()

    def terminate(self, grace: float) -> None:
        """``WorkerTerminate``, then the process is killed if it is still there after ``grace``."""
        if self.process is None or self.process.poll() is not None:
            return
        if self._outgoing is not None:
            self._send(worker_terminate=protos.WorkerTerminate(grace_period={"seconds": int(grace)}))
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    # --- the stream ---

    def attach(self, outgoing: queue.Queue, incoming: Iterator[Any]) -> None:
        """Called by the server once the worker opened its stream."""
        self._outgoing = outgoing
        threading.Thread(target=self._read, args=(incoming,), name=f"funchost-worker-{self.number}-read",
                         daemon=True).start()
        self._attached.set()

    def _send(self, **content: Any) -> None:
        assert self._outgoing is not None
        self._outgoing.put(protos.StreamingMessage(request_id=self.request_id, **content))

    def _read(self, incoming: Iterator[Any]) -> None:
        try:
            for message in incoming:
                self._received(message)
        except grpc.RpcError:
            pass  # the worker went away: its process watcher fails what it held

    def _received(self, message: Any) -> None:
        content = message.WhichOneof("content")
        if content == "invocation_response":
            response = message.invocation_response
            with self._lock:
                pending = self._pending.pop(response.invocation_id, None)
            if pending is not None:
                pending[0].set_result(response)
        elif content == "rpc_log":
            self._log(message.rpc_log)
        elif content in self._replies:
            self._replies[content].put(getattr(message, content))
        elif content == "worker_status_response":
            pass
        else:
            worker_log.debug("worker %d: ignoring %s", self.number, content)

    def call(self, request_field: str, request: Any, reply_field: str, timeout: float) -> Any:
        """One request of the handshake and its reply (one at a time per kind)."""
        started = self._attached.wait(max(0.0, self.started_at + START_STREAM_TIMEOUT_SECONDS - time.monotonic()))
        if not started or self.exited.is_set():
            raise WorkerError(self._why_not_started())
        reply: queue.Queue = queue.Queue()
        self._replies[reply_field] = reply
        try:
            self._send(**{request_field: request})
            try:
                answer = reply.get(timeout=timeout)
            except queue.Empty:
                raise WorkerError(f"the worker did not answer {request_field} within {timeout:.0f} s") from None
        finally:
            self._replies.pop(reply_field, None)
        if answer is None:
            raise WorkerError(self._why_not_started())
        return answer

    def _why_not_started(self) -> str:
        if self.exited.is_set():
            return f"the worker process exited with code {self.exit_code} (its output is in the log above)"
        return "the worker did not connect"

    # --- invocations ---

    def invoke(self, request: Any, future: concurrent.futures.Future, function_name: str) -> None:
        with self._lock:
            self._pending[request.invocation_id] = (future, time.monotonic(), function_name)
        if self.exited.is_set():
            self._fail_all(WorkerExited("the worker process exited"))
            return
        self._send(invocation_request=request)

    def overdue(self, timeout: float) -> list[tuple[str, str, concurrent.futures.Future]]:
        """The invocations running for longer than ``timeout`` seconds: (id, function name, future)."""
        now = time.monotonic()
        with self._lock:
            return [(key, name, future) for key, (future, started, name) in self._pending.items()
                    if now - started > timeout]

    def _log(self, entry: Any) -> None:
        """As the Functions host logs an ``RpcLog``: the worker's own under its channel's category (every level
        but Warning and Error as Information); the app's under ``Function.<name>.User``, and only while its
        invocation runs (others are dropped, as the host drops them)."""
        if entry.log_category == protos.RpcLog.RpcLogCategory.System:
            level = {protos.RpcLog.Warning: logging.WARNING, protos.RpcLog.Error: logging.ERROR}.get(
                entry.level, logging.INFO)
            logger = logging.getLogger(f"Worker.LanguageWorkerChannel.{RUNTIME_NAME}")
        else:
            with self._lock:
                pending = self._pending.get(entry.invocation_id) if entry.invocation_id else None
            if pending is None:
                worker_log.debug("Ignoring RpcLog from invocation '%s' because there is no matching invocation: %s",
                                 entry.invocation_id, entry.message)
                return
            level = _RPC_LEVELS.get(entry.level, logging.INFO)
            logger = logging.getLogger(f"Function.{pending[2]}.User")
        if logger.isEnabledFor(level):
            logger.log(level, "%s", entry.message)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def fail(self, invocation_id: str, error: Exception) -> None:
        with self._lock:
            pending = self._pending.pop(invocation_id, None)
        if pending is not None and not pending[0].done():
            pending[0].set_exception(error)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for future, _, _ in pending.values():
            if not future.done():
                future.set_exception(error)


_RPC_LEVELS = {
    protos.RpcLog.Trace: logging.DEBUG,
    protos.RpcLog.Debug: logging.DEBUG,
    protos.RpcLog.Information: logging.INFO,
    protos.RpcLog.Warning: logging.WARNING,
    protos.RpcLog.Error: logging.ERROR,
    protos.RpcLog.Critical: logging.CRITICAL,
}


# --- the workers together -------------------------------------------------------------------


class WorkerPool:
    """The app's worker processes: started, indexed, loaded, restarted; each invocation to one of them.

    ``on_give_up`` is called when workers keep failing (the third error per worker process within
    30 minutes): the Functions host then stops ("proactively recycling the Functions Host").
    """

    def __init__(self, app_dir: Path, environ: Mapping[str, str], *, count: int = 1,
                 function_timeout: float | None = None, startup_interval: float = STARTUP_INTERVAL_SECONDS,
                 on_give_up: Callable[[str], None] | None = None) -> None:
        self.app_dir = Path(app_dir)
        self.environ = environ
        self.count = count
        self.function_timeout = function_timeout
        self.startup_interval = startup_interval
        self._on_give_up = on_give_up or (lambda reason: None)
        self.functions: list[IndexedFunction] = []
        self._loaded: list[IndexedFunction] = []
        self._server: RpcServer | None = None
        self._channels: list[WorkerChannel] = []
        self._ready: list[WorkerChannel] = []
        self._waiting: list[tuple[Any, concurrent.futures.Future, str]] = []
        self._errors: list[float] = []
        self._given_up = False
        self._round = itertools.count()
        self._lock = threading.Lock()
        self._restart_lock = threading.Lock()
        self._closing = threading.Event()
        self._numbers = itertools.count()

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [channel.pid for channel in self._channels if channel.pid and not channel.exited.is_set()]

    @property
    def load_timeout(self) -> float:
        """Each ``FunctionLoadRequest``'s limit: max(functionTimeout, 1 minute), none without a functionTimeout."""
        return max(self.function_timeout, 60.0) if self.function_timeout else 24 * 3600.0

    def index(self) -> list[IndexedFunction]:
        """Start the first worker, initialize it and ask it for the app's functions."""
        self._server = RpcServer()
        first = self._new_channel()
        try:
            self._initialize(first)
            answer = first.call("functions_metadata_request",
                                protos.FunctionsMetadataRequest(function_app_directory=str(self.app_dir)),
                                "function_metadata_response", METADATA_TIMEOUT_SECONDS)
        except (WorkerError, AppIndexError) as error:
            self.close(0)
            raise AppIndexError(str(error) if isinstance(error, AppIndexError)
                                else f"the worker could not start: {error}") from error
        if answer.result.status == protos.StatusResult.Failure:
            self.close(0)
            raise AppIndexError(f"the worker could not index the app: {_exception_text(answer.result)}")
        self.functions = [
            IndexedFunction(item.function_id, item.name, tuple(item.raw_bindings), item)
            for item in answer.function_metadata_results
        ]
        return self.functions

    def _new_channel(self) -> WorkerChannel:
        assert self._server is not None
        channel = WorkerChannel(self._server, self.app_dir, self.environ, next(self._numbers), self._exited)
        with self._lock:
            self._channels.append(channel)
        channel.start()
        return channel

    def _initialize(self, channel: WorkerChannel) -> None:
        init = protos.WorkerInitRequest(
            host_version=HOST_VERSION, worker_directory=str(Path(__file__).resolve().parent),
            function_app_directory=str(self.app_dir),
        )
        answer = channel.call("worker_init_request", init, "worker_init_response", INIT_TIMEOUT_SECONDS)
        if answer.result.status == protos.StatusResult.Failure:
            raise AppIndexError(f"the worker could not load the app: {_exception_text(answer.result)}")

    def _load(self, channel: WorkerChannel) -> None:
        for function in self._loaded:
            answer = channel.call(
                "function_load_request",
                protos.FunctionLoadRequest(function_id=function.function_id, metadata=function.metadata),
                "function_load_response", self.load_timeout,
            )
            if answer.result.status == protos.StatusResult.Failure:
                raise WorkerError(f"the worker could not load {function.name}: {_exception_text(answer.result)}")

    def load(self, functions: list[IndexedFunction]) -> None:
        """Load these functions on the first worker; the others start one after another, each loaded too."""
        self._loaded = list(functions)
        first = self._channels[0]
        self._load(first)
        self._became_ready(first)
        if self.count > 1:
            threading.Thread(target=self._start_others, name="funchost-worker-start", daemon=True).start()
        if self.function_timeout:
            threading.Thread(target=self._watch_timeouts, name="funchost-function-timeout", daemon=True).start()

    def _start_others(self) -> None:
        for _ in range(1, self.count):
            if self._closing.wait(self.startup_interval) or not self._start_one():
                return

    def _start_one(self) -> bool:
        """Start, initialize and load one more worker; False if it failed (counted as a worker error)."""
        channel = self._new_channel()
        try:
            self._initialize(channel)
            self._load(channel)
        except (WorkerError, AppIndexError) as error:
            if self._closing.is_set():
                return False
            log.error("worker %d could not start: %s", channel.number, error)
            channel.dropped = True  # its exit is this error, not another one
            channel.kill()
            self._error(f"worker {channel.number} could not start: {error}")
            return False
        self._became_ready(channel)
        return True

    def _became_ready(self, channel: WorkerChannel) -> None:
        with self._lock:
            if channel.exited.is_set():
                return
            channel.ready = True
            self._ready.append(channel)
            waiting, self._waiting = self._waiting, []
        log.info("worker %d: ready (process %d)", channel.number, channel.pid)
        for request, future, name in waiting:
            self._send(request, future, name)

    def _exited(self, channel: WorkerChannel, code: int) -> None:
        with self._lock:
            was_ready = channel in self._ready or channel.dropped
            if channel in self._ready:
                self._ready.remove(channel)
            if channel in self._channels and not channel.in_flight():
                self._channels.remove(channel)
        if self._closing.is_set() or not was_ready:
            return
        if channel.dropped:
            log.warning("worker %d: process %s stopped; starting a new one", channel.number, channel.pid)
            self._restart()
            return
        log.error("Language Worker Process exited. Pid=%s; worker %d exited with code %s",
                  channel.pid, channel.number, code)
        self._error(f"worker {channel.number} exited with code {code}")

    def _error(self, reason: str) -> None:
        """A worker error: restart a worker, unless this is the third within the window (per process)."""
        now = time.monotonic()
        with self._lock:
            if self._errors and now - self._errors[-1] > ERROR_WINDOW_SECONDS:
                self._errors.clear()
            self._errors.append(now)
            given_up = len(self._errors) >= ERRORS_PER_PROCESS * self.count
        if given_up:
            log.error("Exceeded language worker restart retry count for runtime:%s. Shutting down and proactively "
                      "recycling the Functions Host to recover (%s)", RUNTIME_NAME, reason)
            self._given_up = True
            with self._lock:
                waiting, self._waiting = self._waiting, []
            for _, future, _ in waiting:  # no worker will run them: they fail now, their triggers retry
                if not future.done():
                    future.set_exception(WorkerError("the host is stopping: its workers kept failing"))
            self._on_give_up(reason)
            return
        self._restart()

    def _restart(self) -> None:
        threading.Thread(target=self._restart_one, name="funchost-worker-restart", daemon=True).start()

    def _restart_one(self) -> None:
        with self._restart_lock:  # one restart at a time, as the host's dispatcher does
            if self._closing.wait(RESTART_DELAY_SECONDS):
                return
            self._start_one()

    def invoke(self, request: Any, function_name: str) -> concurrent.futures.Future:
        """Send the invocation to a ready worker (round-robin), or hold it until one is ready."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(request, future, function_name)
        return future

    def _send(self, request: Any, future: concurrent.futures.Future, function_name: str) -> None:
        with self._lock:
            if self._closing.is_set() or self._given_up:
                future.set_exception(WorkerError("the host is stopping"))
                return
            if not self._ready:
                self._waiting.append((request, future, function_name))
                return
            channel = self._ready[next(self._round) % len(self._ready)]
        channel.invoke(request, future, function_name)

    def _watch_timeouts(self) -> None:
        assert self.function_timeout is not None
        limit = self.function_timeout
        timed_out: dict[str, tuple[WorkerChannel, float]] = {}
        while not self._closing.wait(0.5):
            with self._lock:
                channels = list(self._channels)
            now = time.monotonic()
            for channel in channels:
                for invocation_id, name, _ in channel.overdue(limit):
                    if invocation_id in timed_out:
                        continue
                    log.error("Timeout value of %s exceeded by function 'Functions.%s' (Id: '%s'). "
                              "Initiating cancellation.", _span(limit), name, invocation_id)
                    channel.fail(invocation_id, FunctionTimeout(
                        f"Timeout value of {_span(limit)} was exceeded by function: Functions.{name}"))
                    timed_out[invocation_id] = (channel, now)
            for invocation_id, (channel, when) in list(timed_out.items()):
                if now - when < TIMEOUT_GRACE_SECONDS:
                    continue
                del timed_out[invocation_id]
                if channel.exited.is_set() or channel.dropped:
                    continue
                # The response never came: the host restarts the worker that ran it. What else that worker
                # held is not failed: each waits for its own timeout, as in the Functions host.
                log.warning("A function timeout has occurred. Restarting worker process executing "
                            "invocationId '%s'.", invocation_id)
                channel.dropped = True
                with self._lock:
                    if channel in self._ready:
                        self._ready.remove(channel)
                channel.kill()
            with self._lock:  # dropped channels whose invocations have all timed out
                self._channels = [c for c in self._channels if not (c.exited.is_set() and not c.in_flight())]

    def close(self, grace: float = 5.0) -> None:
        self._closing.set()
        with self._lock:
            channels = list(self._channels)
            waiting, self._waiting = self._waiting, []
        for _, future, _ in waiting:
            if not future.done():
                future.set_exception(WorkerError("the host is stopping"))
        for channel in channels:
            channel.terminate(grace)
            channel._fail_all(WorkerError("the host stopped"))
        if self._server is not None:
            self._server.stop()


def _span(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"
