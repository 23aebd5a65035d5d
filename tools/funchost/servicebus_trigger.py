"""Service Bus queue trigger: peek-lock through the real SDK, complete on success, abandon on failure.

One pump thread owns the receiver (the SDK's sync handlers are not thread-safe): while
fewer than ``maxConcurrentCalls`` messages are in flight it receives one message at a
time (as the Functions host's processor does), converts it and hands the function to
the worker (a sync function may wait there for a thread of the worker's shared pool),
and settles each message once its function has returned: complete after it returned,
abandon when it raised. The queue's max delivery count then dead-letters a message that
keeps failing (the broker does that, as in Azure). While a message is in flight (its
function running, or waiting for a worker thread), its lock is renewed at half-life, up
to host.json ``maxAutoLockRenewalDuration`` from its receipt, as the host's processor does.

No thread waits for each invocation: the thread that ran the function writes its log line
and hands the result to the pump, which settles the message between receive calls; a
function with output bindings is finished at once on one of this trigger's threads instead
(its outputs sent, its log line, then its result handed to the pump), so neither its outputs
nor its log line wait for the pump's receive call to end. Before, a thread per message in flight waited for the
worker and handed the result on: two more thread switches per message, ~2 ms of the host's
CPU per order of the project's app (BENCHMARKS.md, "Where the CPU goes, and what was cut").

The worker gets what the Functions host would send it for the message (``servicebus_message``,
from the bytes the broker sent: ``servicebus_wire``), and Microsoft's runtime makes of it the
``azure.functions.ServiceBusMessage`` the function receives.
A message that cannot be handed over (one the host's .NET client cannot read, that
cannot be bound to the parameter, or that this host cannot convert) is dead-lettered
at once with a reason and a description naming the cause, and logged; the function is
not called (in Azure it is not called either, and the message is dead-lettered once
its delivery count runs out).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from dataclasses import dataclass

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode, ServiceBusReceiver
from azure.servicebus.exceptions import (
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
)

from .app import FunctionSpec
from .config import ServiceBusOptions
from .connections import Clients
from .invoke import Invoker, Running, TriggerValue
from .listener import Listener
from .servicebus_message import ConversionError, LocalConversionFailed, function_message, message_id_of
from .servicebus_wire import KEEP_ALIVE_SECONDS, DeliveryTap, PumpKeepAlive, Undecodable, dead_letter_undecodable

log = logging.getLogger("funchost")
#: The pumps' own debug lines (``--debug funchost.servicebus``): each keep-alive read of the connection.
keep_alive_log = logging.getLogger("funchost.servicebus")

#: How long one receive call waits for a first message; results are settled between calls.
RECEIVE_WAIT_SECONDS = 0.5
#: A receiver refused because the namespace is throttled is opened again after this long, without
#: growing the backoff: Azure asks to "wait 2 seconds" and a Standard namespace's credits come back
#: every second (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling).
THROTTLED_WAIT_SECONDS = 2.0


def _shown_id(message: ServiceBusReceivedMessage) -> str:
    """The message id for a log line, whatever its type."""
    try:
        value = message.message_id
    except Exception:  # noqa: BLE001 - only for a log line
        return "?"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 100 else text[:99] + "…"


# --- the SDK's tracing hooks and what clients put in trace properties ------------------
#
# azure-servicebus (7.15) reads the ``traceparent``, ``Diagnostic-Id`` and ``tracestate``
# application properties as ASCII for its tracing links, catching only ``AttributeError``:
# on every settlement (``ServiceBusReceiver._settle_message_with_retry`` ->
# ``get_span_link_from_message``, tracing on or off) and, when the Azure SDK's tracing is on
# in the process (``AZURE_SDK_TRACING_IMPLEMENTATION``, or an app that exports to Application
# Insights), on every receive (``receive_messages`` -> ``get_receive_links``). Any client may
# put other text or bytes there; the ``UnicodeDecodeError`` would then fail the receive or
# the settlement, and the message would come back after every lock expiry though its
# function succeeded. The Functions host's .NET client reads and settles such a message as
# any other. So, on this host's own receivers, the SDK's message objects show no
# application properties while the SDK receives or settles them: receiving and settling
# need only the delivery and its lock token, and the function gets its properties from the
# message's bytes (``servicebus_wire``) or, failing those, once the receive has returned.


class _UntracedReceive:
    """Installed on one ``ServiceBusReceiver``: :meth:`receive` hides the application properties
    of the messages it builds from the SDK's tracing hook until the receive call has returned."""

    def __init__(self, receiver: ServiceBusReceiver) -> None:
        self._hidden: list[tuple[ServiceBusReceivedMessage, object]] = []
        build = getattr(receiver, "_build_received_message", None)
        if not callable(build):  # another SDK version: receive as it is
            return

        def build_hidden(*args: object, **kwargs: object) -> ServiceBusReceivedMessage:
            message = build(*args, **kwargs)
            self._hidden.append((message, message.application_properties))
            message.application_properties = None
            return message

        receiver._build_received_message = build_hidden

    def receive(self, receiver: ServiceBusReceiver, **kwargs: object) -> list[ServiceBusReceivedMessage]:
        try:
            return receiver.receive_messages(**kwargs)
        finally:
            for message, properties in self._hidden:
                message.application_properties = properties
            self._hidden.clear()


