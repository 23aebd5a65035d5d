"""The same features through the SDK's async client (``azure.servicebus.aio``)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import ServiceBusError


async def _receive_exactly(receiver: ServiceBusReceiver, count: int, timeout: float = 10.0) -> list:
    received: list = []
    deadline = asyncio.get_running_loop().time() + timeout
    while len(received) < count:
        remaining = deadline - asyncio.get_running_loop().time()
        assert remaining > 0, f"received {len(received)} of {count} messages within {timeout} s"
        received += await receiver.receive_messages(max_message_count=count - len(received), max_wait_time=remaining)
    return received


def test_async_send_receive_complete_abandon(servicebus_emulator, servicebus_connection_string, make_queue):
    queue = make_queue()

    async def scenario() -> None:
        async with ServiceBusClient.from_connection_string(servicebus_connection_string) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages(ServiceBusMessage("single", message_id="s1", subject="s"))
                batch = await sender.create_message_batch()
                for i in range(10):
                    batch.add_message(ServiceBusMessage(f"batch-{i}"))
                await sender.send_messages(batch)
            async with client.get_queue_receiver(queue) as receiver:
                messages = await _receive_exactly(receiver, 11)
                assert [str(m) for m in messages] == ["single"] + [f"batch-{i}" for i in range(10)]
                assert (messages[0].message_id, messages[0].subject) == ("s1", "s")
                await receiver.abandon_message(messages[0])
                for message in messages[1:]:
                    await receiver.complete_message(message)
                (again,) = await _receive_exactly(receiver, 1)
                assert (str(again), again.delivery_count) == ("single", 1)
                await receiver.complete_message(again)

    asyncio.run(scenario())
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_async_dead_letter_peek_renew_schedule_and_receive_and_delete(
    servicebus_emulator, servicebus_connection_string, make_queue
):
    queue = make_queue()

    async def scenario() -> None:
        async with ServiceBusClient.from_connection_string(servicebus_connection_string) as client:
            async with client.get_queue_sender(queue) as sender, client.get_queue_receiver(queue) as receiver:
                await sender.send_messages([ServiceBusMessage("bad"), ServiceBusMessage("slow")])
                peeked = await receiver.peek_messages(5, sequence_number=1)
                assert [str(m) for m in peeked] == ["bad", "slow"]
                bad, slow = await _receive_exactly(receiver, 2)
                await receiver.dead_letter_message(bad, reason="r", error_description="d")
                before = slow.locked_until_utc
                assert await receiver.renew_message_lock(slow) >= before
                await receiver.complete_message(slow)

                at = datetime.now(UTC) + timedelta(minutes=5)
                numbers = await sender.schedule_messages([ServiceBusMessage("s1"), ServiceBusMessage("s2")], at)
                assert servicebus_emulator.message_counts(queue)["scheduled"] == 2
                await sender.cancel_scheduled_messages(numbers)
                assert servicebus_emulator.message_counts(queue)["scheduled"] == 0

            async with client.get_queue_receiver(
                queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as dead_letters:
                (dead,) = await _receive_exactly(dead_letters, 1)
                assert (str(dead), dead.dead_letter_reason, dead.dead_letter_error_description) == ("bad", "r", "d")

    asyncio.run(scenario())
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}


def test_async_session_receivers_are_refused_at_once(servicebus_connection_string, queue):
    async def scenario() -> str:
        async with ServiceBusClient.from_connection_string(servicebus_connection_string) as client:
            receiver = client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION)
            with pytest.raises(ServiceBusError) as raised:
                async with receiver:
                    await receiver.receive_messages(max_wait_time=5)
            return str(raised.value)

    started = time.monotonic()
    message = asyncio.run(scenario())
    assert "is not session-enabled" in message and "amqp:not-allowed" in message, message
    assert time.monotonic() - started < 5
