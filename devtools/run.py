"""``make run``: the local stack in the foreground, with no generated load.

Prints the connection strings and the status API's URL (``http://127.0.0.1:7071/api``,
loopback only, no auth), so you can send orders from another shell
(``python -m ordersctl send-order ...``) or from any Service Bus client, and watch
them with ``ordersctl status`` / ``list`` / ``alerts`` or the API. Ctrl-C stops everything.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from core.workflow import remotes
from devtools import azurite
from devtools.localstack import (
    SERVICEBUS_FAULTS_HELP,
    STORAGE_FAULTS_HELP,
    LocalStack,
    servicebus_faults_option,
    storage_faults_option,
)
from devtools.paths import ROOT

console = Console()


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    pairs = {}
    for text in values or []:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise typer.BadParameter(f"{text!r}: expected {what}")
        pairs[name.strip()] = value.strip()
    return pairs


def main(
    remote: Annotated[
        list[str] | None,
        typer.Option(help=f"NAME=URL: use this base URL for remote service NAME ({', '.join(remotes())}) "
                          "instead of the fake one. Repeatable."),
    ] = None,
    setting: Annotated[
        list[str] | None, typer.Option(help="NAME=VALUE: an app setting for every host. Repeatable.")
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(help="A queue for clients (e.g. a ReplyTo queue for status events). Repeatable. "
                          "Default: my-status."),
    ] = None,
    hosts: Annotated[int, typer.Option(min=1, max=4, help="Local Functions host processes.")] = 1,
    state_accounts: Annotated[
        int, typer.Option(min=1, max=len(azurite.STATE_ACCOUNTS),
                          help="Storage accounts of Azurite the order state is spread over (STATE_STORAGE_ACCOUNTS).")
    ] = 1,
    servicebus_port: Annotated[int, typer.Option(help="Service Bus emulator port.")] = 5672,
    remote_port: Annotated[int, typer.Option(help="Fake remote service port.")] = 7081,
    api_port: Annotated[
        int, typer.Option(help="The status API's port on 127.0.0.1 (the first host's; 0 = a free port).")
    ] = 7071,
    standard_storage_ports: Annotated[bool, typer.Option(help="Azurite on 10000-10002 (UseDevelopmentStorage=true).")] = True,
    settings_out: Annotated[Path, typer.Option(help="Where to write a settings file for ordersctl.")] = ROOT / "demo-output" / "run.settings.json",
    log_dir: Annotated[Path, typer.Option(help="Where the processes' logs go.")] = ROOT / "demo-output" / "logs",
    storage_faults: Annotated[str | None, typer.Option(help=STORAGE_FAULTS_HELP)] = None,
    servicebus_faults: Annotated[str | None, typer.Option(help=SERVICEBUS_FAULTS_HELP)] = None,
) -> None:
    """Run the whole system locally in the foreground (Ctrl-C stops it)."""
    remote_urls = _pairs(remote, "NAME=URL, e.g. payments=http://127.0.0.1:9000/payments")
    unknown = sorted(set(remote_urls) - set(remotes()))
    if unknown:
        raise typer.BadParameter(f"unknown remote service(s) {', '.join(unknown)}; known: {', '.join(remotes())}")
    stack = LocalStack(
        servicebus_port=servicebus_port,
        remote_port=remote_port,
        http_port=api_port,
        storage_ports={"Blob": 10000, "Queue": 10001, "Table": 10002} if standard_storage_ports else None,
        settings={"SUPERVISOR_SCHEDULE": "*/5 * * * * *", **_pairs(setting, "NAME=VALUE, e.g. MAX_FAILURES=5")},
        remote_urls=remote_urls,
        client_queues=tuple(queue or ("my-status",)),
        log_dir=log_dir,
        storage_faults=storage_faults_option(storage_faults),
        servicebus_faults=servicebus_faults_option(servicebus_faults),
        state_accounts=state_accounts,
    )
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with stack.start(hosts=hosts):
        settings_out.parent.mkdir(parents=True, exist_ok=True)
        settings_out.write_text(json.dumps({"IsEncrypted": False, "Values": stack.env}, indent=2) + "\n")
        console.print("[bold]The local stack is running.[/bold]")
        # soft_wrap: a connection string stays on one line, whole, for copy and paste.
        console.print(f"  Service Bus : {stack.servicebus_connection_string}", soft_wrap=True)
        console.print(f"  Storage     : {stack.azurite.connection_string}", soft_wrap=True)
        if stack.storage_proxy is not None:
            console.print(f"  Storage faults: {storage_faults} (the app's storage goes through "
                          f"{stack.storage_connection_string}; counts at GET /_faults on its ports)", soft_wrap=True)
        console.print(f"  Status API  : {stack.api_url}/orders/{{id}}, {stack.api_url}/orders?state=Error "
                      "(loopback only, no auth)", soft_wrap=True)
        console.print(f"  Operator page: {stack.api_url}/ops (orders per state, Error and Compensated orders, "
                      "resubmit, one order's timeline)", soft_wrap=True)
        console.print(f"  Client queues: {', '.join(stack.client_queues)} (for --reply-to)", soft_wrap=True)
        if stack.servicebus_faults is not None:
            console.print(f"  Service Bus faults: {stack.servicebus_faults.to_arg()}", soft_wrap=True)
        for name in remotes():
            console.print(f"  Remote      : {name:<10} {stack.remote_url(name)}", soft_wrap=True)
        console.print(f"  Host logs   : {', '.join(str(p) for p in stack.host_logs)}")
        console.print(f"  Spans       : {', '.join(str(p) for p in stack.spans_files)} (JSON lines, one trace per order)")
        console.print(f"  Metrics     : {', '.join(str(p) for p in stack.metrics_files)}")
        console.print(f"\nSend an order from another shell:\n  .venv/bin/python -m ordersctl --help\n"
                      f"  .venv/bin/python -m ordersctl send-order --settings {settings_out} "
                      f"--order-id o-1 --customer c-1 --item sku-1:2:12.50\n"
                      f"  .venv/bin/python -m ordersctl status o-1 --settings {settings_out}\n"
                      f"  curl {stack.api_url}/orders/o-1\n")
        console.print("Ctrl-C stops everything.")
        try:
            stopping.wait()
        except KeyboardInterrupt:
            pass
    console.print("stopped.")


if __name__ == "__main__":
    typer.run(main)
