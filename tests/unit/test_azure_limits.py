"""Azure's limits that the app's own messages and rows must meet (docs/scale.md, "Azure
limits the app enforces"), measured on the largest order the app accepts."""

from __future__ import annotations

import json

from core.models import AgentResponse, MAX_DOCUMENT_CHARS, Nudge, OrderRequest, Outcome
from scheduler import dispatch
from tests.unit.test_workflow import World

#: A Standard namespace's largest message (learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas).
STANDARD_MAX_MESSAGE_BYTES = 256 * 1024
#: A Table string property holds 64 KiB of UTF-16: 32,768 characters
#: (learn.microsoft.com/rest/api/storageservices/understanding-the-table-service-data-model).
MAX_STRING_PROPERTY_CHARS = 32 * 1024
WIDE = "\U0001d11e"  # four bytes in UTF-8, two UTF-16 units


def largest_order(order_id: str) -> OrderRequest:
    """Every field at its longest, the free text in four-byte characters."""
    items = [{"sku": f"S{i:02d}" + "k" * 61, "quantity": 10_000, "unit_price": "9999.99"} for i in range(100)]
    return OrderRequest.model_validate(
        {
            "order_id": order_id + "x" * (100 - len(order_id)), "customer_id": "c" * 64, "customer_name": WIDE * 200,
            "currency": "EUR", "items": items, "total": "9999990000.00", "notes": WIDE * 2000,
        }
    )


def test_the_largest_order_fits_one_table_string_property(report_figure):
    document = largest_order("o-big").document()
    utf16_units = len(document.encode("utf-16-le")) // 2
    report_figure(f"largest order: {len(document)} characters, {utf16_units} UTF-16 units, {len(document.encode())} bytes")
    assert len(document) <= MAX_DOCUMENT_CHARS and utf16_units <= MAX_STRING_PROPERTY_CHARS, utf16_units


def test_with_the_largest_results_a_table_keeps_every_message_fits_a_standard_namespace(report_figure):
    """A step's result is kept as one Table string (JSON, ASCII-escaped: at most 32,768
    characters, so at most as many bytes in a message); every request carries the order and
    the results so far, every response those and its own. With the largest order and every
    result at that bound, each message of the three-step order stays under 256 KB."""
    result = {"r": "x" * (MAX_STRING_PROPERTY_CHARS - len('{"r":""}'))}
    assert len(json.dumps(result, separators=(",", ":"))) == MAX_STRING_PROPERTY_CHARS
    w = World()
    order = largest_order("o-big")
    created = w.store.create_order(order, workflow=w.definition, reply_to=None, now=w.now, pending_timeout=w.scheduler.pending_timeout)
    dispatch.schedule(Nudge(order_id=order.order_id, state=created.state, document=order.document()),
                      scheduler=w.scheduler, now=w.now)
    sizes = []
    for _ in range(3):
        request = w.last
        response = AgentResponse(order_id=request.order_id, step=request.step, kind=request.kind,
                                 attempt=request.attempt, outcome=Outcome.SUCCEEDED, context=request.context,
                                 result=result)
        sizes += [len(request.model_dump_json().encode()), len(response.model_dump_json().encode())]
        w.answer(request=request, result=result)
    assert w.state(order.order_id).process_state.value == "Processed"
    report_figure(f"largest agent request / response of the largest order: {max(sizes[::2])} / {max(sizes[1::2])} bytes")
    assert max(sizes) < STANDARD_MAX_MESSAGE_BYTES, sizes
