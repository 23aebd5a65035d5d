"""Sending messages: agent requests/responses, status events and alerts on Service Bus,
and scheduler nudges on the storage queues.

One :class:`Publisher` per process holds one ``ServiceBusClient`` and one sender per
queue, reused across invocations (opening a link per message would cost a round trip
or more each time).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from azure.servicebus import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage

from pydantic import BaseModel

from adapters import telemetry
from core import names
from core.models import AgentRequest, AgentResponse, Alert, Nudge, StatusEvent

log = logging.getLogger(__name__)

JSON = "application/json"
#: A status event may hold up the order's function this long at most...
STATUS_SEND_TIMEOUT = 2.0
#: ...and a reply queue that failed is left alone this long before the next try.
BROKEN_QUEUE_PAUSE = 60.0
#: The app's own queues plus the most recent reply queues.
MAX_OPEN_SENDERS = 16
#: The longest MessageId Service Bus takes.
MAX_MESSAGE_ID = 128
#: A sender not used for this long is closed and a new one opened for the next send. Azure
#: force-detaches a link with no send for 10 minutes ("AMQP errors in Azure Service Bus",
#: Microsoft Learn): the SDK recovers a detached sender only by retrying after its back-off,
#: which took 1.9 s of a status event's 2-s budget against the emulator, or failed past it
#: (the reply queue is then taken for broken and its events dropped for a minute), and which
#: holds any other send up as long (docs/scale.md, "Service Bus throttling, lost locks,
#: dropped links").
SENDER_IDLE_SECONDS = 9 * 60.0


def _idle_too_long(used: float) -> bool:
    """Whether a sender last used at ``used`` (monotonic seconds) is to be replaced (SENDER_IDLE_SECONDS)."""
    return time.monotonic() - used >= SENDER_IDLE_SECONDS


def agent_request_id(order_id: str, step: str, attempt: int) -> str:
    return f"{order_id}:{step}:{attempt}"


def _message(
    body: BaseModel, *, message_id: str, correlation_id: str, subject: str, reply_to: str | None = None,
    time_to_live: timedelta | None = None,
) -> AmqpAnnotatedMessage:
    """Every message the app sends: JSON of one model, correlated to its order, with the
    current span's trace context in its application properties (adapters.telemetry).

    Built as the AMQP message ``ServiceBusMessage`` builds for the same arguments (its header,
    properties and application properties; the sender turns either into the same outgoing
    message, tests/unit/test_messaging.py), without its property setters, each of which
    counts the message's AMQP properties again: 17-18 µs a message instead of 33-42 (issue 21)."""
    if len(message_id) > MAX_MESSAGE_ID:  # as ServiceBusMessage refuses it
        raise ValueError(f"message_id cannot be longer than {MAX_MESSAGE_ID} characters.")
    properties = {"message_id": message_id, "content_type": JSON, "correlation_id": correlation_id, "subject": subject}
    if reply_to is not None:
        properties["reply_to"] = reply_to
    return AmqpAnnotatedMessage(
        data_body=body.model_dump_json(),
        # Whole seconds, as ServiceBusMessage's time_to_live keeps them.
        header=None if time_to_live is None else {"time_to_live": int(time_to_live.total_seconds()) * 1000},
        properties=properties,
        application_properties=telemetry.message_properties() or None,
    )


