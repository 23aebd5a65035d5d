"""Service Bus queue trigger: peek-lock through the real SDK, complete on success, abandon on failure.

One pump thread owns the receiver (the SDK's sync handlers are not thread-safe): while
fewer than ``maxConcurrentCalls`` messages are in flight it receives one message at a
time (as the Functions host's processor does), hands each to one of this trigger's
threads, which invokes the function in the worker (a sync function may wait there for
a thread of the worker's shared pool), and settles the results they hand back:
complete after the function returned, abandon when it raised. The queue's max
delivery count then dead-letters a message that keeps failing (the broker does that,
as in Azure). While a message is in flight (its function running, or waiting for a
worker thread), its lock is renewed at half-life, up to host.json
``maxAutoLockRenewalDuration`` from its receipt, as the host's processor does.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from azure.functions import meta
from azure.functions.servicebus import ServiceBusMessage as FunctionMessage
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode, ServiceBusReceiver
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import ServiceBusCommunicationError, ServiceBusConnectionError, ServiceBusError

from .app import FunctionSpec
from .config import ServiceBusOptions
from .connections import Clients
from .invoke import Invoker, TriggerValue
from .listener import Listener

log = logging.getLogger("funchost")

#: How long one receive call waits for a first message; results are settled between calls.
RECEIVE_WAIT_SECONDS = 0.5
_VIA_PARTITION_KEY = b"x-opt-via-partition-key"


# --- ServiceBusReceivedMessage -> azure.functions.ServiceBusMessage ------------------


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return value


def _jsonable(value: Any) -> Any:
    """An application property value as it reaches the worker (through JSON)."""
    if isinstance(value, (bytes, bytearray)):
        return _text(bytes(value))
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(_text(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def message_body(message: ServiceBusReceivedMessage) -> bytes:
    if message.body_type == AmqpMessageBodyType.DATA:
        body = message.body
        return body if isinstance(body, bytes) else b"".join(body)
    body = message.body
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if not isinstance(body, (dict, list, int, float, bool)) and body is not None:
        body = list(body)  # a SEQUENCE body arrives as an iterable of lists
    return json.dumps(_jsonable(body)).encode("utf-8")


def _iso(value: datetime.datetime | None) -> str | None:
    return value.isoformat() if value else None


def to_function_message(message: ServiceBusReceivedMessage) -> FunctionMessage:
    """A fully populated ``azure.functions.ServiceBusMessage``, as the worker builds it from the host's data.

    ``delivery_count`` counts this delivery (1 on the first one), as the Functions host
    reports it; the AMQP header the SDK exposes counts prior attempts only.
    """
    body = message_body(message)
    properties = _jsonable(dict(message.application_properties or {}))
    annotations = message.raw_amqp_message.annotations or {}
    via_partition_key = _text(annotations.get(_VIA_PARTITION_KEY))
    delivery_count = (message.delivery_count or 0) + 1
    lock_token = str(message.lock_token) if message.lock_token else None
    state = int(message.state.value if hasattr(message.state, "value") else message.state or 0)
    metadata_values = {
        "MessageId": (message.message_id, "string"),
        "CorrelationId": (message.correlation_id, "string"),
        "ContentType": (message.content_type, "string"),
        "ReplyTo": (message.reply_to, "string"),
        "ReplyToSessionId": (message.reply_to_session_id, "string"),
        "SessionId": (message.session_id, "string"),
        "Subject": (message.subject, "string"),
        "Label": (message.subject, "string"),
        "To": (message.to, "string"),
        "PartitionKey": (message.partition_key, "string"),
        "TransactionPartitionKey": (via_partition_key, "string"),
        "DeliveryCount": (delivery_count, "int"),
        "SequenceNumber": (message.sequence_number, "int"),
        "EnqueuedSequenceNumber": (message.enqueued_sequence_number, "int"),
        "EnqueuedTimeUtc": (_iso(message.enqueued_time_utc), "string"),
        "ExpiresAtUtc": (_iso(message.expires_at_utc), "string"),
        "LockedUntil": (_iso(message.locked_until_utc), "string"),
        "ScheduledEnqueueTimeUtc": (_iso(message.scheduled_enqueue_time_utc), "string"),
        "LockToken": (lock_token, "string"),
        "DeadLetterSource": (message.dead_letter_source, "string"),
        "DeadLetterReason": (message.dead_letter_reason, "string"),
        "DeadLetterErrorDescription": (message.dead_letter_error_description, "string"),
        "State": (state, "int"),
        "UserProperties": (json.dumps(properties), "json"),
        "ApplicationProperties": (json.dumps(properties), "json"),
    }
    trigger_metadata = {
        key: meta.Datum(value, kind) for key, (value, kind) in metadata_values.items() if value is not None
    }
    return FunctionMessage(
        body=body,
        trigger_metadata=trigger_metadata,
        application_properties=properties,
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        dead_letter_error_description=message.dead_letter_error_description,
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_source=message.dead_letter_source,
        delivery_count=delivery_count,
        enqueued_sequence_number=message.enqueued_sequence_number,
        enqueued_time_utc=message.enqueued_time_utc,
        expires_at_utc=message.expires_at_utc,
        label=message.subject,
        locked_until=message.locked_until_utc,
        lock_token=lock_token,
        message_id=message.message_id,
        partition_key=message.partition_key,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        sequence_number=message.sequence_number,
        session_id=message.session_id,
        state=state,
        subject=message.subject,
        time_to_live=message.time_to_live,
        to=message.to,
        transaction_partition_key=via_partition_key,
        user_properties=properties,
    )


# --- the listener -------------------------------------------------------------------


@dataclass
class _Delivery:
    message: ServiceBusReceivedMessage
    receiver: ServiceBusReceiver
    received_at: float
    lock_span: float
    renew_at: float
    renewing: bool = True


class ServiceBusTriggerListener(Listener):
    def __init__(self, spec: FunctionSpec, invoker: Invoker, clients: Clients, options: ServiceBusOptions) -> None:
        super().__init__(spec, invoker)
        self._clients = clients
        self._options = options
        self.queue_name: str = spec.trigger.queue_name
        self._setting = spec.trigger.connection
        self._results: queue.Queue[tuple[_Delivery, bool]] = queue.Queue()
        self._result_signal = threading.Event()
        self._in_flight: dict[int, _Delivery] = {}
        self._receiving = False
        self._executor = ThreadPoolExecutor(
            max_workers=options.max_concurrent_calls, thread_name_prefix=f"servicebus-{spec.name}"
        )
        if not options.auto_complete_messages:
            log.warning(
                "%s: autoCompleteMessages=false needs SDK-type bindings to settle messages; "
                "this host completes them as if it were true",
                spec.name,
            )

    def describe(self) -> str:
        return f"{self.spec.trigger_type} queue={self.queue_name}"

    def concurrency(self) -> str:
        return f"maxConcurrentCalls={self._options.max_concurrent_calls}"

    def prepare(self) -> None:
        self._clients.new_servicebus(self._setting).close()  # fail now if the setting is missing or malformed

    def _wake(self) -> None:
        self._result_signal.set()

    def _run(self) -> None:
        backoff = 1.0
        while True:
            self._receiving = False
            try:
                client = self._clients.new_servicebus(self._setting)
                with client:
                    receiver = client.get_queue_receiver(
                        self.queue_name,
                        receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                        prefetch_count=self._options.prefetch_count,
                    )
                    with receiver:
                        self._pump(receiver)
                break
            except Exception as error:  # the broker went away or refused: retry, as the host's processor does
                if self._stopping.is_set():
                    log.warning("%s: receiver failed while stopping: %s", self.name, type(error).__name__)
                    break
                if self._receiving:
                    backoff = 1.0  # it worked for a while: start the backoff over
                log.warning(
                    "%s: receiving from Service Bus queue %s failed (%s); retrying in %.0f s",
                    self.name,
                    self.queue_name,
                    f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                    backoff,
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _pump(self, receiver: ServiceBusReceiver) -> None:
        while True:
            self._settle_results(receiver)
            self._renew_locks(receiver)
            if self._stopping.is_set():
                if not self._in_flight:
                    return
                if self.remaining() <= 0:
                    self._abandon_unfinished(receiver)
                    return
                self._result_signal.wait(min(0.2, self.remaining()))
                self._result_signal.clear()
                continue
            if len(self._in_flight) >= self._options.max_concurrent_calls:
                self._result_signal.wait(0.5)
                self._result_signal.clear()
                continue
            # One message per receive, as the Functions host's processor asks for: the call
            # returns as soon as it arrives, and no link credit outlives the call (a message
            # the broker delivers after a receive ended is handed back and delivered again).
            messages = receiver.receive_messages(max_message_count=1, max_wait_time=RECEIVE_WAIT_SECONDS)
            self._receiving = True
            self.ready.set()
            for message in messages:
                self._dispatch(receiver, message)

    def _dispatch(self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage) -> None:
        now = time.monotonic()
        locked_until = message.locked_until_utc
        span = 30.0
        if locked_until is not None:
            span = max(1.0, (locked_until - datetime.datetime.now(datetime.UTC)).total_seconds())
        delivery = _Delivery(message, receiver, now, span, now + span / 2)
        self._in_flight[id(delivery)] = delivery
        self._executor.submit(self._process, delivery)

    def _process(self, delivery: _Delivery) -> None:
        succeeded = False
        try:
            rich = to_function_message(delivery.message)
            details = f"queue={self.queue_name} message_id={rich.message_id} delivery_count={rich.delivery_count}"
            succeeded = self.invoker.invoke(self.spec, TriggerValue(rich, rich.get_body(), details)).succeeded
        except Exception:  # building the message failed: abandon it, and say why
            log.exception("%s: could not hand message %s to the function", self.name, delivery.message.message_id)
        finally:
            self._results.put((delivery, succeeded))
            self._result_signal.set()

    def _settle_results(self, receiver: ServiceBusReceiver) -> None:
        while True:
            try:
                delivery, succeeded = self._results.get_nowait()
            except queue.Empty:
                return
            if self._in_flight.pop(id(delivery), None) is None:
                continue  # already abandoned at the drain deadline
            if delivery.receiver is not receiver:
                log.warning(
                    "%s: message %s finished after its receiver was reopened; it will be delivered again",
                    self.name,
                    delivery.message.message_id,
                )
                continue
            self._settle(receiver, delivery, complete=succeeded)

    def _settle(self, receiver: ServiceBusReceiver, delivery: _Delivery, *, complete: bool) -> None:
        try:
            if complete:
                receiver.complete_message(delivery.message)
            else:
                receiver.abandon_message(delivery.message)
        except (ServiceBusConnectionError, ServiceBusCommunicationError):
            raise
        except (ServiceBusError, ValueError) as error:
            log.warning(
                "%s: could not %s message %s: %s",
                self.name,
                "complete" if complete else "abandon",
                delivery.message.message_id,
                f"{type(error).__name__}: {error}",
            )

    def _renew_locks(self, receiver: ServiceBusReceiver) -> None:
        now = time.monotonic()
        limit = self._options.max_auto_lock_renewal_duration.total_seconds()
        for delivery in list(self._in_flight.values()):
            if not delivery.renewing or delivery.renew_at > now or delivery.receiver is not receiver:
                continue
            if now - delivery.received_at >= limit:
                delivery.renewing = False
                continue
            try:
                receiver.renew_message_lock(delivery.message)
                delivery.renew_at = time.monotonic() + delivery.lock_span / 2
            except (ServiceBusConnectionError, ServiceBusCommunicationError):
                raise
            except (ServiceBusError, ValueError) as error:
                delivery.renewing = False
                log.warning(
                    "%s: renewing the lock of message %s failed: %s",
                    self.name,
                    delivery.message.message_id,
                    f"{type(error).__name__}: {error}",
                )

    def _abandon_unfinished(self, receiver: ServiceBusReceiver) -> None:
        for key, delivery in list(self._in_flight.items()):
            del self._in_flight[key]
            log.warning("%s: abandoning message %s unfinished at shutdown", self.name, delivery.message.message_id)
            if delivery.receiver is receiver:
                self._settle(receiver, delivery, complete=False)
