"""A Service Bus emulator for local runs and tests: AMQP 1.0 on loopback, no Docker.

The official SDKs (``azure-servicebus`` in Python, ``@azure/service-bus`` in JavaScript)
talk to it over a real socket with::

    Endpoint=sb://127.0.0.1:PORT;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;

In a test or script::

    from tools import servicebus_emulator
    emu = servicebus_emulator.start(queues=[servicebus_emulator.QueueSettings("orders", max_delivery_count=5)])
    emu.declare_queue("q1", max_delivery_count=3)
    ... ServiceBusClient.from_connection_string(emu.connection_string) ...
    emu.message_counts("q1")                   # {"active", "dead_letter", "scheduled", "locked"}
    emu.operation_counts()                     # {"enqueue q1": 1, "deliver q1": 1, "frame.flow": 3, ...}
    emu.set_faults(servicebus_emulator.Faults(throttle=1000, lock_lost=0.01))  # Azure's push-back
    emu.fault_counts()                         # {"throttled": 0, "lock_lost": 0, ...}
    emu.stop()

As a command: ``python -m tools.servicebus_emulator --port 5672 --queue orders:max_delivery_count=5``.
It imports nothing from the project around it. See README.md (next to this file) for what
it supports and its limits.
"""

from .broker import QueueSettings
from .codec import SUPPORTED_SDK_VERSION, SdkVersionError, check_sdk_version
from .faults import Faults
from .server import EmulatorError, EmulatorServer, ServiceBusEmulator, connection_string, start

__all__ = [
    "SUPPORTED_SDK_VERSION",
    "EmulatorError",
    "EmulatorServer",
    "Faults",
    "QueueSettings",
    "SdkVersionError",
    "ServiceBusEmulator",
    "check_sdk_version",
    "connection_string",
    "start",
]
