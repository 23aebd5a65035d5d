"""The published JSON Schemas of the messages any client sends: ``python -m core.schema``
rewrites ``schemas/order.schema.json``, ``schemas/order-event.schema.json`` and
``schemas/cancel.schema.json`` from the models; tests keep them equal."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from core.models import CancelRequest, OrderEvent, OrderRequest

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "order.schema.json"
EVENT_SCHEMA_PATH = SCHEMA_PATH.with_name("order-event.schema.json")
CANCEL_SCHEMA_PATH = SCHEMA_PATH.with_name("cancel.schema.json")


def _schema(model: type[BaseModel], path: Path) -> dict:
    schema = model.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": path.name, **schema}


def order_schema() -> dict:
    return _schema(OrderRequest, SCHEMA_PATH)


def render(model: type[BaseModel] = OrderRequest, path: Path = SCHEMA_PATH) -> str:
    return json.dumps(_schema(model, path), indent=2, sort_keys=True) + "\n"


def render_event() -> str:
    return render(OrderEvent, EVENT_SCHEMA_PATH)


#: Each published schema: its model and its file.
PUBLISHED = ((OrderRequest, SCHEMA_PATH), (OrderEvent, EVENT_SCHEMA_PATH), (CancelRequest, CANCEL_SCHEMA_PATH))


if __name__ == "__main__":
    for model, path in PUBLISHED:
        path.write_text(render(model, path), encoding="utf-8")
        print(f"wrote {path.name}")
