"""Queues: messages, sequence numbers, locks, scheduling, expiry and dead-lettering.

Everything here runs on the emulator's event loop thread, so nothing is locked.
Each queue has two stores (the queue itself and its ``$deadletterqueue``), and one
timeline of deadlines (lock expiries, scheduled enqueue times, message expiries)
served by a single timer. Entries in the heaps are checked when they come due
rather than removed when they become stale, which keeps every operation O(log n).

Delivery is pushed: a receiver link registers as a :class:`Consumer` and the store
hands it messages while it has credit, round-robin between consumers.

The broker also holds the emulator's operation counters (:attr:`Broker.operations`),
which the queues, links, management nodes and connections add to as they work.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import heapq
import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from .faults import FaultInjector, Faults
from .message import MessageContent, PropertyUpdates, with_message_id, with_properties

log = logging.getLogger(__name__)

MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
TTL_EXPIRED = "TTLExpiredException"


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


@dataclass(frozen=True)
class QueueSettings:
    """A queue's properties (times in seconds), with Service Bus's defaults.

    On the command line a queue is ``NAME[:key=value,...]`` (see :meth:`parse`), e.g.
    ``orders:max_delivery_count=5,dead_letter_on_expiry=true,default_ttl=7d``.
    """

    name: str
    lock_duration: float = 60.0
    max_delivery_count: int = 10
    default_ttl: float = 14 * 24 * 3600.0
    dead_letter_on_expiry: bool = False
    duplicate_detection: bool = False
    duplicate_detection_window: float = 600.0

    def __post_init__(self) -> None:
        if not self.name or any(character in self.name for character in ":,= "):
            raise ValueError(f"invalid queue name {self.name!r}")
        if self.max_delivery_count < 1:
            raise ValueError(f"queue {self.name}: max_delivery_count must be at least 1")
        for key in ("lock_duration", "default_ttl", "duplicate_detection_window"):
            if getattr(self, key) <= 0:
                raise ValueError(f"queue {self.name}: {key} must be positive")

    @classmethod
    def parse(cls, text: str) -> QueueSettings:
        """``NAME[:key=value,...]``: keys are the field names; durations are seconds, or a
        number with ``s``, ``m``, ``h`` or ``d``; booleans ``true``/``false``. Raises ValueError."""
        name, _, options = text.strip().partition(":")
        types = {f.name: f.type for f in fields(cls) if f.name != "name"}
        values: dict[str, Any] = {}
        for option in filter(None, (part.strip() for part in options.split(","))):
            key, equals, raw = (item.strip() for item in option.partition("="))
            if key not in types or not equals:
                raise ValueError(f"queue {name!r}: unknown option {option!r} (known: {', '.join(types)})")
            values[key] = _parse_value(key, types[key], raw)
        return cls(name.strip(), **values)

    def to_arg(self) -> str:
        """The ``NAME[:key=value,...]`` form :meth:`parse` reads (only the non-default properties)."""
        defaults = QueueSettings("q")
        options = [
            f"{f.name}={_format_value(getattr(self, f.name), duration=f.type == 'float')}"
            for f in fields(self)
            if f.name != "name" and getattr(self, f.name) != getattr(defaults, f.name)
        ]
        return ":".join([self.name, ",".join(options)]) if options else self.name


def _parse_value(key: str, kind: str, raw: str) -> Any:
    text = raw.lower()
    try:
        if kind == "bool":
            if text not in _TRUE | _FALSE:
                raise ValueError(raw)
            return text in _TRUE
        if kind == "int":
            return int(text)
        unit = _DURATION_UNITS.get(text[-1:]) if text else None
        return float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        raise ValueError(f"invalid value {raw!r} for {key} (expected a {kind})") from None


def _format_value(value: Any, *, duration: bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if duration and float(value).is_integer():
        for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
            if int(value) % seconds == 0:
                return f"{int(value) // seconds}{unit}"
    return str(value)


class MessageState(enum.IntEnum):
    """The values of the ``x-opt-message-state`` annotation."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


@dataclass(eq=False, slots=True)
class StoredMessage:
    sequence_number: int
    content: MessageContent
    enqueued_ms: int
    state: MessageState = MessageState.ACTIVE
    expires_at: float | None = None
    scheduled_at: float | None = None
    delivery_count: int = 0
    lock_token: bytes | None = None
    locked_until: float = 0.0
    dead_letter: tuple[str | None, str | None] | None = None

    @property
    def locked(self) -> bool:
        return self.lock_token is not None


