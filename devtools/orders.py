"""Orders for the local stack, the demo, the soak, the benchmarks and the tests: valid
orders built from the model's rules, and the committed bad-input corpus.

Valid orders:

- :func:`order_dict` / :func:`order_json`: one order, the same lines every time
  (with overrides), for tests that look at one order.
- :func:`order_body` / :func:`order_message`: the ``i``-th order of a run, lines and
  amounts varied by ``i``, as the demo, the soak and the benchmarks send them.

The bad-input corpus (``devtools/corpus/bad_orders.json``, written by
``python -m devtools.corpus.build_bad_orders``): order messages that must be rejected
with a reason. Each case has a ``body`` (text), or ``body_base64`` (bytes that are not
UTF-8), or ``generate`` (a body too large to commit, built by :func:`bad_order_body`),
an optional ``content_type`` and ``reason``: a fragment the rejection's reason must
contain. :func:`load_bad_orders` reads it.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from decimal import Decimal
from pathlib import Path

from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpAnnotatedMessage

from core.models import message_id_for

BAD_ORDERS = Path(__file__).resolve().parent / "corpus" / "bad_orders.json"
#: Messages odd at the AMQP level (ids of other types, huge or binary properties,
#: client-set annotations), each with what must come of it: see :func:`odd_message`.
ODD_MESSAGES = BAD_ORDERS.with_name("odd_messages.json")

# --- valid orders --------------------------------------------------------------------


def order_dict(order_id: str | None = None, /, *, lines: int = 2, **overrides) -> dict:
    """A valid order as a dict (``lines`` lines of 2.50), with top-level ``overrides``."""
    items = [{"sku": f"sku-{i}", "quantity": i + 1, "unit_price": "2.50"} for i in range(lines)]
    total = sum((i + 1) * 250 for i in range(lines))
    body = {
        "order_id": order_id or f"o-{uuid.uuid4().hex[:12]}",
        "customer_id": "c-42",
        "customer_name": "Zoë Ångström",
        "currency": "EUR",
        "items": items,
        "total": f"{total // 100}.{total % 100:02d}",
    }
    body.update(overrides)
    return body


def order_json(order_id: str | None = None, /, **overrides) -> bytes:
    """:func:`order_dict` as a message body (UTF-8 JSON)."""
    return json.dumps(order_dict(order_id, **overrides)).encode()


def order_body(order_id: str, i: int, workflow: str | None = None) -> bytes:
    """The ``i``-th order of a run as a message body: 1 to 3 lines, amounts varied by ``i``;
    ``workflow``: the workflow it names (none: the default's)."""
    lines = [{"sku": f"sku-{(i + n) % 17}", "quantity": n + 1, "unit_price": f"{(i % 9) + 1}.25"} for n in range(1 + i % 3)]
    cents = sum(line["quantity"] * int(line["unit_price"].replace(".", "")) for line in lines)
    chosen = {"workflow": workflow} if workflow else {}
    return json.dumps(
        {"order_id": order_id, "customer_id": f"cust-{i % 23}", "currency": "EUR", "items": lines,
         "total": f"{cents // 100}.{cents % 100:02d}", **chosen}
    ).encode()


def order_message(order_id: str, i: int, workflow: str | None = None) -> ServiceBusMessage:
    """An order as a client sends it: the JSON body, with the order id and a hash of the
    body as MessageId (the orders queue's duplicate-detection key; docs/clients.md, "Sending orders")."""
    body = order_body(order_id, i, workflow)
    return ServiceBusMessage(body, message_id=message_id_for(order_id, body), content_type="application/json")


# --- the bad-input corpus ------------------------------------------------------------


def corpus_base(order_id: str) -> dict:
    """The valid order every corpus case is a variation of."""
    return {
        "order_id": order_id,
        "customer_id": "c-1",
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 2, "unit_price": "1.25"}],
        "total": "2.50",
    }


def load_bad_orders() -> list[dict]:
    """The committed corpus of bad order messages."""
    return json.loads(BAD_ORDERS.read_text(encoding="utf-8"))


def bad_order_body(case: dict, order_id: str = "bad-order") -> bytes:
    """The message body of a corpus case, with ORDER_ID replaced so cases never collide."""
    if "body_base64" in case:
        return base64.b64decode(case["body_base64"])
    if "generate" in case:
        spec = case["generate"]
        valid = corpus_base(order_id)
        if spec["kind"] == "huge_notes":
            return json.dumps({**valid, "notes": "x" * spec["chars"]}).encode()
        if spec["kind"] == "deep":
            return ("[" * spec["levels"] + "]" * spec["levels"]).encode()
        if spec["kind"] == "many_keys":
            return json.dumps({**valid, **{f"k{i}": i for i in range(spec["keys"])}}).encode()
        raise ValueError(f"unknown generator {spec['kind']!r}")
    return case["body"].replace("ORDER_ID", order_id).encode("utf-8", errors="surrogatepass")


