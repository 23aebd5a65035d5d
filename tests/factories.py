"""Valid orders for tests, built from the model's own rules."""

from __future__ import annotations

import json
import uuid


def order_dict(order_id: str | None = None, /, *, lines: int = 2, **overrides) -> dict:
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
    return json.dumps(order_dict(order_id, **overrides)).encode()
