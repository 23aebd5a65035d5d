"""``python -m tools.servicebus_emulator``: the command a local stack or a person runs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from tools.servicebus_emulator import QueueSettings

from .conftest import IMPORT_ROOT, receive_exactly

CONNECTION_STRING = re.compile(
    r"^Endpoint=sb://127\.0\.0\.1:(\d+);SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;$"
)


class Command:
    def __init__(self, *args: str, stdin: int = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tools.servicebus_emulator", "--port", "0", *args],
            cwd=IMPORT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=stdin,
            text=True,
        )
        assert self.process.stdout is not None
        self.connection_string = self.process.stdout.readline().strip()

    def ask(self, line: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline()

    def stop(self, signum: int) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        _, stderr = self.process.communicate(timeout=10)
        return self.process.returncode, stderr


@pytest.fixture
def command() -> Iterator[type[Command]]:
    started: list[Command] = []

    def start(*args: str, stdin: int = subprocess.DEVNULL) -> Command:
        instance = Command(*args, stdin=stdin)
        started.append(instance)
        return instance

    yield start  # type: ignore[misc]
    for instance in started:
        if instance.process.poll() is None:
            instance.process.kill()
            instance.process.communicate(timeout=10)


def test_the_command_prints_the_connection_string_serves_its_queues_and_stops_on_sigterm(command):
    emulator = command("--queue", "orders:max_delivery_count=5,dead_letter_on_expiry=true")
    assert CONNECTION_STRING.match(emulator.connection_string), emulator.connection_string
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_sender("orders", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("order"))
        with client.get_queue_receiver("orders") as receiver:
            (message,) = receive_exactly(receiver, 1)
            assert str(message) == "order"
            receiver.complete_message(message)
    returncode, stderr = emulator.stop(signal.SIGTERM)
    assert returncode == 0, stderr
    assert "listening on 127.0.0.1" in stderr and "(queues: orders)" in stderr and "stopped" in stderr
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
        [sys.executable, "-m", "tools.servicebus_emulator", "--port", str(servicebus_emulator.port)],
        cwd=IMPORT_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert process.returncode == 1
    assert process.stdout == ""
    assert f"cannot listen on 127.0.0.1:{servicebus_emulator.port}" in process.stderr


def test_the_command_without_queues_serves_none(command):
    emulator = command()
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        nowhere = client.get_queue_sender("orders", keep_alive=None)
        with pytest.raises(MessagingEntityNotFoundError), nowhere as sender:
            sender.send_messages(ServiceBusMessage("nowhere"))
    returncode, stderr = emulator.stop(signal.SIGTERM)
    assert returncode == 0, stderr
    assert "(queues: none)" in stderr


def refused(*arguments: str) -> subprocess.CompletedProcess:
    """The command with a bad argument: it must stop at once (it would otherwise serve)."""
    return subprocess.run(
        [sys.executable, "-m", "tools.servicebus_emulator", "--port", "0", *arguments],
        cwd=IMPORT_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    "spec", ["orders:max_delivery_count=0", "orders:colour=blue", "orders:lock_duration=soon", ":max_delivery_count=2"]
)
def test_the_command_refuses_a_bad_queue_declaration(spec):
    process = refused("--queue", spec)
    assert process.returncode == 2, process.stderr
    assert process.stdout == ""
    assert "--queue" in process.stderr and "Traceback" not in process.stderr


def test_the_command_refuses_an_unknown_log_level_as_a_bad_argument():
    process = refused("--log-level", "loud")
    assert process.returncode == 2, process.stderr
    assert "--log-level" in process.stderr and "Traceback" not in process.stderr


def test_a_queue_declaration_reads_every_property_and_writes_back_what_it_reads():
    settings = QueueSettings.parse(
        "orders:lock_duration=30s,max_delivery_count=5,default_ttl=7d,dead_letter_on_expiry=true,"
        "duplicate_detection=yes,duplicate_detection_window=1.5h"
    )
    assert settings == QueueSettings(
        "orders",
        lock_duration=30.0,
        max_delivery_count=5,
        default_ttl=7 * 86400.0,
        dead_letter_on_expiry=True,
        duplicate_detection=True,
        duplicate_detection_window=5400.0,
    )
    assert QueueSettings.parse(settings.to_arg()) == settings
    assert QueueSettings.parse("plain") == QueueSettings("plain")
    assert QueueSettings("plain").to_arg() == "plain"
    assert QueueSettings("q", lock_duration=0.5, duplicate_detection=True).to_arg() == (
        "q:lock_duration=0.5,duplicate_detection=true"
    )
    assert QueueSettings("q", lock_duration=90, default_ttl=7 * 86400.0).to_arg() == "q:lock_duration=90s,default_ttl=7d"
    assert QueueSettings.parse("q:lock_duration=90,default_ttl=2m") == QueueSettings(
        "q", lock_duration=90.0, default_ttl=120.0
    )


def test_stats_on_stdin_answer_operation_counts_and_end_of_stdin_stops_the_command(command):
    emulator = command("--queue", "counted", "--stats-stdin", stdin=subprocess.PIPE)
    before = json.loads(emulator.ask("stats"))
    assert before["operations"] == {}
    assert before["cpu_seconds"] > 0
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_sender("counted", keep_alive=None) as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        with client.get_queue_receiver("counted") as receiver:
            for message in receive_exactly(receiver, 2):
                receiver.complete_message(message)
    assert emulator.process.stdin is not None
    emulator.process.stdin.write("hello\n")  # not a command: ignored
    after = json.loads(emulator.ask("stats"))["operations"]
    assert after["enqueue counted"] == 2
    assert after["deliver counted"] == 2
    assert after["settle.accepted counted"] == 2
    assert after["connections"] >= 1
    assert after["frame.open"] == after["frame.sasl_init"] == after["connections"]
    assert after["frame.transfer"] >= 1 and after["frame.disposition"] >= 1 and after["frame.flow"] >= 1
    emulator.process.stdin.close()  # whoever drove it went away
    assert emulator.process.wait(10) == 0


def test_the_benchmark_runs_and_reports_both_modes(capsys):
    from tools.servicebus_emulator import benchmark

    assert benchmark.main(["--batched-messages", "200", "--single-messages", "20"]) == 0
    output = capsys.readouterr().out
    assert re.search(r"^batched\s+200\s+\d+", output, re.MULTILINE), output
    assert re.search(r"^single\s+20\s+\d+", output, re.MULTILINE), output
    assert "targets: " in output


@pytest.mark.parametrize("seconds", ["-1", "soon", "inf"])
def test_the_command_refuses_a_bad_link_idle_timeout_as_a_bad_argument(seconds):
    process = refused("--link-idle-timeout", seconds)
    assert process.returncode == 2, process.stderr
    assert "--link-idle-timeout" in process.stderr and "Traceback" not in process.stderr
