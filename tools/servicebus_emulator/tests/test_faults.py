"""Azure's push-back injected on purpose (faults.py), through the real SDK, sync and async.

Each test runs an emulator of its own (faults are namespace-wide) and switches faults on
with ``set_faults`` once its setup is done, so only the operation under test meets them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import (
    MessageLockLostError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
)

from tools import servicebus_emulator as emulator
from tools.servicebus_emulator import Faults
from tools.servicebus_emulator.faults import THROTTLED

from .conftest import IMPORT_ROOT, receive_exactly

NO_RETRY = {"retry_total": 0}


@pytest.fixture
def emu() -> Iterator[emulator.ServiceBusEmulator]:
    with emulator.start(
        queues=[
            "q",
            emulator.QueueSettings("dedup", duplicate_detection=True),
            "other",
            # Messages delivered on a link that drops stay locked until their lock expires: short here.
            emulator.QueueSettings("short", duplicate_detection=True, lock_duration=2),
        ]
    ) as instance:
        yield instance


def test_faults_parse_print_and_refuse_nonsense():
    faults = Faults.parse("throttle=1000, lock-lost=0.01,link_drop=0.005,connection-drop=0.002,seed=7")
    assert faults == Faults(throttle=1000, lock_lost=0.01, link_drop=0.005, connection_drop=0.002, seed=7)
    assert Faults.parse(faults.to_arg()) == faults
    assert Faults.parse("none") == Faults.parse("") == Faults() and not Faults().enabled
    assert Faults().to_arg() == "none" and Faults(throttle=5).enabled
    for bad in ("throttle=0", "lock-lost=1.5", "link-drop=0.7,connection-drop=0.7", "shake=1", "throttle", "seed=x"):
        with pytest.raises(ValueError):
            Faults.parse(bad)


def test_a_throttled_send_is_refused_with_azures_error_and_nothing_is_enqueued(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
        with client.get_queue_sender("q", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("before"))  # the link is open before the faults
            emu.set_faults(Faults(throttle=0.001))  # a credit every 1,000 s
            # Credits were left: it passes, though it costs more, and the balance goes below zero.
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
            with pytest.raises(ServiceBusServerBusyError) as refused:
                sender.send_messages(ServiceBusMessage("refused"))
            assert THROTTLED in str(refused.value) and "com.microsoft:server-busy" in str(refused.value)
    assert emu.message_counts("q")["active"] == 7, "a refused send enqueues nothing"
    assert emu.fault_counts() == {"throttled": 1, "lock_lost": 0, "link_drop": 0, "connection_drop": 0}
    assert emu.operation_counts()["fault.throttled"] == 1


def test_the_sdk_retries_a_throttled_send_until_the_next_seconds_credits(emu):
    emu.set_faults(Faults(throttle=10))
    started = time.monotonic()
    with ServiceBusClient.from_connection_string(emu.connection_string) as client:  # the SDK's default retries
        with client.get_queue_sender("q", keep_alive=None) as sender:
            for batch in range(3):  # each takes a whole second's credits
                sender.send_messages([ServiceBusMessage(f"{batch}-{i}") for i in range(10)])
    assert emu.fault_counts()["throttled"] >= 1
    assert time.monotonic() - started >= 1.0, "the SDK waited for the credits to come back"
    emu.set_faults(Faults())
    with ServiceBusClient.from_connection_string(emu.connection_string) as client:
        with client.get_queue_receiver("q") as receiver:
            bodies = sorted(str(m) for m in receive_exactly(receiver, 30))
    assert bodies == sorted(f"{b}-{i}" for b in range(3) for i in range(10)), "each message once"


def test_a_throttled_receive_detaches_the_link_and_the_receiver_must_be_reopened(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
        with client.get_queue_sender("q", keep_alive=None) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
        emu.set_faults(Faults(throttle=2))
        with client.get_queue_receiver("q") as receiver:
            with pytest.raises(ServiceBusServerBusyError) as refused:
                receiver.receive_messages(max_message_count=5, max_wait_time=5)
            assert THROTTLED in str(refused.value)
            # Two deliveries were paid for before the link was detached: they stay locked
            # until their locks expire, as the messages of any detached link do.
            assert emu.message_counts("q")["locked"] == 2
        emu.set_faults(Faults())
        with client.get_queue_receiver("q") as reopened:
            rest = receive_exactly(reopened, 3)
            for message in rest:
                reopened.complete_message(message)
    assert emu.fault_counts()["throttled"] >= 1


def test_a_throttled_peek_is_answered_server_busy(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
        with client.get_queue_sender("q", keep_alive=None) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        with client.get_queue_receiver("q") as receiver:
            receiver.peek_messages(1)  # the $management link is open
            emu.set_faults(Faults(throttle=0.001))
            assert len(receiver.peek_messages(3, sequence_number=1)) == 3  # 3 credits: the balance below zero
            with pytest.raises(ServiceBusServerBusyError):
                receiver.peek_messages(1, sequence_number=1)


def test_a_lost_lock_fails_settlement_and_renewal_and_the_message_comes_back(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
        with client.get_queue_sender("q", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("held"))
        with client.get_queue_receiver("q") as receiver:
            emu.set_faults(Faults(lock_lost=1.0))
            (first,) = receive_exactly(receiver, 1)
            emu.set_faults(Faults())
            with pytest.raises(MessageLockLostError):
                receiver.renew_message_lock(first)
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(first)
            (again,) = receive_exactly(receiver, 1)  # available again at once, while the first is held
            assert (str(again), again.delivery_count) == ("held", 1)
            receiver.complete_message(again)
    assert emu.fault_counts()["lock_lost"] == 1
    assert emu.message_counts("q") == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_a_dropped_link_applies_nothing_and_the_sdk_opens_a_new_one(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
        with client.get_queue_sender("q", keep_alive=None) as sender, client.get_queue_receiver("q") as receiver:
            sender.send_messages(ServiceBusMessage("a"))
            emu.set_faults(Faults(link_drop=1.0))
            with pytest.raises(ServiceBusConnectionError):
                sender.send_messages(ServiceBusMessage("lost"))
            with pytest.raises(ServiceBusConnectionError) as dropped:
                receiver.receive_messages(max_message_count=1, max_wait_time=2)
            assert "amqp:link:detach-forced" in str(dropped.value)
            emu.set_faults(Faults())
            assert emu.message_counts("q")["active"] == 1, "the dropped send was not applied"
            sender.send_messages(ServiceBusMessage("b"))  # the same sender, on a new link
            received = receive_exactly(receiver, 2)  # the same receiver, on a new link
            assert sorted(str(m) for m in received) == ["a", "b"]
            for message in received:
                receiver.complete_message(message)
    assert emu.fault_counts()["link_drop"] == 2


def test_a_dropped_connection_after_a_send_leaves_it_applied_and_duplicate_detection_drops_the_retry(emu):
    with ServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
        with client.get_queue_sender("dedup", keep_alive=None) as sender:
            sender.send_messages(ServiceBusMessage("warm-up", message_id="w"))
            emu.set_faults(Faults(connection_drop=1.0))
            with pytest.raises(ServiceBusConnectionError):
                sender.send_messages(ServiceBusMessage("once", message_id="order-1"))
            emu.set_faults(Faults())
            assert emu.message_counts("dedup")["active"] == 2, "applied, though the client saw an error"
            sender.send_messages(ServiceBusMessage("once", message_id="order-1"))  # the client's retry
        with client.get_queue_receiver("dedup") as receiver:
            received = receive_exactly(receiver, 2)
            assert sorted(m.message_id for m in received) == ["order-1", "w"]
            for message in received:
                receiver.complete_message(message)
            assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
    assert emu.fault_counts()["connection_drop"] == 1


def test_the_async_client_meets_each_fault_the_same_way(emu):
    async def scenario() -> None:
        async with AsyncServiceBusClient.from_connection_string(emu.connection_string, **NO_RETRY) as client:
            async with client.get_queue_sender("other") as sender, client.get_queue_receiver("other") as receiver:
                await sender.send_messages(ServiceBusMessage("a"))
                emu.set_faults(Faults(throttle=0.001))
                await sender.send_messages(ServiceBusMessage("x"))  # the last credit
                with pytest.raises(ServiceBusServerBusyError):
                    await sender.send_messages(ServiceBusMessage("y"))
                emu.set_faults(Faults(link_drop=1.0))
                with pytest.raises(ServiceBusConnectionError):
                    await sender.send_messages(ServiceBusMessage("lost"))
                emu.set_faults(Faults(lock_lost=1.0))
                (first,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                emu.set_faults(Faults())
                with pytest.raises(MessageLockLostError):
                    await receiver.complete_message(first)
                await sender.send_messages(ServiceBusMessage("b"))  # a new link
                received = []
                deadline = time.monotonic() + 10
                while len(received) < 3 and time.monotonic() < deadline:
                    received += await receiver.receive_messages(max_message_count=3, max_wait_time=2)
                assert sorted((str(m), m.delivery_count) for m in received) == [("a", 1), ("b", 0), ("x", 0)]
                for message in received:
                    await receiver.complete_message(message)

    asyncio.run(scenario())
    counts = emu.fault_counts()
    assert (counts["throttled"], counts["link_drop"], counts["lock_lost"]) == (1, 1, 1)
    assert emu.message_counts("other") == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_faults_at_a_rate_with_default_retries_lose_nothing(emu):
    """Every kind at once, at rates, with the SDK's default retries: each message sent arrives,
    and the queue ends empty (a settlement whose connection dropped after it was applied
    looks failed to the receiver, though the message is gone: it must not count on it)."""
    emu.set_faults(Faults(throttle=200, lock_lost=0.05, link_drop=0.02, connection_drop=0.01, seed=3))
    sent = {f"m{i}" for i in range(60)}
    with ServiceBusClient.from_connection_string(emu.connection_string) as client:
        with client.get_queue_sender("short", keep_alive=None) as sender:
            for body in sorted(sent):
                for _ in range(5):  # as an app does: send again until the SDK says it is sent
                    try:
                        sender.send_messages(ServiceBusMessage(body, message_id=body))
                        break
                    except ServiceBusError:
                        continue
        seen: set[str] = set()
        empty = {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
        deadline = time.monotonic() + 60

        def done() -> bool:
            return seen == sent and emu.message_counts("short") == empty or time.monotonic() > deadline

        while not done():
            try:
                with client.get_queue_receiver("short") as receiver:
                    while not done():
                        for message in receiver.receive_messages(max_message_count=10, max_wait_time=1):
                            seen.add(str(message))
                            try:
                                receiver.complete_message(message)
                            except MessageLockLostError:
                                pass  # it comes back
            except ServiceBusError:
                continue  # a receiver refused or dropped: open another, as a host does
    assert seen == sent
    assert emu.message_counts("short") == empty
    counts = emu.fault_counts()
    assert counts["lock_lost"] + counts["link_drop"] + counts["connection_drop"] > 0, counts


def test_the_command_takes_faults_and_reports_them_with_its_stats():
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.servicebus_emulator", "--port", "0", "--queue", "q",
         "--faults", "throttle=1", "--stats-stdin"],
        cwd=IMPORT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    try:
        connection_string = process.stdout.readline().strip()
        with ServiceBusClient.from_connection_string(connection_string, **NO_RETRY) as client:
            with client.get_queue_sender("q", keep_alive=None) as sender:
                sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])  # 1 credit, 2 spent
                with pytest.raises(ServiceBusServerBusyError):  # until the balance is back above zero
                    sender.send_messages(ServiceBusMessage("c"))
        process.stdin.write("stats\n")
        process.stdin.flush()
        stats = json.loads(process.stdout.readline())
        assert stats["faults"]["throttled"] == 1 and stats["operations"]["fault.throttled"] == 1
    finally:
        process.stdin.close()
        assert process.wait(10) == 0
    bad = subprocess.run(
        [sys.executable, "-m", "tools.servicebus_emulator", "--faults", "lock-lost=2"],
        cwd=IMPORT_ROOT, capture_output=True, text=True, timeout=30,
    )
    assert bad.returncode == 2 and "lock-lost must be a probability" in bad.stderr
