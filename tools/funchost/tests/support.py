"""Helpers for the local host's tests: the test app, its records, polling with a deadline,
AMQP types the Python SDK cannot send."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeVar

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from azure.storage.queue import QueueClient

T = TypeVar("T")

APP_DIR = Path(__file__).resolve().parent / "app"
FUNCTIONS = ("sb_record", "queue_record", "queue_sync", "tick", "tick_on_startup", "slow_tick")


def eventually(
    check: Callable[[], T], *, timeout: float = 20.0, what: str = "the condition", interval: float = 0.05
) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail naming
    ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value {result!r}")
        time.sleep(interval)


def receive(
    connection_string: str, queue: str, count: int, *, timeout: float = 10.0, sub_queue=None
) -> list[ServiceBusReceivedMessage]:
    """Receive and complete up to ``count`` messages (from ``sub_queue``, e.g. the
    dead-letter queue, if given), waiting at most ``timeout`` seconds."""
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + timeout
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
            while len(got) < count and time.monotonic() < deadline:
                wait = max(0.1, min(2.0, deadline - time.monotonic()))
                for message in receiver.receive_messages(max_message_count=count - len(got), max_wait_time=wait):
                    receiver.complete_message(message)
                    got.append(message)
    return got


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


def most_at_once(*runs: list[dict]) -> int:
    """The most invocations running at the same moment, from the functions' own ``start``
    and ``done`` records (each list holds one kind; pass starts first, then dones)."""
    events = []
    for items in runs:
        for item in items:
            events.append((datetime.fromisoformat(item["at"]), 1 if item["event"] == "start" else -1))
    running = most = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # at a tie, an end before a start
        running += step
        most = max(most, running)
    return most


def b64(text: str | bytes) -> str:
    """A storage queue message body as the Functions host expects it (messageEncoding base64)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> str:
    return base64.b64decode(text).decode("utf-8")


def host_env(
    servicebus_emulator, storage_connection_string: str, unique_name, record_dir: Path, *,
    lock_duration: timedelta, max_delivery_count: int | None = None,
    enabled: tuple[str, ...] = ("sb_record", "queue_record"), **settings: str,
) -> tuple[dict[str, str], dict[str, str]]:
    """Fresh queues for the test app's Service Bus and storage-queue functions, and the
    host's app settings with only ``enabled`` functions on: ``(env, names)``."""
    names = {
        "FH_SB_QUEUE": unique_name("in-"),
        "FH_SB_OUT_QUEUE": unique_name("out-"),
        "FH_OUT_QUEUE": unique_name("out-"),
        "FH_QUEUE": unique_name("in-"),
        "FH_QUEUE_OUT": unique_name("out-"),
        "FH_SYNC_QUEUE": unique_name("sync-"),
    }
    queue_options = {"lock_duration": lock_duration}
    if max_delivery_count is not None:
        queue_options["max_delivery_count"] = max_delivery_count
    servicebus_emulator.declare_queue(names["FH_SB_QUEUE"], **queue_options)
    servicebus_emulator.declare_queue(names["FH_SB_OUT_QUEUE"])
    env = {
        "AzureWebJobsStorage": storage_connection_string,
        "ServiceBusConnection": servicebus_emulator.connection_string,
        "FH_RECORD_DIR": str(record_dir),
        **names,
        **only(*enabled),
        **settings,
    }
    return env, names


def send_to_both(servicebus_emulator, storage_connection_string: str, names: dict[str, str], body: str, *,
                 count: int = 1, message_id: str = "m"):
    """Send ``body`` ``count`` times to both trigger queues; returns the storage queue's
    client and the storage messages' ids."""
    with (
        ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client,
        client.get_queue_sender(names["FH_SB_QUEUE"]) as sender,
    ):
        ids = [message_id] if count == 1 else [f"{message_id}{i}" for i in range(count)]
        sender.send_messages([ServiceBusMessage(body, message_id=i) for i in ids])
    inbox = QueueClient.from_connection_string(storage_connection_string, names["FH_QUEUE"])
    queue_ids = {inbox.send_message(b64(body)).id for _ in range(count)}
    return inbox, queue_ids


def assert_drained(servicebus_emulator, names: dict[str, str], inbox, *, timeout: float = 20.0) -> None:
    """Wait until nothing is left on either trigger queue: no Service Bus message active,
    locked, scheduled or dead-lettered, and no storage queue message, leased ones included
    (a function's record is written before its host settles the message)."""

    def left() -> tuple[dict[str, int], int]:
        counts = servicebus_emulator.message_counts(names["FH_SB_QUEUE"])
        return {k: n for k, n in counts.items() if n}, inbox.get_queue_properties().approximate_message_count

    try:
        eventually(lambda: left() == ({}, 0), timeout=timeout, what="both trigger queues to be empty")
    except AssertionError as error:
        raise AssertionError(f"{error}; left (Service Bus by kind, storage queue count): {left()}") from None


@contextlib.contextmanager
def rewritten_on_the_wire(*replacements: tuple[bytes, bytes]) -> Iterator[None]:
    """While open, messages the Python SDK sends from this process have each ``old`` byte string
    replaced by ``new`` (same length) once encoded: types its encoder cannot write."""
    from azure.servicebus._pyamqp import sender as pyamqp_sender  # the encoder the send link calls

    for old, new in replacements:
        assert len(old) == len(new), (old, new)
    original = pyamqp_sender.encode_payload

    def encode(output, message):
        result = original(output, message)
        data = bytes(output)
        for old, new in replacements:
            data = data.replace(old, new)
        output[:] = data
        return result

    pyamqp_sender.encode_payload = encode
    try:
        yield
    finally:
        pyamqp_sender.encode_payload = original


def as_the_worker_decodes(converted, binding: str = "serviceBusTrigger", pytype=None):
    """What Microsoft's runtime hands the function for what the host sends (a ``servicebus_message.Converted``):
    the runtime's own decoding (``azure_functions_runtime.bindings.meta.from_incoming_proto``), in this process."""
    import azure.functions as func
    from azure_functions_runtime.bindings import meta

    from tools.funchost.rpc import protos

    meta.load_binding_registry()
    return meta.from_incoming_proto(
        binding,
        protos.ParameterBinding(name="msg", data=converted.data),
        pytype=pytype or func.ServiceBusMessage,
        trigger_metadata=dict(converted.metadata),
        function_name="test",
    )
