"""Sending messages: agent requests/responses, status events and alerts on Service Bus,
and scheduler nudges on the storage queue.

One :class:`Publisher` per process holds one ``ServiceBusClient`` and one sender per
queue, reused across invocations (opening a link per message would cost a round trip
or more each time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from core.models import STEP, AgentRequest, AgentResponse, Alert, Nudge, StatusEvent

log = logging.getLogger(__name__)

JSON = "application/json"
#: A status event may hold up the order's function this long at most...
STATUS_SEND_TIMEOUT = 2.0
#: ...and a reply queue that failed is left alone this long before the next try.
BROKEN_QUEUE_PAUSE = 60.0


def agent_request_id(order_id: str, step: str, attempt: int) -> str:
    return f"{order_id}:{step}:{attempt}"


class Publisher:
    """Thread-safe Service Bus sending (the Functions worker runs sync functions in threads)."""

    def __init__(self, client: ServiceBusClient) -> None:
        self.client = client
        self._senders: dict[str, object] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        #: Reply queues whose last send failed, with when to try them again.
        self._broken: dict[str, float] = {}
        #: Service Bus sends by kind, for benchmarks and tests.
        self.ops: Counter[str] = Counter()

    def _send(self, queue: str, message: ServiceBusMessage, kind: str, timeout: float | None = None) -> None:
        with self._guard:
            lock = self._locks.setdefault(queue, threading.Lock())
        with lock:
            sender = self._senders.get(queue)
            if sender is None:
                sender = self._senders[queue] = self.client.get_queue_sender(queue)
            try:
                sender.send_messages(message, timeout=timeout)
            except Exception:
                # A broken link is not reused: the next send opens a fresh one.
                self._senders.pop(queue, None)
                try:
                    sender.close()
                except Exception:  # noqa: BLE001 - closing a broken sender may fail too
                    pass
                raise
        self.ops[kind] += 1

    def send_agent_request(
        self, request: AgentRequest, *, queue: str, reply_to: str, now: datetime
    ) -> bool:
        """Send the request with a time-to-live that ends at complete-by, so an expired
        request is never delivered. Returns False (nothing sent) if the deadline has passed."""
        ttl = request.complete_by - now
        if ttl <= timedelta(0):
            return False
        message = ServiceBusMessage(
            request.model_dump_json(),
            content_type=JSON,
            message_id=agent_request_id(request.order_id, request.step, request.attempt),
            correlation_id=request.order_id,
            reply_to=reply_to,
            time_to_live=ttl,
            subject=request.step,
        )
        self._send(queue, message, "agent_request")
        return True

    def send_agent_response(self, response: AgentResponse, *, queue: str) -> None:
        message = ServiceBusMessage(
            response.model_dump_json(),
            content_type=JSON,
            message_id=f"{agent_request_id(response.order_id, response.step, response.attempt)}:response",
            correlation_id=response.order_id,
            subject=response.outcome.value,
        )
        self._send(queue, message, "agent_response")

    def send_alert(self, alert: Alert, *, queue: str, attempt: int) -> None:
        """Alerts have a stable message id per failed attempt, so a repeated alert (after a
        crash between the Error write and the send) is dropped by duplicate detection."""
        message = ServiceBusMessage(
            alert.model_dump_json(),
            content_type=JSON,
            message_id=f"{alert.order_id}:alert:{attempt}",
            correlation_id=alert.order_id,
            subject="order-failed",
        )
        self._send(queue, message, "alert")

    def send_status(self, event: StatusEvent, *, queue: str | None) -> bool:
        """Best effort: a missing or broken reply queue never blocks or fails the order."""
        if not queue or self._broken.get(queue, 0.0) > time.monotonic():
            return False
        message = ServiceBusMessage(
            event.model_dump_json(),
            content_type=JSON,
            message_id=f"{event.order_id}:{event.status.value}:{event.attempt or 0}",
            correlation_id=event.order_id,
            subject=event.status.value,
        )
        try:
            self._send(queue, message, "status", timeout=STATUS_SEND_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - by design: status events never fail an order
            self._broken[queue] = time.monotonic() + BROKEN_QUEUE_PAUSE
            log.warning(
                "status event %s for order %s not delivered to %r (not tried again for %.0f s): %s",
                event.status.value, event.order_id, queue, BROKEN_QUEUE_PAUSE, error,
            )
            return False
        self._broken.pop(queue, None)
        return True

    def close(self) -> None:
        for sender in list(self._senders.values()):
            try:
                sender.close()
            except Exception:  # noqa: BLE001
                pass
        self._senders.clear()
        self.client.close()


class Nudger:
    """Puts nudges on the scheduler's storage queue (base64, as the Functions host reads them)."""

    def __init__(self, queue_client) -> None:
        self.queue = queue_client
        self.ops: Counter[str] = Counter()

    def nudge(self, nudge: Nudge, *, delay: timedelta = timedelta(0)) -> None:
        seconds = max(0, min(int(delay.total_seconds() + 0.999), 7 * 24 * 3600 - 1))
        self.queue.send_message(nudge.model_dump_json(exclude_none=True), visibility_timeout=seconds or None)
        self.ops["nudge"] += 1


__all__ = ["Publisher", "Nudger", "agent_request_id", "STEP"]
