"""``python -m devtools.servicebus_emulator --port 5672 [--host 127.0.0.1] [--queue NAME ...]``

Given no ``--queue``, declares the app's queues (``core.names.SERVICEBUS_QUEUES``).
Prints the connection string on stdout once listening, logs to stderr, and stops
cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from .codec import SdkVersionError
from .server import EmulatorError, EmulatorServer, app_queues, queue_settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.servicebus_emulator",
        description="Service Bus emulator: AMQP 1.0 on loopback for the azure-servicebus SDK (no TLS, no auth).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5672, help="port to listen on; 0 picks a free one (default: 5672)")
    parser.add_argument(
        "--queue",
        action="append",
        metavar="NAME",
        help="declare this queue (repeatable, default properties); default: the app's queues from core.names",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level on stderr (default: INFO)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    queues = [queue_settings(name) for name in args.queue] if args.queue else app_queues()
    server = EmulatorServer(args.host, args.port, queues)
    await server.start()
    print(server.connection_string, flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stopping.set)
        except (NotImplementedError, RuntimeError):  # not available on this platform
            signal.signal(signum, lambda *_: loop.call_soon_threadsafe(stopping.set))
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
        logging.getLogger("devtools.servicebus_emulator").error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
