"""``python -m devtools.fake_remote``: run the fake remote service until SIGTERM or Ctrl-C.

Prints its base URL on stdout (one line), logs one line per call to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from devtools.fake_remote.faults import FAULT_KINDS, FaultConfigError
from devtools.fake_remote.server import start


def _script(text: str) -> dict:
    """A JSON object, or @path to a file holding one."""
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.fake_remote",
        description="Fake remote service with fault injection (development tool).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=7081, help="port, 0 for a free one (default: %(default)s)")
    rates = parser.add_argument_group("fault rates (probability per call, 0..1, all default 0)")
    for kind in FAULT_KINDS:
        rates.add_argument(f"--{kind.replace('_', '-')}", dest=kind, type=float, default=0.0, metavar="RATE")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rate draws (default: %(default)s)")
    parser.add_argument(
        "--script",
        type=_script,
        default=None,
        help='faults per order id, JSON or @file, e.g. \'{"o-1": ["transient", "transient"]}\'',
    )
    parser.add_argument("--slow-seconds", type=float, default=30.0, help="delay of slow and hang (default: %(default)s)")
    parser.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds of throttle (default: %(default)s)")
    parser.add_argument("--apply-seconds", type=float, default=0.0, help="time to apply one effect (default: 0)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"], help="stderr log level")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="%(asctime)s fake-remote %(message)s")
    log = logging.getLogger("devtools.fake_remote")
    try:
        svc = start(
            port=args.port,
            host=args.host,
            rates={kind: getattr(args, kind) for kind in FAULT_KINDS},
            script=args.script,
            seed=args.seed,
            slow_seconds=args.slow_seconds,
            retry_after_seconds=args.retry_after,
            apply_seconds=args.apply_seconds,
        )
    except FaultConfigError as error:
        print(f"fake remote: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"fake remote: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    config = svc.config()
    log.info("listening on %s rates=%s script=%s seed=%s", svc.url, config["rates"], config["script"], config["seed"])
    print(svc.url, flush=True)
    while not stop.wait(0.5):
        pass
    effects = svc.effects()
    svc.stop()
    faults = {kind: n for kind, n in effects["faults"].items() if n}
    log.info(
        "stopped: calls=%d effects=%d replays=%d faults=%s", effects["calls"], effects["total"], effects["replays"], faults
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
