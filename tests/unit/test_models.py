import json
from decimal import Decimal

import pytest
from pydantic import ValidationError

from core.models import OrderRequest, idempotency_key
from devtools.orders import order_dict


def parse(body: dict) -> OrderRequest:
    return OrderRequest.model_validate_json(json.dumps(body))


def test_valid_order_keeps_money_exact():
    order = parse(order_dict("o-1"))
    assert order.total == Decimal("7.50")
    assert order.items[0].unit_price == Decimal("2.50")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"order_id": ""}, "order_id"),
        ({"order_id": "a/b"}, "order_id"),
        ({"order_id": "a\\b"}, "order_id"),
        ({"order_id": "a#b"}, "order_id"),
        ({"order_id": "a?b"}, "order_id"),
        ({"order_id": "a\u0001b"}, "order_id"),
        ({"order_id": "x' or PartitionKey ne '"}, "order_id"),
        ({"order_id": "o" * 101}, "order_id"),
        ({"total": 12.5}, "not a JSON number"),
        ({"total": "-1.00"}, "not negative"),
        ({"total": "99.00"}, "does not equal"),
        ({"currency": "eur"}, "currency"),
        ({"items": []}, "items"),
        ({"extra": 1}, "extra"),
        ({"customer_name": "bad\u0007bell"}, "control characters"),
    ],
)
def test_invalid_orders_are_refused_with_the_field_named(change, message):
    with pytest.raises(ValidationError, match=message):
        parse(order_dict("o-1", **change))


def test_quantity_must_be_positive_integer():
    body = order_dict("o-1")
    body["items"][0]["quantity"] = 0
    with pytest.raises(ValidationError, match="quantity"):
        parse(body)
    body["items"][0]["quantity"] = "1"
    with pytest.raises(ValidationError, match="quantity"):
        parse(body)


def test_item_count_is_bounded():
    with pytest.raises(ValidationError, match="items"):
        parse(order_dict("o-1", lines=101))


def test_unicode_text_is_accepted_and_document_is_canonical():
    order = parse(order_dict("o-1", notes="日本語 — ok"))
    assert parse(json.loads(order.document())) == order


def test_idempotency_key_is_stable_per_order_step_and_action():
    assert idempotency_key("o-1", "reserve", "reserve") == idempotency_key("o-1", "reserve", "reserve")
    assert idempotency_key("o-1", "reserve", "reserve") != idempotency_key("o-2", "reserve", "reserve")
    assert idempotency_key("o-1", "reserve", "reserve") != idempotency_key("o-1", "reserve", "release")


def test_money_takes_ascii_digits_only():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="money"):
        parse(order_dict("o-1", lines=1, items=[{"sku": "s", "quantity": 1, "unit_price": "٢٥.٠٠"}], total="٢٥.٠٠"))