@contextlib.contextmanager
def _hidden_from_sdk_tracing(message: ServiceBusReceivedMessage) -> Iterator[None]:
    """While open, ``message`` shows the SDK no application properties (see above)."""
    properties = message.application_properties
    message.application_properties = None
    try:
        yield
    finally:
        message.application_properties = properties


# --- the listener -------------------------------------------------------------------


def _lock_left(locked_until: datetime.datetime | None) -> float:
    """Seconds a lock has left by this machine's clock; at least 1 (renewing sooner gains nothing),
    30 when the broker did not say."""
    if locked_until is None:
        return 30.0
    return max(1.0, (locked_until - datetime.datetime.now(datetime.UTC)).total_seconds())


@dataclass
class _Delivery:
    message: ServiceBusReceivedMessage
    receiver: ServiceBusReceiver
    received_at: float
    lock_span: float
    renew_at: float
    payload: bytes | None = None
    renewing: bool = True
    running: Running | None = None


@dataclass(frozen=True)
class _Outcome:
    """How to settle a message: complete, abandon, or dead-letter with a reason and description."""

    action: str  # "complete" | "abandon" | "dead-letter"
    reason: str | None = None
    description: str | None = None


_COMPLETE = _Outcome("complete")
_ABANDON = _Outcome("abandon")


