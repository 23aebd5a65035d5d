"""Stamps for the operator (docs/scale.md, "Past one deployment: stamps"): each stamp is a
whole deployment, operated with its own settings (one ``ordersctl`` per stamp, as one per
deployment); these helpers say which stamp an order belongs to, from the stamps' namespaces
(``ORDERS_STAMPS``), and keep ``send-order`` from sending an order to another stamp."""

from __future__ import annotations

from core import names


class StampError(ValueError):
    """A malformed stamp list, or an order sent to a stamp that is not its own."""


def parse_stamps(text: str) -> list[str]:
    """``ORDERS_STAMPS``: the stamps' fully qualified namespaces, comma-separated, in stamp
    order (the namespaces of main.bicep's output AZURE_STAMPS)."""
    stamps = [_host(part) for part in text.split(",") if part.strip()]
    if not 1 <= len(stamps) <= names.MAX_STAMPS:
        raise StampError(f"{names.ORDERS_STAMPS_SETTING} lists 1 to {names.MAX_STAMPS} namespaces, "
                         f"comma-separated in stamp order; got {len(stamps)}: {text!r}")
    repeated = sorted({s for s in stamps if stamps.count(s) > 1})
    if repeated:
        raise StampError(f"{names.ORDERS_STAMPS_SETTING} names a namespace twice: {', '.join(repeated)}")
    return stamps


def _host(namespace: str) -> str:
    """``sb://x.servicebus.windows.net/``, ``x.servicebus.windows.net`` -> the host, lower-case."""
    host = namespace.strip().lower().removeprefix("sb://").removeprefix("amqps://").rstrip("/")
    if not host or "/" in host or " " in host:
        raise StampError(f"{namespace!r} is not a Service Bus namespace (e.g. sb-x.servicebus.windows.net)")
    return host


def connected_namespace(connection_string: str | None, namespace: str | None) -> str | None:
    """The namespace the settings reach: the identity-based one, or a connection string's Endpoint."""
    if namespace:
        return _host(namespace)
    for part in (connection_string or "").split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "endpoint" and value.strip():
            return _host(value)
    return None


def stamp_for(order_id: str, stamps: list[str]) -> tuple[int, str]:
    """The order's stamp (core/names.py stamp_of) and its namespace."""
    stamp = names.stamp_of(order_id, len(stamps))
    return stamp, stamps[stamp]


def check_stamp(order_id: str, stamps: list[str], reached: str | None) -> None:
    """Refuse to send ``order_id`` through settings that reach another stamp's namespace: its
    resends and the operator's look-ups would go to the stamp the rule picks, not there."""
    stamp, namespace = stamp_for(order_id, stamps)
    if reached != namespace:
        raise StampError(f"order {order_id} belongs to stamp {stamp} ({namespace}), but these settings reach "
                         f"{reached or 'no namespace'}: send it with stamp {stamp}'s settings")
