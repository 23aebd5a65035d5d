"""The app's side of the Service Bus emulator (``tools.servicebus_emulator``, which knows
nothing of the app): the local stack and the test fixture hand it the app's queues,
from ``core.names.SERVICEBUS_QUEUES``, with every property, and the SDK pin agrees."""

from __future__ import annotations

from core import names
from devtools.localstack import LocalStack, app_queues
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