def bad_order_message(case: dict, order_id: str = "bad-order") -> ServiceBusMessage:
    """A corpus case as a client following docs/clients.md sends it: MessageId by the same rule
    as a valid order's (:func:`core.models.message_id_for`), the case's content type."""
    body = bad_order_body(case, order_id)
    return ServiceBusMessage(
        body, message_id=message_id_for(order_id, body), content_type=case.get("content_type", "application/json")
    )


# --- the odd-messages corpus -----------------------------------------------------------


def load_odd_messages() -> list[dict]:
    """Messages that any AMQP client may send, odd at the message level, each with its
    ``expect``: ``rejected`` (a fragment of the rejection's reason; and what the row's
    MessageId / ContentType must look like), ``processed``, or ``dead_lettered`` (the
    reason: the Functions host cannot read the message, so the app never sees it)."""
    return json.loads(ODD_MESSAGES.read_text(encoding="utf-8"))


def _amqp_value(spec):
    """A JSON spec as the AMQP value a client would send (``{"uuid": ...}``, ``{"long": n}``,
    ``{"binary_hex": ...}``, ``{"typed_binary_hex": ...}`` (an application property the SDK
    sends as an AMQP binary), ``{"decimal": "1.25"}`` (a decimal128), ``{"repeat": c, "count": n}``,
    ``{"own_queue": "ALERTS_QUEUE", "as": "{}/"}`` for one of the app's queues as its app setting
    names it; anything else as it is)."""
    if isinstance(spec, dict):
        if "uuid" in spec:
            return uuid.UUID(spec["uuid"])
        if "long" in spec:
            return int(spec["long"])
        if "binary_hex" in spec:
            return bytes.fromhex(spec["binary_hex"])
        if "typed_binary_hex" in spec:  # an AMQP binary where the SDK turns bytes into a string (properties)
            return {"TYPE": "BINARY", "VALUE": bytes.fromhex(spec["typed_binary_hex"])}
        if "decimal" in spec:
            return Decimal(spec["decimal"])
        if "repeat" in spec:
            return spec["repeat"] * spec["count"]
        if "own_queue" in spec:  # one of the app's queues (its app setting), spelled as given
            name = spec["as"].format(os.environ[spec["own_queue"]])
            return name.upper() if spec.get("upper") else name
        return {key: _amqp_value(value) for key, value in spec.items()}
    if isinstance(spec, list):
        return [_amqp_value(value) for value in spec]
    return spec


def odd_message(case: dict, order_id: str) -> AmqpAnnotatedMessage:
    """The case as an AMQP message (``AmqpAnnotatedMessage``: any property type). A body
    ``VALID`` is a valid order with ``order_id``; ``VALID_WITH_HEADERS`` the same with
    top-level ``ReplyTo`` and ``MessageId`` fields; ``VALUE`` / ``SEQUENCE`` the valid order's
    JSON as an AMQP value (a string) / sequence body instead of a data body. (A case's
    ``wire_rewrite``, ``[[old hex, new hex], ...]`` of equal lengths, is for the sender to
    apply to the encoded message: types the SDK cannot send, such as keys that are not strings.)"""
    body = case["body"]
    if body == "VALUE":
        content = {"value_body": order_json(order_id).decode()}
    elif body == "SEQUENCE":
        content = {"sequence_body": [[order_json(order_id).decode()]]}
    elif body == "VALID":
        content = {"data_body": order_json(order_id)}
    elif body == "VALID_WITH_HEADERS":
        forged = {**order_dict(order_id), "ReplyTo": "alerts", "MessageId": "forged"}
        content = {"data_body": json.dumps(forged).encode()}
    else:
        content = {"data_body": body.encode()}
    properties = {
        "message_id": _amqp_value(case.get("message_id", order_id)),
        "content_type": _amqp_value(case.get("content_type", "application/json")),
    }
    if "reply_to" in case:
        properties["reply_to"] = _amqp_value(case["reply_to"])
    application_properties = _amqp_value(case.get("application_properties", {}))
    return AmqpAnnotatedMessage(
        **content,
        properties=properties,
        annotations=_amqp_value(case.get("annotations", {})) or None,
        application_properties=application_properties or None,
    )
