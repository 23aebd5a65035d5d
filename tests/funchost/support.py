"""Helpers for the local host's tests: the test app, its records, polling with a deadline."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import TypeVar

from tests.polling import wait_until as eventually  # noqa: F401 - the name these tests use

APP_DIR = Path(__file__).resolve().parent / "app"
FUNCTIONS = ("sb_record", "queue_record", "tick", "tick_on_startup")

T = TypeVar("T")


def only(*enabled: str) -> dict[str, str]:
    """App settings that switch off every test-app function except ``enabled``."""
    return {f"AzureWebJobs.{name}.Disabled": "true" for name in FUNCTIONS if name not in enabled}


def records(directory: Path, function: str | None = None, event: str | None = None) -> list[dict]:
    """What the test app's functions recorded, from every host process, in file order."""
    found = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            if (function is None or item["function"] == function) and (event is None or item["event"] == event):
                found.append(item)
    return found


def b64(text: str | bytes) -> str:
    """A storage queue message body as the Functions host expects it (messageEncoding base64)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> str:
    return base64.b64decode(text).decode("utf-8")


def receive_all(connection_string: str, queue: str, count: int, *, timeout: float = 10.0, sub_queue=None) -> list:
    """Receive and complete up to ``count`` Service Bus messages within ``timeout`` seconds."""
    from azure.servicebus import ServiceBusClient

    got: list = []
    deadline = time.monotonic() + timeout
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver,
    ):
        while len(got) < count and time.monotonic() < deadline:
            wait = max(0.1, min(1.0, deadline - time.monotonic()))
            for message in receiver.receive_messages(max_message_count=count - len(got), max_wait_time=wait):
                receiver.complete_message(message)
                got.append(message)
    return got
