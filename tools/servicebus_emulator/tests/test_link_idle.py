"""Azure force-detaches a link on which no call was made for 10 minutes
(``amqp:link:detach-forced``, "…IdleTimerExpired: Idle timeout: 00:10:00"), and leaves the
connection open; a receive waiting for a message is a call. The emulator does the same after
its ``link_idle_timeout``, shortened here (``set_link_idle_timeout``) so tests need not wait."""

from __future__ import annotations

import threading

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusConnectionError

from tools import servicebus_emulator as emulator
from tools.servicebus_emulator import codec
from tools.servicebus_emulator.__main__ import parse_args
from tools.servicebus_emulator.broker import LINK_IDLE_TIMEOUT
from tools.servicebus_emulator.tests.conftest import wait_until
from tools.servicebus_emulator.tests.rawamqp import RawClient, message

IDLE = 0.5


@pytest.fixture
def own_emulator():
    """An emulator of the test's own (the only links it detaches are the test's), with Azure's 10 minutes."""
    instance = emulator.start(host="127.0.0.1", port=0)
    yield instance
    instance.stop()


@pytest.fixture
def short_idle(own_emulator):
    """The same, shortened to IDLE at run time, as a test of an app would shorten it."""
    own_emulator.set_link_idle_timeout(IDLE)
    return own_emulator


def test_the_command_detaches_after_azures_ten_minutes_unless_told_otherwise():
    assert parse_args([]).link_idle_timeout == LINK_IDLE_TIMEOUT == 600
    assert parse_args(["--link-idle-timeout", "2.5"]).link_idle_timeout == 2.5
    assert parse_args(["--link-idle-timeout", "0"]).link_idle_timeout is None  # never


def idle_detaches(emulator) -> int:
    return emulator.operation_counts().get("link.idle-detached", 0)


def test_a_link_with_no_call_is_force_detached_as_azure_says_and_the_connection_stays_open(
    own_emulator, unique_name
):
    """On a connection opened under Azure's 10 minutes, shortened once the link is idle: the
    new time holds from then on (the raw client reads for 5 s at most)."""
    short_idle = own_emulator
    queue = short_idle.declare_queue(unique_name())
    with RawClient(short_idle.port) as client:
        sender = client.attach(queue, receiver=False)
        client.send(sender, message(value=codec.enc_string("before")))
        short_idle.set_link_idle_timeout(IDLE)
        code, fields = client.read_frame()  # the next frame but credit: the detach, once the link has been idle
        while code == codec.FLOW:
            code, fields = client.read_frame()
        assert code == codec.DETACH and fields[1] is True  # closed
        condition, description = fields[2][0], fields[2][1]
        assert condition == b"amqp:link:detach-forced"
        assert b"force detached by the broker due to errors occurred in publisher" in description
        assert b"AmqpMessagePublisher.IdleTimerExpired: Idle timeout: 00:00:00" in description
        # The connection is still open: a new link works on it.
        again = client.attach(queue, receiver=False)
        client.send(again, message(value=codec.enc_string("after")))
    assert short_idle.message_counts(queue)["active"] == 2


def test_a_receive_waiting_past_the_idle_time_is_a_call_and_keeps_its_link(short_idle, unique_name):
    queue = short_idle.declare_queue(unique_name())
    before = idle_detaches(short_idle)
    client = ServiceBusClient.from_connection_string(short_idle.connection_string)
    with client, client.get_queue_receiver(queue) as receiver:
        arrived = threading.Event()

        def send_later() -> None:  # once the receive has waited several idle times (and its link stayed)
            arrived.wait(IDLE * 4)
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("late"))

        threading.Thread(target=send_later, daemon=True).start()
        (received,) = receiver.receive_messages(max_message_count=1, max_wait_time=IDLE * 10)
        assert str(received) == "late"
        receiver.complete_message(received)
    assert idle_detaches(short_idle) == before


def test_a_sender_idle_past_the_time_is_detached_and_a_send_without_a_deadline_recovers(short_idle, unique_name):
    """What the Python SDK does about it: a send with no timeout retries on a new link; one with
    a short timeout (as the app's status events have) fails instead."""
    queue = short_idle.declare_queue(unique_name())
    before = idle_detaches(short_idle)
    client = ServiceBusClient.from_connection_string(short_idle.connection_string)
    with client, client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("one"))
        wait_until(lambda: idle_detaches(short_idle) > before, what="the idle sender's link detached")
        with pytest.raises(ServiceBusConnectionError):
            sender.send_messages(ServiceBusMessage("lost"), timeout=2.0)
    client = ServiceBusClient.from_connection_string(short_idle.connection_string)
    with client, client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("two"))
        wait_until(lambda: idle_detaches(short_idle) > before + 1, what="the second sender's link detached")
        sender.send_messages(ServiceBusMessage("three"))  # no deadline: the SDK opens a new link
    assert short_idle.message_counts(queue)["active"] == 3
