"""Link addresses, as the SDK sends them.

Queue links arrive as full URIs (``amqps://127.0.0.1:PORT/orders``, with the
``amqps`` scheme even without TLS), the dead-letter queue as
``orders/$DeadLetterQueue``, management as ``orders/$management`` and the token
node as ``$cbs``. Entity names, like Service Bus's, are case-insensitive.
"""

from __future__ import annotations

import enum
from typing import NamedTuple
from urllib.parse import urlparse


class Kind(enum.Enum):
    QUEUE = "queue"
    MANAGEMENT = "management"
    CBS = "cbs"


class Address(NamedTuple):
    kind: Kind
    queue: str = ""
    dead_letter: bool = False

    @property
    def key(self) -> tuple[str, str, bool]:
        """Identifies a request/response node: the reply goes to the link with the same key."""
        return (self.kind.value, self.queue.lower(), self.dead_letter)


def parse(raw: bytes | str | None) -> Address | None:
    """Normalise a link address; None if there is none."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    path = urlparse(text).path if "://" in text else text
    parts = [part for part in path.split("/") if part]
    if not parts:
        return None
    if [part.lower() for part in parts] == ["$cbs"]:
        return Address(Kind.CBS)
    kind = Kind.QUEUE
    if parts[-1].lower() == "$management":
        kind, parts = Kind.MANAGEMENT, parts[:-1]
    dead_letter = len(parts) > 1 and parts[-1].lower() == "$deadletterqueue"
    if dead_letter:
        parts = parts[:-1]
    if not parts:
        return None
    return Address(kind, "/".join(parts), dead_letter)
