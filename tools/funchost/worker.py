"""The worker process: a small stand-in for Microsoft's Python proxy worker, with ``azure-functions-runtime`` behind it.

On Python 3.13 and later, Azure runs a Python Function app in a worker process beside the
Functions host: a thin *proxy worker* that ships with the host (Azure/azure-functions-python-worker,
``workers/proxy_worker``; not on PyPI) holds the gRPC stream and hands each request to the
*runtime*, ``azure-functions-runtime`` (on PyPI, pinned in the app's requirements.txt), which
does the work: indexing ``function_app.py``, converting each binding's data, running the
function (sync ones on its thread pool, ``async def`` ones on the event loop) and converting
what it returns. This module plays the proxy's part and nothing more:

- the command line the host starts a worker with (``--host --port --workerId --requestId
  --grpcMaxMessageLength`` and their ``--functions-*`` forms: Azure/azure-functions-host,
  ``src/WebJobs.Script/Workers/Rpc/RpcWorkerContext.cs``);
- one gRPC stream to the host (``FunctionRpc.EventStream``), opened with ``StartStream``; a
  thread reads it and hands each message to the event loop as a task of its own, and replies
  go out through one queue, as Microsoft's proxy worker does (Azure/azure-functions-python-worker,
  ``workers/proxy_worker/dispatcher.py``: ``Dispatcher.__poll_grpc``, ``_dispatch_grpc_request``);
- the runtime's five verbs, called as the proxy calls them: ``worker_init_request`` (the
  runtime's thread pool started just before it), ``functions_metadata_request``,
  ``function_load_request``, ``invocation_request`` and ``function_environment_reload_request``,
  each with the host's message in a ``WorkerRequest`` (the protos injected in
  ``properties["protos"]`` at init and reload: ``tools.funchost.rpc``); one INFO line per
  invocation received (``Received FunctionInvocationRequest, ...``), as the proxy logs it;
- ``WorkerStatusRequest`` answered, ``WorkerTerminate`` obeyed; ``InvocationCancel`` ignored
  (the runtime cannot cancel);
- logging: once the stream is open, every log record of the process goes to the host as an
  ``RpcLog`` (``System`` for the runtime's and this module's own loggers, ``User`` for the
  app's), with the invocation it belongs to when there is one. One difference: Microsoft's
  proxy takes that invocation from a process-wide "current invocation" set by each invocation
  request, so under concurrency a record may be sent with another invocation's id (and the
  host then logs it under that function, or drops it once that invocation is done); this
  stand-in takes it from the record's own context (the invocation's task, or the runtime's
  ``invocation_id_cv`` in a sync function's thread).

When the stream ends (the host stopped or died), the process exits at once, whatever its
functions are doing: the host has settled or will redeliver what they held.

Run by the host: ``python -m tools.funchost.worker --host 127.0.0.1 --port N --workerId ID --requestId ID``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc

from .rpc import protos

log = logging.getLogger("funchost.worker")

#: Loggers whose records are the worker's own (``RpcLog.System``); the rest are the app's (``User``).
SYSTEM_LOGGERS = ("funchost.worker", "azure.functions", "azure_functions_runtime")
#: The runtime (the v2 programming model's; ``azure-functions-runtime-v1`` would be the v1 model's).
RUNTIME_MODULE = "azure_functions_runtime"
CONNECT_TIMEOUT_SECONDS = 5.0

_STOP = object()
_invocation_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("funchost_invocation_id", default=None)

#: The reply each request gets, by the request's field in ``StreamingMessage``.
_REPLIES = {
    "worker_init_request": "worker_init_response",
    "functions_metadata_request": "function_metadata_response",
    "function_load_request": "function_load_response",
    "invocation_request": "invocation_response",
    "function_environment_reload_request": "function_environment_reload_response",
}


@dataclass
class WorkerRequest:
    """What the proxy hands the runtime: the request's name, the host's message, and (at init) the protos."""

    name: str
    request: Any
    properties: dict[str, Any] | None = None


#: The runtime's verbs, with the name the proxy gives each request.
_NAMES = {
    "worker_init_request": "WorkerInitRequest",
    "functions_metadata_request": "WorkerMetadataRequest",
    "function_load_request": "FunctionLoadRequest",
    "invocation_request": "FunctionInvocationRequest",
    "function_environment_reload_request": "FunctionEnvironmentReloadRequest",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.funchost.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--workerId", dest="worker_id")
    parser.add_argument("--requestId", dest="request_id")
    parser.add_argument("--grpcMaxMessageLength", type=int, dest="max_message_length")
    parser.add_argument("--functions-uri", dest="functions_uri")
    parser.add_argument("--functions-worker-id", dest="functions_worker_id")
    parser.add_argument("--functions-request-id", dest="functions_request_id")
    parser.add_argument("--functions-grpc-max-message-length", type=int, dest="functions_max_message_length")
    args = parser.parse_args(argv)
    if args.functions_uri:  # the newer arguments win, as in Microsoft's worker
        parts = urlsplit(args.functions_uri)
        args.host, args.port = parts.hostname, parts.port
    args.worker_id = args.functions_worker_id or args.worker_id
    args.request_id = args.functions_request_id or args.request_id
    args.max_message_length = args.functions_max_message_length or args.max_message_length
    if not (args.host and args.port and args.worker_id and args.request_id):
        parser.error("the host's address, --workerId and --requestId are required")
    return args


def current_invocation_id() -> str | None:
    """The invocation the running code belongs to: an invocation's task (and the tasks it starts),
    or a sync function's thread (the runtime sets its ``invocation_id_cv`` there)."""
    found = _invocation_id.get()
    if found is None:
        runtime = sys.modules.get(RUNTIME_MODULE)
        if runtime is not None:
            found = runtime.invocation_id_cv.get()
    return found


