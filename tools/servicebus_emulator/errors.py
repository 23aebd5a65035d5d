"""The error that closes a connection."""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer broke the protocol; the connection is closed with this AMQP error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
