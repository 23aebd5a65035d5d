"""The published JSON Schemas of an order message and of an order-event message:
``python -m core.schema`` rewrites ``schemas/order.schema.json`` and
``schemas/order-event.schema.json`` from the models; tests keep them equal."""

from __future__ import annotations

import json
from pathlib import Path

from core.models import OrderEvent, OrderRequest

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "order.schema.json"
EVENT_SCHEMA_PATH = SCHEMA_PATH.with_name("order-event.schema.json")


def order_schema() -> dict:
    schema = OrderRequest.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "order.schema.json", **schema}


def render() -> str:
    return json.dumps(order_schema(), indent=2, sort_keys=True) + "\n"


def render_event() -> str:
    schema = OrderEvent.model_json_schema(mode="validation")
    document = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": EVENT_SCHEMA_PATH.name, **schema}
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render(), encoding="utf-8")
    EVENT_SCHEMA_PATH.write_text(render_event(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH.name}, {EVENT_SCHEMA_PATH.name}")