_LEVELS = (
    (logging.CRITICAL, protos.RpcLog.Critical),
    (logging.ERROR, protos.RpcLog.Error),
    (logging.WARNING, protos.RpcLog.Warning),
    (logging.INFO, protos.RpcLog.Information),
    (logging.DEBUG, protos.RpcLog.Debug),
)


class RpcLogHandler(logging.Handler):
    """Every log record of the process as an ``RpcLog`` to the host."""

    def __init__(self, worker: Worker) -> None:
        super().__init__()
        self._worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            level = next((rpc for python, rpc in _LEVELS if record.levelno >= python), protos.RpcLog.Trace)
            system = record.name.startswith(SYSTEM_LOGGERS)
            entry = protos.RpcLog(
                level=level,
                message=message,
                category=record.name,
                log_category=protos.RpcLog.RpcLogCategory.System if system else protos.RpcLog.RpcLogCategory.User,
                invocation_id=current_invocation_id() or "",
            )
            self._worker.send(protos.StreamingMessage(request_id=self._worker.request_id, rpc_log=entry))
        except Exception:  # noqa: BLE001 - a log record must never fail the code that logged it
            self.handleError(record)


class Worker:
    """One gRPC stream to the host, and the runtime behind it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.host, self.port = args.host, args.port
        self.worker_id, self.request_id = args.worker_id, args.request_id
        self.max_message_length = args.max_message_length
        self._outgoing: queue.Queue = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Future | None = None
        self._runtime: Any = None
        self._tasks: set[asyncio.Task] = set()

    def send(self, message: Any) -> None:
        self._outgoing.put(message)

    # --- the stream ------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ended = self._loop.create_future()
        connected = self._loop.create_future()
        thread = threading.Thread(target=self._poll, args=(connected,), name="grpc-thread", daemon=True)
        thread.start()
        await connected
        self.send(protos.StreamingMessage(request_id=self.request_id,
                                          start_stream=protos.StartStream(worker_id=self.worker_id)))
        handler = RpcLogHandler(self)
        root = logging.getLogger()
        root.handlers[:] = [handler]  # from now on the host gets the logs, not the console
        debug = os.environ.get("PYTHON_ENABLE_DEBUG_LOGGING", "").lower() in ("true", "1")
        root.setLevel(logging.DEBUG if debug else logging.INFO)
        await self._ended

    def _poll(self, connected: asyncio.Future) -> None:
        """The gRPC thread: open the stream, hand each message to the event loop."""
        assert self._loop is not None
        options = []
        if self.max_message_length:
            options += [("grpc.max_receive_message_length", self.max_message_length),
                        ("grpc.max_send_message_length", self.max_message_length)]
        channel = grpc.insecure_channel(f"{self.host}:{self.port}", options)
        try:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_SECONDS)
        except Exception as error:  # noqa: BLE001 - reported to the event loop, which exits
            self._loop.call_soon_threadsafe(connected.set_exception, error)
            return
        self._loop.call_soon_threadsafe(connected.set_result, True)
        stub = protos.FunctionRpcStub(channel)

        def replies():
            while (message := self._outgoing.get()) is not _STOP:
                yield message

        try:
            for message in stub.EventStream(replies()):
                self._loop.call_soon_threadsafe(self._received, message)
        except grpc.RpcError as error:
            # The host went away (stopped, killed): exit now, from this thread, whatever the event loop and
            # the functions are doing; the host has settled, or will redeliver, what they held.
            print(f"funchost worker {self.worker_id}: the stream to the host ended ({error.code().name}); exiting",
                  file=sys.stderr, flush=True)
            os._exit(0)
        self._loop.call_soon_threadsafe(self._end)

    def _end(self) -> None:
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    def _received(self, message: Any) -> None:
        task = asyncio.ensure_future(self._dispatch(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the requests ------------------------------------------------------------------

    async def _dispatch(self, message: Any) -> None:
        content = message.WhichOneof("content")
        try:
            if content == "invocation_request":
                invocation = message.invocation_request
                _invocation_id.set(invocation.invocation_id)
                log.info("Received FunctionInvocationRequest, request ID %s, function_id: %s, invocation_id: %s, "
                         "worker_id: %s", self.request_id, invocation.function_id, invocation.invocation_id,
                         self.worker_id)
            if content in _REPLIES:
                reply = await self._call_runtime(content, message)
                self.send(protos.StreamingMessage(request_id=self.request_id, **{_REPLIES[content]: reply}))
            elif content == "worker_status_request":  # answered at once, unlogged: the host times it
                self.send(protos.StreamingMessage(request_id=message.request_id,
                                                  worker_status_response=protos.WorkerStatusResponse()))
            elif content == "worker_terminate":
                log.info("the host asked this worker to terminate")
                self._end()
            elif content in ("invocation_cancel", "worker_heartbeat", "file_change_event_request"):
                pass  # the runtime cannot cancel an invocation; the rest needs no answer
            else:
                log.error("unknown StreamingMessage content type %s", content)
        except Exception:  # a bug here must be seen; the host times the request out
            log.exception("handling %s failed", content)

    async def _call_runtime(self, content: str, message: Any) -> Any:
        properties = None
        if content in ("worker_init_request", "function_environment_reload_request"):
            self._runtime = __import__(RUNTIME_MODULE)
            app_dir = getattr(message, content).function_app_directory
            if app_dir and app_dir not in sys.path:
                sys.path.insert(0, app_dir)
            properties = {"protos": protos, "host": self.host}
            self._runtime.start_threadpool_executor()  # sized by PYTHON_THREADPOOL_THREAD_COUNT, as the app set it
        request = WorkerRequest(name=_NAMES[content], request=message, properties=properties)
        return await getattr(self._runtime, content)(request)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)-7s [worker {args.worker_id[:8]}] %(message)s")
    log.info("starting: worker %s, host %s:%s, Python %s", args.worker_id, args.host, args.port,
             sys.version.split()[0])
    worker = Worker(args)
    try:
        asyncio.run(worker.run())
    except Exception as error:  # noqa: BLE001 - cannot reach the host: say so and exit
        print(f"funchost worker {args.worker_id}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # functions still running in the pool's threads hold nothing the host will wait for


if __name__ == "__main__":
    main()
