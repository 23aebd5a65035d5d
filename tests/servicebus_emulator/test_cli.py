"""``python -m devtools.servicebus_emulator``: the command the demo and ``func start`` users run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from .conftest import receive_exactly

ROOT = Path(__file__).resolve().parents[2]
CONNECTION_STRING = re.compile(
    r"^Endpoint=sb://127\.0\.0\.1:(\d+);SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;$"
)


class Command:
    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "devtools.servicebus_emulator", "--port", "0", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        self.connection_string = self.process.stdout.readline().strip()

    def stop(self, signum: int) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        _, stderr = self.process.communicate(timeout=10)
        return self.process.returncode, stderr


@pytest.fixture
def command() -> Iterator[type[Command]]:
    started: list[Command] = []

    def start(*args: str) -> Command:
        instance = Command(*args)
        started.append(instance)
        return instance

    yield start  # type: ignore[misc]
    for instance in started:
        if instance.process.poll() is None:
            instance.process.kill()
            instance.process.communicate(timeout=10)


def test_the_command_prints_the_connection_string_serves_the_app_queues_and_stops_on_sigterm(command):
    from core.names import ORDERS_QUEUE

    emulator = command()
    assert CONNECTION_STRING.match(emulator.connection_string), emulator.connection_string
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_sender(ORDERS_QUEUE, keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("order"))
        with client.get_queue_receiver(ORDERS_QUEUE) as receiver:
            (message,) = receive_exactly(receiver, 1)
            assert str(message) == "order"
            receiver.complete_message(message)
    returncode, stderr = emulator.stop(signal.SIGTERM)
    assert returncode == 0, stderr
    assert "listening on 127.0.0.1" in stderr and "stopped" in stderr
    assert "Traceback" not in stderr


def test_the_command_declares_only_the_queues_it_is_given_and_stops_on_ctrl_c(command):
    emulator = command("--queue", "first", "--queue", "second")
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_sender("second", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("ok"))
        nowhere = client.get_queue_sender("orders", keep_alive=None)
        with pytest.raises(MessagingEntityNotFoundError), nowhere as sender:
            sender.send_messages(ServiceBusMessage("nowhere"))
    returncode, stderr = emulator.stop(signal.SIGINT)
    assert returncode == 0, stderr
    assert "Traceback" not in stderr


def test_the_command_reports_a_port_in_use(servicebus_emulator):
    process = subprocess.run(
        [sys.executable, "-m", "devtools.servicebus_emulator", "--port", str(servicebus_emulator.port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert process.returncode == 1
    assert process.stdout == ""
    assert f"cannot listen on 127.0.0.1:{servicebus_emulator.port}" in process.stderr


def test_the_benchmark_runs_and_reports_both_modes(capsys):
    from benchmarks import servicebus_emulator as benchmark

    assert benchmark.main(["--batched-messages", "200", "--single-messages", "20"]) == 0
    output = capsys.readouterr().out
    assert re.search(r"^batched\s+200\s+\d+", output, re.MULTILINE), output
    assert re.search(r"^single\s+20\s+\d+", output, re.MULTILINE), output
    assert "targets: " in output
