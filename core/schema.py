"""The published JSON Schema of an order message: ``python -m core.schema`` rewrites
``schemas/order.schema.json`` from the model; a test keeps the two equal."""

from __future__ import annotations

import json
from pathlib import Path

from core.models import OrderRequest

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "order.schema.json"


def order_schema() -> dict:
    schema = OrderRequest.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "order.schema.json", **schema}


def render() -> str:
    return json.dumps(order_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH.name}")