class Publisher:
    """Thread-safe Service Bus sending (the Functions worker runs sync functions in threads)."""

    def __init__(self, client: ServiceBusClient) -> None:
        self.client = client
        #: queue -> its link: open senders, most recently used last. Reply queues are
        #: many, so only the MAX_OPEN_SENDERS most recent stay open.
        self._links: OrderedDict[str, _Link] = OrderedDict()
        self._guard = threading.Lock()
        #: Reply queues whose last send failed, with when to try them again.
        self._broken: dict[str, float] = {}
        #: Service Bus sends by kind, for benchmarks and tests.
        self.ops: Counter[str] = Counter()

    def _link(self, queue: str) -> _Link:
        with self._guard:
            link = self._links.get(queue)
            if link is None:
                link = self._links[queue] = _Link()
            self._links.move_to_end(queue)
            # Close the least recently used idle senders beyond the limit (one in use is kept).
            for name in list(self._links)[: max(0, len(self._links) - MAX_OPEN_SENDERS)]:
                old = self._links[name]
                if old is not link and old.lock.acquire(blocking=False):
                    try:
                        old.close()
                        del self._links[name]
                    finally:
                        old.lock.release()
            return link

    def _send(self, queue: str, message: AmqpAnnotatedMessage, kind: str, timeout: float | None = None) -> None:
        link = self._link(queue)
        with link.lock:
            if link.sender is not None and _idle_too_long(link.used):
                link.close()  # Azure has detached its link by now, or is about to
            if link.sender is None:
                link.sender = self.client.get_queue_sender(queue)
            try:
                link.sender.send_messages(message, timeout=timeout)
            except Exception:
                link.close()  # a broken link is not reused: the next send opens a fresh one
                raise
            link.used = time.monotonic()
        self.ops[kind] += 1
        telemetry.message_sent("servicebus", kind)

    def send_agent_request(
        self, request: AgentRequest, *, queue: str, reply_to: str, now: datetime
    ) -> bool:
        """Send the request with a time-to-live that ends at complete-by, so an expired
        request is never delivered. Returns False (nothing sent) if the deadline has passed."""
        ttl = request.complete_by - now
        if ttl <= timedelta(0):
            return False
        # Whole seconds on the wire (below): rounded up, never to 0, which the broker would
        # take for no time-to-live at all (the agent still never acts past complete-by).
        ttl = timedelta(seconds=math.ceil(ttl.total_seconds()))
        message = _message(
            request,
            message_id=agent_request_id(request.order_id, request.step, request.attempt),
            correlation_id=request.order_id,
            subject=request.action,
            reply_to=reply_to,
            time_to_live=ttl,
        )
        self._send(queue, message, "agent_request")
        return True

    def send_agent_response(self, response: AgentResponse, *, queue: str) -> None:
        self._send(queue, _response_message(response), "agent_response")

    def send_alert(self, alert: Alert, *, queue: str, attempt: int, ended: datetime | None = None) -> None:
        """Alerts have a stable message id per Error (its attempt, and when it ended: an undo
        resubmitted may fail again at the same attempt), so a repeated alert of one Error
        (after a crash between the Error write and the send) is dropped by duplicate
        detection, and a new Error's is not."""
        key = f"{attempt}" if ended is None else f"{attempt}:{ended_key(ended)}"
        message = _message(
            alert, message_id=f"{alert.order_id}:alert:{key}", correlation_id=alert.order_id, subject="order-failed"
        )
        self._send(queue, message, "alert")

    def send_status(self, event: StatusEvent, *, queue: str | None, key: str | None = None) -> bool:
        """Best effort: a missing or broken reply queue never blocks or fails the order.
        ``key``: what tells this event apart from another of its status at its attempt
        (:func:`status_message_id`)."""
        if not queue or self._broken.get(queue, 0.0) > time.monotonic():
            return False
        message = _message(
            event,
            message_id=status_message_id(event, key),
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

    def oldest_enqueued(self, queue: str) -> datetime | None:
        """When the oldest message still on ``queue`` was enqueued (locked ones included: a
        peek sees them), the current time if the queue is empty, None if it cannot be told
        (the supervisor then awaits answers for the whole response grace). One peek: one
        Service Bus operation, billed as one message received."""
        try:
            with self.client.get_queue_receiver(queue) as receiver:
                head = receiver.peek_messages(max_message_count=1, sequence_number=0)
        except Exception as error:  # noqa: BLE001 - unknown is a safe answer: the supervisor waits longer
            log.warning("could not peek %s for its oldest message: %s", queue, error)
            return None
        self.ops["peek"] += 1
        if not head:
            return datetime.now(UTC)
        return head[0].enqueued_time_utc

    def close(self) -> None:
        with self._guard:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            with link.lock:
                link.close()
        self.client.close()


def status_message_id(event: StatusEvent, key: str | None = None) -> str:
    """A status event's MessageId: the order id, the status and the attempt, then ``key``
    where one status can happen twice at one attempt (an order's end: an undo resubmitted
    can fail again at once, unclaimed; a rejection: two different invalid messages can name
    one order id). The same event sent again (a close repeated after a crash, a message
    redelivered) has the same id, so a reply queue's duplicate detection drops the repeat
    and never a new event. An id longer than Service Bus takes keeps the order id and a
    digest of the rest."""
    parts = [event.status.value, str(event.attempt or 0), *([key] if key else [])]
    message_id = ":".join([event.order_id, *parts])
    if len(message_id) <= MAX_MESSAGE_ID:
        return message_id
    return f"{event.order_id[:100]}:{hashlib.sha256(':'.join(parts).encode()).hexdigest()[:24]}"


def ended_key(ended: datetime) -> str:
    """An order's end as a status event's or an alert's key: milliseconds since the epoch, in hex."""
    return f"{int(ended.timestamp() * 1000):x}"


class _Link:
    """One queue's sender and the lock that serialises its use (senders are not thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sender = None
        #: When the sender last sent (monotonic seconds): one idle too long is replaced.
        self.used = 0.0

    def close(self) -> None:
        sender, self.sender = self.sender, None
        if sender is not None:
            try:
                sender.close()
            except Exception:  # noqa: BLE001 - closing a broken or idle sender may fail; nothing to do
                pass


class AsyncPublisher:
    """Service Bus sending from ``async`` functions (the agents): one client and one sender
    per queue on the event loop, reused across invocations; nothing holds a thread."""

    def __init__(self, client) -> None:
        self.client = client  # an azure.servicebus.aio.ServiceBusClient
        self._senders: dict[str, object] = {}
        #: When each queue's sender last sent (monotonic seconds): one idle too long is replaced.
        self._used: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.ops: Counter[str] = Counter()

    async def send_agent_response(self, response: AgentResponse, *, queue: str) -> None:
        lock = self._locks.setdefault(queue, asyncio.Lock())
        async with lock:  # a sender is not safe for concurrent sends
            sender = self._senders.get(queue)
            if sender is not None and _idle_too_long(self._used.get(queue, 0.0)):
                del self._senders[queue]  # Azure has detached its link by now (SENDER_IDLE_SECONDS)
                await _close_quietly(sender)
                sender = None
            if sender is None:
                sender = self._senders[queue] = self.client.get_queue_sender(queue)
            try:
                await sender.send_messages(_response_message(response))
            except Exception:
                self._senders.pop(queue, None)  # a broken link is not reused
                await _close_quietly(sender)
                raise
            self._used[queue] = time.monotonic()
        self.ops["agent_response"] += 1
        telemetry.message_sent("servicebus", "agent_response")

    async def close(self) -> None:
        senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            await _close_quietly(sender)
        await self.client.close()


async def _close_quietly(sender) -> None:
    try:
        await sender.close()
    except Exception:  # noqa: BLE001 - closing a broken or idle sender may fail; nothing to do
        pass


def _response_message(response: AgentResponse) -> AmqpAnnotatedMessage:
    return _message(
        response,
        message_id=f"{agent_request_id(response.order_id, response.step, response.attempt)}:response",
        correlation_id=response.order_id,
        subject=response.outcome.value,
    )


class Nudger:
    """Puts nudges on the scheduler's storage queues (base64, as the Functions host reads them),
    each with the current span's trace context. An order's nudges all go to one queue, the
    one its id picks (``core.names.scheduler_queue_shard``): ``queues`` holds one client per
    shard, in shard order."""

    def __init__(self, queues: Sequence) -> None:
        if len(queues) != names.SCHEDULER_QUEUE_SHARDS:
            raise ValueError(f"the scheduler has {names.SCHEDULER_QUEUE_SHARDS} queues, not {len(queues)}")
        self.queues = tuple(queues)
        self.ops: Counter[str] = Counter()

    def queue_for(self, order_id: str):
        """The client of the queue ``order_id``'s nudges go to."""
        return self.queues[names.scheduler_queue_shard(order_id)]

    def nudge(self, nudge: Nudge, *, delay: timedelta = timedelta(0)) -> None:
        seconds = max(0, min(int(delay.total_seconds() + 0.999), 7 * 24 * 3600 - 1))
        self.queue_for(nudge.order_id).send_message(self.body(nudge), visibility_timeout=seconds or None)
        self.sent()

    @staticmethod
    def body(nudge: Nudge) -> str:
        """The text a nudge is sent as (before base64), with the current span's trace context."""
        return telemetry.stamp(nudge).model_dump_json(exclude_none=True)

    def sent(self) -> None:
        """Count one nudge sent, by this nudger or by a function's queue output binding."""
        self.ops["nudge"] += 1
        telemetry.message_sent("storage_queue", "nudge")


__all__ = ["AsyncPublisher", "Nudger", "Publisher", "agent_request_id"]
