"""``ordersctl.peek.decode``: a message the Azure SDK cannot decode whole is decoded as far as
it can be, and each part left out is named with the reason (no I/O: encoded bytes in, the
SDK's decoded message out)."""

from __future__ import annotations

from ordersctl.peek import decode
from tools.servicebus_emulator import codec
from tools.servicebus_emulator.tests.rawamqp import message

DECIMAL128 = bytes.fromhex("94303e000000000000000000000000007d")  # 1.25, as Qpid Proton encodes it
DECIMAL32 = bytes.fromhex("74000020ac")


def _as_is(decoded):
    return decoded


def test_a_message_the_sdk_decodes_is_returned_whole_with_nothing_skipped():
    peeked = decode(message(message_id=codec.enc_string("m-1"), application_properties=[("a", codec.enc_long(5))]),
                    _as_is)
    assert peeked.skipped == []
    assert peeked.message.properties.message_id == b"m-1"
    assert peeked.message.application_properties == {b"a": 5}


def test_undecodable_annotations_and_properties_are_left_out_one_by_one():
    payload = message(
        message_id=codec.enc_string("m-2"),
        annotations=[("x-opt-sequence-number", codec.enc_long(42)), ("x-opt-amount", DECIMAL128)],
        application_properties=[("amount", DECIMAL32), ("note", codec.enc_string("kept"))],
    )
    peeked = decode(payload, _as_is)
    assert [(s.part, s.why.split(",")[0]) for s in peeked.skipped] == [
        ("message annotation 'x-opt-amount'", "an AMQP decimal128"),
        ("application property 'amount'", "an AMQP decimal32"),
    ]
    assert peeked.message.message_annotations == {b"x-opt-sequence-number": 42}
    assert peeked.message.application_properties == {b"note": b"kept"}
    assert peeked.message.properties.message_id == b"m-2"


def test_a_body_the_sdk_cannot_decode_is_left_out_and_the_rest_kept():
    peeked = decode(message(message_id=codec.enc_string("m-3"), value=DECIMAL128), _as_is)
    assert [s.part for s in peeked.skipped] == ["body (value)"]
    assert "AMQP decimal128" in peeked.skipped[0].why
    assert peeked.message.properties.message_id == b"m-3"


def test_bytes_that_are_not_a_message_are_reported_never_raised():
    peeked = decode(b"\x00\x53\x77\xff", _as_is)
    assert peeked.message is None
    assert [s.part for s in peeked.skipped] == ["the whole message"]
