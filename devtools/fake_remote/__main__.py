"""``python -m devtools.fake_remote``: run the fake remote services until SIGTERM or Ctrl-C.

Prints the server's URL on stdout (one line; service NAME is at ``{url}/NAME``), logs
one line per call to stderr and a summary per service when it stops.
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


def _json_object(text: str) -> dict:
    """A JSON object, or @path to a file holding one."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as error:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]}: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return document


def _port(text: str) -> int:
    """A TCP port, 0..65535 (0: a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: a whole number 0..65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: 0..65535 (0 for a free one)")
    return port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.fake_remote",
        description="Fake remote services with fault injection (development tool). Service NAME is served at "
        "{url}/NAME; each action or compensation is POST {url}/NAME/ACTION (docs/fake-remote.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=_port, default=7081, help="port, 0 for a free one (default: %(default)s)")
    parser.add_argument(
        "--services",
        type=_json_object,
        default=None,
        metavar="JSON",
        help='services and actions, {service: {action: compensation or null}}, JSON or @file '
        '(default: {"inventory": {"reserve": "release"}, "payments": {"charge": "refund"}, "shipping": {"ship": null}})',
    )
    rates = parser.add_argument_group("fault rates, for every service (probability per call, 0..1, all default 0)")
    for kind in FAULT_KINDS:
        rates.add_argument(f"--{kind.replace('_', '-')}", dest=kind, type=float, default=0.0, metavar="RATE")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rate draws (default: %(default)s)")
    parser.add_argument(
        "--script",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="faults per order id or order id/action, for every service, JSON or @file, "
        'e.g. \'{"o-1": ["transient", "transient"], "o-2/release": ["always:transient"]}\'',
    )
    parser.add_argument(
        "--service-faults",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="faults of some services, replacing the ones above there, JSON or @file, e.g. "
        '\'{"payments": {"rates": {"transient": 0.2}, "script": {"o-3": ["permanent"]}, "slow_seconds": 2}}\'',
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
            services=args.services,
            service_faults=args.service_faults,
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
    for name, config in svc.config()["services"].items():
        log.info(
            "serving %s at %s actions=%s rates=%s script=%s seed=%s",
            name, svc.base_url(name), config["actions"], config["rates"], config["script"], config["seed"],
        )  # fmt: skip
    print(svc.url, flush=True)
    while not stop.wait(0.5):
        pass
    effects = svc.effects()
    svc.stop()
    for name, service in effects["services"].items():
        faults = {kind: n for kind, n in service["faults"].items() if n}
        log.info(
            "stopped %s: calls=%d applied=%d undone=%d noop_compensations=%d replays=%d late=%d twice=%d faults=%s",
            name, service["calls"], sum(map(len, service["applied"].values())),
            sum(map(len, service["undone"].values())), service["noop_compensations"], service["replays"],
            service["late"], service["twice"], faults,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
