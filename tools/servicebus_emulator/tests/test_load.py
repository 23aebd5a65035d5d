"""Competing consumers, large messages, and a client that dies holding locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta

from azure.servicebus import ServiceBusMessage

from tools.servicebus_emulator import connection

from .conftest import IMPORT_ROOT, receive_exactly, sender_for, wait_until


def test_four_competing_receivers_get_each_of_2000_messages_exactly_once(
    servicebus_emulator, client, queue, report_figure
):
    total = 2000
    with sender_for(client, queue) as sender:
        for start in range(0, total, 100):
            batch = sender.create_message_batch()
            for number in range(start, start + 100):
                batch.add_message(ServiceBusMessage(str(number)))
            sender.send_messages(batch)
    assert servicebus_emulator.message_counts(queue)["active"] == total

    received: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    done = threading.Event()
    deadline = time.monotonic() + 60
    started = time.perf_counter()

    def consume(index: int) -> None:
        try:
            with client.get_queue_receiver(queue) as receiver:
                while not done.is_set() and time.monotonic() < deadline:
                    for message in receiver.receive_messages(max_message_count=50, max_wait_time=0.5):
                        receiver.complete_message(message)
                        received[index].append(str(message))
                    if sum(len(r) for r in received) >= total:
                        done.set()
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)
            done.set()

    threads = [threading.Thread(target=consume, args=(i,), name=f"receiver-{i}") for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    elapsed = time.perf_counter() - started
    assert not errors, errors
    everything = Counter(body for bodies in received for body in bodies)
    assert sorted(everything, key=int) == [str(n) for n in range(total)]
    assert set(everything.values()) == {1}, "a message was delivered (and completed) twice"
    assert all(received), f"a receiver got nothing: {[len(r) for r in received]}"
    assert servicebus_emulator.message_counts(queue) == {"active": 0, "dead_letter": 0, "scheduled": 0, "locked": 0}
    report_figure(
        f"servicebus emulator: 4 competing receivers completed {total} messages in {elapsed:.1f} s "
        f"(split {[len(r) for r in received]})"
    )


def test_a_200_kb_message_crosses_in_several_frames_both_ways_intact(servicebus_emulator, client, queue):
    body = os.urandom(200 * 1024)
    # The emulator accepts, and sends, frames of at most MAX_FRAME_SIZE: this message needs several each way.
    assert connection.MAX_FRAME_SIZE * 3 < len(body)
    properties = {"k": "v" * 1000}
    with sender_for(client, queue) as sender:
        sender.send_messages(ServiceBusMessage(body, application_properties=properties, message_id="big"))
        sender.send_messages(ServiceBusMessage("small after big"))
    with client.get_queue_receiver(queue) as receiver:
        big, small = receive_exactly(receiver, 2)
        assert b"".join(big.body) == body
        assert big.application_properties == {b"k": b"v" * 1000}
        assert big.message_id == "big"
        assert str(small) == "small after big"
        receiver.complete_message(big)
        receiver.complete_message(small)
    assert servicebus_emulator.message_counts(queue)["active"] == 0


_DYING_RECEIVER = """
import sys, time
from azure.servicebus import ServiceBusClient
with ServiceBusClient.from_connection_string(sys.argv[1]) as client:
    receiver = client.get_queue_receiver(sys.argv[2])
    got = []
    while len(got) < 3:
        got += receiver.receive_messages(max_message_count=3 - len(got), max_wait_time=5)
    print("locked", len(got), flush=True)
    time.sleep(120)  # until killed, holding the locks
"""


def test_a_client_that_dies_mid_lock_gets_its_messages_redelivered_after_the_lock_expires(
    servicebus_emulator, make_queue, client
):
    queue = make_queue(lock_duration=timedelta(seconds=1))
    with sender_for(client, queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    child = subprocess.Popen(
        [sys.executable, "-c", _DYING_RECEIVER, servicebus_emulator.connection_string, queue],
        cwd=IMPORT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["locked", "3"]
        assert servicebus_emulator.message_counts(queue)["locked"] == 3
        os.killpg(child.pid, signal.SIGKILL)  # no detach, no close: the socket just goes away
        child.wait(10)
        wait_until(lambda: servicebus_emulator.message_counts(queue)["active"] == 3, timeout=5, what="lock expiry")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
    with client.get_queue_receiver(queue) as receiver:
        messages = receive_exactly(receiver, 3)
        assert sorted(str(m) for m in messages) == ["m0", "m1", "m2"]
        assert {m.delivery_count for m in messages} == {1}
        for message in messages:
            receiver.complete_message(message)
