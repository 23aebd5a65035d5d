"""Writes devtools/corpus/bad_orders.json: order messages that must be rejected with a reason.

Run ``python -m devtools.corpus.build_bad_orders`` after changing the cases; the file is
committed so any client (or another implementation) can replay it. Each case has a
``body`` (text), or ``body_base64`` (bytes that are not UTF-8), or ``generate`` (a body
too large to commit, built by ``devtools.orders.bad_order_body``), an optional
``content_type`` and ``reason``: a fragment the rejection's reason must contain. Read it
with ``devtools.orders.load_bad_orders``.
"""

from __future__ import annotations

import base64
import json

from devtools.orders import BAD_ORDERS, corpus_base

VALID = corpus_base("ORDER_ID")

def with_(**changes):
    body = json.loads(json.dumps(VALID))
    for key, value in changes.items():
        if value is ...:
            body.pop(key)
        else:
            body[key] = value
    return body


def item(**changes):
    line = {"sku": "sku-1", "quantity": 2, "unit_price": "1.25"}
    line.update(changes)
    return with_(items=[line])


def cases():
    j = lambda body: json.dumps(body, ensure_ascii=False)  # noqa: E731
    out = [
        # --- not JSON at all
        ("empty body", "", None, "invalid order"),
        ("plain text", "hello", None, "invalid order"),
        ("truncated JSON", j(VALID)[:-5], None, "invalid order"),
        ("trailing garbage", j(VALID) + "}", None, "invalid order"),
        ("single quotes", j(VALID).replace('"', "'"), None, "invalid order"),
        ("JSON null", "null", None, "invalid order"),
        ("JSON array", j([VALID]), None, "invalid order"),
        ("JSON string", j("an order"), None, "invalid order"),
        ("JSON number", "42", None, "invalid order"),
        ("NaN money", j(VALID).replace('"2.50"', "NaN"), None, "invalid order"),
        # --- content types
        ("text/plain content type", j(VALID), "text/plain", "content type"),
        ("xml content type", "<order/>", "application/xml", "content type"),
        ("octet-stream content type", j(VALID), "application/octet-stream", "content type"),
        ("form content type", "order_id=1", "application/x-www-form-urlencoded", "content type"),
        # --- missing fields
        ("missing order_id", j(with_(order_id=...)), None, "order_id"),
        ("missing customer_id", j(with_(customer_id=...)), None, "customer_id"),
        ("missing currency", j(with_(currency=...)), None, "currency"),
        ("missing items", j(with_(items=...)), None, "items"),
        ("missing total", j(with_(total=...)), None, "total"),
        ("missing item sku", j(with_(items=[{"quantity": 1, "unit_price": "1.00"}], total="1.00")), None, "sku"),
        # --- wrong types
        ("order_id number", j(with_(order_id=123)), None, "order_id"),
        ("items object", j(with_(items={"sku": "a"})), None, "items"),
        ("quantity string", j(item(quantity="2")), None, "quantity"),
        ("quantity float", j(item(quantity=2.0)), None, "quantity"),
        ("quantity bool", j(item(quantity=True)), None, "quantity"),
        ("customer_id list", j(with_(customer_id=["c"])), None, "customer_id"),
        ("extra field", j(with_(discount="1.00")), None, "discount"),
        # --- numbers out of range
        ("zero quantity", j(item(quantity=0)), None, "quantity"),
        ("negative quantity", j(item(quantity=-1)), None, "quantity"),
        ("huge quantity", j(item(quantity=10**12)), None, "quantity"),
        ("float money", j(with_(total=2.5)), None, "JSON number"),
        ("float unit price", j(item(unit_price=1.25)), None, "JSON number"),
        ("integer money", j(with_(total=2)), None, "JSON number"),
        ("negative money", j(with_(total="-2.50")), None, "not negative"),
        ("three decimals", j(item(unit_price="1.255")), None, "two decimals"),
        ("money with exponent", j(with_(total="2.5e0")), None, "money"),
        ("total mismatch", j(with_(total="3.00")), None, "does not equal"),
        ("no items", j(with_(items=[])), None, "items"),
        ("too many items", j(with_(items=[{"sku": f"s{i}", "quantity": 1, "unit_price": "1.00"} for i in range(101)], total="101.00")), None, "items"),
        ("lower-case currency", j(with_(currency="eur")), None, "currency"),
        # --- ids outside the Table key rules, and injection attempts
        ("empty order_id", j(with_(order_id="")), None, "order_id"),
        ("slash in id", j(with_(order_id="a/b")), None, "order_id"),
        ("backslash in id", j(with_(order_id="a\\b")), None, "order_id"),
        ("hash in id", j(with_(order_id="a#b")), None, "order_id"),
        ("question mark in id", j(with_(order_id="a?b")), None, "order_id"),
        ("tab in id", j(with_(order_id="a\tb")), None, "order_id"),
        ("NUL in id", j(with_(order_id="a\u0000b")), None, "order_id"),
        ("DEL in id", j(with_(order_id="a\u007fb")), None, "order_id"),
        ("C1 control in id", j(with_(order_id="a\u0085b")), None, "order_id"),
        ("OData injection in id", j(with_(order_id="x' or PartitionKey ne '")), None, "order_id"),
        ("OData injection in id 2", j(with_(order_id="') or true or ('")), None, "order_id"),
        ("id with spaces", j(with_(order_id="an order")), None, "order_id"),
        ("id too long", j(with_(order_id="o" * 101)), None, "order_id"),
        ("id reserved index partition", j(with_(order_id="_active")), None, "order_id"),
        # --- unicode edge cases
        ("unicode id", j(with_(order_id="ördér-1")), None, "order_id"),
        ("zero-width space in id", j(with_(order_id="o\u200b1")), None, "order_id"),
        ("RTL override in id", j(with_(order_id="o\u202e1")), None, "order_id"),
        ("lone surrogate", '{"order_id": "\\ud800", "customer_id": "c-1", "currency": "EUR", "items": [], "total": "0"}', None, "invalid order"),
        ("control character in name", j(with_(customer_name="bell\u0007")), None, "control characters"),
        ("name too long", j(with_(customer_name="名" * 201)), None, "customer_name"),
    ]
    result = [
        {"name": name, "body": body, **({"content_type": ct} if ct else {}), "reason": reason}
        for name, body, ct, reason in out
    ]
    result += [
        {"name": "invalid UTF-8", "body_base64": base64.b64encode(b"\xff\xfe\xfa{}").decode(), "reason": "order"},
        {"name": "UTF-16 body", "body_base64": base64.b64encode(json.dumps(VALID).encode("utf-16")).decode(), "reason": "order"},
        {"name": "huge body (200 KB)", "generate": {"kind": "huge_notes", "chars": 200_000}, "reason": "notes"},
        # Above what one table row holds: the rejection keeps it whole in part rows.
        {"name": "huge body (1,000 KiB)", "generate": {"kind": "huge_notes", "chars": 1_024_000}, "reason": "notes"},
        {"name": "deep nesting (10,000 levels)", "generate": {"kind": "deep", "levels": 10_000}, "reason": "invalid order"},
        {"name": "many keys", "generate": {"kind": "many_keys", "keys": 20_000}, "reason": "invalid order"},
    ]
    return result


def main() -> None:
    path = BAD_ORDERS
    path.write_text(json.dumps(cases(), indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    print(f"wrote {len(cases())} cases to {path.name}")


if __name__ == "__main__":
    main()
