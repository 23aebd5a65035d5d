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
import uuid
from pathlib import Path

from azure.servicebus import ServiceBusMessage

from core.models import message_id_for

BAD_ORDERS = Path(__file__).resolve().parent / "corpus" / "bad_orders.json"

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


def order_body(order_id: str, i: int) -> bytes:
    """The ``i``-th order of a run as a message body: 1 to 3 lines, amounts varied by ``i``."""
    lines = [{"sku": f"sku-{(i + n) % 17}", "quantity": n + 1, "unit_price": f"{(i % 9) + 1}.25"} for n in range(1 + i % 3)]
    cents = sum(line["quantity"] * int(line["unit_price"].replace(".", "")) for line in lines)
    return json.dumps(
        {"order_id": order_id, "customer_id": f"cust-{i % 23}", "currency": "EUR", "items": lines,
         "total": f"{cents // 100}.{cents % 100:02d}"}
    ).encode()


def order_message(order_id: str, i: int) -> ServiceBusMessage:
    """An order as a client sends it: the JSON body, with the order id and a hash of the
    body as MessageId (the orders queue's duplicate-detection key; README, "Sending orders")."""
    body = order_body(order_id, i)
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
