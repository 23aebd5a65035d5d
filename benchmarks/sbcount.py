"""The project's Service Bus emulator with operation counters, for the benchmarks.

``python -m benchmarks.sbcount --port 0`` runs the same emulator as
``python -m devtools.servicebus_emulator`` (the app's queues, plus ``--extra-queue``
ones shaped like the app's ``agent-responses`` queue) and counts, at the server, what
its clients do: messages sent per queue, deliveries (receives) per queue, settlements
per outcome and queue, management requests per operation, AMQP frames by kind and
connections opened. The emulator itself offers message counts only, so the counters
are wrapped around its classes here; nothing in the emulator changes.

Protocol: the connection string on the first stdout line; then each ``stats`` line on
stdin is answered with one JSON line of counters on stdout. SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import logging
import signal
import sys
import threading
from collections import Counter

from core import names
from devtools.servicebus_emulator import codec, connection, management, session
from devtools.servicebus_emulator.broker import Queue
from devtools.servicebus_emulator.server import EmulatorServer, queue_settings

COUNTS: Counter[str] = Counter()


def _wrap(owner, attribute: str, count) -> None:
    original = getattr(owner, attribute, None)
    if original is None:  # the emulator changed: counting nothing would report zeros, so refuse to start
        raise RuntimeError(f"cannot count {getattr(owner, '__name__', owner)}.{attribute}: no such attribute")

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        try:
            count(*args, **kwargs)
        except Exception:  # noqa: BLE001 - counting must never break the emulator
            COUNTS["counting_errors"] += 1
        return original(*args, **kwargs)

    setattr(owner, attribute, wrapper)


def _queue_of_store(store) -> str:
    return getattr(store, "path", None) or "?"


def _settle_kind(state) -> str:
    if isinstance(state, dict) and state:
        return str(next(iter(state)))
    return "none"


_FRAME_NAMES = {
    getattr(codec, name): name.lower()
    for name in ("OPEN", "BEGIN", "ATTACH", "FLOW", "TRANSFER", "DISPOSITION", "DETACH", "END", "CLOSE")
    if hasattr(codec, name)
}


def install() -> None:
    """Wrap the emulator's classes with counters."""
    _wrap(Queue, "send", lambda self, content: COUNTS.update([f"enqueue {self.settings.name}"]))
    _wrap(session.OutgoingLink, "deliver", lambda self, message, token: COUNTS.update(
        [f"deliver {_queue_of_store(self.store) if self.store is not None else 'reply'}"]
    ))
    _wrap(session.OutgoingLink, "settle", lambda self, token, state: COUNTS.update(
        [f"settle.{_settle_kind(state)} {_queue_of_store(self.store)}"]
    ))
    _wrap(management.ManagementNode, "handle", lambda self, request: COUNTS.update(
        [f"management.{_operation(request)} {self.queue.settings.name}"]
    ))
    _wrap(connection.Connection, "connection_made", lambda self, transport: COUNTS.update(["connections"]))
    original_decode = codec.decode_performative

    def decode(body):
        code, fields = original_decode(body)
        COUNTS[f"frame.{_FRAME_NAMES.get(code, hex(code))}"] += 1
        return code, fields

    codec.decode_performative = decode


def _operation(request) -> str:
    value = (getattr(request, "application_properties", None) or {}).get(b"operation", b"?")
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text.removeprefix("com.microsoft:")


def extra_queue(name: str):
    spec = next(q for q in names.SERVICEBUS_QUEUES if q.name == names.AGENT_RESPONSES_QUEUE)
    return queue_settings(dataclasses.replace(spec, name=name))


async def serve(args: argparse.Namespace) -> None:
    from devtools.servicebus_emulator.server import app_queues

    queues = app_queues() + [extra_queue(name) for name in args.extra_queue or []]
    server = EmulatorServer(args.host, args.port, queues)
    await server.start()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)

    def answer() -> None:
        counts = dict(COUNTS)
        print(json.dumps({"counts": counts}), flush=True)

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip() == "stats":
                loop.call_soon_threadsafe(answer)
        loop.call_soon_threadsafe(stopping.set)  # our parent went away

    print(server.connection_string, flush=True)
    threading.Thread(target=read_commands, name="stats-commands", daemon=True).start()
    await stopping.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sbcount", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--extra-queue", action="append", metavar="NAME")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    install()
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