class Consumer(Protocol):
    """A receiver link, as the store sees it."""

    receive_and_delete: bool

    def available_credit(self) -> int:
        """How many messages the link can take now (link credit, session window)."""

    def deliver(self, message: StoredMessage, lock_token: bytes | None) -> None:
        """Send the message; ``lock_token`` is None when it was removed from the queue (receive-and-delete)."""

    def throttled(self) -> None:
        """The namespace has no credits left this second: refuse the receiver (it stops being a consumer)."""


class LockLost(Exception):
    """The lock token is unknown or its lock has expired."""


class MessageNotFound(Exception):
    """No message with that sequence number (in the state asked for)."""


class MessageStore:
    """The messages of a queue, or of its dead-letter sub-queue."""

    def __init__(self, queue: Queue, *, dead_letter: bool) -> None:
        self.queue = queue
        self.is_dead_letter = dead_letter
        self.messages: dict[int, StoredMessage] = {}
        self._ready: list[int] = []  # sequence numbers, lazily invalidated
        self._locks: dict[bytes, StoredMessage] = {}
        self._consumers: list[Consumer] = []
        self._next_consumer = 0
        self._pumping = False

    @property
    def path(self) -> str:
        return f"{self.queue.settings.name}/$deadletterqueue" if self.is_dead_letter else self.queue.settings.name

    # --- consumers -------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self._consumers.append(consumer)
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)

    def wake(self) -> None:
        """Deliver what can be delivered now (a no-op when called from within a delivery)."""
        if self._pumping:
            return
        self._pumping = True
        try:
            self._pump()
        finally:
            self._pumping = False

    def _pump(self) -> None:
        consumers = self._consumers
        while self._ready and consumers:
            consumer = None
            for offset in range(len(consumers)):
                candidate = consumers[(self._next_consumer + offset) % len(consumers)]
                if candidate.available_credit() > 0:
                    consumer = candidate
                    self._next_consumer = (self._next_consumer + offset + 1) % len(consumers)
                    break
            if consumer is None:
                return
            message = self._pop_ready()
            if message is None:
                return
            faults = self.queue.faults
            if not faults.charge(1):  # a receive costs a credit, as on the Standard tier
                heapq.heappush(self._ready, message.sequence_number)
                consumer.throttled()
                continue
            if consumer.receive_and_delete:
                del self.messages[message.sequence_number]
                consumer.deliver(message, None)
            else:
                token = self._lock(message)
                consumer.deliver(message, token)
                if faults.lose_lock():
                    self.queue.loop.call_soon(self._lose_lock, message, token)

    def _pop_ready(self) -> StoredMessage | None:
        now = time.time()
        while self._ready:
            message = self.messages.get(heapq.heappop(self._ready))
            if message is None or message.locked or message.state is not MessageState.ACTIVE:
                continue
            if message.expires_at is not None and message.expires_at <= now:
                self.queue.expire(message)
                continue
            return message
        return None

    # --- state changes -----------------------------------------------------------------------

    def add(self, message: StoredMessage) -> None:
        self.messages[message.sequence_number] = message
        if message.state is MessageState.ACTIVE:
            self.make_ready(message)
        elif message.state is MessageState.SCHEDULED:
            self.queue.timeline.add(message.scheduled_at, "schedule", self, message)

    def make_ready(self, message: StoredMessage) -> None:
        heapq.heappush(self._ready, message.sequence_number)
        self.wake()

    def remove(self, message: StoredMessage) -> None:
        self.messages.pop(message.sequence_number, None)
        self._unlock(message)

    def _lock(self, message: StoredMessage) -> bytes:
        token = uuid.uuid4().bytes
        message.lock_token = token
        message.locked_until = time.time() + self.queue.settings.lock_duration
        self._locks[token] = message
        self.queue.timeline.add(message.locked_until, "lock", self, message)
        return token

    def _unlock(self, message: StoredMessage) -> None:
        if message.lock_token is not None:
            self._locks.pop(message.lock_token, None)
            message.lock_token = None

    def locked_message(self, token: bytes) -> StoredMessage:
        message = self._locks.get(token)
        if message is None or message.locked_until <= time.time():
            raise LockLost()
        return message

    # --- settlement (peek-lock) ------------------------------------------------------------

    def complete(self, token: bytes) -> None:
        self.remove(self.locked_message(token))

    def abandon(self, token: bytes, updates: PropertyUpdates | None = None) -> None:
        """Unlock and redeliver, counting a delivery (Service Bus counts an abandon as an attempt)."""
        message = self.locked_message(token)
        self._modify(message, updates)
        self._return(message, count_delivery=True)

    def release(self, token: bytes) -> None:
        """Hand the message back without counting a delivery (the client never looked at it)."""
        self._return(self.locked_message(token), count_delivery=False)

    def defer(self, token: bytes, updates: PropertyUpdates | None = None) -> None:
        message = self.locked_message(token)
        self._modify(message, updates)
        self._unlock(message)
        message.state = MessageState.DEFERRED

    def dead_letter(
        self, token: bytes, reason: str | None, description: str | None, updates: PropertyUpdates | None = None
    ) -> None:
        message = self.locked_message(token)
        self._modify(message, updates)
        self.queue.move_to_dead_letter(self, message, reason, description)

    @staticmethod
    def _modify(message: StoredMessage, updates: PropertyUpdates | None) -> None:
        """Apply a settlement's properties to modify to the message's application properties."""
        if updates:
            message.content = with_properties(message.content, updates)

    def renew(self, token: bytes) -> float:
        message = self.locked_message(token)
        message.locked_until = time.time() + self.queue.settings.lock_duration
        self.queue.timeline.add(message.locked_until, "lock", self, message)
        return message.locked_until

    def _lose_lock(self, message: StoredMessage, token: bytes) -> None:
        """An injected fault: the lock is gone before its time, and the message available again."""
        if message.lock_token == token and self.messages.get(message.sequence_number) is message:
            log.debug("lock lost (injected) on %s #%d", self.path, message.sequence_number)
            self._return(message, count_delivery=True)

    def lock_expired(self, message: StoredMessage) -> None:
        log.debug("lock expired on %s #%d", self.path, message.sequence_number)
        self._return(message, count_delivery=True)

    def _return(self, message: StoredMessage, *, count_delivery: bool) -> None:
        self._unlock(message)
        if count_delivery:
            message.delivery_count += 1
            if message.delivery_count >= self.queue.settings.max_delivery_count and not self.is_dead_letter:
                self.queue.move_to_dead_letter(
                    self,
                    message,
                    MAX_DELIVERY_COUNT_EXCEEDED,
                    f"Message could not be consumed after {self.queue.settings.max_delivery_count} delivery attempts.",
                )
                return
        if message.state is MessageState.ACTIVE:
            if message.expires_at is not None and message.expires_at <= time.time():
                self.queue.expire(message)
            else:
                self.make_ready(message)

    # --- by sequence number (deferred messages, peek) --------------------------------------------

    def take_deferred(self, sequence_number: int, consumer_deletes: bool) -> tuple[StoredMessage, bytes | None]:
        """Lock (or remove) a deferred message for ``receive_deferred_messages``."""
        message = self.messages.get(sequence_number)
        if message is None or message.state is not MessageState.DEFERRED or message.locked:
            raise MessageNotFound(sequence_number)
        if consumer_deletes:
            self.remove(message)
            return message, None
        return message, self._lock(message)

    def peek(self, from_sequence_number: int, count: int) -> list[StoredMessage]:
        numbers = heapq.nsmallest(count, (n for n in self.messages if n >= from_sequence_number))
        return [self.messages[n] for n in numbers]

    def counts(self) -> dict[str, int]:
        active = scheduled = locked = 0
        for message in self.messages.values():
            if message.locked:
                locked += 1
            elif message.state is MessageState.ACTIVE:
                active += 1
            elif message.state is MessageState.SCHEDULED:
                scheduled += 1
        return {"active": active, "scheduled": scheduled, "locked": locked}


