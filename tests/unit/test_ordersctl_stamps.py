"""ordersctl with stamps (ordersctl/stamps.py): ``stamp`` says which stamp an order belongs
to, and ``send-order`` refuses an order whose stamp its settings do not reach, before
connecting to anything. The rule itself is tests/unit/test_stamps.py's."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from core import names
from ordersctl.cli import app
from ordersctl.stamps import StampError, check_stamp, connected_namespace, parse_stamps

NAMESPACES = ["sb-a.servicebus.windows.net", "sb-b.servicebus.windows.net", "sb-c.servicebus.windows.net"]


def an_order_of(stamp: int) -> str:
    return next(f"o-{i}" for i in range(1000) if names.stamp_of(f"o-{i}", len(NAMESPACES)) == stamp)


def test_stamp_prints_each_orders_stamp_and_namespace(monkeypatch):
    monkeypatch.setenv(names.ORDERS_STAMPS_SETTING, ",".join(NAMESPACES))
    ids = [an_order_of(0), an_order_of(2)]
    result = CliRunner().invoke(app, ["stamp", *ids])
    assert result.exit_code == 0, result.output
    assert [line.split() for line in result.output.splitlines()] == [
        [ids[0], "stamp", "0", NAMESPACES[0]], [ids[1], "stamp", "2", NAMESPACES[2]]]


def test_stamp_without_the_stamps_is_a_usage_error(monkeypatch):
    monkeypatch.delenv(names.ORDERS_STAMPS_SETTING, raising=False)
    result = CliRunner().invoke(app, ["stamp", "o-1"])
    assert result.exit_code == 2 and names.ORDERS_STAMPS_SETTING in result.output


@pytest.mark.parametrize(("text", "says"), [
    ("", "1 to 16 namespaces"),
    (",".join(f"n{i}.servicebus.windows.net" for i in range(17)), "1 to 16 namespaces"),
    ("a.servicebus.windows.net,A.servicebus.windows.net/", "twice"),
    ("https://a.servicebus.windows.net/x", "not a Service Bus namespace"),
])
def test_a_malformed_stamp_list_is_refused_with_a_clear_error(text, says):
    with pytest.raises(StampError, match=says):
        parse_stamps(text)


def test_the_namespace_reached_comes_from_either_kind_of_connection():
    assert connected_namespace(None, "SB-A.servicebus.windows.net") == NAMESPACES[0]
    assert connected_namespace("Endpoint=sb://sb-b.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v",
                               None) == NAMESPACES[1]
    assert connected_namespace(None, None) is None


def test_an_order_for_another_stamp_is_refused_and_one_for_this_stamp_passes():
    mine, other = an_order_of(1), an_order_of(2)
    check_stamp(mine, NAMESPACES, NAMESPACES[1])
    with pytest.raises(StampError, match=f"belongs to stamp 2 \\({NAMESPACES[2]}\\).*stamp 2's settings"):
        check_stamp(other, NAMESPACES, NAMESPACES[1])


def test_send_order_refuses_an_order_of_another_stamp_before_sending(monkeypatch):
    monkeypatch.setenv(names.STORAGE_CONNECTION, "UseDevelopmentStorage=true")
    monkeypatch.setenv(names.SERVICEBUS_CONNECTION, f"Endpoint=sb://{NAMESPACES[1]}/;SharedAccessKeyName=k;SharedAccessKey=v")
    monkeypatch.setenv(names.ORDERS_STAMPS_SETTING, ",".join(NAMESPACES))
    other = an_order_of(0)
    result = CliRunner().invoke(app, ["send-order", "--order-id", other, "--customer", "c-1", "--item", "sku-1:1:1.00"])
    assert result.exit_code == 1, result.output
    assert f"belongs to stamp 0 ({NAMESPACES[0]})" in " ".join(result.output.split())
