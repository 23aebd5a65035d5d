"""``ordersctl dead-letters`` shows every dead-lettered message it can decode and names what it
skipped, even when a message carries a value the Azure SDK for Python cannot decode.

The messages are sent and dead-lettered by a raw AMQP 1.0 client over a real socket to the
Service Bus emulator (``rawamqp``: the bytes any other client, .NET, Java or Qpid Proton,
may send): a ``decimal128`` application property, the very type that failed the whole
command before (``peek_messages`` decodes every message before it returns any).
"""

from __future__ import annotations

import os
import subprocess
import sys

from core import names
from tests import ROOT
from tools.servicebus_emulator import codec
from tools.servicebus_emulator.tests.rawamqp import RawClient, enc_map, message, rejected

#: 1.25 as an AMQP decimal128 (what Qpid Proton encodes for decimal128 1.25).
DECIMAL128 = bytes.fromhex("94303e000000000000000000000000007d")
#: An AMQP char ('€'): the SDK has no decoder for it either.
CHAR = bytes.fromhex("73000020ac")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ordersctl", *args], cwd=ROOT, env={**os.environ, "COLUMNS": "250"},
                          capture_output=True, text=True, timeout=60)


def _dead_letter(port: int, queue: str, payloads: list[bytes]) -> None:
    """Send each payload to ``queue`` and dead-letter it, as a raw AMQP client does."""
    with RawClient(port) as client:
        sender = client.attach(queue, receiver=False)
        for payload in payloads:
            assert "accepted" in client.send(sender, payload)
        receiver = client.attach(queue, receiver=True)
        for _ in payloads:
            delivery = client.receive(receiver)
            client.settle(delivery, rejected([("DeadLetterReason", codec.enc_string("ClientRejected")),
                                              ("DeadLetterErrorDescription", codec.enc_string("by the test"))]))


def test_dead_letters_shows_what_it_can_decode_and_names_each_skipped_property(app_settings, servicebus_emulator):
    queue = app_settings[names.ORDERS_QUEUE_SETTING]
    long_key = (  # a properties map whose key is not a string (AMQP says string keys; the SDK reads it anyway)
        codec.enc_described(codec.PROPERTIES, codec.enc_list([codec.enc_string("long-key-1")]))
        + codec.enc_described(codec.APPLICATION_PROPERTIES, enc_map([(codec.enc_long(7), codec.enc_string("x"))]))
        + codec.enc_described(codec.AMQP_VALUE, codec.enc_string("body of long-key-1"))
    )
    _dead_letter(servicebus_emulator.port, queue, [
        message(message_id=codec.enc_string("plain-1"), value=codec.enc_string("a plain body")),
        message(message_id=codec.enc_string("dec-1"), value=codec.enc_string("body of dec-1"),
                application_properties=[("amount", DECIMAL128), ("note", codec.enc_string("kept")),
                                        ("symbol", CHAR)]),
        long_key,
    ])

    shown = cli("dead-letters", queue)

    assert shown.returncode == 0, shown.stderr
    for message_id in ("plain-1", "dec-1", "long-key-1"):
        assert message_id in shown.stdout
    assert "3 dead-lettered message(s)" in shown.stdout
    assert "2 part(s) the Azure SDK cannot decode were skipped" in shown.stdout
    assert shown.stdout.count("ClientRejected") == 3  # each one's reason, the odd ones' included
    skipped = [line for line in shown.stderr.splitlines() if line.startswith("skipped in ")]
    assert len(skipped) == 2, shown.stderr
    assert any(line.startswith("skipped in message dec-1 (sequence number 2): application property 'amount': ")
               and "AMQP decimal128" in line for line in skipped), skipped
    assert any(line.startswith("skipped in message dec-1 (sequence number 2): application property 'symbol': ")
               and "AMQP char" in line for line in skipped), skipped
    assert "note" not in shown.stderr  # the decodable property of the same message was kept