class Timeline:
    """Deadlines of one queue (lock expiry, scheduled enqueue, message expiry) on one timer."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._heap: list[tuple[float, int, str, MessageStore, StoredMessage]] = []
        self._counter = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._compact_at = 1024

    def add(self, when: float, kind: str, store: MessageStore, message: StoredMessage) -> None:
        heapq.heappush(self._heap, (when, next(self._counter), kind, store, message))
        if len(self._heap) > self._compact_at:
            self._compact()
        self._arm()

    def _arm(self) -> None:
        if not self._heap:
            return
        when = self._heap[0][0]
        if when >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = self.queue.loop
        self._timer_at = when
        self._timer = loop.call_at(loop.time() + max(0.0, when - time.time()), self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        now = time.time()
        while self._heap and self._heap[0][0] <= now:
            _, _, kind, store, message = heapq.heappop(self._heap)
            if store.messages.get(message.sequence_number) is not message:
                continue  # settled, moved or cancelled since
            if kind == "lock":
                if message.locked and message.locked_until <= now:
                    store.lock_expired(message)
            elif kind == "schedule":
                if message.state is MessageState.SCHEDULED:
                    self.queue.activate(message)
            elif kind == "expire":
                due = message.expires_at is not None and message.expires_at <= now
                if due and not message.locked and message.state is MessageState.ACTIVE:
                    self.queue.expire(message)
        self._arm()

    def _compact(self) -> None:
        """Drop entries of messages that are gone (a long run must not keep every message's deadline)."""
        self._heap = [entry for entry in self._heap if entry[3].messages.get(entry[4].sequence_number) is entry[4]]
        heapq.heapify(self._heap)
        self._compact_at = 2 * len(self._heap) + 1024

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, float("inf")


@dataclass
class _DuplicateHistory:
    window: float
    seen: dict[object, float] = field(default_factory=dict)
    order: collections.deque[tuple[float, object]] = field(default_factory=collections.deque)

    def is_duplicate(self, message_id: object, now: float) -> bool:
        while self.order and self.order[0][0] <= now:
            expires, old = self.order.popleft()
            if self.seen.get(old) == expires:
                del self.seen[old]
        if message_id in self.seen:
            return True
        expires = now + self.window
        self.seen[message_id] = expires
        self.order.append((expires, message_id))
        return False


class Queue:
    """One queue and its dead-letter sub-queue."""

    def __init__(
        self,
        settings: QueueSettings,
        loop: asyncio.AbstractEventLoop,
        operations: collections.Counter[str] | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        self.settings = settings
        self.loop = loop
        self.operations: collections.Counter[str] = collections.Counter() if operations is None else operations
        self.faults = FaultInjector(None, self.operations) if faults is None else faults
        self.active = MessageStore(self, dead_letter=False)
        self.dead_letter = MessageStore(self, dead_letter=True)
        self.timeline = Timeline(self)
        self._sequence = itertools.count(1)
        self._duplicates = _DuplicateHistory(settings.duplicate_detection_window)

    def size(self) -> int:
        return len(self.active.messages) + len(self.dead_letter.messages)

    def store(self, dead_letter: bool) -> MessageStore:
        return self.dead_letter if dead_letter else self.active

    def reconfigure(self, settings: QueueSettings) -> None:
        self.settings = settings
        self._duplicates.window = settings.duplicate_detection_window

    def _is_duplicate(self, content: MessageContent, now: float) -> bool:
        if not self.settings.duplicate_detection or content.message_id is None:
            return False
        return self._duplicates.is_duplicate(content.message_id, now)

    def send(self, content: MessageContent) -> int | None:
        """Enqueue (or schedule, if it carries a scheduled enqueue time); None if dropped as a duplicate."""
        self.operations["enqueue " + self.settings.name] += 1
        now = time.time()
        content = with_message_id(content)
        if self._is_duplicate(content, now):
            log.debug("dropped duplicate message id %r on %s", content.message_id, self.settings.name)
            return None
        scheduled = content.scheduled_enqueue_ms
        if scheduled is not None and scheduled / 1000.0 > now:
            return self._schedule(content, scheduled / 1000.0)
        message = StoredMessage(next(self._sequence), content, int(now * 1000))
        self._set_expiry(message, now)
        self.active.add(message)
        return message.sequence_number

    def schedule(self, content: MessageContent, at: float) -> int:
        """Schedule a message (``schedule_messages``); duplicates still get a sequence number."""
        content = with_message_id(content)
        if self._is_duplicate(content, time.time()):
            return next(self._sequence)
        return self._schedule(content, at)

    def _schedule(self, content: MessageContent, at: float) -> int:
        message = StoredMessage(next(self._sequence), content, int(at * 1000), MessageState.SCHEDULED)
        message.scheduled_at = at
        self.active.add(message)
        return message.sequence_number

    def cancel_scheduled(self, sequence_number: int) -> None:
        message = self.active.messages.get(sequence_number)
        if message is None or message.state is not MessageState.SCHEDULED:
            raise MessageNotFound(sequence_number)
        self.active.remove(message)

    def activate(self, message: StoredMessage) -> None:
        """A scheduled message comes due: it is enqueued now, and its time-to-live starts now."""
        now = time.time()
        message.state = MessageState.ACTIVE
        message.enqueued_ms = int(now * 1000)
        self._set_expiry(message, now)
        self.active.make_ready(message)

    def _set_expiry(self, message: StoredMessage, now: float) -> None:
        """Time-to-live: the message's own, capped by the queue's default; counted from enqueue."""
        ttl = self.settings.default_ttl
        if message.content.ttl_ms is not None:
            ttl = min(ttl, message.content.ttl_ms / 1000.0)
        message.expires_at = now + ttl
        self.timeline.add(message.expires_at, "expire", self.active, message)

    def expire(self, message: StoredMessage) -> None:
        if self.settings.dead_letter_on_expiry:
            self.move_to_dead_letter(self.active, message, TTL_EXPIRED, "The message expired and was dead lettered.")
        else:
            log.debug("message #%d expired on %s", message.sequence_number, self.settings.name)
            self.active.remove(message)

    def move_to_dead_letter(
        self, source: MessageStore, message: StoredMessage, reason: str | None, description: str | None
    ) -> None:
        source.remove(message)
        if source.is_dead_letter:  # dead-lettering from the dead-letter queue keeps it there
            message.state = MessageState.ACTIVE
            self.dead_letter.add(message)
            return
        message.state = MessageState.ACTIVE
        message.expires_at = None  # no time-to-live in the dead-letter queue
        message.dead_letter = (reason, description)
        self.dead_letter.add(message)

    def counts(self) -> dict[str, int]:
        counts = self.active.counts()
        return {
            "active": counts["active"],
            "dead_letter": len(self.dead_letter.messages),
            "scheduled": counts["scheduled"],
            "locked": counts["locked"],
        }

    def close(self) -> None:
        self.timeline.cancel()


#: Azure force-detaches a link on which no call (a send, a receive) was made for 10 minutes
#: (``amqp:link:detach-forced``, "AmqpMessagePublisher.IdleTimerExpired: Idle timeout:
#: 00:10:00"); the connection stays open. Microsoft Learn, "AMQP errors in Azure Service Bus",
#: https://learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-troubleshoot
#: (read 2026-11-28: "no calls (for example, send or receive) are made using the link for 10
#: minutes. So, the link is closed. The connection is still open.").
LINK_IDLE_TIMEOUT = 600.0


class Broker:
    """All queues, by case-insensitive name, and the emulator's operation counters."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, faults: Faults | None = None, *,
        link_idle_timeout: float | None = LINK_IDLE_TIMEOUT,
    ) -> None:
        self.loop = loop
        #: Seconds without a call on a queue's link before it is force-detached (None: never); session.py.
        self.link_idle_timeout = link_idle_timeout
        self._queues: dict[str, Queue] = {}
        #: What the emulator has done since it started, by kind (see the README's "Operation counters").
        self.operations: collections.Counter[str] = collections.Counter()
        #: The push-back it injects (faults.py), one for the namespace: credits are per namespace.
        self.faults = FaultInjector(faults, self.operations)

    def declare(self, settings: QueueSettings) -> Queue:
        """Create the queue, or update the properties of an existing one (idempotent)."""
        queue = self._queues.get(settings.name.lower())
        if queue is None:
            queue = self._queues[settings.name.lower()] = Queue(settings, self.loop, self.operations, self.faults)
            log.info("declared queue %s", settings.name)
        elif queue.settings != settings:
            queue.reconfigure(settings)
        return queue

    def get(self, name: str) -> Queue | None:
        return self._queues.get(name.lower())

    def names(self) -> list[str]:
        return [queue.settings.name for queue in self._queues.values()]

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
