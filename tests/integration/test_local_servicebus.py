"""The app's side of the Service Bus emulator (``tools.servicebus_emulator``, which knows
nothing of the app): the local stack and the test fixture hand it the app's queues,
from ``core.names.SERVICEBUS_QUEUES``, with every property, and the SDK pin agrees."""

from __future__ import annotations

import pytest
import typer
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusServerBusyError

from core import names
from devtools.localstack import (
    DEFAULT_THROTTLE_CREDITS,
    LocalStack,
    ServiceBusFaults,
    app_queues,
    servicebus_faults_option,
)
from tests import ROOT
from tools import servicebus_emulator as emulator


def test_requirements_pin_the_sdk_version_the_emulator_was_built_against():
    with open(ROOT / "requirements.txt") as requirements:
        pins = [line.split("#")[0].strip() for line in requirements]
    assert f"azure-servicebus=={emulator.SUPPORTED_SDK_VERSION}" in pins


def test_the_app_queues_carry_every_property_of_core_names():
    queues = app_queues()
    assert [q.name for q in queues] == [spec.name for spec in names.SERVICEBUS_QUEUES]
    for spec, settings in zip(names.SERVICEBUS_QUEUES, queues, strict=True):
        assert settings == emulator.QueueSettings(
            name=spec.name,
            lock_duration=spec.lock_duration.total_seconds(),
            max_delivery_count=spec.max_delivery_count,
            default_ttl=spec.default_ttl.total_seconds(),
            dead_letter_on_expiry=spec.dead_letter_on_expiry,
            duplicate_detection=spec.duplicate_detection,
            duplicate_detection_window=spec.duplicate_detection_window.total_seconds(),
        )


def test_the_local_stack_command_declares_exactly_the_app_queues():
    command = LocalStack()._emulator_command()
    assert command[1:3] == ["-m", "tools.servicebus_emulator"]
    declared = [emulator.QueueSettings.parse(value) for flag, value in zip(command, command[1:]) if flag == "--queue"]
    assert declared == app_queues()


def test_the_session_emulator_has_the_app_queues(servicebus_emulator):
    for spec in names.SERVICEBUS_QUEUES:
        assert servicebus_emulator.message_counts(spec.name) is not None


def test_service_bus_faults_of_the_local_stack_parse_from_the_command_line():
    default = ServiceBusFaults.default()
    assert default.throttle == DEFAULT_THROTTLE_CREDITS and default.lock_lost == 0.01 and default.enabled
    assert ServiceBusFaults.from_option("default") == default
    assert ServiceBusFaults.from_option("none") == ServiceBusFaults() and not ServiceBusFaults().enabled
    assert ServiceBusFaults.from_option("throttle=1000,link-drop=0.005") == ServiceBusFaults(throttle=1000, link_drop=0.005)
    assert servicebus_faults_option(None) is None
    with pytest.raises(typer.BadParameter, match="--servicebus-faults 'lock-lost=2'"):
        servicebus_faults_option("lock-lost=2")


def test_the_local_stack_hands_its_faults_to_the_emulator_and_reads_their_counts(tmp_path):
    assert "--faults" not in LocalStack()._emulator_command()
    stack = LocalStack(servicebus_faults=ServiceBusFaults(throttle=1), log_dir=tmp_path)
    command = stack._emulator_command()
    assert command[command.index("--faults") + 1] == "throttle=1" and "--stats-stdin" in command
    stack._start_emulator()
    try:
        with ServiceBusClient.from_connection_string(stack.servicebus_connection_string, retry_total=0) as client:
            with client.get_queue_sender(names.ORDERS_QUEUE) as sender:
                sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])  # 1 credit, 2 spent
                with pytest.raises(ServiceBusServerBusyError):  # until the balance is back above zero
                    sender.send_messages(ServiceBusMessage("c"))
        assert stack.servicebus_fault_counts() == {"throttled": 1, "lock_lost": 0, "link_drop": 0, "connection_drop": 0}
    finally:
        stack.stop()
