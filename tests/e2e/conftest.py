"""The whole app on the local stack: Azurite, the Service Bus emulator, the fake remote
service, and local host processes running the real function_app.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from core.models import OrderState, ProcessState
from adapters.store import OrderNotFound
from adapters.wiring import services
from tests.polling import wait_until
from tests.servicebus_helpers import bodies, receive

#: Short timings for tests, set through app settings (never by patching code).
FAST = {
    "STEP_TIMEOUT_SECONDS": "2",
    "PENDING_TIMEOUT_SECONDS": "2",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
    "RETRY_BACKOFF_BASE_SECONDS": "0.5",
    "RETRY_BACKOFF_MAX_SECONDS": "2",
    "AGENT_BACKOFF_INITIAL_SECONDS": "0.05",
    "AGENT_BACKOFF_MAX_SECONDS": "0.3",
    "REMOTE_CALL_TIMEOUT_SECONDS": "1",
}


@dataclass
class Stack:
    settings: dict[str, str]
    emulator: object
    remote: object
    funchost: object
    hosts: list = field(default_factory=list)

    @property
    def connection_string(self) -> str:
        return self.emulator.connection_string

    def start_hosts(self, count: int = 1, **overrides: str):
        env = {**FAST, **overrides}
        started = self.funchost.start(count=count, env=env)
        self.hosts += started
        return started

    def send(self, orders: Iterable[tuple[str, bytes]], *, reply_to: str | None = None) -> None:
        messages = [
            ServiceBusMessage(body, message_id=order_id, content_type="application/json", reply_to=reply_to)
            for order_id, body in orders
        ]
        with ServiceBusClient.from_connection_string(self.connection_string) as client:
            with client.get_queue_sender(self.settings["ORDERS_QUEUE"]) as sender:
                for start in range(0, len(messages), 100):
                    sender.send_messages(messages[start : start + 100])

    def state(self, order_id: str) -> OrderState | None:
        try:
            return services().store.get(order_id)
        except OrderNotFound:
            return None

    def wait_terminal(self, order_ids: list[str], *, timeout: float) -> dict[str, OrderState]:
        def all_terminal():
            states = {order_id: self.state(order_id) for order_id in order_ids}
            if all(s is not None and s.process_state.terminal for s in states.values()):
                return states
            return None

        return wait_until(all_terminal, timeout=timeout, what=f"{len(order_ids)} order(s) to finish", interval=0.25)

    def alerts(self, expected: int, timeout: float = 5.0) -> list[dict]:
        return bodies(receive(self.connection_string, self.settings["ALERTS_QUEUE"], expected + 1, timeout=timeout))

    def statuses(self, queue: str, expected: int, timeout: float = 5.0) -> list[dict]:
        return bodies(receive(self.connection_string, queue, expected, timeout=timeout))

    def host_logs(self) -> str:
        return "\n".join(host.log_text() for host in self.hosts)


@pytest.fixture
def stack(app_settings, servicebus_emulator, fake_remote, funchost) -> Stack:
    return Stack(app_settings, servicebus_emulator, fake_remote, funchost)


def processed(states: dict[str, OrderState]) -> int:
    return sum(1 for s in states.values() if s.process_state is ProcessState.PROCESSED)
