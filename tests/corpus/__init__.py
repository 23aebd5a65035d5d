"""The committed bad-input corpus and how to turn a case into message bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "bad_orders.json"


def load() -> list[dict]:
    return json.loads(CORPUS.read_text(encoding="utf-8"))


def body_of(case: dict, order_id: str = "bad-order") -> bytes:
    """The message body of a case, with ORDER_ID replaced so cases never collide."""
    if "body_base64" in case:
        return base64.b64decode(case["body_base64"])
    if "generate" in case:
        spec = case["generate"]
        valid = {"order_id": order_id, "customer_id": "c-1", "currency": "EUR",
                 "items": [{"sku": "sku-1", "quantity": 2, "unit_price": "1.25"}], "total": "2.50"}
        if spec["kind"] == "huge_notes":
            return json.dumps({**valid, "notes": "x" * spec["chars"]}).encode()
        if spec["kind"] == "deep":
            return ("[" * spec["levels"] + "]" * spec["levels"]).encode()
        if spec["kind"] == "many_keys":
            return json.dumps({**valid, **{f"k{i}": i for i in range(spec["keys"])}}).encode()
        raise ValueError(f"unknown generator {spec['kind']!r}")
    return case["body"].replace("ORDER_ID", order_id).encode("utf-8", errors="surrogatepass")
