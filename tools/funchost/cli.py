"""``python -m tools.funchost``: run an app's functions against the local stack until stopped."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from .app import AppLoadError
from .config import ConfigError
from .host import Host, HostStartError

log = logging.getLogger("funchost")

LOG_FORMAT = "%(asctime)s %(levelname)-7s [%(name)s] %(message)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}",
        description=(
            "Run a v2-model Python Function app (function_app.py) locally: HTTP (on 127.0.0.1), Service Bus "
            "queue, storage queue and timer triggers, storage-queue and Service Bus outputs, settings from "
            "local.settings.json and host.json. Stop with Ctrl-C or SIGTERM: in-flight messages finish "
            "(or are abandoned at the drain deadline)."
        ),
    )
    parser.add_argument(
        "--app-dir", type=Path, default=Path("."), help="directory holding function_app.py and host.json (default: .)"
    )
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        help="local settings file whose Values become app settings (default: <app-dir>/local.settings.json); "
        "environment variables already set win",
    )
    parser.add_argument(
        "--functions", nargs="+", metavar="NAME", help="run only these functions (as `func start --functions`)"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on stop, how long in-flight invocations may run before their messages are abandoned (default: 30)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        metavar="PORT",
        help="port of the HTTP functions' server on 127.0.0.1 (default: local.settings.json Host.LocalHttpPort, "
        "else 7071, as Core Tools; 0 picks a free port). The URL is logged at start.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, Azure SDK logs included")
    parser.add_argument(
        "--debug",
        nargs="+",
        default=[],
        metavar="LOGGER",
        help="debug logging for these loggers only (e.g. funchost.queue: each storage-queue poller's "
        "long waits between empty polls; funchost.servicebus: each keep-alive read of a Service Bus "
        "trigger's connection), the rest at the default level",
    )
    return parser


def configure_logging(verbose: bool, debug: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    # The SDKs log every HTTP request and AMQP frame at INFO; keep their warnings only.
    logging.getLogger("azure").setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name in debug:
        logging.getLogger(name).setLevel(logging.DEBUG)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose, args.debug)
    app_dir: Path = args.app_dir
    if not (app_dir / "function_app.py").is_file():
        log.error("no function_app.py in %s (use --app-dir)", app_dir.resolve())
        return 2

    settings = args.settings.resolve() if args.settings else None
    app_dir = app_dir.resolve()
    # Core Tools and Azure run the worker in the app directory (the script root).
    os.chdir(app_dir)
    if args.port is not None and not 0 <= args.port <= 65535:
        log.error("--port %s is not a port number", args.port)
        return 2
    host = Host(app_dir, settings, functions=args.functions, http_port=args.port)
    stop = threading.Event()

    def on_signal(signum: int, _frame) -> None:
        if stop.is_set():
            log.warning("second %s: abandoning in-flight messages now", signal.Signals(signum).name)
            host.hurry()
        else:
            log.info("%s received: stopping", signal.Signals(signum).name)
            stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        host.load()
    except (AppLoadError, ConfigError) as error:
        log.error("%s", error)
        return 1
    if args.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    try:
        host.start()
    except HostStartError as error:
        log.error("%s", error)
        return 1
    while not stop.wait(0.5) and not host.failed.is_set():
        pass
    host.stop(args.drain_timeout)
    return 1 if host.failed.is_set() else 0
