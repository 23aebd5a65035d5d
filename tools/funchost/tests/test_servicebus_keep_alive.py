"""The Service Bus trigger's receiver runs no SDK keep-alive thread: its pump listens itself.

azure-servicebus starts, for a peek-lock receiver without prefetch, a thread that every 5 s
reads the connection for up to 0.2 s holding the transport's socket lock, and a settlement
or the next receive's flow waits behind it (servicebus_wire.PumpKeepAlive). On the project's
emulator, over real sockets: the SDK does start that thread on a plain receiver (the
behaviour worked around, pinned), the pump's receiver has none, and its own listen reads
the connection while the receiver goes on receiving and settling."""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from tools.funchost.servicebus_wire import KEEP_ALIVE_SECONDS, PumpKeepAlive

from .support import APP_DIR, eventually, host_env, records


def _keep_alive_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive() and "_keep_alive" in t.name]


def test_a_plain_receiver_without_prefetch_gets_the_sdks_keep_alive_thread(servicebus_emulator, unique_name):
    queue = unique_name("ka")
    servicebus_emulator.declare_queue(queue)
    before = set(_keep_alive_threads())
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0) as receiver:
            receiver.receive_messages(max_message_count=1, max_wait_time=0.1)
            assert receiver._handler._keep_alive_thread is not None  # noqa: SLF001 - the SDK behaviour worked around
            assert set(_keep_alive_threads()) - before


@contextlib.contextmanager
def _pump_receiver(servicebus_emulator, unique_name):
    """A fresh queue, and a receiver as the pump makes it (PumpKeepAlive installed), opened and
    used once: (client, queue, receiver, keep_alive, keep-alive threads that were there before)."""
    queue = unique_name("ka")
    servicebus_emulator.declare_queue(queue)
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        receiver = client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0)
        keep_alive = PumpKeepAlive(receiver)
        before = set(_keep_alive_threads())
        with receiver:
            assert receiver.receive_messages(max_message_count=1, max_wait_time=0.1) == []
            yield client, queue, receiver, keep_alive, before


def test_the_pumps_receiver_has_none_and_listens_on_its_own_thread(servicebus_emulator, unique_name):
    with _pump_receiver(servicebus_emulator, unique_name) as (client, queue, receiver, keep_alive, before):
        assert keep_alive.installed
        assert receiver._handler._keep_alive_thread is None  # noqa: SLF001
        assert not set(_keep_alive_threads()) - before
        keep_alive.listen(receiver)  # what the SDK's thread did, here, between receive calls
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"after the listen"))
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(message) == "after the listen"
        receiver.complete_message(message)
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_receiver(queue) as check:
            assert check.receive_messages(max_message_count=1, max_wait_time=0.5) == []  # completed, not released


def test_the_sdks_own_reopen_starts_no_thread_and_a_failed_listen_is_left_to_the_next_call(
    servicebus_emulator, unique_name
):
    """The SDK reopens a receiver's handler after a connection error (its retries): the hook is on
    the receiver, so the new handler starts no thread either. A listen whose connection has failed
    raises nothing on the pump (the SDK's thread logged it too); the next SDK call reopens."""
    from azure.servicebus._pyamqp.error import AMQPConnectionError, ErrorCondition

    with _pump_receiver(servicebus_emulator, unique_name) as (client, queue, receiver, keep_alive, before):
        receiver._close_handler()  # noqa: SLF001 - what the SDK's retry does before reopening
        receiver._open()  # noqa: SLF001
        assert keep_alive.installed and receiver._handler._keep_alive_thread is None  # noqa: SLF001
        assert not set(_keep_alive_threads()) - before
        connection = receiver._handler._connection  # noqa: SLF001
        connection._error = AMQPConnectionError(ErrorCondition.SocketError, description="dropped")  # noqa: SLF001
        keep_alive.listen(receiver)  # logged, not raised
        connection._error = None  # noqa: SLF001
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"still received"))
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.complete_message(message)


def test_a_pump_whose_every_slot_stays_busy_reads_the_connection_itself_and_goes_on(
    funchost, servicebus_emulator, storage_connection_string, unique_name, tmp_path
):
    """One slot (maxConcurrentCalls 1), its function busy longer than KEEP_ALIVE_SECONDS: no receive
    call reads the connection meanwhile, so the pump does (``--debug funchost.servicebus`` logs it), and the
    busy message is then completed and the next one received, each delivered once."""
    env, names = host_env(
        servicebus_emulator, storage_connection_string, unique_name, tmp_path,
        lock_duration=timedelta(seconds=30), enabled=("sb_record",),
        AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls="1",
    )
    queue = names["FH_SB_QUEUE"]
    (host,) = funchost.start(APP_DIR, env=env, args=["--debug", "funchost.servicebus"])
    busy = KEEP_ALIVE_SECONDS + 3  # the pump checks every 0.5 s: room for a loaded machine
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(f'{{"sleep": {busy}}}', message_id="busy"))
            eventually(lambda: records(tmp_path, "sb_record", "start"), what="the busy message's invocation")
            sender.send_messages(ServiceBusMessage(b"{}", message_id="next"))
    line = "sb_record: no receive call for"
    eventually(lambda: line in host.log_path.read_text(errors="replace"), timeout=busy + 10,
               what="the pump's own keep-alive read while its slot is busy")
    def both_done():
        done = records(tmp_path, "sb_record", "done")
        return len(done) == 2 and done

    done = eventually(both_done, timeout=30, what="both invocations")
    assert [r["message_id"] for r in done] == ["busy", "next"]
    assert [r["delivery_count"] for r in records(tmp_path, "sb_record", "start")] == [1, 1]
    lines = host.log_path.read_text(errors="replace").splitlines()
    executed_busy = next(i for i, text in enumerate(lines) if "Executed" in text and "message_id=busy" in text)
    keep_alive_read = next(i for i, text in enumerate(lines) if line in text)
    assert keep_alive_read < executed_busy  # read while the busy function still ran, not after it returned
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_receiver(queue) as check:
            assert check.receive_messages(max_message_count=1, max_wait_time=1) == []  # both completed
