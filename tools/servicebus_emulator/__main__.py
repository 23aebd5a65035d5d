"""``python -m tools.servicebus_emulator [--port 5672] [--queue NAME[:key=value,...] ...] [--faults SPEC] [--link-idle-timeout SECONDS] [--stats-stdin]``

Declares the queues it is given (none by default). Prints the connection string on
stdout once listening, logs to stderr, and stops cleanly on Ctrl-C or SIGTERM. With
``--stats-stdin`` it also answers each ``stats`` line on stdin with one JSON line on
stdout, and stops at the end of stdin. See README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from .broker import LINK_IDLE_TIMEOUT, QueueSettings
from .codec import SdkVersionError
from .faults import Faults
from .server import EmulatorError, EmulatorServer

T = TypeVar("T")

QUEUE_HELP = (
    "declare this queue (repeatable): NAME, or NAME:key=value,... with keys lock_duration, max_delivery_count, "
    "default_ttl, dead_letter_on_expiry, duplicate_detection, duplicate_detection_window; durations in seconds or "
    "with s/m/h/d (e.g. orders:max_delivery_count=5,dead_letter_on_expiry=true,default_ttl=7d)"
)


FAULTS_HELP = (
    "inject Azure's push-back: throttle=CREDITS_PER_SECOND (Standard tier: 1000; each message sent, received or "
    "peeked costs one), lock-lost=P, link-drop=P, connection-drop=P (probabilities per delivery / per frame on a "
    "queue's link), seed=N; e.g. throttle=1000,lock-lost=0.01,link-drop=0.005 (default: none)"
)


def _argument(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` from a parser that raises ValueError: the error becomes argparse's (exit 2)."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def _seconds(text: str) -> float | None:
    """A number of seconds, 0 for none."""
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"not a number of seconds: {text!r}")
    return value or None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.servicebus_emulator",
        description="Service Bus emulator: AMQP 1.0 on loopback for the azure-servicebus SDK (no TLS, no auth).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5672, help="port to listen on; 0 picks a free one (default: 5672)")
    parser.add_argument(
        "--queue", action="append", type=_argument(QueueSettings.parse), default=[], metavar="NAME[:key=value,...]", help=QUEUE_HELP
    )
    parser.add_argument("--faults", type=_argument(Faults.parse), default=Faults(), metavar="SPEC", help=FAULTS_HELP)
    parser.add_argument(
        "--link-idle-timeout", type=_argument(_seconds), default=LINK_IDLE_TIMEOUT, metavar="SECONDS",
        help=f"force-detach a queue's link after this many seconds without a send, receive or settlement, as "
        f"Azure does after 10 minutes; 0: never (default: {LINK_IDLE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--stats-stdin",
        action="store_true",
        help='answer each "stats" line on stdin with one JSON line on stdout: {"operations": {...}, '
        '"cpu_seconds": ...}; stop at the end of stdin',
    )
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="logging level on stderr (default: INFO)",
    )
    return parser.parse_args(argv)


def stats(server: EmulatorServer) -> str:
    """The answer to a ``stats`` command: operation counts and the process's CPU seconds so far."""
    return json.dumps(
        {"operations": server.operation_counts(), "faults": server.fault_counts(), "cpu_seconds": time.process_time()}
    )


def _serve_stats(server: EmulatorServer, loop: asyncio.AbstractEventLoop, stopping: asyncio.Event) -> None:
    """Read commands on stdin in a thread; answer on the event loop (where the counters live)."""

    def answer() -> None:
        print(stats(server), flush=True)

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip() == "stats":
                loop.call_soon_threadsafe(answer)
        loop.call_soon_threadsafe(stopping.set)  # end of stdin: whoever drove us went away

    threading.Thread(target=read_commands, name="stats-stdin", daemon=True).start()


async def serve(args: argparse.Namespace) -> None:
    server = EmulatorServer(args.host, args.port, args.queue, args.faults, link_idle_timeout=args.link_idle_timeout)
    await server.start()
    print(server.connection_string, flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stopping.set)
        except (NotImplementedError, RuntimeError):  # not available on this platform
            signal.signal(signum, lambda *_: loop.call_soon_threadsafe(stopping.set))
    if args.stats_stdin:
        _serve_stats(server, loop, stopping)
    await stopping.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(serve(args))
    except (EmulatorError, SdkVersionError) as error:
        logging.getLogger(__package__).error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