class ServiceBusTriggerListener(Listener):
    def __init__(self, spec: FunctionSpec, invoker: Invoker, clients: Clients, options: ServiceBusOptions) -> None:
        super().__init__(spec, invoker)
        self._clients = clients
        self._options = options
        self.queue_name: str = spec.trigger.queue_name
        self._setting = spec.trigger.connection
        # How each message in flight ends: its outcome, or None when its function returned and
        # the invocation is still to be finished (outputs, the log line) before it is settled.
        self._results: queue.Queue[tuple[_Delivery, _Outcome | None]] = queue.Queue()
        self._result_signal = threading.Event()
        self._in_flight: dict[int, _Delivery] = {}
        self._receiving = False
        # Threads that send finished invocations' output bindings (at most one per message in flight).
        self._executor = ThreadPoolExecutor(
            max_workers=options.max_concurrent_calls, thread_name_prefix=f"servicebus-{spec.name}"
        )
        self._parameter = spec.trigger.name
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
                    tap = DeliveryTap(receiver)  # before it opens: the message bytes as the broker sent them
                    untraced = _UntracedReceive(receiver)
                    keep_alive = PumpKeepAlive(receiver)  # before it opens: the SDK's keep-alive thread off
                    with receiver:
                        self._pump(receiver, tap, untraced, keep_alive)
                break
            except Exception as error:  # the broker went away or refused: retry, as the host's processor does
                if self._stopping.is_set():
                    log.warning("%s: receiver failed while stopping: %s", self.name, type(error).__name__)
                    break
                if self._receiving:
                    backoff = 1.0  # it worked for a while: start the backoff over
                throttled = isinstance(error, ServiceBusServerBusyError)
                wait = THROTTLED_WAIT_SECONDS if throttled else backoff
                log.warning(
                    "%s: receiving from Service Bus queue %s failed (%s); retrying in %.0f s",
                    self.name,
                    self.queue_name,
                    f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                    wait,
                )
                self._stopping.wait(wait)
                if not throttled:
                    backoff = min(backoff * 2, 30.0)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _pump(
        self, receiver: ServiceBusReceiver, tap: DeliveryTap, untraced: _UntracedReceive, keep_alive: PumpKeepAlive
    ) -> None:
        # The receiver's link is open (``with receiver`` attached it): the listener is receiving. Ready
        # now, not after a first receive call, which on an empty queue waits its RECEIVE_WAIT_SECONDS out.
        self.ready.set()
        read_at = time.monotonic()  # when a receive call last read the connection
        while True:
            self._settle_results(receiver)
            self._renew_locks(receiver)
            idle = time.monotonic() - read_at
            if idle >= KEEP_ALIVE_SECONDS:  # no receive call for a while: every slot busy, or draining
                keep_alive_log.debug(
                    "%s: no receive call for %.1f s: reading the connection (keep-alive)", self.name, idle
                )
                keep_alive.listen(receiver)
                read_at = time.monotonic()
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
            # returns as soon as it arrives. Without prefetch no link credit outlives the call (a
            # message the broker delivers after a receive ended is handed back and delivered
            # again); with host.json prefetchCount the receiver holds that many more, locked, and
            # the call takes the next from them (the SDK releases those still held when it closes).
            messages = untraced.receive(receiver, max_message_count=1, max_wait_time=RECEIVE_WAIT_SECONDS)
            read_at = time.monotonic()
            self._receiving = True
            for message in messages:
                self._dispatch(receiver, message, tap.take(message.lock_token))
            for item in tap.take_undecodable():
                self._dead_letter_undecodable(receiver, item)

    def _dispatch(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage, payload: bytes | None
    ) -> None:
        now = time.monotonic()
        # A prefetched message may have waited in the buffer: renew at half of what its lock has
        # left. One whose lock ran out there is still handed over, as the Functions host's
        # processor hands it (azure-sdk-for-net#31966): completing it then fails, and it comes back.
        span = _lock_left(message.locked_until_utc)
        delivery = _Delivery(message, receiver, now, span, now + span / 2, payload)
        self._in_flight[id(delivery)] = delivery
        try:
            trigger = self._trigger_value(delivery)
            if isinstance(trigger, _Outcome):
                self._results.put((delivery, trigger))
                return
            delivery.running = self.invoker.start(
                self.spec, trigger, on_return=lambda running: self._returned(delivery, running)
            )
        except Exception:  # never lose a message: the pump settles every one it dispatched
            log.exception("%s: handling message %s failed", self.name, _shown_id(message))
            self._results.put((delivery, _ABANDON))

    def _trigger_value(self, delivery: _Delivery) -> TriggerValue | _Outcome:
        """What the function gets for the message, or how to settle it when it cannot get it."""
        try:
            converted = function_message(
                delivery.payload, delivery.message, data_type=self.spec.trigger.get("dataType"),
                parameter=self._parameter,
            )
        except ConversionError as error:
            return self._cannot_convert(delivery, error)
        except Exception as error:  # an input this host did not foresee: its limit, not the app's
            log.exception("%s: converting message %s failed", self.name, _shown_id(delivery.message))
            return self._cannot_convert(delivery, LocalConversionFailed(f"{type(error).__name__}: {error}"))
        message_id = converted.message_id or ""
        shown = message_id if len(message_id) <= 200 else f"{message_id[:200]}…"
        details = f"queue={self.queue_name} message_id={shown} delivery_count={converted.delivery_count}"
        return TriggerValue(converted.data, converted.metadata, details)

    def _returned(self, delivery: _Delivery, running: Running) -> None:
        """On the thread that ran the function (the worker's), once it returned: an invocation with
        outputs to send goes to one of this trigger's threads at once (its outputs must not wait
        for the pump's receive call to end: on a quiet queue that is up to RECEIVE_WAIT_SECONDS,
        and the next function waits for them); any other is finished here (its log line, written
        as the function returns, as the Functions host writes it), and the pump settles it."""
        if running.sends_outputs:
            try:
                self._executor.submit(self._finish_sending, delivery, running)
                return
            except RuntimeError:  # shutting down: the pump finishes it (outputs included) or abandons it
                self._results.put((delivery, None))
        else:
            self._results.put((delivery, self._finish(delivery, running)))
        self._result_signal.set()

    def _finish(self, delivery: _Delivery, running: Running) -> _Outcome:
        """The host's part of the invocation (outputs, the log line), then how to settle its message."""
        try:
            return _COMPLETE if self.invoker.finish(running).succeeded else _ABANDON
        except Exception:  # never lose a result: abandon, it comes back
            log.exception("%s: handling message %s failed", self.name, _shown_id(delivery.message))
            return _ABANDON

    def _finish_sending(self, delivery: _Delivery, running: Running) -> None:
        """On one of this trigger's threads: finish an invocation that has outputs to send."""
        self._results.put((delivery, self._finish(delivery, running)))
        self._result_signal.set()

    def _cannot_convert(self, delivery: _Delivery, error: ConversionError) -> _Outcome:
        log.error(
            "%s: message %s (delivery %s) cannot be handed to the function; dead-lettering it: %s: %s",
            self.name,
            _shown_id(delivery.message),
            (delivery.message.delivery_count or 0) + 1,
            error.reason,
            error.description,
        )
        return _Outcome("dead-letter", error.reason, error.description)

    def _dead_letter_undecodable(self, receiver: ServiceBusReceiver, item: Undecodable) -> None:
        """A delivery the Python SDK could not decode (the receive call never returned it)."""
        cause = f"{type(item.error).__name__}: {item.error}"
        try:  # would the Functions host have read it? Then it is this host's limit, else the message's fault
            function_message(
                item.payload,
                None,
                lock_token=item.lock_token,
                data_type=self.spec.trigger.get("dataType"),
                parameter=self._parameter,
            )
            failure: ConversionError = LocalConversionFailed(
                f"the Python azure-servicebus SDK cannot decode it ({cause}), "
                "though the Functions host would hand it to the function"
            )
        except ConversionError as error:
            failure = error
        except Exception as error:  # noqa: BLE001 - only choosing the reason
            failure = LocalConversionFailed(
                f"the Python azure-servicebus SDK cannot decode it ({cause}), nor can this host "
                f"({type(error).__name__}: {error})"
            )
        log.error(
            "%s: message %s (lock token %s, %d bytes) cannot be decoded by the Python SDK; dead-lettering it: %s: %s",
            self.name,
            message_id_of(item.payload),
            item.lock_token,
            len(item.payload),
            failure.reason,
            failure.description,
        )
        try:
            dead_letter_undecodable(receiver, item, failure.reason, failure.description)
        except (ServiceBusConnectionError, ServiceBusCommunicationError):
            raise
        except Exception as error:  # it comes back when its lock expires, and is tried again
            log.warning("%s: could not dead-letter it: %s: %s", self.name, type(error).__name__, error)

    def _settle_results(self, receiver: ServiceBusReceiver) -> None:
        while True:
            try:
                delivery, outcome = self._results.get_nowait()
            except queue.Empty:
                return
            if outcome is None:  # its function returned with outputs while shutting down: finish it here
                assert delivery.running is not None
                outcome = self._finish(delivery, delivery.running)
            if self._in_flight.pop(id(delivery), None) is None:
                continue  # already abandoned at the drain deadline
            if delivery.receiver is not receiver:
                log.warning(
                    "%s: message %s finished after its receiver was reopened; it will be delivered again",
                    self.name,
                    _shown_id(delivery.message),
                )
                continue
            self._settle(receiver, delivery, outcome)

    def _settle(self, receiver: ServiceBusReceiver, delivery: _Delivery, outcome: _Outcome) -> None:
        try:
            with _hidden_from_sdk_tracing(delivery.message):
                self._settle_now(receiver, delivery, outcome)
        except (ServiceBusConnectionError, ServiceBusCommunicationError):
            raise
        except (ServiceBusError, ValueError) as error:
            log.warning(
                "%s: could not %s message %s: %s",
                self.name,
                outcome.action,
                _shown_id(delivery.message),
                f"{type(error).__name__}: {error}",
            )

    @staticmethod
    def _settle_now(receiver: ServiceBusReceiver, delivery: _Delivery, outcome: _Outcome) -> None:
        if outcome.action == "complete":
            receiver.complete_message(delivery.message)
        elif outcome.action == "dead-letter":
            receiver.dead_letter_message(delivery.message, reason=outcome.reason, error_description=outcome.description)
        else:
            receiver.abandon_message(delivery.message)

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
                # Half of the renewed lock, not of what was left when the message was dispatched.
                delivery.lock_span = _lock_left(receiver.renew_message_lock(delivery.message))
                delivery.renew_at = time.monotonic() + delivery.lock_span / 2
            except (ServiceBusConnectionError, ServiceBusCommunicationError):
                raise
            except (ServiceBusError, ValueError) as error:
                delivery.renewing = False
                log.warning(
                    "%s: renewing the lock of message %s failed: %s",
                    self.name,
                    _shown_id(delivery.message),
                    f"{type(error).__name__}: {error}",
                )

    def _abandon_unfinished(self, receiver: ServiceBusReceiver) -> None:
        for key, delivery in list(self._in_flight.items()):
            del self._in_flight[key]
            log.warning("%s: abandoning message %s unfinished at shutdown", self.name, _shown_id(delivery.message))
            if delivery.receiver is receiver:
                self._settle(receiver, delivery, _ABANDON)
