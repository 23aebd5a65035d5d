"""Throughput of the Service Bus emulator with the real SDK: ``python -m tools.servicebus_emulator.benchmark``.

Runs the emulator as a subprocess (the command, ``python -m tools.servicebus_emulator``,
with ``--stats-stdin``, which also reports the emulator's CPU seconds) so its CPU time
is measured apart from the client's, then, with the sync client, for each mode sends,
receives (peek-lock) and completes N messages:

- ``batched``: batches of 100 sent as one transfer each, ``receive_messages(100)``;
- ``single``: one ``send_messages`` per message, ``receive_messages(1)`` per message.

Completion is one settlement per message in both (the SDK has no batch complete).
Prints messages/s and the CPU seconds of the emulator beside the client's for the same
work. Targets: the emulator is never the bottleneck (its CPU at most half the
client's) and batched reaches 1,000 msg/s. ``--check`` exits 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import azure.servicebus
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiver, ServiceBusSender

#: Where ``python -m tools.servicebus_emulator`` can be imported from (the package's grandparent).
IMPORT_ROOT = Path(__file__).resolve().parents[2]
COMMAND = __package__ or "tools.servicebus_emulator"
BATCH = 100
TARGET_BATCHED_RATE = 1000.0
TARGET_CPU_RATIO = 0.5


@dataclass
class Result:
    mode: str
    messages: int
    wall: float
    client_cpu: float
    emulator_cpu: float

    @property
    def rate(self) -> float:
        return self.messages / self.wall

    @property
    def ratio(self) -> float:
        return self.emulator_cpu / self.client_cpu if self.client_cpu else float("inf")


class Emulator:
    """The emulator command as a subprocess."""

    def __init__(self, queues: list[str]) -> None:
        args = [sys.executable, "-m", COMMAND, "--port", "0", "--log-level", "WARNING", "--stats-stdin"]
        for queue in queues:
            args += ["--queue", queue]
        self.process = subprocess.Popen(args, cwd=IMPORT_ROOT, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdin is not None
        self.connection_string = self.process.stdout.readline().strip()
        if not self.connection_string.startswith("Endpoint="):
            self.stop()
            raise SystemExit("the emulator did not start")

    def stats(self) -> dict:
        """The emulator's answer to ``stats``: operation counts and its CPU seconds."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def cpu(self) -> float:
        return self.stats()["cpu_seconds"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.communicate(timeout=10)


def _send_receive_complete(
    sender: ServiceBusSender, receiver: ServiceBusReceiver, messages: int, batched: bool
) -> None:
    sent = 0
    while sent < messages:
        if batched:
            batch = sender.create_message_batch()
            count = min(BATCH, messages - sent)
            for number in range(sent, sent + count):
                batch.add_message(ServiceBusMessage(f"message {number}"))
            sender.send_messages(batch)
        else:
            count = 1
            sender.send_messages(ServiceBusMessage(f"message {sent}"))
        received = 0
        while received < count:
            for message in receiver.receive_messages(max_message_count=count - received, max_wait_time=10):
                receiver.complete_message(message)
                received += 1
        sent += count


def measure(emulator: Emulator, client: ServiceBusClient, queue: str, mode: str, messages: int) -> Result:
    batched = mode == "batched"
    with client.get_queue_sender(queue) as sender, client.get_queue_receiver(queue) as receiver:
        _send_receive_complete(sender, receiver, min(messages, 2 * BATCH), batched)  # warm up
        emulator_before, client_before, started = emulator.cpu(), time.process_time(), time.perf_counter()
        _send_receive_complete(sender, receiver, messages, batched)
        wall = time.perf_counter() - started
        client_cpu, emulator_cpu = time.process_time() - client_before, emulator.cpu() - emulator_before
    return Result(mode, messages, wall, client_cpu, emulator_cpu)


HEADER = " ".join(
    [f"{'mode':<8}", f"{'messages':>8}", f"{'msg/s':>8}", f"{'wall s':>7}", f"{'client CPU s':>13}"]
    + [f"{'emulator CPU s':>15}", f"{'ratio':>6}"]
)


def report(results: list[Result]) -> list[str]:
    machine = f"{os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [
        f"Service Bus emulator, azure-servicebus {azure.servicebus.__version__} sync client, {machine}",
        "send + receive (peek-lock) + complete, one client thread, emulator in its own process",
        "",
        HEADER,
    ]
    for r in results:
        lines.append(
            f"{r.mode:<8} {r.messages:>8} {r.rate:>8.0f} {r.wall:>7.2f} {r.client_cpu:>13.2f} "
            f"{r.emulator_cpu:>15.2f} {r.ratio:>6.2f}"
        )
    return lines


def missed_targets(results: list[Result]) -> list[str]:
    missed = []
    for r in results:
        if r.ratio > TARGET_CPU_RATIO:
            missed.append(f"{r.mode}: emulator CPU is {r.ratio:.2f} of the client's (target <= {TARGET_CPU_RATIO})")
        if r.mode == "batched" and r.rate < TARGET_BATCHED_RATE:
            missed.append(f"batched: {r.rate:.0f} msg/s (target >= {TARGET_BATCHED_RATE:.0f})")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.servicebus_emulator.benchmark", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--batched-messages", type=int, default=5000, help="messages in the batched run")
    parser.add_argument("--single-messages", type=int, default=1000, help="messages in the single run")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    emulator = Emulator(["bench-batched", "bench-single"])
    try:
        with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
            results = [
                measure(emulator, client, "bench-batched", "batched", args.batched_messages),
                measure(emulator, client, "bench-single", "single", args.single_messages),
            ]
    finally:
        emulator.stop()
    for line in report(results):
        print(line)
    missed = missed_targets(results)
    print()
    print("targets: " + ("met" if not missed else "MISSED - " + "; ".join(missed)))
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
