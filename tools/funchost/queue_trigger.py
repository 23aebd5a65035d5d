"""Storage queue trigger, with the Functions host's polling, leasing and poison handling.

- Polls for up to ``batchSize`` messages; fetches the next batch when the messages in
  flight drop to ``newBatchThreshold``. After an empty poll it waits as the Functions
  host's listener does: 100 ms after a poll that found messages, then a randomized
  exponential back-off (100 ms + 0.8-1.2 x 100 ms x 2^(n-1): ~200, ~300, ~500, ~900 ms,
  ...) up to ``maxPollingInterval``. A message that an output binding of this host sends
  to the queue wakes the poller at once (the Storage Queues extension's SharedQueueWatcher;
  README.md cites the source). Each poll is one Get Messages request built and signed
  here (``queue_rest``) when the connection has an account key, through the SDK otherwise.
- The poller hands each message's function to the worker itself, as the Service Bus
  trigger's pump does and as the Functions host hands an invocation to the worker: a sync
  function of either trigger then waits in the worker's one pool in the order its message
  arrived. What needs storage calls (the delete, a release, a poison move, the outputs)
  runs on one of this trigger's threads once the function has returned.
- A received message is leased for 10 minutes and the lease is renewed at half-time
  while it is in flight, its function running or waiting for a worker thread (the
  Functions host does the same), so a slow function never lets another instance take
  its message. A message taken by a crashed host reappears when its lease ends;
  ``FUNCHOST_QUEUE_LEASE_SECONDS`` (this host's own setting) shortens the lease for
  crash tests.
- Success deletes the message. Failure makes it visible again after host.json
  ``visibilityTimeout``; the failure of the ``maxDequeueCount``-th attempt moves it to
  ``<queue>-poison`` (so does a message received past that count, or one whose body is
  not valid for ``messageEncoding``).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.queue import QueueMessage as StorageMessage

from .app import FunctionSpec
from .config import QueueOptions
from .connections import Clients
from .invoke import Invoker, Running, TriggerValue
from .listener import Listener
from .outputs import decode_queue_text, ensure_queue
from .rpc import protos
from .servicebus_message import merge_body_fields
from .queue_rest import lean_queue

log = logging.getLogger("funchost")
#: The pollers' own debug lines (``--debug funchost.queue``): each wait of IDLE_LOG_SECONDS or more.
poll_log = logging.getLogger("funchost.queue")
IDLE_LOG_SECONDS = 2.0

#: QueuePollingIntervals.Minimum of the Storage Queues extension.
MIN_POLL_SECONDS = 0.1
POISON_SUFFIX = "-poison"


class Backoff:
    """The Functions host's wait between polls (the extension's RandomizedExponentialBackoffStrategy,
    randomization factor 0.2, with the minimum as the base delta): ``next(found)`` after each poll
    that came back empty, ``found`` when a poll since the previous wait found messages."""

    RANDOMIZATION = 0.2

    def __init__(self, minimum: float, maximum: float, rng: random.Random | None = None) -> None:
        self._minimum, self._maximum = minimum, max(minimum, maximum)
        self._current = 0.0
        self._exponent = 0
        self._rng = rng or random.Random()

    def next(self, found: bool) -> float:
        if found:
            self._current, self._exponent = self._minimum, 1
        elif self._current != self._maximum:
            interval = self._minimum
            if self._exponent > 0:
                factor = self._rng.uniform(1 - self.RANDOMIZATION, 1 + self.RANDOMIZATION)
                interval += factor * 2 ** (self._exponent - 1) * self._minimum
            if interval < self._maximum:
                self._current, self._exponent = interval, self._exponent + 1
            else:
                self._current = self._maximum
        return self._current


@dataclass
class _Lease:
    message: StorageMessage
    pop_receipt: str
    renew_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    settled: bool = False


class QueueTriggerListener(Listener):
    def __init__(self, spec: FunctionSpec, invoker: Invoker, clients: Clients, options: QueueOptions) -> None:
        super().__init__(spec, invoker)
        self._clients = clients
        self._options = options
        self._setting = spec.trigger.connection
        self.queue_name: str = spec.trigger.queue_name
        self.poison_name = self.queue_name + POISON_SUFFIX
        self._client = clients.queue(self._setting, self.queue_name)
        self._poll_signal = threading.Event()
        self._slot_signal = threading.Event()
        self._leases: dict[str, _Lease] = {}
        self._leases_lock = threading.Lock()
        self._futures: set[Future] = set()
        self._lease = int(options.lease.total_seconds())
        self._batch = min(32, max(1, options.batch_size))
        self._threshold = max(0, options.new_batch_threshold)
        # Receive and delete without the SDK's pipeline where the connection allows (queue_rest):
        # one connection for the poller and one per message in flight.
        self._rest = lean_queue(self._client, pool_size=self._batch + self._threshold + 1)
        self._executor = ThreadPoolExecutor(
            max_workers=self._batch + self._threshold, thread_name_prefix=f"queue-{spec.name}"
        )

    def describe(self) -> str:
        return f"{self.spec.trigger_type} queue={self.queue_name}"

    def concurrency(self) -> str:
        return f"batchSize={self._batch} + newBatchThreshold={self._threshold} = {self._batch + self._threshold}"

    def prepare(self) -> None:
        ensure_queue(self._clients, self._setting, self.queue_name)

    def notify(self) -> None:
        """A message was just sent to this queue by this host: poll now."""
        self._poll_signal.set()

    def _wake(self) -> None:
        self._poll_signal.set()
        self._slot_signal.set()

    # --- the poller thread ------------------------------------------------------------

    def _run(self) -> None:
        backoff = Backoff(MIN_POLL_SECONDS, self._options.max_polling_interval.total_seconds())
        found = False
        self.ready.set()
        while not self._stopping.is_set():
            self._renew_leases()
            if len(self._futures) > self._threshold:
                self._slot_signal.wait(min(0.5, self._until_renewal()))
                self._slot_signal.clear()
                continue
            # A wake-up counts for the polls after it: this one sees what was sent before it
            # (the Functions host likewise arms a new notification before each poll).
            self._poll_signal.clear()
            messages = self._receive()
            if messages:
                found = True
                for message in messages:
                    self._dispatch(message)
                continue
            wait = min(backoff.next(found), self._until_renewal())
            if wait >= IDLE_LOG_SECONDS and poll_log.isEnabledFor(logging.DEBUG):
                poll_log.debug("queue %s: idle, next poll in %.2f s", self.queue_name, wait)
            self._poll_signal.wait(wait)
            found = False
        self._drain()
        if self._rest is not None:
            self._rest.close()

    def _receive(self) -> list[StorageMessage]:
        try:
            if self._rest is not None:
                return self._rest.receive(self._batch, self._lease)
            pages = self._client.receive_messages(
                messages_per_page=self._batch, visibility_timeout=self._lease
            ).by_page()
            return list(next(pages, []))
        except ResourceNotFoundError:
            # Deleted under us (a test cleaning up, an operator): recreate it, as the host would on start.
            self._ensure_queue_quietly(self.queue_name)
        except AzureError as error:
            log.warning("polling queue %s failed: %s", self.queue_name, _short(error))
        except (ValueError, SyntaxError) as error:  # an answer the lean reader cannot read (ParseError is a SyntaxError)
            # The SDK raised DecodeError for it, logged above: the poller goes on either way.
            log.warning("polling queue %s failed: unreadable answer: %s", self.queue_name, _short(error))
        return []

    def _dispatch(self, message: StorageMessage) -> None:
        """Start handling one message: its function goes to the worker from here, as the Functions host
        hands an invocation to the worker; what needs storage calls runs on one of this trigger's threads."""
        lease = _Lease(message, message.pop_receipt, time.monotonic() + self._lease / 2)
        with self._leases_lock:
            self._leases[message.id] = lease
        handled: Future = Future()  # done once the message is settled: what the poller and the drain count
        self._futures.add(handled)
        handled.add_done_callback(self._done)
        try:
            trigger = self._trigger_value(message)
            if isinstance(trigger, str):  # a poison reason
                self._executor.submit(self._handle, lease, handled, lambda: self._poison(lease, trigger))
                return
            self.invoker.start(
                self.spec, trigger, on_return=lambda running: self._on_return(lease, handled, running)
            )
        except Exception:  # its lease runs out and it reappears
            log.exception("%s: handling message %s failed", self.name, message.id)
            self._handled(lease, handled)

    def _done(self, future: Future) -> None:
        self._futures.discard(future)
        self._slot_signal.set()

    def _until_renewal(self) -> float:
        """Seconds until the next lease renewal is due (a long poll wait must not miss it)."""
        with self._leases_lock:
            due = [lease.renew_at for lease in self._leases.values() if not lease.settled]
        return max(0.0, min(due) - time.monotonic()) if due else float(self._lease)

    def _renew_leases(self) -> None:
        now = time.monotonic()
        with self._leases_lock:
            due = [lease for lease in self._leases.values() if lease.renew_at <= now and not lease.settled]
        for lease in due:
            with lease.lock:
                if lease.settled:
                    continue
                try:
                    updated = self._client.update_message(
                        lease.message.id, lease.pop_receipt, visibility_timeout=self._lease
                    )
                    lease.pop_receipt = updated.pop_receipt
                    lease.renew_at = time.monotonic() + self._lease / 2
                except AzureError as error:
                    log.warning("renewing the lease of message %s failed: %s", lease.message.id, _short(error))
                    lease.renew_at = time.monotonic() + 5

    def _drain(self) -> None:
        pending = set(self._futures)
        if pending:
            log.info("%s: waiting for %d in-flight message(s)", self.name, len(pending))
        # In short steps: a second Ctrl-C moves the deadline to now (Host.hurry).
        while pending and self.remaining() > 0:
            pending = wait(pending, timeout=min(0.2, self.remaining())).not_done
        with self._leases_lock:
            unfinished = [lease for lease in self._leases.values() if not lease.settled]
        for lease in unfinished:
            with lease.lock:
                if lease.settled:
                    continue
                lease.settled = True
                self._set_visibility(lease, 0)
                log.warning("%s: released message %s unfinished at shutdown", self.name, lease.message.id)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- one message ---------------------------------------------------------------------

    def _trigger_value(self, message: StorageMessage) -> TriggerValue | str:
        """What the function gets for the message, or why it goes to the poison queue."""
        count = message.dequeue_count or 1
        if count > self._options.max_dequeue_count:
            return f"dequeue count {count} exceeds maxDequeueCount"
        try:
            body = decode_queue_text(message.content or "", self._options.message_encoding)
        except ValueError:
            return f"its body is not valid {self._options.message_encoding}"
        details = f"queue={self.queue_name} message_id={message.id} dequeue_count={count}"
        return TriggerValue(trigger_data(body, self.spec.trigger.binary), binding_data(message, body, count), details)

    def _on_return(self, lease: _Lease, handled: Future, running: Running) -> None:
        """On the thread that ran the function (the worker's): the rest goes to one of this trigger's threads."""
        try:
            self._executor.submit(self._handle, lease, handled, lambda: self._settle(lease, running))
        except RuntimeError:  # shut down past the drain deadline: its lease was released
            self._handled(lease, handled)

    def _handle(self, lease: _Lease, handled: Future, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception:  # a storage error here must not kill the pool thread; the lease expires and it reappears
            log.exception("%s: handling message %s failed", self.name, lease.message.id)
        finally:
            self._handled(lease, handled)

    def _handled(self, lease: _Lease, handled: Future) -> None:
        with self._leases_lock:
            self._leases.pop(lease.message.id, None)
        handled.set_result(None)

    def _settle(self, lease: _Lease, running: Running) -> None:
        """The invocation finished (outputs, the log line), its message deleted, released or poisoned."""
        outcome = self.invoker.finish(running)
        count = lease.message.dequeue_count or 1
        if outcome.succeeded:
            self._delete(lease)
        elif count >= self._options.max_dequeue_count:
            self._poison(lease, f"it failed {count} times (maxDequeueCount)")
        else:
            with lease.lock:
                if not lease.settled:
                    lease.settled = True
                    self._set_visibility(lease, int(self._options.visibility_timeout.total_seconds()))

    def _delete(self, lease: _Lease) -> None:
        with lease.lock:
            if lease.settled:
                log.warning(
                    "%s: message %s finished after it was released; it will run again", self.name, lease.message.id
                )
                return
            lease.settled = True
            try:
                if self._rest is not None:
                    self._rest.delete(lease.message.id, lease.pop_receipt)
                else:
                    self._client.delete_message(lease.message.id, lease.pop_receipt)
            except ResourceNotFoundError:
                log.warning("%s: message %s was already gone when deleting it", self.name, lease.message.id)

    def _set_visibility(self, lease: _Lease, seconds: int) -> None:
        try:
            self._client.update_message(lease.message.id, lease.pop_receipt, visibility_timeout=seconds)
        except ResourceNotFoundError:
            log.warning("%s: message %s was already gone when releasing it", self.name, lease.message.id)

    def _poison(self, lease: _Lease, reason: str) -> None:
        with lease.lock:
            if lease.settled:
                return
            lease.settled = True
            poison = self._clients.queue(self._setting, self.poison_name)
            try:
                poison.send_message(lease.message.content or "")
            except ResourceNotFoundError:
                self._ensure_queue_quietly(self.poison_name)
                poison.send_message(lease.message.content or "")
            try:
                self._client.delete_message(lease.message.id, lease.pop_receipt)
            except ResourceNotFoundError:
                pass
        log.warning("%s: moved message %s to %s: %s", self.name, lease.message.id, self.poison_name, reason)

    def _ensure_queue_quietly(self, name: str) -> None:
        try:
            ensure_queue(self._clients, self._setting, name)
        except AzureError as error:
            log.warning("creating queue %s failed: %s", name, _short(error))


# --- what goes to the worker ------------------------------------------------------------------


def trigger_data(body: bytes, binary: bool) -> protos.TypedData:
    """The message as the Storage Queues extension binds it for the worker: bytes for ``dataType: binary``,
    else its text (``BinaryData.ToString()``: UTF-8, invalid bytes replaced)."""
    if binary:
        return protos.TypedData(bytes=body)
    return protos.TypedData(string=body.decode("utf-8", errors="replace"))


def _json_date(moment: datetime | None) -> protos.TypedData | None:
    """A ``DateTimeOffset`` as the host's JSON writer (Newtonsoft.Json) writes it: ``yyyy-MM-ddTHH:mm:ss.FFFFFFF+00:00``."""
    if moment is None:
        return None
    text = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return protos.TypedData(json=json.dumps(text + "+00:00"))


def binding_data(message: StorageMessage, body: bytes, count: int) -> dict[str, protos.TypedData]:
    """The trigger's binding data (the extension's ``QueueTriggerBinding.CreateBindingData``; ``QueueTrigger``
    only for a body that is valid UTF-8), then the top-level fields of a JSON body (the host's
    ``Utility.ApplyBindingData``, as for a Service Bus message)."""
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    entries = {
        "QueueTrigger": None if text is None else protos.TypedData(string=text),
        "DequeueCount": protos.TypedData(json=str(count)),
        "ExpirationTime": _json_date(message.expires_on),
        "Id": protos.TypedData(string=message.id),
        "InsertionTime": _json_date(message.inserted_on),
        "NextVisibleTime": _json_date(message.next_visible_on),
        "PopReceipt": protos.TypedData(string=message.pop_receipt) if message.pop_receipt else None,
    }
    metadata = {name: value for name, value in entries.items() if value is not None}
    if text is not None:
        merge_body_fields(metadata, text)
    return metadata


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
