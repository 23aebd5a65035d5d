"""``python -m tools.storage_faults --connection-string CS [--faults SPEC] [--services table,queue] [--seed N]``

Starts one proxy port per service in front of the endpoints of the storage connection
string (Azurite's), prints the connection string that goes through the proxy on one
line of stdout once listening, and runs until Ctrl-C or SIGTERM. ``GET /_faults`` on
any of its ports answers the counts (JSON); ``PUT /_faults`` changes the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from .faults import KINDS, StorageFaults
from .proxy import FaultProxy, proxied, upstreams_of


def _faults(text: str) -> StorageFaults:
    try:
        return StorageFaults.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.storage_faults",
                                     description="Fault-injecting proxy for Azure Storage (Azurite) on loopback.")
    parser.add_argument("--connection-string", required=True, help="the storage connection string to proxy")
    parser.add_argument("--faults", type=_faults, default=StorageFaults(),
                        help=f"rates per request: KIND=RATE,... with KIND in {', '.join(KINDS)} "
                             "(latency=RATE:SECONDS), e.g. 503=0.02,500-applied=0.01,reset-applied=0.01,latency=0.05:0.5")
    parser.add_argument("--services", default="table,queue", help="services to proxy (default: table,queue)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the fault draws")
    parser.add_argument("--log-level", default="WARNING")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    services = tuple(s.strip() for s in args.services.split(",") if s.strip())
    proxy = FaultProxy(upstreams_of(args.connection_string, services), args.faults, seed=args.seed)
    await proxy.start()
    print(proxied(args.connection_string, proxy.endpoints), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    try:
        asyncio.run(serve(args))
    except ValueError as error:
        print(f"storage_faults: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
