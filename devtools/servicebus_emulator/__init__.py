"""A Service Bus emulator for local runs and tests: AMQP 1.0 on loopback, no Docker.

The official ``azure-servicebus`` SDK talks to it over a real socket with::

    Endpoint=sb://127.0.0.1:PORT;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;

In a test or script::

    from devtools import servicebus_emulator
    emu = servicebus_emulator.start()          # free port, the app's queues from core.names
    emu.declare_queue("q1", max_delivery_count=3)
    ... ServiceBusClient.from_connection_string(emu.connection_string) ...
    emu.message_counts("q1")                   # {"active", "dead_letter", "scheduled", "locked"}
    emu.stop()

As a command: ``python -m devtools.servicebus_emulator --port 5672``.
See docs/servicebus-emulator.md for what it supports and its limits.
"""

from .broker import QueueSettings
from .codec import SUPPORTED_SDK_VERSION, SdkVersionError, check_sdk_version
from .server import EmulatorError, EmulatorServer, ServiceBusEmulator, connection_string, start

__all__ = [
    "SUPPORTED_SDK_VERSION",
    "EmulatorError",
    "EmulatorServer",
    "QueueSettings",
    "SdkVersionError",
    "ServiceBusEmulator",
    "check_sdk_version",
    "connection_string",
    "start",
]
